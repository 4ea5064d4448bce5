"""The example plugin's study: retrieval heads on first-token retrieval, the plugin's Gaussian
bias against RoPE and ALiBi, accuracy at the training lengths and past them."""

from __future__ import annotations

from pathlib import Path

from poslab import probes
from poslab.experiments import Trained
from poslab.experiments.config import EvalConfig, StudyConfig
from poslab.experiments.outputs import Column, Table, write_outputs
from poslab.tasks import eval_batch
from poslab.train import TrainConfig

TABLES = [Table("Accuracy by encoding and length", by=("encoding", "length"),
                columns=(Column("accuracy", "accuracy"),))]


BASE = StudyConfig(model_type="retrieval_head", model=dict(d_model=16), task_type="first_token",
                   task=dict(m=8), grid={"encoding": ("gaussian_bias", "rope", "alibi")}, seeds=2,
                   train=TrainConfig(steps=400, batch_size=64, min_length=4, max_length=8),
                   eval=EvalConfig(lengths=(8, 12, 16), n_sequences=256))
# presets are data: what each changes over BASE (quick: every code path in seconds, the plugin's encoding
# against RoPE, one seed)
PRESETS = {"paper": {},
           "quick": {"train.steps": 20, "train.batch_size": 16, "seeds": 1,
                     "grid": {"encoding": ("gaussian_bias", "rope")},
                     "eval": EvalConfig(lengths=(8, 12), n_sequences=32)}}


def evaluate(ctx) -> list[dict]:
    eval_cfg = ctx.study.eval
    return [dict(probe="length", length=L, accuracy=probes.accuracy(
                ctx.model, eval_batch(ctx.task, L, eval_cfg.n_sequences, eval_cfg.seed, device=ctx.device)))
            for L in eval_cfg.lengths]


def report(rows: list[dict], study: StudyConfig, out: Path) -> list[Path]:
    return write_outputs(out, title=EXPERIMENT.title, rows=rows, claims=[], tables=TABLES,
                         intro=f"{study.train.steps} steps, seeds 0..{study.seeds - 1}.")


EXPERIMENT = Trained(name="example-first-token", title="Example plugin: first-token retrieval", base=BASE,
                     presets=PRESETS, evaluate=evaluate, report=report)
