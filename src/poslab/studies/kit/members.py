"""What the kit's probe rows read of a member (``MemberContext``, whose ``model`` and ``task`` are typed
as any module and any task): the model as the class the study trains, the task's fixed offset ``K``."""

from __future__ import annotations

from torch import nn

from poslab.models import RetrievalHead, Transformer
from poslab.tasks.base import Task


def retrieval_head(model: nn.Module) -> RetrievalHead:
    """``model`` as the ``RetrievalHead`` a fixed-offset study trains (its grid fast path, ``attend``)."""
    if not isinstance(model, RetrievalHead):
        raise TypeError(f"a RetrievalHead (the fixed-offset studies' model), got {type(model).__name__}")
    return model


def poslab_model(model: nn.Module) -> Transformer | RetrievalHead:
    """``model`` as one of poslab's own models (a config and a built ``encoding``, as the carrier probes read)."""
    if not isinstance(model, Transformer | RetrievalHead):
        raise TypeError(f"a Transformer or RetrievalHead, got {type(model).__name__}")
    return model


def task_offset(task: Task) -> int:
    """The fixed offset ``K`` of a retrieval or shift task (the target is the token K before)."""
    K = getattr(task, "K", None)
    if not isinstance(K, int):
        raise TypeError(f"a task with a fixed offset K (fixed_offset, shift), got {type(task).__name__}")
    return K
