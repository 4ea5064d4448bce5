"""Energy-gated attention, an extension of a Block's attention (the EGA companion of MoPE, seed survey
``001``; the method section is not public, so this is our definition, every choice a field of
:class:`EnergyGate`). Each layer gates every key token j, per head h, by its energy relative to the past::

    e_hj = W_gate[h] . a_j                               one linear projection of the normalized state
    E_hj = e_hj^2 / (mean_{k<=j} e_hk^2 + eps)           energy="power" (default)
         = e_hj / sqrt(mean_{k<=j} e_hk^2 + eps)         energy="amplitude"
    g_hj = sigmoid((E_hj - tau_h) / T)                   tau_h learned per head (init tau_init),
                                                         T = temperature
    out_i = sum_j w_ij g_hj v_j                          renormalize=False (default)
          = sum_j w_ij g_hj v_j / sum_j w_ij g_hj        renormalize=True (softmax(l + log g))

The running mean runs over internal indices k <= j, so the gate is causal: no token's gate reads a
later token (right padding sits after every real key and never reaches a real gate). A
power-ratio E has running mean about 1: E_hj > 1 is "above average energy". Unrenormalized, the
gate scales the values (v_j -> g_hj v_j), which keeps the fused attention kernel; renormalized, it
goes to attention as ``key_gate``. ``projection="shared"`` uses one projection for all heads
(e_j the same for every head, tau_h still per head). Extra parameters per layer: h D + h
(shared: D + h); :func:`gate_parameter_count` counts them.

A model turns it on with ``TransformerConfig(energy_gate=EnergyGate(...))`` (``True``: the defaults);
the layer keeps the parameters ``W_gate`` [h | 1, D] and ``gate_tau`` [h] and
:meth:`~poslab.models.transformer.Block.energy_gate` returns (E, g) for probes. A run's config
records the gate under the flat names it had before it was an extension (:data:`RECORDED`), so every
stored run key still names its run.

Notation: b batch, n internal sequence, h head, d head dim, D d_model.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from poslab.errors import ConfigError, check_choice

PROJECTIONS = ("per_head", "shared")  # one projection per head, or one for all heads
ENERGIES = ("power", "amplitude")  # E_j as e_j^2 / mean e^2, or e_j / sqrt(mean e^2)
PARAMETERS = ("W_gate", "gate_tau")  # the names a gated Block gives its gate's parameters
EPS = 1e-6  # keeps E finite where every e so far is 0


@dataclass(frozen=True, kw_only=True)
class EnergyGate:
    projection: str = "per_head"  # "per_head": e_hj = W_gate[h] . a_j; "shared": one e_j for all heads
    energy: str = "power"  # E_j: "power" e_j^2 / mean e^2, "amplitude" e_j / sqrt(mean e^2)
    temperature: float = 0.1  # T in g = sigmoid((E - tau) / T)
    tau_init: float = 0.5  # tau_h at initialization (learned per head)
    renormalize: bool = False  # True: weights w_ij g_j renormalized over j (softmax(l + log g))

    def __post_init__(self):
        check_choice("energy_gate.projection", self.projection, PROJECTIONS)
        check_choice("energy_gate.energy", self.energy, ENERGIES)
        if isinstance(self.temperature, bool) or not (isinstance(self.temperature, (int, float))
                                                       and self.temperature > 0):
            raise ConfigError("energy_gate.temperature", self.temperature, "a positive number")
        if isinstance(self.tau_init, bool) or not isinstance(self.tau_init, (int, float)):
            raise ConfigError("energy_gate.tau_init", self.tau_init, "a number")
        if not isinstance(self.renormalize, bool):
            raise ConfigError("energy_gate.renormalize", self.renormalize, "True, False")
        for name in ("temperature", "tau_init"):  # 1 and 1.0 are one config (and one run key)
            object.__setattr__(self, name, float(getattr(self, name)))

    @classmethod
    def setting(cls, value, path: str = "energy_gate") -> EnergyGate | None:
        """The gate a config value stands for: True (the defaults), False or None (off), a mapping of
        this class's fields, or an EnergyGate."""
        if isinstance(value, cls) or value is None:
            return value
        if isinstance(value, bool):
            return cls() if value else None
        if isinstance(value, dict):
            unknown = sorted(set(value) - set(cls.__dataclass_fields__))
            if unknown:
                raise ConfigError(f"{path}.{unknown[0]}", unknown[0], sorted(cls.__dataclass_fields__))
            return cls(**value)
        raise ConfigError(path, value, f"true, false, null or an object of {sorted(cls.__dataclass_fields__)}")

    def rows(self, n_heads: int) -> int:
        """Rows of W_gate: one projection per head, or one for all."""
        return n_heads if self.projection == "per_head" else 1

    def record(self) -> dict:
        """The gate as a run's config records it: the flat fields of the model config before this
        class existed (see the module docstring)."""
        return dict(energy_gate=True, gate_projection=self.projection, gate_energy=self.energy,
                    gate_temperature=self.temperature, gate_tau_init=self.tau_init,
                    gate_renormalize=self.renormalize)


RECORDED = tuple(EnergyGate().record())  # the flat names of a run's config


def recorded(gate: EnergyGate | None) -> dict:
    """``gate`` as a run's config records it (an ungated model: the defaults with energy_gate False)."""
    return EnergyGate().record() | dict(energy_gate=False) if gate is None else gate.record()


def from_recorded(fields: dict) -> EnergyGate | None:
    """The gate of a run's recorded model config (:func:`recorded`'s inverse)."""
    if not fields.get("energy_gate"):
        return None
    names = dict(projection="gate_projection", energy="gate_energy", temperature="gate_temperature",
                 tau_init="gate_tau_init", renormalize="gate_renormalize")
    return EnergyGate(**{k: fields[v] for k, v in names.items() if v in fields})


def energy(gate: EnergyGate, a: Tensor, W_gate: Tensor, tau: Tensor, n_heads: int, start: int = 0,
           carry: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """The keys a [b, n, D] at internal indices start .. start + n - 1 -> relative energy E and gate
    g, each [b, h, n], and the running sum of e^2 [b, h | 1] that continues it: ``carry`` is that
    sum over every earlier index (None: there are none)."""
    e = (a @ W_gate.T).transpose(1, 2)  # e_hj, [b, h | 1, n]
    count = torch.arange(start + 1, start + e.shape[-1] + 1, device=e.device, dtype=e.dtype)  # j + 1, [n]
    cum = e.square().cumsum(-1)
    if carry is not None:
        cum = cum + carry[..., None]
    mean_square = cum / count + EPS  # causal running mean of e^2, [b, h | 1, n]
    E = e.square() / mean_square if gate.energy == "power" else e / mean_square.sqrt()
    E = E.expand(-1, n_heads, -1)  # [b, h, n]
    g = torch.sigmoid((E - tau[:, None]) / gate.temperature)  # [b, h, n]
    return E, g, cum[..., -1]


def apply(gate: EnergyGate, g: Tensor, v: Tensor) -> tuple[Tensor, Tensor | None]:
    """The values v [b, h, n, d] and the key gate attention applies, given the gate g [b, h, n]:
    renormalized, g [b, h, 1, n] reweights the keys inside the softmax; otherwise token j's value is
    scaled by g_hj and there is no key gate."""
    if gate.renormalize:
        return v, g[:, :, None, :]
    return v * g[..., None], None


def gate_parameter_count(model: nn.Module) -> int:
    """The extra parameters energy gating adds to ``model`` (W_gate and tau_h of every layer)."""
    return sum(p.numel() for name, p in model.named_parameters() if name.rsplit(".", 1)[-1] in PARAMETERS)
