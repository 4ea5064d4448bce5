"""Extract, from Kazemnejad et al.'s own results files, the runs poslab.studies.kit.published reads.

McGill-NLP/length-generalization publishes its runs in ``results/*.jsonl``: one JSON object per
W&B run, with ``job_type`` ``best_run_seed_exp`` for the three seeds trained at the selected
hyper-parameters. Each such run has ``sum__pred/test_acc_<L>`` (exact match of the generated
answer on the test examples of length bin L, a fraction, rounded to 4 places by their analyzer)
and ``sum__pred/test_acc_overall`` (over every test example), and, where the trainer logged it,
``sum__pred/test_seq_acc`` (the share of test outputs whose tokens are all right). This script keeps
the runs whose task, split and encoding poslab's lengthgen study runs (copy cmc, reverse mc, SCAN
len_tr25_ts48; no scratchpad), each with its group, seed and every ``sum__pred/test_*`` and
``sum__pred/valid_*`` number, as they are in the source, and writes them to
``src/poslab/data/sources/kazemnejad2023_runs.jsonl.gz``, which ``poslab.studies.kit.published``
reads (and a test recomputes every recorded number from)::

    .venv/bin/python scripts/kazemnejad_published.py /path/to/length-generalization/results

It reads data only; it needs the source's results directory (a checkout of the repository).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import sys
from pathlib import Path

from poslab.studies.kit.published import EXTRACT, parse_group

FILES = ("sanity_check.jsonl", "classic.jsonl")  # copy and reverse; SCAN (and PCFG, not run here)
KEEP = ("run_group", "job_type", "cfg__global_vars.seed")  # and every sum__pred/{test,valid}_* number


def extract(results: Path) -> list[dict]:
    """The kept runs, each with the fields poslab reads, in a stable order."""
    out = []
    for file in FILES:
        for line in (results / file).read_text().splitlines():
            run = json.loads(line)
            if run["job_type"] == "best_run_seed_exp" and parse_group(run["run_group"]):
                out.append({k: v for k, v in run.items()
                            if k in KEEP or k.startswith(("sum__pred/test_", "sum__pred/valid_"))})
    return sorted(out, key=lambda r: (r["run_group"], r["cfg__global_vars.seed"]))


def main(results: str) -> None:
    runs = extract(Path(results))
    text = "".join(json.dumps(r, sort_keys=True) + "\n" for r in runs)
    with gzip.GzipFile(EXTRACT, "wb", mtime=0) as f:  # mtime 0: the same runs give the same bytes
        f.write(text.encode())
    for file in FILES:
        print(f"{file}: sha256 {hashlib.sha256((Path(results) / file).read_bytes()).hexdigest()}")
    print(f"wrote {len(runs)} runs to {EXTRACT}")


if __name__ == "__main__":
    main(*sys.argv[1:])
