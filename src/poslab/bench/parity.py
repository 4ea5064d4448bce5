"""``poslab bench parity``: ensemble = solo on a device, Table 1's groups trained both ways."""

from __future__ import annotations

import numpy as np

from poslab.bench.train import table1_groups
from poslab.experiments.config import apply_overrides
from poslab.experiments.training import train_members
from poslab.studies import DEFAULTS, get_experiment


def bench_parity(*, device: str = "cpu", members: int = 3, steps: int = 50, echo=print) -> list[dict]:
    """Ensemble = solo on ``device``: Table 1's groups (RoPE, APE; K = 2, ``members`` seeds, ``steps``
    steps of the paper recipe) trained as one ensemble each, and each seed alone, on ``device``. Per
    group: the largest absolute difference of any final weight (0 on CPU: bit for bit; a GPU's
    batched kernels may round otherwise) and of any step's reported loss (the vmapped mean may add
    up in another order even where the weights are bit for bit)."""
    paper = get_experiment(DEFAULTS["bench"]).study("paper")  # Table 1's study
    study = apply_overrides(paper, [f"train.steps={steps}", f"seeds={members}", "grid.task.K=[2]",
                                    "grid.encoding_options.learned.init_std=[0.02]"])
    out = []
    for label, group in table1_groups(study).items():
        ensemble = train_members(group, device=device, progress=False)
        weights = losses = 0.0
        for i, member in enumerate(group):
            solo = train_members([member], device=device, progress=False)
            mine, theirs = ensemble.models[i].state_dict(), solo.models[0].state_dict()
            weights = max(weights, *((mine[k] - theirs[k]).abs().max().item() for k in theirs))
            losses = max(losses, float(np.abs(ensemble.loss_curve[:, i] - solo.loss_curve[:, 0]).max()))
        row = dict(group=label, device=device, members=len(group), steps=steps, max_weight_diff=weights,
                   max_loss_diff=losses, weights_bit_for_bit=weights == 0)
        echo(f"{label} on {device}: {len(group)} members x {steps} steps, ensemble against each alone: "
             f"largest weight difference {weights:.3g}{' (bit for bit)' if weights == 0 else ''}, "
             f"largest loss difference {losses:.3g}")
        out.append(row)
    return out
