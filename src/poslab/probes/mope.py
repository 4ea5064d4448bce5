"""MoPE's (omega, sigma) pairs against the admissibility boundary, and the energy gate's shares.

    ratio = omega_f sigma_f / c     (1 = on the boundary omega sigma = c),   gap = |ratio - 1|
    damping at offset T = exp(-T^2 / 2 sigma_f^2)                          (1 = no locality)

Rows for the MoPE ablation (docs/mope.md): ``pair`` rows, every (omega, sigma) of a MoPE encoding
(poslab/positional/mope.py) at one recorded training step (:func:`pair_rows`, from a snapshot of
the weights, never the live ones; :func:`trajectory_rows` over initialization, the snapshots and
the end), ``move`` rows from them (:func:`move_rows`: each pair's gap at the first and last step),
``gate`` rows of an energy-gated Transformer (:func:`gate_rows`: tau_h and the shares of tokens
with g > 1/2 and with E > 1), and the (omega, sigma) figure (:func:`pairs_figure`).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from poslab.experiments.outputs import save, select


def pair_rows(encoding, state: dict, step: int, T: int) -> list[dict]:
    """Every (omega, sigma) pair of ``encoding`` with the weights of ``state`` (model parameter
    names -> tensors): omega sigma / c, its distance to 1 and the damping at offset T."""
    enc = copy.deepcopy(encoding).cpu().double()
    enc.load_state_dict({k[len("encoding."):]: v.detach().cpu().double() for k, v in state.items()
                         if k.startswith("encoding.")}, strict=False)
    with torch.no_grad():
        omega = enc.omega.reshape(-1, enc.omega.shape[-1])  # [h | 1, F]
        sigma = enc.sigma.reshape(omega.shape)
    ratio = omega * sigma / enc.c
    return [dict(probe="pair", step=step, head=h, pair=f, omega=float(omega[h, f]), sigma=float(sigma[h, f]),
                 ratio=float(ratio[h, f]), log10_ratio=math.log10(float(ratio[h, f])),
                 gap=abs(float(ratio[h, f]) - 1), damping_T=math.exp(-T ** 2 / (2 * float(sigma[h, f]) ** 2)),
                 c=enc.c, init_sigma=enc.init_sigma)
            for h in range(omega.shape[0]) for f in range(omega.shape[1])]


def trajectory_rows(model, untrained, snapshots: dict[int, dict], steps: int, T: int) -> list[dict]:
    """:func:`pair_rows` of ``model``'s MoPE encoding at step 0 (``untrained``'s weights), at every
    snapshot (step -> weights, ``train.snapshot_steps``) and at the end (``steps``: the model's)."""
    states = {0: dict(untrained.named_parameters()), **snapshots, steps: dict(model.named_parameters())}
    return [row for step, state in sorted(states.items()) for row in pair_rows(model.encoding, state, step, T)]


def move_rows(rows: list[dict], start: Callable[[dict], str]) -> list[dict]:
    """One ``move`` row per model, head and pair of the ``pair`` rows: its gap at the first and last
    recorded step, the log-changes of sigma and omega, and ``sigma_init`` = ``start(first row)``."""
    pairs: dict[tuple, list[dict]] = {}
    for p in select(rows, "pair"):
        pairs.setdefault((p["energy_gate"], p["seed"], p["head"], p["pair"]), []).append(p)
    out = []
    for (gate, seed, head, pair), track in pairs.items():
        track = sorted(track, key=lambda p: p["step"])
        first, last = track[0], track[-1]
        out.append(dict(probe="move", energy_gate=gate, seed=seed, head=head, pair=pair, sigma_init=start(first),
                        initial_gap=first["gap"], final_gap=last["gap"],
                        log_sigma_change=math.log(last["sigma"] / first["sigma"]),
                        log_omega_change=math.log(last["omega"] / first["omega"])))
    return out


def gate_rows(model, windows, device) -> list[dict]:
    """tau_h and, over the validation windows' tokens, the shares with g > 1/2 and with E > 1."""
    on: dict[int, torch.Tensor] = {}
    above_: dict[int, torch.Tensor] = {}
    mean_g: dict[int, torch.Tensor] = {}
    count = 0
    with torch.no_grad():
        for batch in windows:
            _, inter = model(batch.tokens.to(device), return_intermediates=True)
            for i, (block, layer) in enumerate(zip(model.layers, inter.layers, strict=True)):
                E, g = block.energy_gate(block.ln_attn(layer.resid_pre))  # [b, h, n]
                for key, value in ((on, (g > 0.5)), (above_, (E > 1)), (mean_g, g)):
                    key[i] = key.get(i, 0) + value.double().sum(dim=(0, 2)).cpu()  # [h]
            count += batch.tokens.numel()
    rows = []
    for i, block in enumerate(model.layers):
        tau = block.gate_tau.detach().cpu()
        rows += [dict(probe="gate", layer=i, head=h, tau=float(tau[h]), gated_on=float(on[i][h]) / count,
                      above_average=float(above_[i][h]) / count, mean_gate=float(mean_g[i][h]) / count)
                 for h in range(tau.numel())]
    return rows


def pairs_figure(rows: list[dict], out: Path, near: float = 0.05) -> list[Path]:
    """pairs.png: (omega, sigma) of every pair at initialization and after training, against
    sigma = c / omega and (1 + ``near``) c / omega, a panel per energy-gate setting."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pairs = select(rows, "pair")
    if not pairs:
        return []
    last = max(p["step"] for p in pairs)
    fig, axes = plt.subplots(1, 2, figsize=(9, 4), squeeze=False, sharey=True)
    for ax, gate in zip(axes[0], (False, True), strict=False):
        mine = [p for p in pairs if bool(p["energy_gate"]) == gate]
        for step, style in ((0, dict(mfc="none", color="grey", label="initial")),
                            (last, dict(color="C3", label=f"after {last} steps"))):
            sel = [p for p in mine if p["step"] == step]
            ax.loglog([p["omega"] for p in sel], [p["sigma"] for p in sel], "o", ms=3, **style)
        omega = np.array([p["omega"] for p in pairs])
        grid = np.geomspace(omega.min() / 2, omega.max() * 2, 100)
        c = pairs[0]["c"]
        ax.loglog(grid, c / grid, "k--", lw=1, label=f"omega sigma = {c:g}")
        ax.loglog(grid, (1 + near) * c / grid, "k:", lw=0.8, label=f"+{near:.0%}")
        ax.set(xlabel="omega", title=f"MoPE, energy gate {'on' if gate else 'off'}")
        ax.legend(fontsize=7)
    axes[0][0].set_ylabel("sigma")
    return [save(fig, out / "pairs.png")]
