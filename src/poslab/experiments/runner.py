"""Run a study: validate, skip what the store has, train the rest in ensembles, record, report.

    validate everything (before any work)
      -> members: one per grid point x seed, keyed by the hash of its fully resolved config
      -> the store: a recorded member (finished or diverged) is never trained again (--force redoes it)
      -> missing members with the same model and training config train as one vectorized ensemble
         (tasks may differ: another K is only other data), groups side by side through an executor
      -> each member is evaluated by the experiment and recorded in one transaction
      -> evaluate-only variants: trained weights from the store under another encoding option,
         schedule or inference-time fix; their rows are stored and resumed like trained ones
      -> the experiment's report reads every member's rows back from the store

Members are recorded one by one as their group finishes, so an interrupted sweep loses at most
the groups in flight and a rerun trains only what is missing.

An experiment is a module with ``name``, ``title``, ``study(preset) -> StudyConfig``,
``evaluate(ctx: MemberContext) -> rows`` and ``report(rows, study, out) -> files``; optionally
``FIXED`` ({path: reason} its --set may not change) and ``check(study)`` (its own validation).
The runner adds each member's axis values and seed to every row it returns.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import sys
import time
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cached_property, partial
from pathlib import Path

import numpy as np
import torch
from torch import nn

from poslab.errors import ConfigError
from poslab.experiments.config import StudyConfig, _coerce, apply_point, grid_points, short_name
from poslab.experiments.executors import (
    MEMORY_FRACTION,
    Executor,
    Inline,
    make_executor,
    memory_bytes,
    workers_that_fit,
)
from poslab.experiments.stages import Stages
from poslab.models import model_classes
from poslab.positional import check_encoding
from poslab.store import Store, config_hash, git_revision
from poslab.tasks import Task, build_task, task_options
from poslab.train import PhaseTimer, TrainResult, build_member, spans, train_ensemble

DEVICES = ("cpu", "cuda")


@dataclass(frozen=True)
class Member:
    """One point of a study's grid and one seed, with its fully resolved config."""

    experiment: str
    point: tuple  # ((axis path, value), ...) in the grid's axis order
    seed: int
    study: StudyConfig  # the study with this point applied (no grid left)
    variant: str | None = None  # an evaluate-only variant's name; None for a trained member

    @property
    def ids(self) -> dict:
        """The columns every row of this member carries: axis values (short names) and seed."""
        ids = {short_name(path): value for path, value in self.point}
        ids["seed"] = self.seed
        if self.variant is not None:
            ids["variant"] = self.variant
        return ids

    @cached_property
    def task(self) -> Task:
        return resolve_task(self.study)

    @cached_property
    def model_config(self):
        return resolve_model_config(self.study, self.task, self.experiment)

    def make_model(self) -> partial:
        """The factory of this member's model (called after seeding, see ``build_member``)."""
        return partial(model_classes(self.study.model_type)[0], self.model_config)

    def config(self) -> dict:
        """Everything that determines this member's result; its hash is the run key."""
        s = self.study
        return dict(experiment=self.experiment, point=[[p, v] for p, v in self.point], seed=self.seed,
                    variant=self.variant, model_type=s.model_type,
                    model=model_fields(self.model_config), task_type=s.task_type,
                    task=dataclasses.asdict(self.task), train=train_fields(s.train),
                    eval=dataclasses.asdict(s.eval))

    @cached_property
    def key(self) -> str:
        """The hash of the resolved config, not of the grid point: two points that resolve to one
        config (an axis that does not touch this member, say APE options on a RoPE member) are
        one run, trained once."""
        return config_hash({k: v for k, v in self.config().items() if k != "point"})

    @property
    def group_label(self) -> str:
        """A group's name in progress bars and benchmarks: its ids but the seed and K."""
        return ",".join(f"{k}={v}" for k, v in self.ids.items() if k not in ("seed", "K"))

    def group_key(self) -> str:
        """Members with one group key share one model forward and one training config: they
        train as one ensemble."""
        s = self.study
        return config_hash(dict(model_type=s.model_type, model=model_fields(self.model_config),
                                train=dataclasses.asdict(s.train)))


# Model fields added after runs were stored: left out of a run's config while at these defaults, so
# every key from before the field existed still names its run (as ``train_fields`` does for compile).
LATER_MODEL_DEFAULTS = {"random_positions": None, "random_positions_eval": True}


def model_fields(model) -> dict:
    """A model config as a run's config records it (see LATER_MODEL_DEFAULTS)."""
    fields = dataclasses.asdict(model)
    for name, default in LATER_MODEL_DEFAULTS.items():
        if name in fields and fields[name] == default:
            del fields[name]
    return fields


def train_fields(train) -> dict:
    """A TrainConfig as a run's config records it: ``compile`` only when on (compiled training
    rounds floats differently), so every key from before the field existed still names its run."""
    fields = dataclasses.asdict(train)
    if not fields["compile"]:
        del fields["compile"]
    return fields


@dataclass
class MemberContext:
    """What an experiment's ``evaluate`` gets for one member."""

    model: nn.Module  # trained, in eval mode
    untrained: nn.Module  # the same member's initial weights (baselines)
    member: Member
    device: str
    snapshots: dict[int, dict[str, torch.Tensor]] = dataclasses.field(default_factory=dict)  # step -> weights
    # how training went: group_train_seconds, group_size, final_loss, loss_curve (this member's, per step)
    timings: dict = dataclasses.field(default_factory=dict)
    # the study's stored stages (searches, fine-tuned copies: experiments.stages), where the store is at
    # hand (evaluate-only variants run in the runner's process); None in a training worker
    stages: Stages | None = None

    @property
    def study(self) -> StudyConfig:
        return self.member.study

    @property
    def task(self) -> Task:
        return self.member.task


@dataclass(frozen=True, kw_only=True)
class Experiment:
    """One published artefact, as the runner, the command line and the report see it.

    A study module builds one at its end (``EXPERIMENT = Experiment(...)``) and
    :mod:`poslab.studies` registers it; nothing looks for optional module attributes."""

    name: str  # the command-line name, e.g. "phenomenon"
    title: str  # the published artefact, e.g. "Table 1 / Fig. 1"
    study: Callable[[str], StudyConfig]  # preset -> the study's grid
    evaluate: Callable[[MemberContext], list[dict]]  # one trained (or variant) member -> rows
    report: Callable[[list[dict], StudyConfig, Path], list[Path]]  # rows -> rows.csv, table.md, claims, figures
    presets: tuple[str, ...] = ("paper", "quick")
    fixed: Mapping[str, str] = dataclasses.field(default_factory=dict)  # {path: why --set may not change it}
    check: Callable[[StudyConfig], None] | None = None  # the study's own validation (before any work)
    table_length: Callable[[StudyConfig], int] | None = None  # learned tables' length (default: longest length)
    checks_eval_lengths: bool = False  # check() validates eval lengths itself (the runner does not)
    in_run_all: bool = False  # part of ``poslab run all`` (the seed paper's studies)
    headline: str | None = None  # the figure the report shows beside the claims (default: the first)
    # an evaluate-only study with no trained members (a pretrained checkpoint): it lists, keys, stores and
    # resumes its own members; (study, store=, out=, device=, force=, progress=) -> run_study's summary.
    # validate() then runs only its check(study); run_study() hands the whole run to it.
    run: Callable[..., dict] | None = None
    # evaluate reads how training went beyond the stored timings (the loss curve): its rows cannot be
    # recomputed from stored weights, so ``--reevaluate`` refuses the study
    training_rows: bool = False


def no_member_rows(ctx: MemberContext) -> list[dict]:
    """``evaluate`` of a study whose own ``run`` lists and evaluates its members (a pretrained checkpoint)."""
    return []


# ----------------------------------------------------------------------------- resolution

def resolve_task(study: StudyConfig) -> Task:
    hints = typing.get_type_hints(_task_class(study.task_type))
    options = {k: _coerce(v, hints[k], f"task.{k}") if k in hints else v for k, v in study.task.items()}
    return build_task(study.task_type, **options)


def _task_class(name: str):
    task_options(name)  # ConfigError for an unknown task
    from poslab.tasks import TASKS

    return TASKS[name]


def longest_length(study: StudyConfig) -> int:
    return max((*study.eval.lengths, study.train.max_length))


def resolve_model_config(study: StudyConfig, task: Task, experiment: str | None = None):
    """The model's config: the study's options plus what the study owns (vocabulary from the
    task, the encoding and its options, tables long enough for every length the study uses, or,
    where the experiment defines ``table_length(study)``, that long: the LM's learned table is its
    training context, and longer eval lengths meet the encoding's own out-of-range policy)."""
    _, cfg_cls = model_classes(study.model_type)
    fields = {f.name: f for f in dataclasses.fields(cfg_cls)}
    hints = typing.get_type_hints(cfg_cls)
    options = {}
    for key, value in study.model.items():
        if key not in fields:
            raise ConfigError(f"model.{key}", key, sorted(fields))
        options[key] = _coerce(value, hints[key], f"model.{key}")
    default_len = fields["max_len"].default
    exp = _experiment(experiment)
    table = exp.table_length if exp is not None and exp.table_length is not None else longest_length
    needed = table(study) + int(bool(options.get("bos", False)))
    options["max_len"] = max(options.get("max_len", default_len), needed)
    check_encoding(study.encoding, study.encoding_options.get(study.encoding))
    return cfg_cls(**options, vocab_size=task.vocab_size, encoding=study.encoding,
                   encoding_options=dict(study.encoding_options.get(study.encoding, {})))


def _experiment(name: str | None) -> Experiment | None:
    from poslab.studies import EXPERIMENTS

    return EXPERIMENTS.get(name)


def members(experiment: str, study: StudyConfig) -> list[Member]:
    """Every trained member of the study: grid points (axis order) x seeds, each resolved config
    once (the first grid point that gives it names it in the rows)."""
    out, seen = [], set()
    for point in grid_points(study):
        resolved = apply_point(study, point)
        for s in range(study.seeds):
            member = Member(experiment, tuple(point.items()), s, resolved)
            if member.key not in seen:
                seen.add(member.key)
                out.append(member)
    return out


def variant_members(experiment: str, study: StudyConfig, trained: list[Member]) -> list[tuple[Member, Member]]:
    """(variant member, its trained member) for every variant of every trained member it applies to.

    A variant is {dotted path: value} applied to the trained member's config before evaluation;
    an optional ``"where": {axis: value}`` limits it to members with those axis values
    (``{"where": {"encoding": "rope"}, "encoding": "rope_yarn"}``).
    """
    from poslab.experiments.config import apply_overrides

    out = []
    for name, changes in study.variants.items():
        if not isinstance(changes, dict) or not changes:
            raise ConfigError(f"variants.{name}", changes, "a JSON object of {dotted path: value}")
        where = changes.get("where", {})
        if not isinstance(where, dict):
            raise ConfigError(f"variants.{name}.where", where, "a JSON object of {axis: value}")
        sets = [f"{path}={json.dumps(value)}" for path, value in changes.items() if path != "where"]
        for base in trained:
            point = dict(base.point)
            if all(point.get(axis, base.ids.get(axis)) == value for axis, value in where.items()):
                changed = apply_overrides(base.study, sets)
                out.append((Member(experiment, base.point, base.seed, changed, variant=name), base))
    return out


# ----------------------------------------------------------------------------- validation

def validate(study: StudyConfig, device: str, experiment: Experiment | None = None) -> list[Member]:
    """Every check on user input, before anything is trained or written; returns the members.

    Builds one small real model per distinct model config (every table the run will use) and
    asks it about every length; variants must keep the trained parameter shapes.
    """
    if device not in DEVICES:
        raise ConfigError("device", device, DEVICES)
    if device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device", device, "cpu (no CUDA device is available here)")
    if experiment is not None and experiment.run is not None:  # no trained members: the study checks itself
        if experiment.check is not None:
            experiment.check(study)
        return []
    if not isinstance(study.seeds, int) or study.seeds < 1:
        raise ConfigError("seeds", study.seeds, "a positive integer")
    study.train.validate()
    if not study.eval.lengths or min(study.eval.lengths) < 1:
        raise ConfigError("eval.lengths", study.eval.lengths, "positive integers")
    for name in ("n_sequences", "chunk"):
        if getattr(study.eval, name) < 1:
            raise ConfigError(f"eval.{name}", getattr(study.eval, name), "a positive integer")
    for path, values in study.grid.items():
        if not values:
            raise ConfigError(f"grid.{path}", values, "a non-empty list of values")
    encodings = set(study.axis("encoding"))
    for name in study.encoding_options:
        if name not in encodings:
            raise ConfigError("encoding_options", name, f"options for one of the study's encodings: "
                                                        f"{', '.join(sorted(encodings))}")
    name = experiment.name if experiment is not None else "study"
    trained = members(name, study)
    shapes: dict[str, dict] = {}
    for member in trained:
        member.task.validate(member.study.train.min_length)
        for L in member.study.eval.lengths:
            if experiment is None or not experiment.checks_eval_lengths:  # else its check() does (lm: whole corpus)
                member.task.validate(L)
        if member.group_key() not in shapes:
            shapes[member.group_key()] = _check_model(member)
    for variant, base in variant_members(name, study, trained):
        variant.task.validate(variant.study.train.min_length)
        got = _check_model(variant)
        if got != shapes[base.group_key()]:
            raise ConfigError(f"variants.{variant.variant}", dict(study.variants[variant.variant]),
                              "changes that keep the trained parameters' names and shapes (evaluate-only)")
    if experiment is not None and experiment.check is not None:
        experiment.check(study)
    return trained


def _check_model(member: Member) -> dict:
    model = member.make_model()()
    for L in (*member.study.eval.lengths, member.study.train.max_length):
        model.check_length(L)
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}


# ----------------------------------------------------------------------------- training

@dataclass
class MemberResult:
    member: Member
    rows: list[dict]
    weights: dict[str, torch.Tensor]
    diverged_at: int | None
    timings: dict


def train_members(group: list[Member], *, device: str = "cpu", progress: bool = True, desc: str = "train",
                  position: int = 0, timer: PhaseTimer | None = None) -> TrainResult:
    """Train one group (one group key) as one ensemble."""
    study = group[0].study
    return train_ensemble(group[0].make_model(), [m.task for m in group], [m.seed for m in group], study.train,
                          device=device, progress=progress, desc=desc, position=position, timer=timer)


def train_group(experiment: Experiment, group: list[Member], device: str = "cpu", progress: bool = True,
                position: int = 0, timer: PhaseTimer | None = None) -> list[MemberResult]:
    """Train one group as an ensemble and evaluate every member.

    A pure function of its (picklable) arguments, so an executor may run it anywhere: in this
    process, in a worker process, or on a Ray worker. It never touches the store. ``timer``
    (inline only: a worker's copy never comes back) also gets each member's ``evaluation``.
    """
    result = train_members(group, device=device, progress=progress, position=position,
                           desc=f"{experiment.name} {group[0].group_label} x{len(group)}", timer=timer)
    span = spans(timer)
    out = []
    for i, member in enumerate(group):
        with span("evaluation"):
            model = result.models[i].eval()
            untrained = build_member(member.make_model(), member.seed).to(device).eval()
            start = time.perf_counter()
            snapshots = {step: states[i] for step, states in result.snapshots.items()}  # train.snapshot_steps
            trained = dict(group_train_seconds=result.seconds, group_size=len(group),
                           train_threads=torch.get_num_threads(), cores=os.cpu_count() or 1,
                           final_loss=[float(x) for x in result.loss_curve[-1:, i]],
                           loss_curve=[float(x) for x in result.loss_curve[:, i]])
            rows = evaluate_member(experiment, MemberContext(model, untrained, member, device, snapshots, trained))
            out.append(MemberResult(member=member, rows=rows, diverged_at=result.diverged_at[i],
                                    weights={k: v.detach().cpu() for k, v in model.state_dict().items()},
                                    timings=dict(train_seconds=result.seconds / len(group), group_size=len(group),
                                                 group_train_seconds=result.seconds,
                                                 eval_seconds=time.perf_counter() - start,
                                                 eval_threads=torch.get_num_threads(),
                                                 diverged_at=result.diverged_at[i],
                                                 final_loss=[float(x) for x in result.loss_curve[-1:, i]])))
    return out


def evaluate_member(experiment: Experiment, ctx: MemberContext) -> list[dict]:
    with torch.no_grad():
        rows = experiment.evaluate(ctx)
    return [{**ctx.member.ids, **row} for row in rows]


def evaluate_variant(experiment: Experiment, variant: Member, weights: dict[str, torch.Tensor],
                     device: str = "cpu", stages: Stages | None = None, timings: dict | None = None) -> MemberResult:
    """Evaluate trained weights under a variant's config (no training); ``timings``: the stored run's,
    when a trained member is re-evaluated (``--reevaluate``)."""
    make = variant.make_model()
    model = build_member(make, variant.seed)
    model.load_state_dict(weights)
    model = model.to(device).eval()
    untrained = build_member(make, variant.seed).to(device).eval()
    start = time.perf_counter()
    rows = evaluate_member(experiment, MemberContext(model, untrained, variant, device, stages=stages,
                                                     timings=dict(timings or {})))
    return MemberResult(member=variant, rows=rows, weights=None, diverged_at=None,
                        timings=dict(eval_seconds=time.perf_counter() - start))


def check_reevaluate(experiment: Experiment, study: StudyConfig, trained: list[Member], store: Store) -> dict:
    """``--reevaluate``'s preconditions, checked before any work: a study whose rows follow from its
    weights, every trained member stored with them. Returns the stored runs by key."""
    use_force = "use --force to train it again"
    if experiment.run is not None:
        raise ConfigError("--reevaluate", experiment.name, "a study that trains its members (this one evaluates "
                                                           "a pretrained checkpoint on every run: use --force)")
    if experiment.training_rows:
        raise ConfigError("--reevaluate", experiment.name, "a study whose rows follow from its weights (this one's "
                                                           f"rows hold the training loss curve, not stored: "
                                                           f"{use_force})")
    if study.train.snapshot_steps:
        raise ConfigError("--reevaluate", experiment.name, "a study without train.snapshot_steps (weights during "
                                                           f"training are not stored: {use_force})")
    stored = {r["key"]: r for r in store.runs(experiment=experiment.name)}
    missing = [m for m in trained if m.key not in stored or stored[m.key]["weights"] is None]
    if missing:
        raise ConfigError("--reevaluate", f"{experiment.name}: {len(missing)} of {len(trained)} members not in the "
                                          f"store with weights", "a study already trained into this store with the "
                                                                 "same preset, --seeds and --set, eval settings "
                                                                 "included (or run it without --reevaluate first)")
    return stored


def reevaluate_members(experiment: Experiment, trained: list[Member], stored: dict, store: Store, *, device: str,
                       progress: bool, revision: str | None) -> None:
    """``--reevaluate``: every trained member's stored weights probed again (the runner's evaluation,
    with the stored timings, on the threads its first evaluation had), its rows replaced."""
    from tqdm import tqdm

    for member in tqdm(trained, desc=f"{experiment.name} re-evaluate", disable=not progress, leave=False):
        timings = stored[member.key]["timings"] or {}
        # the threads its evaluation ran on, so reductions add up in the same order (runs stored before
        # eval_threads was: one, as a CPU worker of `run` evaluates)
        threads = timings.get("eval_threads") or (1 if device == "cpu" else torch.get_num_threads())
        with torch_threads(threads):
            result = evaluate_variant(experiment, member, store.load_weights(member.key), device, timings=timings)
        store.replace_rows(member.key, result.rows, revision=revision)


# ----------------------------------------------------------------------------- the study

def check_output_folder(out: Path) -> None:
    """``out`` must be a folder or a path where one can be made (checked before any work)."""
    out = Path(out)
    allowed = "a folder, or a new path whose nearest existing parent is a writable folder"
    if out.exists():
        if not out.is_dir():
            raise ConfigError("--out", str(out), f"{allowed} (this is an existing file)")
        if not os.access(out, os.W_OK):
            raise ConfigError("--out", str(out), f"{allowed} (this folder is not writable)")
        return
    parent = out.parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK):
        raise ConfigError("--out", str(out), f"{allowed} ({parent} is not a writable folder)")


SPLIT_OVERHEAD = 5  # an ensemble's fixed cost per step, in members: 12 members cost 0.58 of 24 (measured, CPU)
MIN_SPLIT = 8  # balancing halves only parts at least this large, so both halves stay vmapped ensembles


def split_groups(groups: list[list[Member]], slots: int, costs: list[float] | None = None) -> list[list[Member]]:
    """The groups as parts to train, costliest first (the order a pool hands them out).

    Members of one group share the model and training config, so any part of a group is a group
    (each member computes what it computes alone; an ensemble's members are bit for bit those of
    any part of it, tests/test_train.py). On a CPU with more workers than groups, the largest is
    halved until every slot has a part. Then, where the parts do not share out evenly (three groups
    on two workers leave one idle for a third of the run), the costliest part of at least MIN_SPLIT
    members is halved while that shortens the estimated wall time: each part costs its members plus
    SPLIT_OVERHEAD, times its group's cost per member (``costs``, one per group: e.g.
    :func:`step_costs`; equal when None), assigned costliest first to the least loaded slot.
    """
    weights = [1.0] * len(groups) if costs is None else [float(c) for c in costs]
    if len(weights) != len(groups):
        raise ValueError(f"{len(weights)} costs for {len(groups)} groups")

    def cost(part: tuple[float, list]) -> float:
        return (len(part[1]) + SPLIT_OVERHEAD) * part[0]

    def halve_largest(parts: list[tuple[float, list]], smallest: int, by) -> list[tuple[float, list]] | None:
        splittable = [i for i in range(len(parts)) if len(parts[i][1]) >= smallest]
        if not splittable:
            return None
        largest = max(splittable, key=lambda i: by(parts[i]))
        (w, group), half = parts[largest], (len(parts[largest][1]) + 1) // 2
        return parts[:largest] + [(w, group[:half]), (w, group[half:])] + parts[largest + 1:]

    out = [(w, list(g)) for w, g in zip(weights, groups, strict=True) if g]
    while len(out) < slots:
        split = halve_largest(out, 2, by=lambda part: len(part[1]))
        if split is None:
            break
        out = split
    best, candidate = out, out
    for _ in range(2 * slots if slots > 1 else 0):
        candidate = halve_largest(candidate, MIN_SPLIT, by=cost)
        if candidate is None:
            break
        if wall_estimate(candidate, slots, cost) < wall_estimate(best, slots, cost):
            best = candidate
    return [part for _, part in sorted(best, key=cost, reverse=True)]


def wall_estimate(parts: list, slots: int, cost: Callable | None = None) -> float:
    """The largest load when ``parts`` (each costing ``cost(part)``; by default its members plus
    SPLIT_OVERHEAD) go costliest first to the least loaded of ``slots``."""
    cost = cost or (lambda part: len(part) + SPLIT_OVERHEAD)
    loads = [0.0] * max(1, slots)
    for part in sorted(parts, key=cost, reverse=True):
        loads[loads.index(min(loads))] += cost(part)
    return max(loads)


def share_out(groups: list[list[Member]], slots: int) -> list[list[Member]]:
    """:func:`split_groups` weighed by :func:`step_costs` where there are shares to make (more than
    one slot and one group), by member count otherwise: how ``poslab run`` and ``bench train``
    share groups out on a CPU."""
    return split_groups(groups, slots, step_costs(groups) if slots > 1 and len(groups) > 1 else None)


CALIBRATION_STEPS = 8  # timed steps per group in step_costs (after one untimed step); their median counts


def step_costs(groups: list[list[Member]]) -> list[float]:
    """Each group's training seconds per member, estimated for :func:`split_groups`: a few steps of
    an ensemble of (at most) two of its members on one thread, as a worker trains, scaled to the
    group's steps; per member, SPLIT_OVERHEAD of them being the ensemble's fixed cost. Groups differ
    several-fold (a d_model of 256 against 64, Shaw's direct forward against the grid fast path),
    which counting members cannot see. A step counts at the median of the timed ones: the mean of
    three once shared Table 1's three groups (equal in cost) out as 24/24/24, one worker training
    two of them (134 s against 96-119 s as 24/24/12/12, docs/speed.md). Only the schedule reads it:
    what each member computes does not depend on its part."""
    costs = []
    with one_thread():
        for group in groups:
            part = group[:2]
            seconds = step_seconds(part, CALIBRATION_STEPS, chunk=CALIBRATION_STEPS + 1)
            costs.append(float(np.median(seconds)) / (len(part) + SPLIT_OVERHEAD) * group[0].study.train.steps)
    return costs


@contextlib.contextmanager
def torch_threads(n: int) -> typing.Iterator[None]:
    """torch on ``n`` threads inside; the caller's threads after."""
    threads = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def one_thread() -> contextlib.AbstractContextManager[None]:
    """torch on one thread, as a worker trains, inside; the caller's threads after."""
    return torch_threads(1)


def step_seconds(part: list[Member], steps: int, chunk: int | None = None) -> np.ndarray:
    """Seconds of each of ``steps`` training steps of ``part`` (members of one group; repeats allowed)
    as one ensemble, after one untimed step (its first draw and warm-up); callers time on
    :func:`one_thread`. ``chunk``: steps of data per draw (None: the study's own, so draws fall
    where training has them). Timing only: nothing is kept."""
    cfg = part[0].study.train
    short = dataclasses.replace(cfg, steps=steps + 1, warmup_steps=0, snapshot_steps=(), compile=False,
                                chunk=cfg.chunk if chunk is None else chunk)
    result = train_ensemble(part[0].make_model(), [m.task for m in part], [m.seed for m in part], short,
                            progress=False)
    assert result.step_ends is not None
    return np.diff(result.step_ends)


def evaluate_members(experiment: str, members: list[tuple[str, dict]], job: Callable[[dict], list[dict]], *,
                     store: Store, force: bool = False, executor: Executor | str | None = None, workers: int = 1,
                     device: str = "cpu", progress: bool = True, worker_bytes: float | None = None) -> int:
    """Evaluate-only members (a pretrained checkpoint's): every ``(key, config)`` the store lacks is
    one call ``job(config)`` on ``executor`` (``job`` picklable: a module-level function or a
    partial of one, which loads what it reads once per process), and its rows are recorded here,
    the only writer, as each comes back. ``force`` evaluates every member again. ``worker_bytes``
    (a job's peak memory, where its study knows it) runs fewer local workers than ``workers``
    where that many would not fit in memory (:func:`workers_that_fit`; said on stderr). Returns
    how many were evaluated."""
    if force:
        for key, _ in members:
            store.delete(key)
    done = {r["key"] for r in store.runs(experiment=experiment)}
    todo = [(key, config) for key, config in members if key not in done]
    if not todo:
        return 0
    if isinstance(executor, str) or executor is None:
        wanted = min(workers, len(todo))
        fit = workers_that_fit(wanted, worker_bytes)
        if fit < wanted:
            print(f"{experiment}: each job peaks at about {worker_bytes / 2**30:.1f} GiB of the "
                  f"{memory_bytes() * MEMORY_FRACTION / 2**30:.1f} GiB a run may plan for: {fit} worker(s)",
                  file=sys.stderr, flush=True)
        executor = make_executor(executor or "local", workers=fit, device=device)
    revision = git_revision(Path(__file__).parent)
    if progress:
        print(f"{experiment}: {len(todo)} of {len(members)} members to evaluate", flush=True)
    for i, (key, config, rows, seconds) in enumerate(executor.map_unordered(_timed, [(job, *m) for m in todo])):
        store.record(key, experiment=experiment, config=config, rows=rows, status="finished",
                     timings=dict(eval_seconds=seconds), revision=revision)
        if progress:
            what = ", ".join(f"{k} {v}" for k, v in config.items() if k in ("method", "scale", "length", "bos"))
            print(f"{experiment} {i + 1}/{len(todo)}: {what} ({seconds:.0f} s)", flush=True)
    return len(todo)


def _timed(job: Callable[[dict], list[dict]], key: str, config: dict) -> tuple[str, dict, list[dict], float]:
    start = time.perf_counter()
    rows = job(config)
    return key, config, rows, time.perf_counter() - start


def run_study(experiment: Experiment, study: StudyConfig, *, store: Store, out: Path,
              device: str = "cpu", force: bool = False, progress: bool = True, workers: int = 1,
              executor: Executor | str | None = None, timer: PhaseTimer | None = None,
              validated: list[Member] | None = None, reevaluate: bool = False) -> dict:
    """Run (or resume) a study and write its report; returns a summary of what was done.

    ``workers`` > 1 trains that many groups at once in worker processes (each a share of the
    cores; on CPU, groups are split to give every worker one, :func:`split_groups`); ``executor``
    may be given instead. Only this process writes the store, as each
    group comes back. ``timer`` (``poslab bench profile``; the inline executor only) gets the
    run's phases: setup, the training phases of :func:`~poslab.train.train_ensemble`,
    evaluation, variants, store, and "tables and figures". ``validated``: the members
    :func:`validate` already returned for this study and device (the command line validates every
    study before it opens the store), so it is not validated twice. ``reevaluate``: train nothing; probe
    every stored member's weights again and replace its rows (after a probe or criterion changed;
    :func:`check_reevaluate` says which studies allow it), variants too.
    """
    span = spans(timer)
    with span("setup"):
        check_output_folder(out)
        trained = validated if validated is not None else validate(study, device, experiment)
    if not isinstance(workers, int) or workers < 1:
        raise ConfigError("workers", workers, "a positive integer")
    if reevaluate and force:
        raise ConfigError("--reevaluate", True, "without --force (--force trains again; --reevaluate never trains)")
    stored = check_reevaluate(experiment, study, trained, store) if reevaluate else {}
    if experiment.run is not None:
        return experiment.run(study, store=store, out=out, device=device, force=force, progress=progress,
                              workers=workers, executor=executor)
    with span("setup"):
        variants = variant_members(experiment.name, study, trained)
        everyone = trained + [v for v, _ in variants]
    with span("store"):
        if force:
            for m in everyone:
                store.delete(m.key)
        done = {r["key"] for r in store.runs(experiment=experiment.name)} & {m.key for m in everyone}  # diverged too
    if reevaluate:  # nothing trains; the trained members and every variant are evaluated again below
        done = {m.key for m in trained}
    todo = [m for m in trained if m.key not in done]
    groups: dict[str, list[Member]] = {}
    for m in todo:
        groups.setdefault(m.group_key(), []).append(m)
    with span("setup"):
        revision = git_revision(Path(__file__).parent)
    start = time.perf_counter()

    def record(results: list[MemberResult]) -> None:
        with span("store"):
            for r in results:
                store.record(r.member.key, experiment=experiment.name, config=r.member.config(), rows=r.rows,
                             status="finished" if r.diverged_at is None else "diverged", timings=r.timings,
                             weights=r.weights, revision=revision)

    if isinstance(executor, str) or executor is None:
        executor = make_executor(executor or "local", workers=min(workers, max(1, len(todo))), device=device)
    if timer is not None and not isinstance(executor, Inline):
        raise ValueError("a PhaseTimer sees this process only: time a study with the inline executor")
    batches = list(groups.values())
    if device == "cpu":  # a core per job beats every core on one job (poslab bench lm measures it)
        with span("setup"):  # the groups' measured costs decide the shares
            batches = share_out(batches, getattr(executor, "slots", 1))
    jobs = [(experiment, group, device, progress, i, timer) for i, group in enumerate(batches)]
    for results in executor.map_unordered(train_group, jobs):
        record(results)

    if reevaluate:
        with span("evaluation"):
            reevaluate_members(experiment, trained, stored, store, device=device, progress=progress,
                               revision=revision)
    evaluated = 0
    stages = Stages(store, experiment.name, revision, force)
    for variant, base in variants:
        if variant.key in done:
            continue
        with span("store"):
            weights = store.load_weights(base.key)
        with span("variants"):
            result = evaluate_variant(experiment, variant, weights, device, stages)
        record([result])
        evaluated += 1
    with span("store"):
        rows = store.rows(keys=[m.key for m in everyone])
    with span("tables and figures"):
        out.mkdir(parents=True, exist_ok=True)
        files = experiment.report(rows, study, out)
    with span("store"):
        store.record_outputs(experiment.name, out)
    return dict(members=len(trained), trained=len(todo), reused=len(trained) - len(todo),
                reevaluated=len(trained) if reevaluate else 0, variants=len(variants), evaluated=evaluated,
                seconds=time.perf_counter() - start, files=files)
