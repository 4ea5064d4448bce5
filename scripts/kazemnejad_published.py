"""Rebuild poslab.studies.kit.published's RUNS from Kazemnejad et al.'s own results files.

McGill-NLP/length-generalization publishes its runs in ``results/*.jsonl``: one JSON object per
W&B run, with ``job_type`` ``best_run_seed_exp`` for the three seeds trained at the selected
hyper-parameters. Each such run has ``sum__pred/test_acc_<L>`` (exact match of the generated
answer on the test examples of length bin L, a fraction, rounded to 4 places by their analyzer)
and ``sum__pred/test_acc_overall`` (over every test example). This script keeps the runs whose
task, split and encoding poslab's lengthgen study runs (copy cmc, reverse mc, SCAN len_tr25_ts48;
no scratchpad), averages each number over the seeds, and prints the module's ``RUNS`` literal::

    .venv/bin/python scripts/kazemnejad_published.py /path/to/length-generalization/results

It reads data only; it needs the source's results directory (not shipped with poslab).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

# (their data, their split) -> poslab task, for the splits poslab runs with its default variant
SPLITS = {("s2s_copy", "cmc_tr20_ts40"): "copy", ("s2s_reverse", "mc_tr20_ts40"): "reverse",
          ("scan", "len_tr25_ts48"): "scan"}
ENCODINGS = {"none": "NoPE", "t5": "T5", "alibi": "ALiBi", "rotary": "Rotary", "abs_sin": "APE"}
FILES = ("sanity_check.jsonl", "classic.jsonl")  # copy and reverse; SCAN (and PCFG, not run here)


def parse_group(group: str) -> tuple[str, str] | None:
    """'SW-t5_dec_base_pe_alibi_scan_sweep___data-scan-len_tr25_ts48' -> ('scan', 'ALiBi'): poslab's task and
    their encoding, or None for a run lengthgen has no counterpart of."""
    head, _, data = group.partition("___data-")
    if not head.startswith("SW-t5_dec_base_pe_") or "scratchpad" in head:
        return None
    encoding = head.removeprefix("SW-t5_dec_base_pe_").split("_s2s_")[0].removesuffix("_scan_sweep")
    encoding = encoding.removesuffix("_pcfg_sweep")
    for (name, split), task in SPLITS.items():
        if data == f"{name}-{split}" and encoding in ENCODINGS:
            return task, ENCODINGS[encoding]
    return None


def collect(results: Path) -> dict[tuple[str, str], dict]:
    runs: dict[tuple[str, str], list[dict]] = {}
    for file in FILES:
        for line in (results / file).read_text().splitlines():
            run = json.loads(line)
            parsed = parse_group(run["run_group"]) if run["job_type"] == "best_run_seed_exp" else None
            if parsed:
                runs.setdefault(parsed, []).append(run)
    out = {}
    for key, seeds in sorted(runs.items()):
        lengths = sorted(int(k.rsplit("_", 1)[1]) for k in seeds[0]
                         if k.startswith("sum__pred/test_acc_") and k.rsplit("_", 1)[1].isdigit())
        overall = [run["sum__pred/test_acc_overall"] for run in seeds]
        out[key] = dict(seeds=overall, overall=round(sum(overall) / len(overall), 4),
                        by_length={n: round(sum(run[f"sum__pred/test_acc_{n}"] for run in seeds) / len(seeds), 4)
                                   for n in lengths})
    return out


def main(results: str) -> None:
    print("RUNS = {")
    for (task, their), got in collect(Path(results)).items():
        items = [f"{n}: {v}" for n, v in got["by_length"].items()]
        rows = [", ".join(items[i:i + 8]) for i in range(0, len(items), 8)]
        print(f"    ({task!r}, {their!r}): dict(overall={got['overall']}, seeds={got['seeds']}, by_length={{")
        print("".join(f"        {row},\n" for row in rows) + "    }),", end="\n")
    print("}")


if __name__ == "__main__":
    main(*sys.argv[1:])
