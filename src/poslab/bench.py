"""``poslab bench train``: Table 1 training as ``poslab run`` does it, against a plain loop.

Both sides train the same model on the same batches. The ensemble side trains every (K, seed)
member of an encoding in one vectorized pass over the grid fast path, the encodings' groups in
parallel worker processes exactly as ``poslab run`` schedules them; the plain side trains one
model at a time through the direct forward, in this process, right after. Machines like these
are noisy, so the ratio of the two, measured in one run, is the number to read.
"""

from __future__ import annotations

import os
import time

from poslab.experiments import phenomenon
from poslab.experiments.config import apply_overrides
from poslab.experiments.executors import worker_pool
from poslab.experiments.runner import members, train_members
from poslab.train import train_plain


def bench_train(*, steps: int = 4000, plain_steps: int = 200, workers: int | None = None, echo=print) -> dict:
    paper = phenomenon.study("paper")
    study = apply_overrides(paper, [f"train.steps={steps}"])
    everyone = members("bench", study)
    groups: dict[str, list] = {}
    for m in everyone:
        groups.setdefault(m.group_key(), []).append(m)
    encodings = study.axis("encoding")
    n_members = len(everyone) // len(groups)
    workers = min(workers or os.cpu_count() or 1, len(groups))
    start = time.perf_counter()
    pool, threads = worker_pool(workers)
    with pool:
        futures = [pool.submit(train_members, group, desc=f"ensemble {group[0].ids['encoding']}", position=i)
                   for i, group in enumerate(groups.values())]
        seconds = [f.result().seconds for f in futures]
    wall = time.perf_counter() - start
    # groups run side by side, so the slowest one sets the pace (worker start-up is in `wall`)
    ensemble_ms = max(seconds) / (steps * n_members * len(encodings)) * 1e3 if workers > 1 else \
        sum(seconds) / (steps * n_members * len(encodings)) * 1e3
    echo(f"ensemble: {len(encodings)} groups x {n_members} members x {steps} steps: training "
         f"{', '.join(f'{s:.1f} s' for s in seconds)} in {workers} worker(s) x {threads} thread(s), {wall:.1f} s wall "
         f"with worker start-up = {ensemble_ms:.3f} ms per member-step")
    plain = {}
    for group in groups.values():
        encoding, make, task = group[0].ids["encoding"], group[0].make_model(), group[0].task
        train_plain(make, task, 0, study.train, steps=10)  # warm-up, not timed
        t0 = time.perf_counter()
        train_plain(make, task, 0, study.train, steps=plain_steps)
        plain[encoding] = (time.perf_counter() - t0) / plain_steps * 1e3
        echo(f"plain loop, {encoding}: {plain[encoding]:.3f} ms/step ({plain_steps} steps) = "
             f"{plain[encoding] / ensemble_ms:.1f}x the ensemble's ms per member-step")
    full = paper.train.steps  # the Table 1 protocol, whatever --steps timed
    plain_total = sum(ms * full * n_members for ms in plain.values()) / 1e3
    ens_total = ensemble_ms * full * n_members * len(encodings) / 1e3
    echo(f"Table 1 training ({full} steps x {n_members} members x {len(encodings)} encodings): ensemble "
         f"{ens_total:.0f} s{'' if steps == full else ' (projected)'}, plain loop {plain_total:.0f} s (projected), "
         f"speed-up {plain_total / ens_total:.1f}x")
    return dict(wall=wall, ensemble_ms=ensemble_ms, plain_ms=plain, speedup=plain_total / ens_total)
