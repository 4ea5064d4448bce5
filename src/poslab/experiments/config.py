"""A study is a grid: typed configs, the ``paper`` and ``quick`` presets, and ``--set key=value``.

A :class:`StudyConfig` names its model and task by registry key plus options, and declares
``grid``: named axes over any config field by its dotted path (``encoding``, ``task.K``,
``model.n_heads``, ``train.weight_decay``, ``model.d_model``) with the values each takes.
A member is one point of the grid (one value per axis) and one seed of ``range(seeds)``; its
fully resolved config is the study with those values applied (:func:`apply_point`).
One-at-a-time sweeps are not a product: the axis ``setting`` takes names of bundles declared in
``settings`` ({name: {dotted path: value}}), each applied whole (``grid={"setting": ("base",
"d=32")}``, ``settings={"base": {}, "d=32": {"model.d_model": 32}}``). A bundle's ``"only"``
({axis path: [values]}) keeps, among its grid points, those whose other axes take one of the values
listed: a plan that is not a product (lengthgen's cpu preset runs every encoding on one source's tasks
and RoPE alone on the other's). A point it leaves out is not in the study: no member, no row, not n.a.

``--set`` addresses any field by the same dotted path (``train.steps=100``,
``model.d_model=32``, ``eval.lengths=[12,16]``) and changes an axis's values with
``grid.<path>=[...]`` (``grid.task.K=[2,3]``). Values are JSON, bare words are strings. An
unknown path, a value of the wrong type, a path that is a grid axis, and a path the study or the
experiment fixes itself (``model.encoding`` is set from ``encoding``, ``model.vocab_size`` from
the task) stop before any work: a value is never silently overwritten.

A model extension (a field whose class has a ``setting`` classmethod: the Transformer's
``energy_gate`` and ``random_positions``) takes its shorthand or its own options by dotted path:
``model.energy_gate=true``, ``model.energy_gate.temperature=0.2`` (setting an option turns it on),
``model.random_positions=2048``, ``model.random_positions={"N": 2048, "at_eval": false}``. Where an
extension is an on/off grid axis (mope's ``model.energy_gate``), its options may still be set: they
apply to the points where it is on. The fields it replaced (``model.gate_temperature``, ...) stop with
a message naming the new path.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from poslab.errors import ConfigError, check_choice
from poslab.models.transformer import RENAMED
from poslab.train import TrainConfig


@dataclass(frozen=True, kw_only=True)
class EvalConfig:
    lengths: tuple[int, ...] = (12, 16, 20, 24, 32, 40, 48)  # evaluation lengths L'
    n_sequences: int = 4096  # sequences per length, for accuracy and for the attention probes
    seed: int = 0  # evaluation seed: each length's set is fixed by (task, length, seed)
    chunk: int = 1024  # sequences per forward: evaluation memory is bounded by it


@dataclass(frozen=True, kw_only=True)
class StudyConfig:
    model_type: str  # key of poslab.models.MODELS
    model: dict = field(default_factory=dict)  # that model's config fields (see STUDY_OWNED)
    task_type: str  # key of poslab.tasks.TASKS
    task: dict = field(default_factory=dict)  # that task's options
    encoding: str = "rope"  # key of poslab.positional.ENCODINGS (usually a grid axis)
    encoding_options: dict = field(default_factory=dict)  # encoding name -> its options
    grid: dict = field(default_factory=dict)  # axis (dotted path) -> tuple of values
    seeds: int = 8  # seeds 0 .. seeds-1
    variants: dict = field(default_factory=dict)  # name -> {path: value}: evaluate-only variants
    # name -> {path: value}: named config bundles a grid axis ``setting`` picks from (one-at-a-time sweeps)
    settings: dict = field(default_factory=dict)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)

    def axis(self, path: str) -> tuple:
        """The values of grid axis ``path``, or the field's single value when it is no axis."""
        return tuple(self.grid[path]) if path in self.grid else (get_path(self, path),)


# Model fields the study sets itself, with where their value comes from.
STUDY_OWNED = {
    "model.vocab_size": "the task's vocabulary",
    "model.encoding": "the field `encoding` (or its grid axis)",
    "model.encoding_options": "the field `encoding_options`",
}

PRESETS = ("paper", "quick")

# A study's presets are data: {preset name: {dotted path: value}}, the settings that change over its base
# (a StudyConfig), applied in order by :func:`resolve_preset`; a preset that follows a registry (every
# registered encoding, say) is a function returning that mapping, called when the preset is resolved. QUICK is
# the usual quick preset's changes: a few steps and a small evaluation, every code path in seconds.
Changes = Mapping[str, object]
Preset = Changes | Callable[[], Changes]
QUICK: Changes = {"seeds": 2, "train.steps": 60, "train.batch_size": 64, "eval.n_sequences": 128}


def resolve_preset(base: StudyConfig, presets: Mapping[str, Preset], preset: str) -> StudyConfig:
    """The study of ``preset``: ``base`` with that preset's changes applied in their order. A path names a
    StudyConfig field (``seeds``, ``train``) or goes into one: a key of a dict field (``model.d_model``,
    ``grid.model.window``: the rest of the path is the key) or a field of ``train`` / ``eval`` (``train.steps``).
    An unknown preset is refused naming the allowed ones."""
    check_choice("preset", preset, presets)
    changes = presets[preset]
    cfg = base
    for path, value in (changes() if callable(changes) else changes).items():
        cfg = _replace(cfg, path.split("."), value)
    return cfg


def as_preset(cfg: StudyConfig) -> Changes:
    """A preset that sets every field of the study to ``cfg``'s (a preset whose whole config a recipe builds)."""
    return {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)}


def _replace(obj, keys: list[str], value):
    """``obj`` (a dataclass, or a dict field, whose keys may hold dots: ``grid.model.window`` is the grid's
    axis ``model.window``) with ``keys`` set to ``value``, as a copy."""
    head, rest = keys[0], keys[1:]
    if isinstance(obj, dict):
        return {**obj, ".".join(keys): value}
    return dataclasses.replace(obj, **{head: _replace(getattr(obj, head), rest, value) if rest else value})


def quick(cfg: StudyConfig, steps: int = 60, batch_size: int = 64, n_sequences: int = 128) -> StudyConfig:
    """A few steps and a small evaluation: every code path in seconds, for tests and smoke runs."""
    return dataclasses.replace(
        cfg, seeds=min(cfg.seeds, 2),
        train=dataclasses.replace(cfg.train, steps=steps, batch_size=batch_size,
                                  warmup_steps=min(cfg.train.warmup_steps, steps // 2)),
        eval=dataclasses.replace(cfg.eval, n_sequences=n_sequences),
    )


def short_name(path: str) -> str:
    """The column a grid axis gets in result rows: its last path component (``task.K`` -> ``K``)."""
    return path.rsplit(".", 1)[-1]


def grid_points(study: StudyConfig) -> list[dict]:
    """Every point of the grid, {axis path: value}, in the order the axes are declared, less those a setting's
    ``only`` leaves out."""
    axes = list(study.grid)
    values = itertools.product(*(tuple(study.grid[a]) for a in axes))
    points = [dict(zip(axes, point, strict=True)) for point in values]
    if SETTING not in study.grid:
        return points
    plans = {name: _plan(study, name) for name in study.grid[SETTING]}
    kept = [p for p in points if all(p[axis] in allowed for axis, allowed in plans[p[SETTING]].items())]
    for name in set(plans) - {p[SETTING] for p in kept}:  # a setting whose plan keeps nothing
        raise ConfigError(f"settings.{name}.{ONLY}", plans[name],
                          f"values the grid gives those axes: { {a: list(study.grid[a]) for a in plans[name]} }")
    return kept


ONLY = "only"  # a setting bundle's {axis path: [values]}: the values its points keep on the other axes


def _plan(study: StudyConfig, name) -> dict:
    """The setting ``name``'s ``only`` ({axis: values}; {} keeps every point), checked against the grid's axes."""
    only = setting_bundle(study, name).get(ONLY)
    if only is None:
        return {}
    allowed = [a for a in study.grid if a != SETTING]
    if not isinstance(only, dict) or any(a not in allowed or not isinstance(v, list | tuple) for a, v in only.items()):
        raise ConfigError(f"settings.{name}.{ONLY}", only, f"a JSON object of {{grid axis: [values]}}, the axes: "
                                                           f"{allowed}")
    return only


def apply_point(study: StudyConfig, point: dict) -> StudyConfig:
    """The study with each axis set to its value and no grid left: one member's config."""
    cfg = dataclasses.replace(study, grid={}, variants={}, settings={})
    for path, value in point.items():
        if path == SETTING:  # a named bundle of {path: value}, applied in its order
            for sub, v in setting_bundle(study, value).items():
                if sub != ONLY:
                    cfg = _set(cfg, sub.split("."), v, f"settings.{value}.{sub}")
            continue
        cfg = _set(cfg, path.split("."), value, path)
    return cfg


SETTING = "setting"  # the grid axis whose values name bundles in ``StudyConfig.settings``


def setting_bundle(study: StudyConfig, name) -> dict:
    """The {dotted path: value} bundle the ``setting`` axis value ``name`` stands for."""
    if name not in study.settings:
        raise ConfigError("grid.setting", name, sorted(study.settings) or "a name in `settings` (none declared)")
    bundle = study.settings[name]
    if not isinstance(bundle, dict) or SETTING in bundle or any(p.startswith("grid.") for p in bundle):
        raise ConfigError(f"settings.{name}", bundle, "a JSON object of {dotted config path: value}")
    return bundle


def get_path(obj, path: str):
    """The value at a dotted path (dataclass fields, then dict keys); ConfigError if there is none."""
    current = obj
    for key in path.split("."):
        if dataclasses.is_dataclass(current) and key in {f.name for f in dataclasses.fields(current)}:
            current = getattr(current, key)
        elif isinstance(current, dict):
            current = current.get(key)
        else:
            raise ConfigError("path", path, "a dotted path of the study config")
    return current


# ----------------------------------------------------------------------------- --set

def apply_overrides(cfg, overrides: Sequence[str], fixed: Mapping[str, str] | None = None):
    """Return ``cfg`` with each ``path=value`` applied (frozen dataclasses, nested by dots).

    ``fixed`` maps paths the experiment sets itself to the reason; they, the study-owned model
    fields and the current grid axes are refused (``grid.<axis>=[...]`` changes an axis).
    """
    for item in overrides:
        if "=" not in item:
            raise ConfigError("--set", item, "key=value with a dotted key, e.g. train.steps=100")
        path, raw = (part.strip() for part in item.split("=", 1))
        if not path:
            raise ConfigError("--set", item, "key=value with a dotted key, e.g. train.steps=100")
        value = _parse(raw)
        _refuse_renamed(path)
        if isinstance(cfg, StudyConfig):
            _refuse_owned(cfg, path, fixed or {})
            if path.startswith("grid."):
                cfg = _set_axis(cfg, path[len("grid."):], value)
                continue
        cfg = _set(cfg, path.split("."), value, path)
    return cfg


def _refuse_renamed(path: str) -> None:
    """A model field that became an extension's option stops with its new path."""
    model_path = path.removeprefix("grid.")
    name = model_path.removeprefix("model.")
    if model_path.startswith("model.") and name in RENAMED:
        raise ConfigError(f"--set {path}", name, f"model.{RENAMED[name]} (the field moved into the "
                                                 f"{RENAMED[name].split('.')[0]} extension)")


def _refuse_owned(cfg: StudyConfig, path: str, fixed: Mapping[str, str]) -> None:
    owned = {**STUDY_OWNED, **fixed}
    for prefix in _prefixes(path):
        if prefix in cfg.grid and not _switch_option(cfg, prefix, path):
            raise ConfigError(f"--set {path}", prefix, f"not a grid axis: `{prefix}` is one of this study's axes "
                                                       f"(values {list(cfg.grid[prefix])}); change them with "
                                                       f"--set grid.{prefix}=[...]")
        if prefix in owned and not (prefix in cfg.grid and _switch_option(cfg, prefix, path)):
            raise ConfigError(f"--set {path}", prefix, f"a field the study does not fix: `{prefix}` is set by "
                                                       f"{owned[prefix]}")


def _switch_option(cfg: StudyConfig, axis: str, path: str) -> bool:
    """Whether ``path`` sets an option under an on/off grid axis (every value a bool, e.g. mope's
    ``model.energy_gate``): allowed, the option applies where the axis is on (``_set_dict``)."""
    return path != axis and all(isinstance(v, bool) for v in cfg.grid[axis])


def _prefixes(path: str) -> list[str]:
    parts = path.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts) + 1)]


def _set_axis(cfg: StudyConfig, axis: str, value) -> StudyConfig:
    if not axis:
        raise ConfigError("--set grid", value, "grid.<dotted path>=[values], e.g. grid.task.K=[2,3]")
    if not isinstance(value, list) or not value:
        raise ConfigError(f"--set grid.{axis}", value, "a non-empty JSON list of values")
    for v in value:  # each value must be one the field accepts
        if axis == SETTING:
            apply_point(cfg, {SETTING: v})
            continue
        _set(dataclasses.replace(cfg, grid={}), axis.split("."), v, axis)
    return dataclasses.replace(cfg, grid={**cfg.grid, axis: tuple(value)})


def _parse(raw: str):
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        return raw


def _set(obj, keys: list[str], value, path: str):
    names = {f.name: f for f in dataclasses.fields(obj)}
    head = keys[0]
    if head not in names:
        prefix = path[: len(path) - len(".".join(keys))]
        raise ConfigError("--set", path, sorted(prefix + n for n in names))
    current = getattr(obj, head)
    if head == "settings" and isinstance(obj, StudyConfig) and len(keys) > 2:
        return dataclasses.replace(obj, settings=_set_bundle(current, keys[1], ".".join(keys[2:]), value, path))
    if len(keys) > 1:
        if isinstance(current, dict):
            new = {**current, keys[1]: _set_dict(current.get(keys[1]), keys[2:], value, path)}
        elif dataclasses.is_dataclass(current):
            new = _set(current, keys[1:], value, path)
        else:
            raise ConfigError("--set", path, f"{path[: len(path) - len('.'.join(keys[1:])) - 1]} has no sub-fields")
    else:
        new = _coerce(value, typing.get_type_hints(type(obj))[head], path)
    return dataclasses.replace(obj, **{head: new})


def _set_bundle(settings: dict, name: str, sub: str, value, path: str) -> dict:
    """``settings.NAME.a.b=v``: the bundle NAME's dotted key ``a.b`` set to v (a bundle maps dotted config
    paths to values; the path is checked when the bundle is applied to a member)."""
    if name not in settings:
        raise ConfigError("--set", path, sorted(f"settings.{n}" for n in settings) or "no settings declared")
    return {**settings, name: {**settings[name], sub: value}}


def _set_dict(current, keys: list[str], value, path):
    if not keys:  # True on an object of options keeps them: an extension switched on (``_switch_option``)
        return current if value is True and isinstance(current, dict) else value
    if isinstance(current, bool) or current is None:  # an option of an extension set to a shorthand
        current = {}
    elif not isinstance(current, dict):
        raise ConfigError("--set", path, f"a path under an object: its parent is {current!r}; set the parent "
                                         "whole as a JSON object")
    current = dict(current)
    current[keys[0]] = _set_dict(current.get(keys[0]), keys[1:], value, path)
    return current


def _coerce(value, hint, path: str):
    """Check ``value`` against the field's type hint; lists become tuples, ints may be floats.

    NaN and infinities are refused everywhere: no config field means anything by them.
    """
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"--set {path}", value, "a finite number")
    origin = typing.get_origin(hint)
    extension = next((o for o in typing.get_args(hint) or (hint,) if hasattr(o, "setting")), None)
    if extension is not None:  # a model extension: its own shorthands and options (``setting``)
        return extension.setting(value, f"--set {path}")
    if origin in (typing.Union, types.UnionType):
        return _coerce_union(value, hint, path)
    if hint is type(None):
        if value is None:
            return None
        raise ConfigError(f"--set {path}", value, "null")
    if origin is tuple:
        return _coerce_tuple(value, typing.get_args(hint)[0], path)
    if origin is dict or hint is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"--set {path}", value, "a JSON object")
        return value
    if hint in _SCALARS and _SCALARS[hint](value):
        return float(value) if hint is float else value
    raise ConfigError(f"--set {path}", value, f"a value of type {getattr(hint, '__name__', hint)}")


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


# a scalar hint -> whether a JSON value is one (a float field takes an int; a bool is no number)
_SCALARS = {float: _number, int: lambda v: isinstance(v, int) and not isinstance(v, bool),
            bool: lambda v: isinstance(v, bool), str: lambda v: isinstance(v, str)}


def _coerce_union(value, hint, path: str):
    """The first of the union's options ``value`` fits, or one error naming them all."""
    errors = []
    for option in typing.get_args(hint):
        try:
            return _coerce(value, option, path)
        except ConfigError as e:
            errors.append(e.allowed)
    raise ConfigError(f"--set {path}", value, " or ".join(errors))


def _coerce_tuple(value, item, path: str) -> tuple:
    """A JSON list (or one scalar, a list of one) as a tuple of ``item``."""
    if _number(value) or isinstance(value, str):
        value = [value]
    if not isinstance(value, list):
        raise ConfigError(f"--set {path}", value, f"a JSON list of {item.__name__}")
    return tuple(_coerce(v, item, path) for v in value)
