"""Checks a study runs on its configuration before any work (``Experiment.check``)."""

from __future__ import annotations

from poslab.errors import ConfigError
from poslab.experiments.config import StudyConfig
from poslab.positional import ENCODINGS, rotary_encodings


def require_rotary(study: StudyConfig) -> None:
    """Refuse a registered encoding on the grid that is not rotary (a carrier profile needs rotary frequencies)."""
    rotary = rotary_encodings()
    for name in study.axis("encoding"):
        if name in ENCODINGS and name not in rotary:
            raise ConfigError("encoding", name, f"rotary encodings: {', '.join(rotary)}")
