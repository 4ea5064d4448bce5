"""The example plugin's study: retrieval heads on first-token retrieval, the plugin's Gaussian
bias against RoPE and ALiBi, accuracy at the training lengths and past them."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from poslab import probes
from poslab.experiments.config import EvalConfig, StudyConfig, quick
from poslab.experiments.outputs import Column, Table, write_outputs
from poslab.experiments.runner import Experiment
from poslab.tasks import eval_batch
from poslab.train import TrainConfig

TABLES = [Table("Accuracy by encoding and length", by=("encoding", "length"),
                columns=(Column("accuracy", "accuracy"),))]


def study(preset: str) -> StudyConfig:
    cfg = StudyConfig(model_type="retrieval_head", model=dict(d_model=16), task_type="first_token",
                      task=dict(m=8), grid={"encoding": ("gaussian_bias", "rope", "alibi")}, seeds=2,
                      train=TrainConfig(steps=400, batch_size=64, min_length=4, max_length=8),
                      eval=EvalConfig(lengths=(8, 12, 16), n_sequences=256))
    if preset == "quick":  # every code path in seconds: the plugin's encoding against RoPE, one seed
        return dataclasses.replace(quick(cfg, steps=20, batch_size=16, n_sequences=32), seeds=1,
                                   grid={"encoding": ("gaussian_bias", "rope")}, eval=EvalConfig(
                                       lengths=(8, 12), n_sequences=32))
    return cfg


def evaluate(ctx) -> list[dict]:
    eval_cfg = ctx.study.eval
    return [dict(probe="length", length=L, accuracy=probes.accuracy(
                ctx.model, eval_batch(ctx.task, L, eval_cfg.n_sequences, eval_cfg.seed, device=ctx.device)))
            for L in eval_cfg.lengths]


def report(rows: list[dict], study: StudyConfig, out: Path) -> list[Path]:
    return write_outputs(out, title=EXPERIMENT.title, rows=rows, claims=[], tables=TABLES,
                         intro=f"{study.train.steps} steps, seeds 0..{study.seeds - 1}.")


EXPERIMENT = Experiment(name="example-first-token", title="Example plugin: first-token retrieval", study=study,
                        evaluate=evaluate, report=report)
