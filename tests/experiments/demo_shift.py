"""A demo experiment, written as a user would add one: this module plus one registry entry.

A two-layer Transformer on the full-sequence shift task with two encodings; rows hold the
per-position accuracy at each evaluation length; one structured claim. Nothing in the trainer,
runner or store knows about it.
"""

from pathlib import Path

from poslab.experiments.claims import Claim, claims_markdown, write_claims
from poslab.experiments.config import StudyConfig
from poslab.experiments.retrieval import group_stats, write_csv
from poslab.tasks import eval_batch
from poslab.train import evaluate_loss

name = "demo_shift"
title = "Demo: a Transformer on the shift task"


def study(preset: str) -> StudyConfig:
    return StudyConfig(model_type="transformer", model=dict(d_model=16, n_layers=2, n_heads=2),
                       task_type="shift", task=dict(m=10, K=2), grid={"encoding": ("rope", "learned")}, seeds=2,
                       train=dict_train(), eval=dict_eval())


def dict_train():
    from poslab.train import TrainConfig

    return TrainConfig(steps=15, batch_size=16, min_length=8, max_length=12)


def dict_eval():
    from poslab.experiments.config import EvalConfig

    return EvalConfig(lengths=(8, 16), n_sequences=24, chunk=10)


def evaluate(ctx) -> list[dict]:
    rows = []
    for L in ctx.study.eval.lengths:
        batch = eval_batch(ctx.task, L, ctx.study.eval.n_sequences, ctx.study.eval.seed, device=ctx.device)
        result = evaluate_loss(ctx.model, batch, chunk=ctx.study.eval.chunk)
        rows.append(dict(probe="length", length=L, accuracy=result["accuracy"], loss=result["loss"]))
    return rows


def report(rows: list[dict], study: StudyConfig, out: Path) -> list[Path]:
    acc = group_stats(rows, ("encoding", "length"), "accuracy")
    claims = [Claim(name=f"{enc}: accuracy at L={L}", paper="-", measured=m, holds=None, note=f"{n} seeds")
              for (enc, L), (m, _, n) in acc.items()]
    (out / "table.md").write_text(claims_markdown(claims))
    return [write_csv(rows, out / "rows.csv"), out / "table.md", write_claims(claims, out / "claims.json")]
