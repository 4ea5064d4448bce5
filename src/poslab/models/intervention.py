"""Interventions made before the forward pass, for a study of positional leakage (third abstract of seed 001).

    x_0       <- bos_embedding                      the BOS slot holds another vector   [D] | [b, D]
    x^l_0     <- resid0   (l = resid0_layer)        the position-0 residual entering layer l is
                                                    replaced (e.g. by another input's)   [D] | [b, D]
    keep^l_hij <- keep^l_hij and not (j = 0, i >= 1, drop_key0[l, h])
                                                    key 0 is removed for every other query of the
                                                    chosen heads (query 0 keeps itself: a softmax row
                                                    is never empty)                      [n_layers, h]

An :class:`Intervention` is a plain argument of :func:`forward_with` (and ``Transformer.collect``),
which runs the model's own parts (``embed``, the blocks, ``readout``): nothing is hooked or
written into the model, the same weights run with and without it, and the forward stays pure
(the branches are on which fields are set, never on tensor values). Each field acts only where
it says: a BOS swap changes only the input at index 0, a residual patch only index 0
from layer ``resid0_layer`` on, a key-0 removal only the chosen heads' masks.

Under a causal mask position 0 sees only itself, so its residual stream is a closed dynamical
system started from ``x_0``: patching ``x^l_0`` fixes every later ``x^{l'}_0`` (l' >= l), and with
a fixed BOS the position-0 residual is the same for every input.

Notation: b batch, n internal sequence (BOS at 0), h head, D d_model.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from torch import Tensor

from poslab.errors import ConfigError


@dataclass(frozen=True, kw_only=True)
class Intervention:
    bos_embedding: Tensor | None = None  # replaces W_bos at position 0, [D] | [b, D] (needs bos=True)
    resid0: Tensor | None = None  # the position-0 residual entering layer resid0_layer, [D] | [b, D]
    resid0_layer: int = 0  # 0 .. n_layers (n_layers: the residual entering the readout)
    drop_key0: Tensor | None = None  # bool [n_layers, h]: heads whose key-0 column is removed

    def check(self, cfg, b: int) -> None:
        """ConfigError unless every field fits the model ``cfg`` and a batch of ``b`` sequences."""
        D = cfg.d_model
        for name in ("bos_embedding", "resid0"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, Tensor) or tuple(value.shape) not in ((D,), (b, D))):
                raise ConfigError(f"intervention.{name}", _shape(value), f"a tensor of shape [{D}] or [{b}, {D}]")
        if self.bos_embedding is not None and not cfg.bos:
            raise ConfigError("intervention.bos_embedding", _shape(self.bos_embedding), "None (the model has no BOS)")
        if not isinstance(self.resid0_layer, int) or not 0 <= self.resid0_layer <= cfg.n_layers:
            raise ConfigError("intervention.resid0_layer", self.resid0_layer, f"an integer in [0, {cfg.n_layers}]")
        shape = (cfg.n_layers, cfg.n_heads)
        if self.drop_key0 is not None and (not isinstance(self.drop_key0, Tensor) or self.drop_key0.dtype != torch.bool
                                           or tuple(self.drop_key0.shape) != shape):
            raise ConfigError("intervention.drop_key0", _shape(self.drop_key0), f"a bool tensor of shape {list(shape)}")

    def bos(self, W_bos: Tensor, b: int) -> Tensor:
        """The vector at position 0, [b, 1, D]."""
        x0 = W_bos if self.bos_embedding is None else self.bos_embedding.to(W_bos.dtype)
        return x0.expand(b, W_bos.shape[-1])[:, None]

    def patch(self, x: Tensor, layer: int) -> Tensor:
        """x [b, n, D] entering layer ``layer`` -> x with the position-0 residual replaced there."""
        if self.resid0 is None or layer != self.resid0_layer:
            return x
        b, _, D = x.shape
        return torch.cat((self.resid0.to(x.dtype).expand(b, D)[:, None], x[:, 1:]), dim=1)

    def mask(self, mask: Tensor | None, layer: int, n: int) -> Tensor | None:
        """The keep-mask of layer ``layer`` (broadcastable to [b, h, n, n]) with key 0 removed in
        the chosen heads for queries i >= 1."""
        if self.drop_key0 is None:
            return mask
        i = torch.arange(n, device=self.drop_key0.device)
        removed = (i[None, :] == 0) & (i[:, None] >= 1)  # [n, n]: (query i >= 1, key 0)
        keep = ~(self.drop_key0[layer][:, None, None] & removed)  # [h, n, n]
        if mask is not None:
            keep = keep.to(mask.device)
        return keep if mask is None else mask & keep


def forward_with(model, tokens: Tensor, intervention: Intervention, *, lengths: Tensor | None = None):
    """(logits [b, s, m], Intermediates) of a :class:`~poslab.models.transformer.Transformer` on
    ``tokens`` under ``intervention``: the model's forward with the BOS slot, the position-0
    residual entering each layer and each layer's mask as the intervention says (each layer with
    its own encoding and mask under a ``layout``)."""
    from poslab.models.intermediates import Intermediates

    cfg = model.cfg
    b = tokens.shape[0]
    intervention.check(cfg, b)
    x, pos = model.embed(tokens, bos=intervention.bos(model.W_bos, b) if cfg.bos else None)
    n = x.shape[1]
    masks = model.layer_masks(n, lengths, tokens.device, explicit=True)  # each layer's own (window, chunk)
    inter = Intermediates(embed=x, positions=pos)
    for i, (block, (mask, _)) in enumerate(zip(model.layers, masks, strict=True)):
        x = intervention.patch(x, i)
        x, layer = block(x, model.layer_encoding(i), pos, intervention.mask(mask, i, n), need_weights=True)
        inter.layers.append(layer)
    return model.readout(intervention.patch(x, len(model.layers))), inter


def _shape(value) -> object:
    return list(value.shape) if isinstance(value, Tensor) else value


def rows_of(intervention: Intervention | None, start: int, stop: int, batch_size: int) -> Intervention | None:
    """The intervention for sequences ``start:stop`` of a batch of ``batch_size``: per-sequence
    tensors ([b, D]) are sliced, shared ones ([D], the head mask) are kept; for chunked probes."""
    if intervention is None:
        return None
    per_sequence = {}
    for name in ("bos_embedding", "resid0"):
        value = getattr(intervention, name)
        if value is not None and value.dim() == 2 and value.shape[0] == batch_size:
            per_sequence[name] = value[start:stop]
    return dataclasses.replace(intervention, **per_sequence)
