"""Typed experiment configs, the ``paper`` and ``quick`` presets, and ``--set key=value``.

A study is a grid of (encoding, K, seed) members that share one model, training and evaluation
config. ``--set`` addresses any field by its dotted path (``train.steps=100``,
``model.d_model=32``, ``eval.lengths=[12,16]``, ``K=[2,3]``); values are JSON, with bare words
taken as strings. An unknown path or a value of the wrong type stops before any work.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from dataclasses import dataclass, field

from poslab.errors import ConfigError
from poslab.models.retrieval_head import RetrievalHeadConfig
from poslab.train import TrainConfig


@dataclass(frozen=True, kw_only=True)
class EvalConfig:
    lengths: tuple[int, ...] = (12, 16, 20, 24, 32, 40, 48)  # evaluation lengths L'
    n_sequences: int = 4096  # sequences per length, for accuracy and for the attention probes
    seed: int = 0  # evaluation seed: each length's set is fixed by (task, length, seed)


@dataclass(frozen=True, kw_only=True)
class StudyConfig:
    encodings: tuple[str, ...] = ("rope", "learned")  # keys of poslab.positional.ENCODINGS
    K: tuple[int, ...] = (1, 2, 3)  # offsets of the fixed-offset task
    seeds: int = 8  # seeds 0 .. seeds-1
    m: int = 20  # vocabulary size
    encoding_options: dict = field(default_factory=dict)  # encoding name -> its options
    model: RetrievalHeadConfig = field(default_factory=RetrievalHeadConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)


PRESETS = ("paper", "quick")


def quick(cfg: StudyConfig) -> StudyConfig:
    """A few steps and a small evaluation: every code path in seconds, for tests and smoke runs."""
    return dataclasses.replace(
        cfg, seeds=min(cfg.seeds, 2),
        train=dataclasses.replace(cfg.train, steps=60, batch_size=64),
        eval=dataclasses.replace(cfg.eval, n_sequences=128),
    )


def apply_overrides(cfg, overrides: list[str] | tuple[str, ...]):
    """Return ``cfg`` with each ``path=value`` applied (frozen dataclasses, nested by dots)."""
    for item in overrides:
        if "=" not in item:
            raise ConfigError("--set", item, "key=value with a dotted key, e.g. train.steps=100")
        path, raw = item.split("=", 1)
        cfg = _set(cfg, path.strip().split("."), _parse(raw.strip()), path.strip())
    return cfg


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


def _set_dict(current, keys: list[str], value, path):
    if not keys:
        return value
    current = dict(current or {})
    current[keys[0]] = _set_dict(current.get(keys[0]), keys[1:], value, path)
    return current


def _coerce(value, hint, path: str):
    """Check ``value`` against the field's type hint; lists become tuples, ints may be floats."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        errors = []
        for option in typing.get_args(hint):
            try:
                return _coerce(value, option, path)
            except ConfigError as e:
                errors.append(e.allowed)
        raise ConfigError(f"--set {path}", value, " or ".join(errors))
    if hint is type(None):
        if value is None:
            return None
        raise ConfigError(f"--set {path}", value, "null")
    if origin is tuple:
        item = typing.get_args(hint)[0]
        if isinstance(value, (int, float, str)) and not isinstance(value, bool):
            value = [value]
        if not isinstance(value, list):
            raise ConfigError(f"--set {path}", value, f"a JSON list of {item.__name__}")
        return tuple(_coerce(v, item, path) for v in value)
    if origin is dict or hint is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"--set {path}", value, "a JSON object")
        return value
    if hint is float and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if hint is int and isinstance(value, int) and not isinstance(value, bool):
        return value
    if hint is bool and isinstance(value, bool):
        return value
    if hint is str and isinstance(value, str):
        return value
    raise ConfigError(f"--set {path}", value, f"a value of type {getattr(hint, '__name__', hint)}")
