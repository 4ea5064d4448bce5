"""What the benchmark studies share (lengthgen and lengthgen-probes): the two sources' model and
training scales, each benchmark task's setting bundle, its evaluation lengths and token budget, and
the checks and table length of a grid over benchmark tasks.

A benchmark task is a registered task class with a ``benchmark`` class variable (``RUOSS`` for the
Chomsky tasks in encoder form, ``KAZEMNEJAD`` for the decoder tasks), its ``model_form`` and its
``train_range`` / ``test_range`` in the task's own length unit.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import ClassVar, Protocol, TypeGuard, runtime_checkable

import numpy as np
import torch

from poslab.errors import ConfigError
from poslab.experiments.config import ONLY, StudyConfig
from poslab.experiments.experiment import resolve_task
from poslab.models.random_positions import RandomPositions
from poslab.tasks import TASKS, build_task, eval_batch
from poslab.tasks.chomsky.format import EncoderTask
from poslab.tasks.scoring import sequence_scores

RUOSS, KAZEMNEJAD = "ruoss", "kazemnejad"


@dataclasses.dataclass(frozen=True)
class Scale:
    """One preset's model, training and evaluation, per benchmark (the paper preset: each source's)."""

    model: dict  # {benchmark: {model field: value}}
    train: dict  # {benchmark: {train field: value}}
    eval_lengths: str  # "every": each length train lo .. test hi; "few": a handful (see eval_lengths)
    n_sequences: int
    seeds: int
    tasks: str  # "all" | "cpu" | "gpu" | "quick"
    # "all": every registered; "sources": SOURCE_ENCODINGS; "kazemnejad": their five; "quick": quick_encodings()
    encodings: str | tuple[str, ...] = "all"  # or the names themselves
    randomized: bool = True  # cells with Ruoss et al.'s randomized positions beside the plain ones
    # {task: {dotted path in the task's setting: value}}: a task's own scale over its benchmark's (the cpu
    # preset scales each task down to where its source's encodings learn it in range)
    per_task: dict = dataclasses.field(default_factory=dict)
    # {benchmark: {grid axis: values}}: the cells a benchmark's tasks run (each task's setting's ``only``), where
    # a preset does not run the whole product (the cpu preset: RoPE alone on Ruoss et al.'s tasks)
    only: dict = dataclasses.field(default_factory=dict)
    # the randomized cell's ``model.random_positions`` (None: N from the evaluated lengths, drawn for the width)
    random_positions: dict | None = None


RUOSS_MODEL = dict(n_layers=5, d_model=64, n_heads=8, dropout=0.1)  # experiments/example.py; 4x MLP
RUOSS_TRAIN = dict(steps=10_000, batch_size=128, lr=1e-3, optimizer="adam", length_sampling="batch")
# T5-base's decoder stack without cross-attention: 12 layers, d = 768, 12 heads, MLP 3072 (~85M without
# the embeddings; ~107M with T5's 32k vocabulary). Trainer: 40k steps, lr 3e-5, wd 0.05, batch 64, 6% warm-up
KAZEMNEJAD_MODEL = dict(n_layers=12, d_model=768, n_heads=12, d_mlp=3072, dropout=0.1)
KAZEMNEJAD_TRAIN = dict(steps=40_000, batch_size=64, lr=3e-5, optimizer="adamw", weight_decay=0.05,
                        lr_schedule="cosine", warmup_steps=2400, length_sampling="sequence")
CPU_LONGEST = 2.5  # the cpu and quick presets evaluate up to this multiple of the training length


def benchmark_tasks(benchmark: str | None = None) -> tuple[str, ...]:
    """Every registered task with a ``benchmark`` class variable (of ``benchmark``), registry order."""
    return tuple(n for n, cls in TASKS.items()
                 if is_benchmark(cls) and (benchmark is None or cls.benchmark == benchmark))


class BenchmarkTask(Protocol):
    """The class variables a benchmark task declares (Ruoss et al.'s and Kazemnejad et al.'s tasks)."""

    benchmark: ClassVar[str]
    model_form: ClassVar[str]  # "encoder" | "decoder"
    train_range: ClassVar[tuple[int, int]]


def is_benchmark(cls: type) -> TypeGuard[type[BenchmarkTask]]:
    """A registered task class with a ``benchmark`` class variable."""
    return getattr(cls, "benchmark", None) is not None


@runtime_checkable
class TokenBudget(Protocol):
    """A task that bounds its sequences' tokens at a length (the benchmark tasks)."""

    def max_tokens(self, length: int) -> int: ...


def max_tokens(task: str, length: int) -> int:
    """The most tokens a sequence of ``task`` has at ``length``."""
    built = build_task(task)
    if not isinstance(built, TokenBudget):
        raise TypeError(f"task {task!r} declares no max_tokens")
    return built.max_tokens(length)


def eval_lengths(cls, how: str) -> tuple[int, ...]:
    """Evaluation lengths in the task's own unit that the task can pose (SCAN has no command of 41
    actions): every length from the shortest trained to the longest tested, or a few: half the
    training length, the training length, and four lengths past it up to min(test hi, CPU_LONGEST x
    training length), each moved to the nearest length above it that the task can pose."""
    (lo, hi), (_, test_hi) = cls.train_range, cls.test_range
    if how == "every":
        return _every_length(cls.__name__, cls)
    poses = _poses(cls.__name__, cls)
    top = max(hi + 1, min(test_hi, int(CPU_LONGEST * hi)))
    wanted = [max(lo, hi // 2), hi, *(int(v) for v in np.unique(np.linspace(hi + 1, top, 4).round()))]
    return tuple(sorted({next((L for L in range(w, test_hi + 1) if poses(L)), hi) for w in wanted}))


@functools.cache
def _every_length(_: str, cls) -> tuple[int, ...]:
    """Every length from the shortest trained to the longest tested that the task can pose. A task
    that draws a batch of mixed lengths (an ``EncoderTask``'s ``draw``, Ruoss et al.'s) is asked once,
    every length in one batch after ``validate`` passes each; sampling them one at a time took 3.9 s
    for stack_manipulation's 500 (its stack is run slot by slot, so one call costs its width)."""
    (lo, _hi), (_, test_hi) = cls.train_range, cls.test_range
    task = cls()
    if not isinstance(task, EncoderTask):
        poses = _poses(cls.__name__, cls)
        return tuple(L for L in range(lo, test_hi + 1) if poses(L))
    lengths = []
    for L in range(lo, test_hi + 1):
        try:
            task.validate(L)
        except ConfigError:
            continue
        lengths.append(L)
    if lengths:
        task.draw(torch.Generator().manual_seed(0), torch.tensor(lengths))
    return tuple(lengths)


@functools.cache
def _poses(_: str, cls) -> functools._lru_cache_wrapper:
    task = cls()

    @functools.cache
    def poses(L: int) -> bool:
        try:
            task.sample(torch.Generator().manual_seed(0), 1, L)
        except ConfigError:
            return False
        return True
    return poses


def task_setting(task: str, scale: Scale) -> dict:
    """The bundle of one benchmark task: its model form, lengths, and its source's model and training."""
    cls = TASKS[task]
    if not is_benchmark(cls):
        raise ConfigError("task_type", task, ", ".join(benchmark_tasks()))
    lo, hi = cls.train_range
    return {"task_type": task, "model.causal": cls.model_form == "decoder",
            **{f"model.{k}": v for k, v in scale.model[cls.benchmark].items()},
            **{f"train.{k}": v for k, v in scale.train[cls.benchmark].items()},
            "train.min_length": lo, "train.max_length": hi,
            "eval.lengths": list(eval_lengths(cls, scale.eval_lengths)), **scale.per_task.get(task, {}),
            **({ONLY: scale.only[cls.benchmark]} if cls.benchmark in scale.only else {})}


def length_scores(model, task, L: int, ev, device) -> tuple[float, float, int]:
    """Per-token accuracy and exact match over the output positions of ``ev.n_sequences`` evaluation
    sequences of length ``L`` (``eval_batch``, in chunks of ``ev.chunk``), in the model's own form (key
    padding for the encoder), and the batch's width in tokens."""
    batch = eval_batch(task, L, ev.n_sequences, ev.seed, device=device)
    accuracy, exact = [], []
    for start in range(0, batch.size, ev.chunk):
        part = batch[start:start + ev.chunk]
        logits = model(part.tokens, lengths=None if model.cfg.causal else part.lengths)  # [b, s, m]
        a, e = sequence_scores(logits.argmax(-1), part)
        accuracy.append(a)
        exact.append(e)
    return float(torch.cat(accuracy).nanmean()), float(torch.cat(exact).nanmean()), int(batch.tokens.shape[1])


def table_length(cfg: StudyConfig) -> int:
    """Positions the tables must hold: the most tokens of the longest length used, or N of randomized
    positions (a learned table is read at every sampled position)."""
    task = resolve_task(cfg)
    tokens = task.max_tokens(max((*cfg.eval.lengths, cfg.train.max_length)))  # type: ignore[attr-defined]
    sampled = RandomPositions.setting(cfg.model.get("random_positions"), "model.random_positions")
    return max(tokens, 0 if sampled is None else sampled.N)


def check(cfg: StudyConfig) -> None:
    """Every task of the grid is a benchmark task (one ConfigError naming the allowed ones otherwise), and
    randomized positions have room for every token of its longest sequence (N at least its tokens)."""
    for setting in cfg.axis("setting"):
        task = cfg.settings[setting]["task_type"]
        if getattr(TASKS.get(task), "benchmark", None) is None:
            raise ConfigError("grid.setting", setting, list(benchmark_tasks()) or "a registered benchmark task")
        _check_room(cfg, setting, task)


def _check_room(cfg: StudyConfig, setting: str, task: str) -> None:
    """N of randomized positions covers the most tokens of ``task`` at its longest length (training or
    evaluation): a sequence of more tokens than N cannot draw a distinct position for each."""
    changes = cfg.settings[setting]
    longest = max(*changes.get("eval.lengths", cfg.eval.lengths), changes.get("train.max_length", cfg.train.max_length))
    tokens = max_tokens(task, longest)
    for value in cfg.axis("model.random_positions"):
        sampled = RandomPositions.setting(value, "model.random_positions")
        if sampled is not None and sampled.N < tokens:
            raise ConfigError("model.random_positions", sampled.N,
                              f"an N of at least {tokens}: {task} has {tokens} tokens at length {longest}")
