"""The studies: one module per published artefact, each ending in its ``EXPERIMENT``.

A study module reads top to bottom as its declarations (``BASE`` and ``PRESETS``: the grid and what
each preset changes over it, claim specs, tables, figures), then the few functions that are genuinely
its own, and ends in ``EXPERIMENT = Trained(...)`` or ``EvaluateOnly(...)``. Adding a study is one
module here and one entry in ``STUDIES`` below, and no other file (``tests/test_add_a_study.py``); the
machinery that runs it lives in :mod:`poslab.experiments`. Installed packages add studies through the
``poslab.studies`` entry points (:mod:`poslab.plugins`), loaded when this module is imported; a plugin
study never enters ``poslab run all``.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

from poslab import plugins
from poslab.errors import ConfigError
from poslab.experiments import Experiment


@dataclass(frozen=True)
class Entry:
    """One built-in study: its module in this folder and its row in the README's study tables
    (``scripts/readme_studies.py`` writes them; the counts come from its stored claims under docs/)."""

    module: str  # poslab.studies.<module>, which ends in its EXPERIMENT
    reproduces: str  # the README's "reproduces" cell
    page: str  # the README's "page" cell (a markdown link)
    table: str = "seed"  # the README table: "seed" (the seed paper and the survey) or "next" (next steps, benchmarks)
    unrun: str = "no stored run here"  # the count cell while docs/ holds no claims of it


# THE list of built-in studies, in the registry's order (``poslab list``, ``poslab run all``). The
# registry below, the import contract (pyproject.toml keeps every module here apart from every other)
# and the README's study tables all read it: adding a study is its module and one entry here.
STUDIES: tuple[Entry, ...] = (
    Entry("phenomenon", "Table 1 / Fig. 1", "[Table 1](docs/table1-k1-controls.md)"),
    Entry("validation", "Table 2 / Figs. 2-3", "[Table 2](docs/validation-linear-survey.md)"),
    Entry("lm", "seed 001's char LM (nanoGPT's shakespeare_char recipe): position-wise loss past the training context",
          "[speed](docs/speed.md)",
          unrun="no stored run here (its GPU run: [docs/gpu-2026-12-04](docs/gpu-2026-12-04/README.md))"),
    Entry("context_extension", "seed 001's survey: extension methods", "[extension](docs/context-extension.md)"),
    Entry("leakage", "seed 001's leakage abstract, char LMs", "[leakage](docs/leakage.md)"),
    Entry("bias_comparison", "Section 5.1", "[5.1](docs/bias-comparison.md)"),
    Entry("linear_control", "Section 7", "[Section 7](docs/validation-linear-survey.md)"),
    Entry("heads", "the multi-head remark", "[heads](docs/two-layer-heads.md)"),
    Entry("k1", "the K = 1 remark", "[K = 1](docs/table1-k1-controls.md)"),
    Entry("two_layer", "Section 5.2", "[5.2](docs/two-layer-heads.md)"),
    Entry("controls", "Fig. 4", "[Fig. 4](docs/table1-k1-controls.md)"),
    Entry("mope", "seed 001's MoPE abstract (2 x 2 with energy-gated attention)", "[MoPE](docs/mope.md)"),
    Entry("pretrained_extension", "seed 001's survey protocol on SmolLM2-135M-Instruct",
          "[pretrained](docs/pretrained.md#the-cpu-preset-restated-2026-12-05)"),
    Entry("pretrained_leakage", "seed 001's leakage abstract on SmolLM2-135M-Instruct and Gemma 3 270M",
          "[pretrained](docs/pretrained.md#leakage-on-both-checkpoints-cpu-preset-2026-12-05)"),
    Entry("implementation", "seed 001's survey: RoPE in low precision, a KV cache under Dynamic NTK",
          "[implementation](docs/implementation.md)"),
    Entry("nope_depth", "next step: depth with NoPE (1, 2, 4 layers) on fixed-offset retrieval",
          "[next steps](docs/next-steps.md)", table="next"),
    Entry("induction", "next step: a two-layer induction circuit per encoding", "[next steps](docs/next-steps.md)",
          table="next"),
    Entry("lengthgen", "the field's benchmarks: Ruoss et al. 2023 (Chomsky tasks), Kazemnejad et al. 2023",
          "[lengthgen](docs/lengthgen.md"
          "#the-cpu-preset-2026-12-08-ruoss-et-als-gain-over-six-tasks-and-three-levels-3-seeds)", table="next"),
    Entry("lengthgen_probes", "next step: the seed's probes on copy and addition (RoPE, APE, NoPE)",
          "[next steps](docs/next-steps.md#lengthgen-probes-the-seeds-probes-on-copy-and-addition)", table="next"),
    Entry("hybrid", "issue 57: rope / no-rope layouts (RNoPE, SWAN, iRoPE) on the char LM, fixed-offset retrieval and "
          "Kazemnejad et al.'s reverse, "
          "probes per layer type", "[hybrid](docs/hybrid.md)", table="next",
          unrun="no stored run yet (its cpu preset)"),
    Entry("arithmetic", "next step: arithmetic, position coupling (Cho et al. 2024), Abacus, index hints vs NoPE / "
          "RoPE / APE on addition, 1..n digits to 4n", "[arithmetic](docs/arithmetic.md)", table="next",
          unrun="no stored run yet (its cpu preset is sized, not run)"),
)



def entry_experiment(entry: Entry) -> Experiment:
    """The Experiment of a built-in study's entry (its module's EXPERIMENT)."""
    return importlib.import_module(f"{__name__}.{entry.module}").EXPERIMENT


EXPERIMENTS: dict[str, Experiment] = {e.name: e for e in map(entry_experiment, STUDIES)}
# plugins (poslab.plugins): installed packages' studies, an Experiment named like its entry point
EXPERIMENTS.update(plugins.load("studies", EXPERIMENTS, lambda obj: isinstance(obj, Experiment),
                                "an Experiment (poslab.experiments.runner)"))
for _name, _experiment in EXPERIMENTS.items():
    if _experiment.name != _name:
        raise ConfigError(f"plugin {plugins.origin('studies', _name)}: entry point {_name!r} in 'poslab.studies'",
                          _experiment.name, f"an Experiment named {_name!r}, its entry point's name")

# ``poslab run all``: every study flagged ``in_run_all`` (the seed paper's), in the paper's order.
PAPER_STUDIES: tuple[str, ...] = tuple(n for n, e in EXPERIMENTS.items()
                                       if e.in_run_all and plugins.origin("studies", n) == plugins.BUILTIN)

# The study a command reads when none is named, so that no module outside this folder names one:
# ``poslab sample`` samples the character LM's members; ``poslab bench profile`` times Table 1's
# study and ``bench train`` / ``bench parity`` train its grid; ``bench leakage-memory`` measures a job of
# the evaluate-only study on pretrained checkpoints whose jobs say their peak memory; ``bench
# eval --model lm`` evaluates the character LM's members.
DEFAULTS: dict[str, str] = {"sample": "lm", "bench": "phenomenon", "job-memory": "pretrained-leakage",
                           "bench-ensemble": "lengthgen", "bench-lm": "lm"}


def get_experiment(name: str) -> Experiment:
    if name not in EXPERIMENTS:
        raise ConfigError("experiment", name, sorted(EXPERIMENTS))
    return EXPERIMENTS[name]
