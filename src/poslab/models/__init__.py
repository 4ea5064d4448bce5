"""Models: a plain-dict registry and the one loss every model shares.

``MODELS`` maps the names experiments use to (model class, config class). Every model has the
same entry points, so the trainer and the probes never ask which model they hold:

    model.loss(batch)      mean cross-entropy over the batch's loss_mask (one member)
    model.collect(batch)   Intermediates for the probes
    model(tokens, lengths=...)   the direct forward: logits [b, m] or [b, s, m]
"""

from __future__ import annotations

from poslab.errors import ConfigError
from poslab.models.loss import masked_cross_entropy
from poslab.models.retrieval_head import RetrievalHead, RetrievalHeadConfig
from poslab.models.transformer import Transformer, TransformerConfig

MODELS: dict[str, tuple[type, type]] = {
    "retrieval_head": (RetrievalHead, RetrievalHeadConfig),
    "transformer": (Transformer, TransformerConfig),
}


def model_classes(name: str) -> tuple[type, type]:
    if name not in MODELS:
        raise ConfigError("model", name, sorted(MODELS))
    return MODELS[name]


__all__ = ["MODELS", "RetrievalHead", "RetrievalHeadConfig", "Transformer", "TransformerConfig",
           "masked_cross_entropy", "model_classes"]
