"""Plugins through entry points (poslab.plugins): a broken plugin is one ConfigError naming its
package and entry point (import failure, a shadowed built-in, an object of the wrong kind), and the
command line turns it into one line and exit 2 with nothing written; the example plugin package
(examples/poslab-plugin-example) is found, listed with its package, and its study runs end to end.

The example is not pip-installed (the venv is shared, and the test must work offline): a
``*.dist-info`` folder with its entry points, written from the example's pyproject.toml, and the
example's source folder go on PYTHONPATH, which is all importlib.metadata and a subprocess need."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import pytest

from poslab import plugins
from poslab.errors import ConfigError
from poslab.positional import ENCODINGS, PositionalEncoding

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "poslab-plugin-example"


@dataclass(frozen=True)
class FakeDist:
    name: str


@dataclass
class FakeEntryPoint:
    name: str
    value: str
    group: str
    obj: object = None
    error: BaseException | None = None
    dist: FakeDist = FakeDist("fake-plugin")

    def load(self):
        if self.error is not None:
            raise self.error
        return self.obj


def fake(monkeypatch, *eps: FakeEntryPoint) -> None:
    monkeypatch.setattr(plugins, "entry_points", lambda group: [ep for ep in eps if ep.group == group])


def is_encoding(obj):
    cls = obj.func if isinstance(obj, partial) else obj
    return isinstance(cls, type) and issubclass(cls, PositionalEncoding)


class Plain(PositionalEncoding):
    kind, extra_parameters, cost, reference = "none", "none", "none", "a test"


def test_a_plugin_is_loaded_and_its_package_recorded(monkeypatch):
    fake(monkeypatch, FakeEntryPoint("plain", "pkg.mod:Plain", "poslab.encodings", Plain))
    assert plugins.load("encodings", ENCODINGS, is_encoding, "an encoding") == {"plain": Plain}
    assert plugins.origin("encodings", "plain") == "fake-plugin" and plugins.origin("encodings", "rope") == "poslab"


@pytest.mark.parametrize("ep, words", [
    (FakeEntryPoint("broken", "pkg.missing:X", "poslab.encodings", error=ModuleNotFoundError("No module named "
                                                                                           "'pkg'\nsecond line")),
     ["importable", "ModuleNotFoundError", "pkg"]),
    (FakeEntryPoint("rope", "pkg.mod:Plain", "poslab.encodings", Plain), ["already registered", "poslab's"]),
    (FakeEntryPoint("thing", "pkg.mod:thing", "poslab.encodings", obj=42), ["an encoding", "int"]),
])
def test_a_broken_plugin_is_one_line_naming_package_and_entry_point(monkeypatch, ep, words):
    fake(monkeypatch, ep)
    with pytest.raises(ConfigError) as err:
        plugins.load("encodings", ENCODINGS, is_encoding, "an encoding")
    text = str(err.value)
    assert "\n" not in text and "fake-plugin" in text and repr(ep.name) in text and ep.value in text
    for word in words:
        assert word in text, text


@pytest.mark.parametrize("kind, obj, builtin", [("tasks", object(), "fixed_offset"), ("studies", "x", "k1")])
def test_tasks_and_studies_check_their_kind_and_names(monkeypatch, kind, obj, builtin):
    from poslab.studies import EXPERIMENTS
    from poslab.tasks import TASKS, _is_task

    registry, check = (TASKS, _is_task) if kind == "tasks" else (EXPERIMENTS, lambda o: False)
    fake(monkeypatch, FakeEntryPoint("new", "pkg:obj", plugins.GROUPS[kind], obj))
    with pytest.raises(ConfigError, match="fake-plugin"):
        plugins.load(kind, registry, check, "a thing")
    fake(monkeypatch, FakeEntryPoint(builtin, "pkg:obj", plugins.GROUPS[kind], obj))
    with pytest.raises(ConfigError, match="already registered"):
        plugins.load(kind, registry, check, "a thing")


# ----------------------------------------------------------------------------- through the command line

def dist_info(tmp_path: Path, groups: dict[str, dict[str, str]], name: str = "poslab-plugin-example") -> dict:
    """A dist-info folder declaring ``groups`` on a PYTHONPATH entry: environment for a subprocess."""
    folder = tmp_path / "site" / f"{name.replace('-', '_')}-0.1.0.dist-info"
    folder.mkdir(parents=True)
    (folder / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1.0\n")
    (folder / "entry_points.txt").write_text("".join(
        f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in eps.items()) + "\n" for group, eps in groups.items()))
    path = os.pathsep.join([str(tmp_path / "site"), str(EXAMPLE / "src"), os.environ.get("PYTHONPATH", "")])
    return {**os.environ, "PYTHONPATH": path}


def poslab(env, *args, cwd):
    return subprocess.run([sys.executable, "-m", "poslab", *args], env=env, cwd=cwd, capture_output=True, text=True,
                          timeout=300)


def test_a_broken_plugin_stops_the_command_line_with_one_line_and_writes_nothing(tmp_path):
    env = dist_info(tmp_path, {"poslab.encodings": {"alibi": "poslab_plugin_example.encoding:GaussianBias"}},
                    name="shadowing-plugin")
    store = tmp_path / "runs" / "s.sqlite"
    got = poslab(env, "run", "k1", "--preset", "quick", "--store", str(store), "--out", str(tmp_path / "out"),
                 cwd=tmp_path)
    assert got.returncode == 2, got.stderr[-2000:]
    lines = got.stderr.strip().splitlines()
    assert len(lines) == 1 and "shadowing-plugin" in lines[0] and "'alibi'" in lines[0], got.stderr
    assert not store.exists() and not (tmp_path / "out").exists()


def test_the_example_plugin_is_listed_and_its_study_runs_end_to_end(tmp_path):
    """In a fresh process, as a user's shell would run it; the registries load the plugin on import,
    so a worker process that imports them sees it too (inline here: a worker pool's start-up would
    double the test's time)."""
    groups = tomllib.loads((EXAMPLE / "pyproject.toml").read_text())["project"]["entry-points"]
    env = dist_info(tmp_path, groups)
    listed = poslab(env, "list", cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr[-2000:]
    for name in ("gaussian_bias", "first_token", "example-first-token"):
        line = next(ln for ln in listed.stdout.splitlines() if ln.startswith(name + " "))
        assert line.rstrip().endswith("poslab-plugin-example"), line
    assert next(ln for ln in listed.stdout.splitlines() if ln.startswith("rope ")).rstrip().endswith("poslab")
    got = poslab(env, "run", "example-first-token", "--preset", "quick", "--store", str(tmp_path / "s.sqlite"),
                 "--out", str(tmp_path / "out"), "--no-progress", "--executor", "inline", cwd=tmp_path)
    assert got.returncode == 0, got.stderr[-3000:]
    table = (tmp_path / "out" / "table.md").read_text()
    assert "gaussian_bias" in table and "rope" in table


@pytest.mark.xdist_group("ray")  # one local Ray cluster at a time (tests/test_ray.py)
def test_the_example_plugins_study_runs_on_the_ray_executor(tmp_path):
    """Issue 38: a plugin's encoding works with every executor, Ray included. The plugin's study runs
    as Ray tasks on a local Ray instance started by the command; its table names the plugin's encoding."""
    pytest.importorskip("ray", reason="the Ray executor needs the extra: pip install 'poslab[ray]'")
    groups = tomllib.loads((EXAMPLE / "pyproject.toml").read_text())["project"]["entry-points"]
    env = {**dist_info(tmp_path, groups), "RAY_DISABLE_IMPORT_WARNING": "1"}
    got = poslab(env, "run", "example-first-token", "--preset", "quick", "--store", str(tmp_path / "s.sqlite"),
                 "--out", str(tmp_path / "out"), "--no-progress", "--executor", "ray", "--workers", "2", cwd=tmp_path)
    assert got.returncode == 0, got.stderr[-3000:]
    assert "gaussian_bias" in (tmp_path / "out" / "table.md").read_text()
