"""The studies: one module per published artefact, each ending in its ``EXPERIMENT``.

A study module reads top to bottom as its declarations (grid and presets, claim specs, tables,
figures), then the few functions that are genuinely its own. Adding a study is one module here
and one entry below; the machinery that runs it lives in :mod:`poslab.experiments`.
"""

from __future__ import annotations

from poslab.errors import ConfigError
from poslab.experiments.runner import Experiment
from poslab.studies import (
    bias_comparison,
    context_extension,
    controls,
    heads,
    k1,
    leakage,
    linear_control,
    lm,
    mope,
    phenomenon,
    pretrained_extension,
    pretrained_leakage,
    two_layer,
    validation,
)

EXPERIMENTS: dict[str, Experiment] = {m.EXPERIMENT.name: m.EXPERIMENT for m in (
    phenomenon, validation, lm, context_extension, leakage, bias_comparison, linear_control, heads, k1, two_layer,
    controls, mope, pretrained_extension, pretrained_leakage)}

# ``poslab run all``: every study flagged ``in_run_all`` (the seed paper's), in the paper's order.
PAPER_STUDIES: tuple[str, ...] = tuple(n for n, e in EXPERIMENTS.items() if e.in_run_all)


def get_experiment(name: str) -> Experiment:
    if name not in EXPERIMENTS:
        raise ConfigError("experiment", name, sorted(EXPERIMENTS))
    return EXPERIMENTS[name]
