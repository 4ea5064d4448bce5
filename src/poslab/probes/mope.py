"""MoPE's (omega, sigma) pairs against the admissibility boundary, and the energy gate's shares.

    ratio = omega_f sigma_f / c     (1 = on the boundary omega sigma = c),   gap = |ratio - 1|
    damping at offset T = exp(-T^2 / 2 sigma_f^2)                          (1 = no locality)

Rows for the MoPE ablation (docs/mope.md): ``pair`` rows, every (omega, sigma) of a MoPE encoding
(poslab/positional/mope.py) at one recorded training step (:func:`pair_rows`, from a snapshot of
the weights, never the live ones; :func:`trajectory_rows` over initialization, the snapshots and
the end), and ``gate`` rows of an energy-gated Transformer (:func:`gate_rows`: tau_h and the shares
of tokens with g > 1/2 and with E > 1).
"""

from __future__ import annotations

import copy
import math

import torch


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
