"""What the engine runs: a study (trained or evaluate-only), its members, and how one grid point becomes a model
and a task.

    Experiment      what every study declares: name, title, base config, presets as data, report
    Trained         a study that trains its members and evaluates each: ``evaluate(ctx) -> rows``
    EvaluateOnly    a study that trains nothing: ``jobs(study) -> [Job]``, ``run_job(job, device=) -> rows``
    members()       every grid point x seed of a trained study, each keyed by the hash of its resolved config
    variant_members evaluate-only variants of trained members (another schedule, fix or encoding option)
    Job             one member of an evaluate-only study (a pretrained checkpoint's): a keyed config
    Member          one point and one seed: its task, model config, run key and ensemble group key
    MemberContext   what a trained study's ``evaluate`` gets for one member
    describe()      what ``poslab run X --preset P --print-config`` prints: the resolved grid, nothing run

A study's ``study(preset)`` is its ``base`` with the preset's changes (``presets[preset]``, {dotted path:
value}) applied by :func:`~poslab.experiments.config.resolve_preset`. Optionally every study has ``fixed``
({path: reason} its --set may not change), ``check(study)`` (its own validation) and ``extrapolation``
(what it measured past its training length, read by the survey table); a trained one ``table_length(study)``
(its learned tables' length) and ``not_applicable(study)`` (why a grid point cannot run, e.g. a causal-only
encoding in a bidirectional model; such points train no member, and :func:`inapplicable` lists them for the
report); an evaluate-only one ``prepare`` (its driver work before its jobs). The engine adds each member's
axis values and seed to every row it returns.
"""

from __future__ import annotations

import dataclasses
import json
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cached_property, partial
from pathlib import Path

import torch
from torch import nn

from poslab.errors import ConfigError
from poslab.experiments.config import (
    Preset,
    StudyConfig,
    _coerce,
    apply_overrides,
    apply_point,
    grid_points,
    resolve_preset,
    short_name,
)
from poslab.experiments.spec import Extrapolation
from poslab.experiments.stages import Stages
from poslab.models import model_classes
from poslab.positional import check_encoding
from poslab.store import config_hash
from poslab.tasks import Task, build_task, task_options


@dataclass(frozen=True)
class Member:
    """One point of a study's grid and one seed, with its fully resolved config."""

    experiment: str
    point: tuple  # ((axis path, value), ...) in the grid's axis order
    seed: int
    study: StudyConfig  # the study with this point applied (no grid left)
    variant: str | None = None  # an evaluate-only variant's name; None for a trained member
    # the experiment's learned tables' length (Experiment.table_length; None: the longest length used)
    table_length: Callable[[StudyConfig], int] | None = dataclasses.field(default=None, compare=False, repr=False)

    @property
    def ids(self) -> dict:
        """The columns every row of this member carries: axis values (short names; an object or list value,
        such as ``{"N": 1024, "draw": "length"}``, as its compact JSON text, since a row holds scalars) and seed."""
        ids = {short_name(path): _scalar(value) for path, value in self.point}
        ids["seed"] = self.seed
        if self.variant is not None:
            ids["variant"] = self.variant
        return ids

    @cached_property
    def task(self) -> Task:
        return resolve_task(self.study)

    @cached_property
    def model_config(self):
        return resolve_model_config(self.study, self.task, self.table_length)

    def make_model(self) -> partial:
        """The factory of this member's model (called after seeding, see ``build_member``)."""
        return partial(model_classes(self.study.model_type)[0], self.model_config)

    def config(self) -> dict:
        """Everything that determines this member's result; its hash is the run key."""
        s = self.study
        return dict(experiment=self.experiment, point=[[p, v] for p, v in self.point], seed=self.seed,
                    variant=self.variant, model_type=s.model_type,
                    model=model_fields(self.model_config), task_type=s.task_type,
                    task=dataclasses.asdict(self.task),  # type: ignore[call-overload]  # every Task is a dataclass
                    train=train_fields(s.train),
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
LATER_MODEL_DEFAULTS = {"random_positions": None, "random_positions_eval": True, "layout": None, "qk_norm": False,
                        "init": "torch", "random_positions_draw": "width"}


def model_fields(model) -> dict:
    """A model config as a run's config records it (its own ``record()`` where it has one: the
    Transformer's extensions under their earlier flat names; see LATER_MODEL_DEFAULTS)."""
    fields = model.record() if hasattr(model, "record") else dataclasses.asdict(model)
    for name, default in LATER_MODEL_DEFAULTS.items():
        if name in fields and fields[name] == default:
            del fields[name]
    return fields


def train_fields(train) -> dict:
    """A TrainConfig as a run's config records it: ``compile`` and ``crop_padding`` only when on
    (either rounds floats differently), so every key from before the field existed still names its run."""
    fields = dataclasses.asdict(train)
    for name in ("compile", "crop_padding"):
        if not fields[name]:
            del fields[name]
    return fields


def _scalar(value):
    """A grid value as a row column holds it: scalars as they are, objects and lists as compact JSON text."""
    return json.dumps(value, sort_keys=True, separators=(",", ":")) if isinstance(value, (dict, list, tuple)) \
        else value


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


@dataclass(frozen=True)
class Job:
    """One member of an evaluate-only study (nothing trained: a pretrained checkpoint under one
    schedule, say), listed by ``Experiment.jobs`` and turned into rows by ``Experiment.run_job`` in
    whichever process the executor runs it."""

    config: dict  # everything that decides its rows: its hash is the run key, and the store keeps it
    args: Mapping = dataclasses.field(default_factory=dict)  # what it reads beside, not keyed (where a file lies)
    label: str = ""  # its name in the progress bar
    memory: float | None = None  # its peak in bytes, where known: fewer local workers where as many would not fit

    @cached_property
    def key(self) -> str:
        return config_hash(self.config)


@dataclass(frozen=True, kw_only=True)
class Experiment:
    """What every study declares, as the runner, the command line and the report see it: a
    :class:`Trained` study or an :class:`EvaluateOnly` one, never this class itself.

    A study module builds one at its end (``EXPERIMENT = Trained(...)``) and :mod:`poslab.studies`
    registers it; nothing looks for optional module attributes."""

    name: str  # the command-line name, which the registry and the store know it by
    title: str  # the published artefact, e.g. "Table 1 / Fig. 1"
    base: StudyConfig  # the study's grid and settings before a preset
    presets: Mapping[str, Preset]  # preset name -> {dotted path: value}: what it changes over ``base``
    report: Callable[[list[dict], StudyConfig, Path], list[Path]]  # rows -> rows.csv, table.md, claims, figures
    fixed: Mapping[str, str] = dataclasses.field(default_factory=dict)  # {path: why --set may not change it}
    check: Callable[[StudyConfig], None] | None = None  # the study's own validation (before any work)
    in_run_all: bool = False  # part of ``poslab run all`` (the seed paper's studies)
    headline: str | None = None  # the figure the report shows beside the claims (default: the first)
    extrapolation: Extrapolation | None = None  # what it measured past its training length, for the survey table

    def __post_init__(self) -> None:
        if type(self) is Experiment:
            raise TypeError(f"Experiment {self.name!r}: declare a Trained or an EvaluateOnly study")

    def study(self, preset: str) -> StudyConfig:
        """The study of ``preset`` (:func:`~poslab.experiments.config.resolve_preset`)."""
        return resolve_preset(self.base, self.presets, preset)


@dataclass(frozen=True, kw_only=True)
class Trained(Experiment):
    """A study that trains its members: grid points x seeds (:func:`members`), each evaluated by
    ``evaluate(ctx) -> rows`` after training (and its variants on the stored weights)."""

    evaluate: Callable[[MemberContext], list[dict]]  # one trained (or variant) member -> rows
    table_length: Callable[[StudyConfig], int] | None = None  # learned tables' length (default: longest length)
    checks_eval_lengths: bool = False  # check() validates eval lengths itself (the runner does not)
    # evaluate reads how training went beyond the stored timings (the loss curve): its rows cannot be
    # recomputed from stored weights, so ``--reevaluate`` refuses the study
    training_rows: bool = False
    # a grid point's resolved config -> why the point cannot run (a causal-only encoding on a bidirectional
    # task), or None where it runs: such points train no member; ``inapplicable`` lists them with the reason
    not_applicable: Callable[[StudyConfig], str | None] | None = None


@dataclass(frozen=True, kw_only=True)
class EvaluateOnly(Experiment):
    """A study that trains nothing (a pretrained checkpoint's): ``jobs(study)`` lists its members, each
    keyed, stored, resumed and run on the executor like a trained member, as ``run_job(job, device=,
    **prepared) -> rows``; ``prepare(study, todo, stages=, device=, progress=) -> prepared`` (optional) is
    the driver's work before the jobs that are to run (a search, stored as a stage). Validation runs only
    its ``check(study)``."""

    jobs: Callable[[StudyConfig], list[Job]]
    run_job: Callable[..., list[dict]]
    prepare: Callable[..., dict] | None = None


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


def resolve_model_config(study: StudyConfig, task: Task, table_length: Callable[[StudyConfig], int] | None = None):
    """The model's config: the study's options plus what the study owns (vocabulary from the
    task, the encoding and its options, tables long enough for every length the study uses, or,
    given ``table_length(study)`` (an experiment's), that long: the LM's learned table is its
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
    table = table_length or longest_length
    needed = table(study) + int(bool(options.get("bos", False)))
    options["max_len"] = max(options.get("max_len", default_len), needed)
    check_encoding(study.encoding, study.encoding_options.get(study.encoding))
    return cfg_cls(**options, vocab_size=task.vocab_size, encoding=study.encoding,
                   encoding_options=dict(study.encoding_options.get(study.encoding, {})))


def members(experiment: Experiment | str, study: StudyConfig) -> list[Member]:
    """Every trained member of the study: grid points (axis order) x seeds, each resolved config
    once (the first grid point that gives it names it in the rows). ``experiment``: the trained study
    (its name and table length), or a bare name for a study no experiment owns (default tables)."""
    if isinstance(experiment, EvaluateOnly):
        raise TypeError(f"{experiment.name} trains nothing: its members are its jobs")
    name = experiment if isinstance(experiment, str) else experiment.name
    table = experiment.table_length if isinstance(experiment, Trained) else None
    skip = experiment.not_applicable if isinstance(experiment, Trained) else None
    out, seen = [], set()
    for point in grid_points(study):
        resolved = apply_point(study, point)
        if skip is not None and skip(resolved) is not None:
            continue
        for s in range(study.seeds):
            member = Member(name, tuple(point.items()), s, resolved, table_length=table)
            if member.key not in seen:
                seen.add(member.key)
                out.append(member)
    return out


def inapplicable(experiment: Experiment, study: StudyConfig) -> list[tuple[dict, str]]:
    """The grid points a trained study's ``not_applicable`` refuses, as ({axis short name: value}, reason), in
    grid order: what the report records as n.a. cells instead of dropping them silently."""
    if not isinstance(experiment, Trained) or experiment.not_applicable is None:
        return []
    out = []
    for point in grid_points(study):
        reason = experiment.not_applicable(apply_point(study, point))
        if reason is not None:
            out.append(({short_name(path): value for path, value in point.items()}, reason))
    return out


def variant_members(study: StudyConfig, trained: list[Member]) -> list[tuple[Member, Member]]:
    """(variant member, its trained member) for every variant of every trained member it applies to.

    A variant is {dotted path: value} applied to the trained member's config before evaluation;
    an optional ``"where": {axis: value}`` limits it to members with those axis values
    (``{"where": {"encoding": "rope"}, "encoding": "rope_yarn"}``).
    """
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
                out.append((dataclasses.replace(base, study=changed, variant=name), base))
    return out


# ----------------------------------------------------------------------------- what a study runs

def describe(experiment: Experiment, study: StudyConfig) -> str:
    """What ``poslab run X --preset P --print-config`` prints, running nothing: the resolved study as JSON,
    then a trained study's members (axis values and seed, run key, steps, batch, training and evaluation
    lengths), its variants and the grid points it cannot run; an evaluate-only study's grid points."""
    lines = [f"{experiment.name}: {experiment.title}",
             json.dumps(dataclasses.asdict(study), indent=1, default=str)]  # type: ignore[call-overload]
    if not isinstance(experiment, Trained):
        points = grid_points(study)
        lines.append(f"{len(points)} grid points (evaluate-only: nothing trained)")
        lines += ["  " + " ".join(f"{short_name(p)}={v}" for p, v in point.items()) for point in points]
        return "\n".join(lines)
    trained = members(experiment, study)
    lines.append(f"{len(trained)} trained members")
    lines += [f"  {_ids(m)}  key {m.key[:12]}  {_schedule(m.study)}" for m in trained]
    variants = variant_members(study, trained)
    lines.append(f"{len(variants)} evaluate-only variants")
    lines += [f"  {_ids(v)}  key {v.key[:12]}  eval lengths {list(v.study.eval.lengths)}" for v, _ in variants]
    skipped = inapplicable(experiment, study)
    lines += [f"not run: {' '.join(f'{k}={v}' for k, v in point.items())}: {why}" for point, why in skipped]
    return "\n".join(lines)


def _ids(member: Member) -> str:
    return " ".join(f"{k}={v}" for k, v in member.ids.items())


def _schedule(study: StudyConfig) -> str:
    t = study.train
    return (f"steps {t.steps}  batch {t.batch_size}  train lengths [{t.min_length}, {t.max_length}]  "
            f"eval lengths {list(study.eval.lengths)} x {study.eval.n_sequences}")
