"""The studies: one module per published artefact, each ending in its ``EXPERIMENT``.

A study module reads top to bottom as its declarations (grid and presets, claim specs, tables,
figures), then the few functions that are genuinely its own. Adding a study is one module here
and one entry below; the machinery that runs it lives in :mod:`poslab.experiments`. Installed
packages add studies through the ``poslab.studies`` entry points (:mod:`poslab.plugins`), loaded
when this module is imported; a plugin study never enters ``poslab run all``.
"""

from __future__ import annotations

from poslab import plugins
from poslab.errors import ConfigError
from poslab.experiments import Experiment
from poslab.studies import (
    arithmetic,
    bias_comparison,
    context_extension,
    controls,
    heads,
    implementation,
    induction,
    k1,
    leakage,
    lengthgen,
    lengthgen_probes,
    linear_control,
    lm,
    mope,
    nope_depth,
    phenomenon,
    pretrained_extension,
    pretrained_leakage,
    two_layer,
    validation,
)

EXPERIMENTS: dict[str, Experiment] = {m.EXPERIMENT.name: m.EXPERIMENT for m in (
    phenomenon, validation, lm, context_extension, leakage, bias_comparison, linear_control, heads, k1, two_layer,
    controls, mope, pretrained_extension, pretrained_leakage, implementation, nope_depth, induction,
    lengthgen, lengthgen_probes, arithmetic)}
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
