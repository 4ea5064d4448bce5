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

SOURCE = "their results files (McGill-NLP/length-generalization@40f8a44), mean of 3 seeds"
SCALE = "exact match, T5-base decoder (~107M), 40k steps, batch 64; tested at {lengths}"
TEST_LENGTHS = {"copy": "21-40", "reverse": "21-40", "scan": "26-48 actions"}

RUNS: dict[tuple[str, str], dict] = {
    ('copy', 'ALiBi'): dict(overall=0.331, seeds=[0.344, 0.3192, 0.3299], by_length={
        21: 0.8227, 22: 0.7693, 23: 0.8153, 24: 0.7507, 25: 0.734, 26: 0.7127, 27: 0.6367, 28: 0.568,
        29: 0.444, 30: 0.2293, 31: 0.0947, 32: 0.0353, 33: 0.0053, 34: 0.0027, 35: 0.0, 36: 0.0,
        37: 0.0, 38: 0.0, 39: 0.0, 40: 0.0,
    }),
    ('copy', 'APE'): dict(overall=0.0277, seeds=[0.0283, 0.0227, 0.0322], by_length={
        21: 0.5427, 22: 0.012, 23: 0.0, 24: 0.0, 25: 0.0, 26: 0.0, 27: 0.0, 28: 0.0,
        29: 0.0, 30: 0.0, 31: 0.0, 32: 0.0, 33: 0.0, 34: 0.0, 35: 0.0, 36: 0.0,
        37: 0.0, 38: 0.0, 39: 0.0, 40: 0.0,
    }),
    ('copy', 'NoPE'): dict(overall=0.3054, seeds=[0.2896, 0.3322, 0.2944], by_length={
        21: 0.788, 22: 0.7427, 23: 0.7767, 24: 0.722, 25: 0.704, 26: 0.6873, 27: 0.5933, 28: 0.4993,
        29: 0.3393, 30: 0.1727, 31: 0.0527, 32: 0.0253, 33: 0.004, 34: 0.0007, 35: 0.0, 36: 0.0,
        37: 0.0, 38: 0.0, 39: 0.0, 40: 0.0,
    }),
    ('copy', 'Rotary'): dict(overall=0.0114, seeds=[0.0133, 0.0177, 0.0032], by_length={
        21: 0.0367, 22: 0.0, 23: 0.0, 24: 0.0, 25: 0.0, 26: 0.0, 27: 0.0, 28: 0.0,
        29: 0.0, 30: 0.0, 31: 0.0, 32: 0.0, 33: 0.0, 34: 0.0667, 35: 0.0967, 36: 0.028,
        37: 0.0, 38: 0.0, 39: 0.0, 40: 0.0,
    }),
    ('copy', 'T5'): dict(overall=0.4195, seeds=[0.435, 0.4082, 0.4154], by_length={
        21: 0.8027, 22: 0.764, 23: 0.8027, 24: 0.7467, 25: 0.7293, 26: 0.7153, 27: 0.6693, 28: 0.6773,
        29: 0.6587, 30: 0.5553, 31: 0.4647, 32: 0.368, 33: 0.2353, 34: 0.1287, 35: 0.0507, 36: 0.0173,
        37: 0.002, 38: 0.002, 39: 0.0007, 40: 0.0,
    }),
    ('reverse', 'ALiBi'): dict(overall=0.1709, seeds=[0.1654, 0.1632, 0.184], by_length={
        21: 0.9967, 22: 0.986, 23: 0.938, 24: 0.4513, 25: 0.0447, 26: 0.0007, 27: 0.0, 28: 0.0,
        29: 0.0, 30: 0.0, 31: 0.0, 32: 0.0, 33: 0.0, 34: 0.0, 35: 0.0, 36: 0.0,
        37: 0.0, 38: 0.0, 39: 0.0, 40: 0.0,
    }),
    ('reverse', 'APE'): dict(overall=0.023, seeds=[0.0148, 0.0363, 0.018], by_length={
        21: 0.4607, 22: 0.0, 23: 0.0, 24: 0.0, 25: 0.0, 26: 0.0, 27: 0.0, 28: 0.0,
        29: 0.0, 30: 0.0, 31: 0.0, 32: 0.0, 33: 0.0, 34: 0.0, 35: 0.0, 36: 0.0,
        37: 0.0, 38: 0.0, 39: 0.0, 40: 0.0,
    }),
    ('reverse', 'NoPE'): dict(overall=0.2301, seeds=[0.2355, 0.2187, 0.236], by_length={
        21: 0.9907, 22: 0.9793, 23: 0.9527, 24: 0.8047, 25: 0.542, 26: 0.2353, 27: 0.076, 28: 0.0193,
        29: 0.0013, 30: 0.0, 31: 0.0, 32: 0.0, 33: 0.0, 34: 0.0, 35: 0.0, 36: 0.0,
        37: 0.0, 38: 0.0, 39: 0.0, 40: 0.0,
    }),
    ('reverse', 'Rotary'): dict(overall=0.0774, seeds=[0.028, 0.1635, 0.0406], by_length={
        21: 0.7893, 22: 0.3273, 23: 0.294, 24: 0.132, 25: 0.0047, 26: 0.0, 27: 0.0, 28: 0.0,
        29: 0.0, 30: 0.0, 31: 0.0, 32: 0.0, 33: 0.0, 34: 0.0, 35: 0.0, 36: 0.0,
        37: 0.0, 38: 0.0, 39: 0.0, 40: 0.0,
    }),
    ('reverse', 'T5'): dict(overall=0.2423, seeds=[0.2686, 0.2298, 0.2284], by_length={
        21: 0.994, 22: 0.9853, 23: 0.9573, 24: 0.8453, 25: 0.608, 26: 0.3133, 27: 0.1173, 28: 0.0193,
        29: 0.0053, 30: 0.0, 31: 0.0, 32: 0.0, 33: 0.0, 34: 0.0, 35: 0.0, 36: 0.0,
        37: 0.0, 38: 0.0, 39: 0.0, 40: 0.0,
    }),
    ('scan', 'ALiBi'): dict(overall=0.0, seeds=[0, 0, 0], by_length={
        26: 0.0, 27: 0.0, 28: 0.0, 30: 0.0, 32: 0.0, 33: 0.0, 36: 0.0, 40: 0.0,
        48: 0.0,
    }),
    ('scan', 'APE'): dict(overall=0.0434, seeds=[0, 0.0472, 0.0829], by_length={
        26: 0.2656, 27: 0.0, 28: 0.0, 30: 0.0, 32: 0.0, 33: 0.0, 36: 0.0, 40: 0.0,
        48: 0.0,
    }),
    ('scan', 'NoPE'): dict(overall=0.531, seeds=[0.8087, 0.7844, 0], by_length={
        26: 0.6667, 27: 0.6659, 28: 0.6131, 30: 0.6441, 32: 0.4271, 33: 0.6328, 36: 0.2344, 40: 0.0456,
        48: 0.0,
    }),
    ('scan', 'Rotary'): dict(overall=0.0, seeds=[0, 0, 0], by_length={
        26: 0.0, 27: 0.0, 28: 0.0, 30: 0.0, 32: 0.0, 33: 0.0, 36: 0.0, 40: 0.0,
        48: 0.0,
    }),
    ('scan', 'T5'): dict(overall=0.2655, seeds=[0, 0.7966, 0], by_length={
        26: 0.3275, 27: 0.3289, 28: 0.3036, 30: 0.3038, 32: 0.1815, 33: 0.3138, 36: 0.0, 40: 0.1732,
        48: 0.0052,
    }),
}
