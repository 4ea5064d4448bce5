"""scripts/quick_outputs.py, the byte-for-byte check of every study's quick outputs across a refactor:
its wall-time normalisation and its comparison, on two small output folders (no study is run)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("quick_outputs", ROOT / "scripts" / "quick_outputs.py")
qo = importlib.util.module_from_spec(spec)
spec.loader.exec_module(qo)


def write_study(root: Path, seconds: float, loss: float, measured_wall: float) -> None:
    out = root / "lm"
    out.mkdir(parents=True)
    (out / "rows.csv").write_text(f"probe,loss,train_seconds,tokens_per_s\nlm,{loss},{seconds},{1000 / seconds}\n")
    (out / "claims.json").write_text(json.dumps([
        dict(name="rope: training wall time per member", measured=measured_wall, holds=None),
        dict(name="rope: loss below learned", measured=loss, holds=True)]))
    (out / "table.md").write_text(
        "# lm\n\n| encoding | val loss | s / member | tokens / s |\n| --- | --- | --- | --- |\n"
        f"| rope | {loss} | {seconds} | {1000 / seconds:.0f} |\n\n"
        "| role | claim | paper | measured |\n| --- | --- | --- | --- |\n"
        f"| external | rope: training wall time per member | 74.6 s | {measured_wall} |\n"
        f"| paper | rope: loss below learned | lower | {loss} |\n")
    (out / "fig.png").write_bytes(b"\x89PNG" + str(loss).encode())
    (root / "s.sqlite").write_bytes(str(seconds).encode())  # the store: not an output
    (root / "weights").mkdir()
    (root / "weights" / "k.safetensors").write_bytes(str(seconds).encode())


def test_wall_times_aside_two_runs_are_identical_and_any_other_byte_is_not(tmp_path):
    write_study(tmp_path / "a", seconds=1.5, loss=3.25, measured_wall=1.2)
    write_study(tmp_path / "b", seconds=2.5, loss=3.25, measured_wall=0.7)  # only wall times differ
    write_study(tmp_path / "c", seconds=1.5, loss=3.5, measured_wall=1.2)  # the loss moved
    a, b, c = (qo.manifest(tmp_path / x) for x in "abc")
    assert sorted(a) == ["lm/claims.json", "lm/fig.png", "lm/rows.csv", "lm/table.md"]
    assert qo.compare(a, b) == []
    assert qo.compare(a, c) == [f"differs: lm/{f}" for f in ("claims.json", "fig.png", "rows.csv", "table.md")]
    del c["lm/fig.png"]
    assert qo.compare(a, c)[0] == "only before: lm/fig.png"


def test_the_markdown_keeps_its_shape_and_blanks_only_wall_time_cells():
    text = ("| encoding | seconds | loss |\n| --- | --- | --- |\n| rope | 12.5 | 3.2 |\n\nafter\n"
            "| claim | measured |\n| --- | --- |\n| x: wall time per member | 1.2 |\n| x: loss | 3.2 |\n")
    got = qo.normalise("table.md", text.encode()).decode().splitlines()
    assert got[2] == "| rope || 3.2 |" and got[4] == "after"
    assert got[7] == "| x: wall time per member ||" and got[8] == "| x: loss | 3.2 |"
