"""Per-task numbers the benchmark sources publish, for lengthgen's "published beside measured" table.

Kazemnejad et al. 2023 show their per-task results as figures only (Fig. 3, F.4-F.6), but their
repository (McGill-NLP/length-generalization, commit 40f8a44) publishes the runs behind them in
``results/sanity_check.jsonl`` (copy, reverse) and ``results/classic.jsonl`` (SCAN, PCFG): the runs
their figure notebook (``notebooks/plot_aggregate_final.ipynb``) reads by those two tags. For each
(task, encoding) there are three seeds trained at the selected hyper-parameters (``job_type``
``best_run_seed_exp``; T5-base decoder-only, ~107M parameters, 40k steps). Each run logs
``pred/test_acc_<L>``, the exact match of the generated answer over the test examples of length
bin L (a fraction, rounded to 4 places by their analyzer), and ``pred/test_acc_overall``, over every
test example (copy and reverse: 20 bins of equal size, so the mean of the bins).

``RUNS`` holds, for the task variants and splits poslab's lengthgen runs by default -- copy
(``cmc_tr20_ts40``: L uniform symbols, train 2..20, test 21..40), reverse (``mc_tr20_ts40``) and
SCAN (``len_tr25_ts48``: train <= 25 actions, test 26..48; length = actions) -- the mean over the
three seeds of ``overall`` and of each bin (``by_length``), and the seeds' ``overall`` values.
Rebuilt by ``scripts/kazemnejad_published.py`` from the source's results directory.

Not recorded: their other copy and reverse variants (cmc2x, rsc, rsc2x, rdc, mc2x, mcrv; poslab
registers them as ``variant`` values, lengthgen runs the defaults), PCFG (not registered), and the
arithmetic tasks (their published runs use a scratchpad, ``results/scratchpad_f.jsonl``; poslab's
are without). Their figures' SCAN is a second split, ``mdlen_tr25_ts48``, whose prompt is prefixed
"Solve: " (``scan_bos``); its overall exact match, mean of 3 seeds: NoPE 0.797, T5 0.799, ALiBi
0.438, Rotary 0.283, APE 0.057. The ``len_tr25_ts48`` runs recorded here have poslab's format (no
prefix).

Ruoss et al. 2023's Table 1 holds per-task numbers too; it could not be read with this project's
tools (docs/lengthgen.md), so none is recorded.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np

SOURCE = "their results files (McGill-NLP/length-generalization@40f8a44), mean of 3 seeds"
SCALE = "T5-base decoder (~107M), 40k steps, batch 64; tested at {lengths}"
TEST_LENGTHS = {"copy": "21-40", "reverse": "21-40", "scan": "26-48 actions"}
# the runs of their results files that lengthgen has counterparts of, as the source has them
# (scripts/kazemnejad_published.py wrote it; sources/ORIGIN.md says from where)
EXTRACT = Path(__file__).resolve().parents[2] / "data" / "sources" / "kazemnejad2023_runs.jsonl.gz"
# (their data, their split) -> poslab task, for the splits poslab runs with its default variant
SPLITS = {("s2s_copy", "cmc_tr20_ts40"): "copy", ("s2s_reverse", "mc_tr20_ts40"): "reverse",
          ("scan", "len_tr25_ts48"): "scan"}
ENCODINGS = {"none": "NoPE", "t5": "T5", "alibi": "ALiBi", "rotary": "Rotary", "abs_sin": "APE"}
STATISTIC = ("token-level exact match (every output token right: their trainer's test_seq_acc, the statistic "
             "poslab scores; a run that did not log it: their analyzer's exact match where its in-distribution "
             "exact match is above 0)")
EXACT_STATISTIC = "their analyzer's exact match (a comparison of the decoded strings)"


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


def token_exact(run: dict) -> float | None:
    """A run's token-level exact match over its test set (see STATISTIC); None where it has neither."""
    if run.get("sum__pred/test_seq_acc") is not None:
        return float(run["sum__pred/test_seq_acc"])
    if (run.get("sum__pred/valid_acc_overall") or 0) > 0:  # their analyzer worked on this run
        return float(run["sum__pred/test_acc_overall"])
    return None


def summarize(runs: list[dict]) -> dict[tuple[str, str], dict]:
    """{(task, encoding): overall (mean of the seeds' token-level exact match), seeds, exact_match (mean of
    their analyzer's exact match over the runs where it worked: in-distribution exact match above 0),
    seeds_exact, by_length (the analyzer's exact match per test length bin, over the same runs), left_out
    (seeds whose analyzer failed: in-distribution exact match 0)}."""
    groups: dict[tuple[str, str], list[dict]] = {}
    for run in runs:
        key = parse_group(run["run_group"])
        if key is not None and run["job_type"] == "best_run_seed_exp":
            groups.setdefault(key, []).append(run)
    out = {}
    for key, seeds in sorted(groups.items()):
        tokens = [v for v in map(token_exact, seeds) if v is not None]
        working = [r for r in seeds if (r.get("sum__pred/valid_acc_overall") or 0) > 0]
        bins = sorted({int(k.rsplit("_", 1)[1]) for r in working for k in r
                       if k.startswith("sum__pred/test_acc_") and k.rsplit("_", 1)[1].isdigit()})
        out[key] = dict(
            overall=round(float(np.mean(tokens)), 4), seeds=tokens,
            exact_match=round(float(np.mean([r["sum__pred/test_acc_overall"] for r in working])), 4)
            if working else None,
            seeds_exact=[r["sum__pred/test_acc_overall"] for r in working],
            by_length={n: round(float(np.mean([r[f"sum__pred/test_acc_{n}"] for r in working])), 4) for n in bins},
            left_out=len(seeds) - len(working))
    return out


def load(path: Path = EXTRACT) -> list[dict]:
    with gzip.open(path, "rt") as f:
        return [json.loads(line) for line in f]


# (the extract ships with poslab; only the script that writes it imports this module before it exists)
RUNS: dict[tuple[str, str], dict] = summarize(load()) if EXTRACT.exists() else {}
