"""Every study's quick-preset outputs as a manifest of sha256 per file, wall times aside, to show that a
refactor changed no output byte.

    python scripts/quick_outputs.py DIR                                  run every study into DIR/<study>/
    python scripts/quick_outputs.py DIR --compare BEFORE/manifest.json   ... and compare with an earlier manifest
    python scripts/quick_outputs.py DIR --manifest-only [--compare ...]  hash DIR's outputs again, run nothing
    python scripts/quick_outputs.py DIR --src OTHER/src                  run another checkout's package

Each study runs as ``poslab run STUDY --preset quick --executor inline --no-progress --out DIR/STUDY
--store DIR/s.sqlite`` (in the registry's order, every study of ``poslab.studies.EXPERIMENTS`` except
those whose quick preset needs a checkpoint download: none does today, the pretrained studies' quick
preset builds a tiny random checkpoint in code). The manifest (DIR/manifest.json) maps
``study/file`` to the sha256 of the file's normalised bytes.

Wall times are normalised before hashing (``normalise``): they are the only fields that differ
between two runs of the same code. Where they are:

- ``rows.csv``: columns named like a duration or a rate (:data:`WALL_COLUMNS`: ``seconds``,
  ``train_seconds``, ``eval_seconds``, ``group_train_seconds``, ``seconds_per_member``,
  ``machine_seconds_per_member``, ``ms_per_step``, ``tokens_per_s``; the lm study's training
  timings and the context-extension stages' timing rows); their cells are blanked.
- ``claims.json``: the same keys anywhere in the JSON are dropped, and so is ``measured`` of a
  claim whose name says it measures a wall time (:data:`WALL_CLAIMS`: lm's "training wall time
  per member" claims, comparison-only).
- ``table.md``: a table column whose header names one of those quantities (:data:`WALL_HEADERS`:
  "seconds", "s / member", "tokens / s") has its cells blanked, and so has the "measured" cell of
  a claims-table row whose claim names a wall time.
The command's own stdout (``(12.3 s)``) is not an output file and is not hashed. Figures (PNG) are
hashed as written; no study plots a wall time.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

WALL_COLUMNS = frozenset({"seconds", "train_seconds", "eval_seconds", "group_train_seconds", "seconds_per_member",
                          "machine_seconds_per_member", "ms_per_step", "tokens_per_s", "ms_per_iter"})
WALL_HEADERS = re.compile(r"(seconds|\bs ?/ ?member|ms ?/ ?step|ms per|tokens ?/ ?s\b|wall)", re.IGNORECASE)
WALL_CLAIMS = re.compile(r"wall time", re.IGNORECASE)  # a claim whose measured value is a wall time (lm's)
NEEDS_DOWNLOAD: frozenset[str] = frozenset()  # studies whose quick preset would fetch a checkpoint


def normalise(name: str, data: bytes) -> bytes:
    """``data`` of the output file ``name`` with its wall-time fields blanked (see the module docstring)."""
    if name.endswith(".csv"):
        return _csv(data.decode()).encode()
    if name.endswith(".json"):
        return json.dumps(_drop_keys(json.loads(data)), sort_keys=True, indent=1).encode()
    if name.endswith(".md"):
        return _markdown(data.decode()).encode()
    return data


def _csv(text: str) -> str:
    import csv
    import io

    rows = list(csv.reader(io.StringIO(text)))
    if not rows:
        return text
    blank = {i for i, c in enumerate(rows[0]) if c in WALL_COLUMNS}
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    for k, row in enumerate(rows):
        writer.writerow(row if k == 0 else ["" if i in blank else c for i, c in enumerate(row)])
    return out.getvalue()


def _drop_keys(obj):
    if isinstance(obj, dict):
        wall = isinstance(obj.get("name"), str) and WALL_CLAIMS.search(obj["name"]) and "measured" in obj
        return {k: _drop_keys(v) for k, v in obj.items() if k not in WALL_COLUMNS and not (wall and k == "measured")}
    if isinstance(obj, list):
        return [_drop_keys(v) for v in obj]
    return obj


def _markdown(text: str) -> str:
    """Markdown tables: cells under a header naming a wall time are blanked, and a claims table's
    "measured" cell where the claim names a wall time."""
    out: list[str] = []
    blank: set[int] | None = None  # None: outside a table; else the columns to blank in this one
    claim = measured = -1
    for line in text.splitlines():
        if not line.startswith("|"):
            blank = None
            out.append(line)
            continue
        cells = line.strip().strip("|").split("|")
        if set(line) <= set("|-: "):  # the header's rule
            out.append(line)
            continue
        if blank is None:  # the header
            header = [c.strip() for c in cells]
            blank = {i for i, c in enumerate(header) if WALL_HEADERS.search(c) or c in WALL_COLUMNS}
            claim = header.index("claim") if "claim" in header else -1
            measured = header.index("measured") if "measured" in header else -1
            blank -= {claim}
            out.append(line)
            continue
        drop = set(blank)
        if claim >= 0 and measured >= 0 and claim < len(cells) and WALL_CLAIMS.search(cells[claim]):
            drop.add(measured)
        if drop:
            line = "|" + "|".join("" if i in drop else c for i, c in enumerate(cells)) + "|"
        out.append(line)
    return "\n".join(out) + ("\n" if text.endswith("\n") else "")


def manifest(root: Path) -> dict[str, str]:
    """``study/file`` -> sha256 of the normalised bytes, for every file under ``root``'s study folders."""
    out = {}
    for path in sorted(root.rglob("*")):
        # the store (root/s.sqlite, root/weights/) and the manifest are not a study's outputs
        if path.is_file() and path.parent != root and path.relative_to(root).parts[0] != "weights":
            rel = path.relative_to(root).as_posix()
            out[rel] = hashlib.sha256(normalise(path.name, path.read_bytes())).hexdigest()
    return out


def compare(before: dict[str, str], after: dict[str, str]) -> list[str]:
    """One line per difference: a file only on one side, or a file whose hash moved."""
    lines = [f"only before: {k}" for k in sorted(before.keys() - after.keys())]
    lines += [f"only after: {k}" for k in sorted(after.keys() - before.keys())]
    lines += [f"differs: {k}" for k in sorted(before.keys() & after.keys()) if before[k] != after[k]]
    return lines


def studies(python: str, env: dict) -> list[str]:
    code = ("try:\n from poslab.studies import EXPERIMENTS\nexcept ImportError:\n"  # before issue 37 the registry
            " from poslab.experiments import EXPERIMENTS\nprint('\\n'.join(EXPERIMENTS))")  # sat in the engine
    names = subprocess.run([python, "-c", code], env=env, check=True, capture_output=True, text=True).stdout.split()
    return [n for n in names if n not in NEEDS_DOWNLOAD]


def run_all(root: Path, python: str, env: dict, only: list[str] | None) -> None:
    root.mkdir(parents=True, exist_ok=True)
    for name in only or studies(python, env):
        cmd = [python, "-m", "poslab", "run", name, "--preset", "quick", "--executor", "inline", "--no-progress",
               "--out", str(root / name), "--store", str(root / "s.sqlite")]
        print(" ".join(cmd[1:]), flush=True)
        done = subprocess.run(cmd, env=env, capture_output=True, text=True)
        (root / f"{name}.log").write_text(done.stdout + done.stderr)
        if done.returncode:
            sys.exit(f"{name} failed ({done.returncode}); see {root / f'{name}.log'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dir", type=Path)
    parser.add_argument("--compare", type=Path, default=None, help="an earlier manifest.json")
    parser.add_argument("--manifest-only", action="store_true", help="hash DIR's outputs again, run nothing")
    parser.add_argument("--src", type=Path, default=None, help="a checkout's src/ to run instead of the installed one")
    parser.add_argument("--study", action="append", default=None, help="only this study (repeatable)")
    args = parser.parse_args()
    env = dict(os.environ)
    if args.src is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(args.src.resolve()), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    if not args.manifest_only:
        run_all(args.dir, sys.executable, env, args.study)
    got = manifest(args.dir)
    (args.dir / "manifest.json").write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
    print(f"{len(got)} files hashed into {args.dir / 'manifest.json'}")
    if args.compare is not None:
        before = json.loads(args.compare.read_text())
        if args.study:
            before = {k: v for k, v in before.items() if k.split("/")[0] in args.study}
        lines = compare(before, got)
        print("\n".join(lines) or f"identical: {len(got)} files, wall times aside")
        sys.exit(1 if lines else 0)


if __name__ == "__main__":
    main()
