"""A plugin's encoding joins the comparison without a line changed in it (issue 38 item 3): with the
example plugin (examples/poslab-plugin-example) found through its entry points, bias-comparison
runs it at the study's K values, routed by its form, and the survey table (``poslab encodings``)
lists it under its kind with its package.

As in tests/test_plugins.py the example is not pip-installed: a ``*.dist-info`` folder with its
entry points and the example's source folder go on a subprocess's PYTHONPATH."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "poslab-plugin-example"
PLUGIN = "gaussian_bias"  # the example's encoding: -(i - j)^2 / (2 sigma^2), a nearest-first bias


def plugin_env(tmp_path: Path) -> dict:
    project = tomllib.loads((EXAMPLE / "pyproject.toml").read_text())["project"]
    folder = tmp_path / "site" / f"{project['name'].replace('-', '_')}-{project['version']}.dist-info"
    folder.mkdir(parents=True)
    (folder / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n")
    (folder / "entry_points.txt").write_text("".join(
        f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in eps.items()) + "\n"
        for group, eps in project["entry-points"].items()))
    path = os.pathsep.join([str(tmp_path / "site"), str(EXAMPLE / "src"), os.environ.get("PYTHONPATH", "")])
    return {**os.environ, "PYTHONPATH": path}


def poslab(env, *args, cwd):
    got = subprocess.run([sys.executable, "-m", "poslab", *args], env=env, cwd=cwd, capture_output=True, text=True,
                         timeout=300)
    assert got.returncode == 0, got.stderr[-3000:]
    return got.stdout


def test_a_plugin_encoding_runs_in_bias_comparison_and_is_in_the_survey_table(tmp_path):
    env = plugin_env(tmp_path)
    settings = [f"{PLUGIN} K=2"]  # the quick preset's setting for it (K = 1, 2, 3 in the paper preset)
    tiny = ["train.steps=2", "train.batch_size=4", "task.m=5", "model.d_model=8", "eval.n_sequences=8",
            "eval.lengths=[12,20]", "seeds=1", f"grid.setting={json.dumps(settings)}"]
    poslab(env, "run", "bias-comparison", "--preset", "quick", *(a for s in tiny for a in ("--set", s)),
           "--store", str(tmp_path / "s.sqlite"), "--out", str(tmp_path / "out"), "--no-progress",
           "--executor", "inline", cwd=tmp_path)
    table = (tmp_path / "out" / "table.md").read_text()
    rows = [line for line in table.splitlines() if line.startswith(f"| {PLUGIN} | relative | ")]
    assert len(rows) == 1 and "| 2 | nearest-first |" in rows[0], table[:3000]
    claims = {c["name"]: c for c in json.loads((tmp_path / "out" / "claims.json").read_text())}
    assert f"{PLUGIN}, K=2: mean accuracy at unseen lengths" in claims
    judged = [c for n, c in claims.items() if n.startswith(f"{PLUGIN}, K=2: cells selecting -K")]
    # routed by its form: ALiBi's argument for a nearest-first bias (sigma = 4: gap (4 - 1) / 32 >= 0.05), a check
    assert len(judged) == 1 and judged[0]["role"] == "check" and "predicted none" in judged[0]["name"], judged
    # grid.setting is checked against the quick preset's settings: the run above shows the preset holds it
    survey = poslab(env, "encodings", "--store", str(tmp_path / "s.sqlite"), "--cost-lengths", "none", cwd=tmp_path)
    header, dashes, *body = survey.splitlines()
    spans, at = [], 0
    for dash in dashes.split("  "):  # the column widths, from the dashes under the header
        spans.append((at, at + len(dash)))
        at += len(dash) + 2
    table = [[line[a:b].strip() for a, b in spans] for line in body]
    assert [header[a:b].strip() for a, b in spans][:3] == ["encoding", "kind", "from"]
    mine = next(cells for cells in table if cells[0] == PLUGIN)
    assert mine[1] == "relative" and mine[2] == "poslab-plugin-example", mine
    assert [cells[0] for cells in table if cells[1] == "relative"][-1] == PLUGIN  # under its kind, after the built-ins
    kinds = [cells[1] for cells in table]
    assert kinds == sorted(kinds, key=["none", "absolute", "relative", "rotary", "hybrid"].index)  # grouped by kind
    assert "(L 20-20, 1 seeds, bias-comparison)" in mine[-2], mine  # its accuracy past the training range, measured
