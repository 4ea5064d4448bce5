"""A demo study, written as a user would add one: this module plus one entry in ``poslab.studies.STUDIES``.

A two-layer Transformer on the full-sequence shift task with two encodings; rows hold the
accuracy at each evaluation length; one table, one figure and two claims, all declared.
Nothing in the trainer, runner or store knows about it.
"""

from pathlib import Path

from poslab.experiments import Trained
from poslab.experiments.config import EvalConfig, StudyConfig
from poslab.experiments.outputs import Lines, Pivot, Table, write_outputs
from poslab.experiments.spec import ClaimSpec, at_most, comparison_only, is_, judge_all, mean
from poslab.tasks import eval_batch
from poslab.train import TrainConfig, evaluate_loss

CLAIMS = [
    ClaimSpec(name="{encoding}: accuracy at trained lengths", paper="~1", where=at_most("length", 12),
              per=("encoding",), measure=mean("accuracy"), op=">=", threshold=0.9),
    ClaimSpec(name="{encoding}: accuracy past training", paper="no number", where=is_("length", 16),
              per=("encoding",), measure=mean("accuracy"),
              na=comparison_only("the demo makes no prediction past training")),
]
TABLES = [Table("Accuracy by length", by=("encoding",), pivot=Pivot("length", "accuracy", "L={}"))]
FIGURES = [Lines("accuracy.png", x="length", y="accuracy", series=("encoding",), vline=12, ylim=(0, 1.02))]


# the study before a preset, and what each preset changes over it (both run the same small grid here)
BASE = StudyConfig(model_type="transformer", model=dict(d_model=16, n_layers=2, n_heads=2), task_type="shift",
                   task=dict(m=10, K=2), grid={"encoding": ("rope", "learned")}, seeds=2,
                   train=TrainConfig(steps=15, batch_size=16, min_length=8, max_length=12),
                   eval=EvalConfig(lengths=(8, 16), n_sequences=24, chunk=10))
PRESETS = {"paper": {}, "quick": {}}


def evaluate(ctx) -> list[dict]:
    rows = []
    for L in ctx.study.eval.lengths:
        batch = eval_batch(ctx.task, L, ctx.study.eval.n_sequences, ctx.study.eval.seed, device=ctx.device)
        result = evaluate_loss(ctx.model, batch, chunk=ctx.study.eval.chunk)
        rows.append(dict(probe="length", length=L, accuracy=result["accuracy"], loss=result["loss"]))
    return rows


def report(rows: list[dict], study: StudyConfig, out: Path) -> list[Path]:
    return write_outputs(out, title=EXPERIMENT.title, rows=rows, claims=judge_all(CLAIMS, rows), tables=TABLES,
                         figures=FIGURES)


EXPERIMENT = Trained(name="demo_shift", title="Demo: a Transformer on the shift task", base=BASE, presets=PRESETS,
                     evaluate=evaluate, report=report)
