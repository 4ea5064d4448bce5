"""Stages: a study's intermediate results stored under keys of their own.

A stage is what one member's evaluation computes and others reuse: a searched schedule, a
fine-tuned copy of a trained member. It is keyed by the config that decides it (the trained
member's run key, the stage's name and budget), recorded in the store like a member (its rows, its
weights if it has any, its timings), so a resumed run reads it back instead of searching or
fine-tuning again, ``poslab report`` counts it, and another study can read it by the same config.

A stage's run config is ``{"stage": name, ...}``: it has no ``seed``, ``variant`` or ``model`` of
a trained member, and readers of members skip it (:func:`is_stage`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from poslab.store import Store, config_hash


def is_stage(config: dict) -> bool:
    """Whether a stored run's config is a stage's (not a trained or evaluate-only member's)."""
    return "stage" in config


@dataclass
class Stages:
    """Stages of ``experiment`` in ``store``; with ``force`` every stage is computed again once
    in this run (as ``--force`` retrains members), then reused."""

    store: Store
    experiment: str
    revision: str | None = None
    force: bool = False
    _fresh: set[str] = field(default_factory=set)

    def key(self, config: dict) -> str:
        return config_hash({"experiment": self.experiment, **config})

    def get(self, config: dict) -> tuple[list[dict], dict[str, torch.Tensor] | None] | None:
        """(rows, weights or None) of the stored stage ``config``; None when it must be computed."""
        key = self.key(config)
        if self.force and key not in self._fresh:
            return None
        run = next((r for r in self.store.runs(experiment=self.experiment) if r["key"] == key), None)
        if run is None or run["status"] != "finished":
            return None
        rows = [{k: v for k, v in r.items() if k != "run_key"} for r in self.store.rows(keys=[key])]
        return rows, (self.store.load_weights(key) if run["weights"] else None)

    def put(self, config: dict, rows: list[dict], weights: dict[str, torch.Tensor] | None = None,
            seconds: float | None = None) -> str:
        """Record a computed stage; returns its key."""
        if "stage" not in config:
            raise ValueError("a stage's config names it: {'stage': name, ...}")
        key = self.key(config)
        self.store.record(key, experiment=self.experiment, config={"experiment": self.experiment, **config},
                          rows=rows, weights=weights, timings=None if seconds is None else dict(seconds=seconds),
                          revision=self.revision)
        self._fresh.add(key)
        return key
