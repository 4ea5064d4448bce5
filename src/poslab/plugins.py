"""Plugins: encodings, tasks, studies, schedules and probes from other installed packages.

A package installed beside poslab declares entry points in these groups (pyproject.toml)::

    [project.entry-points."poslab.encodings"]
    my_bias = "my_package.bias:MyBias"          # a PositionalEncoding subclass (or a partial of one)
    [project.entry-points."poslab.tasks"]
    my_task = "my_package.task:MyTask"          # a task class (a dataclass with sample())
    [project.entry-points."poslab.studies"]
    my-study = "my_package.study:EXPERIMENT"    # an Experiment named like its entry point
    [project.entry-points."poslab.schedules"]
    my_rope = "my_package.rope:my_schedule"     # a rope_scaling schedule function
    [project.entry-points."poslab.probes"]
    my_probe = "my_package.probe:my_probe"      # a function (poslab has no probe registry: listed here)

Each registry loads its group when it is imported (``poslab.positional`` the encodings and the
schedules, ``poslab.tasks`` the tasks, ``poslab.studies`` the studies), so a worker process that
imports a registry sees exactly what the command line sees. A plugin whose entry point fails to
load, whose name shadows a built-in (or another plugin's), or whose object is not of the group's
kind raises one :class:`~poslab.errors.ConfigError` naming the package and the entry point; the
command line prints it as one line and exits 2 before any work.

:func:`origin` says which package an entry came from ("poslab" for built-ins), for ``poslab list``.
This module imports nothing of poslab but its errors: the registries hand it their checks.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from importlib.metadata import entry_points

from poslab.errors import ConfigError

GROUPS = {"encodings": "poslab.encodings", "tasks": "poslab.tasks", "studies": "poslab.studies",
          "schedules": "poslab.schedules", "probes": "poslab.probes"}
BUILTIN = "poslab"
_ORIGINS: dict[tuple[str, str], str] = {}  # (kind, name) -> the package that registered it


def load(kind: str, builtins: Mapping[str, object], check: Callable[[object], bool], expected: str) -> dict:
    """The entry points of group ``GROUPS[kind]`` as {name: loaded object}.

    ``builtins`` are the registry's own entries (a plugin may not shadow one); ``check(obj)`` says
    whether a loaded object is of the group's kind, ``expected`` describes that kind in the error."""
    group = GROUPS[kind]
    found: dict[str, object] = {}
    for ep in entry_points(group=group):
        package = ep.dist.name if ep.dist is not None else "an unknown package"
        field = f"plugin {package}: entry point {ep.name!r} in {group!r}"
        if ep.name in builtins or ep.name in found:
            owner = BUILTIN if ep.name in builtins else _ORIGINS.get((kind, ep.name), "another plugin")
            raise ConfigError(field, ep.value, f"a name not already registered ({ep.name!r} is {owner}'s)")
        try:
            obj = ep.load()
        except Exception as e:  # any failure to import is the plugin's: one line naming it
            raise ConfigError(field, ep.value, f"an importable object ({_one_line(e)})") from None
        if not check(obj):
            raise ConfigError(field, ep.value, f"{expected} (got {type(obj).__name__} {_one_line(obj)})")
        found[ep.name] = obj
        _ORIGINS[(kind, ep.name)] = package
    return found


def origin(kind: str, name: str) -> str:
    """The package that registered entry ``name`` of ``kind`` ("poslab" for a built-in)."""
    return _ORIGINS.get((kind, name), BUILTIN)


_PROBES: dict[str, Callable] | None = None


def probes() -> dict[str, Callable]:
    """The probes plugins register (functions; poslab's own probes are plain functions of
    :mod:`poslab.probes`, with no registry to join)."""
    global _PROBES
    if _PROBES is None:
        _PROBES = load("probes", {}, callable, "a function")
    return _PROBES


def _one_line(value: object) -> str:
    text = f"{type(value).__name__}: {value}" if isinstance(value, BaseException) else repr(value)
    line = " ".join(text.split())
    return line if len(line) <= 160 else line[:157] + "..."
