"""One module per published artefact; ``EXPERIMENTS`` maps command-line names to them.

Each module declares its grid (``study(preset)``), its per-member probes (``evaluate``), its
report (``report``: rows.csv, table.md with the paper's value beside each measured one,
figures) and the paper's reported values.
"""

from __future__ import annotations

from types import ModuleType

from poslab.errors import ConfigError
from poslab.experiments import context_extension, phenomenon, validation
from poslab.experiments import leakage
from poslab.experiments import lm
from poslab.experiments import mope
from poslab.experiments import bias_comparison, heads, k1, linear_control  # the seed paper's other studies
from poslab.experiments import controls, two_layer  # Section 5.2 and the Fig. 4 controls

EXPERIMENTS: dict[str, ModuleType] = {
    "phenomenon": phenomenon,
    "validation": validation,
    "lm": lm,
    "context-extension": context_extension,
    "leakage": leakage,
    "bias-comparison": bias_comparison,
    "linear-control": linear_control,
    "heads": heads,
    "k1": k1,
    "two-layer": two_layer,
    "controls": controls,
    "mope": mope,
}

# ``poslab run all``: every study of the seed paper, in the paper's order.
PAPER_STUDIES: tuple[str, ...] = ("phenomenon", "validation", "bias-comparison", "linear-control", "heads", "k1", "two-layer",
                                    "controls")


def get_experiment(name: str) -> ModuleType:
    if name not in EXPERIMENTS:
        raise ConfigError("experiment", name, sorted(EXPERIMENTS))
    return EXPERIMENTS[name]
