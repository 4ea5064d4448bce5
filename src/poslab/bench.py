"""``poslab bench train``: Table 1 training as ``poslab run`` does it, against a plain loop.

Both sides train the same model on the same batches. The ensemble side trains every (K, seed)
member of an encoding in one vectorized pass over the grid fast path, the encodings' groups in
parallel worker processes exactly as ``poslab run`` schedules them; the plain side trains one
model at a time through the direct forward, in this process, right after. Machines like these
are noisy, so the ratio of the two, measured in one run, is the number to read.
"""

from __future__ import annotations

import dataclasses
import os
import time

from poslab.experiments import phenomenon
from poslab.experiments.runner import Member, make_model, train_members, worker_pool
from poslab.tasks import build_task
from poslab.train import train_plain


def bench_train(*, steps: int = 4000, plain_steps: int = 200, workers: int | None = None, echo=print) -> dict:
    paper = phenomenon.study("paper")
    study = dataclasses.replace(paper, train=dataclasses.replace(paper.train, steps=steps))
    members = [Member(encoding, K, s) for encoding in study.encodings for K in study.K for s in range(study.seeds)]
    n_members = len(study.K) * study.seeds
    workers = min(workers or os.cpu_count() or 1, len(study.encodings))
    start = time.perf_counter()
    pool, threads = worker_pool(workers)
    with pool:
        futures = [pool.submit(train_members, study, e, [m for m in members if m.encoding == e],
                               desc=f"ensemble {e}", threads=threads, position=i)
                   for i, e in enumerate(study.encodings)]
        seconds = [f.result().seconds for f in futures]
    wall = time.perf_counter() - start
    # groups run side by side, so the slowest one sets the pace (worker start-up is in `wall`)
    ensemble_ms = max(seconds) / (steps * n_members * len(study.encodings)) * 1e3 if workers > 1 else \
        sum(seconds) / (steps * n_members * len(study.encodings)) * 1e3
    echo(f"ensemble: {len(study.encodings)} groups x {n_members} members x {steps} steps: training "
         f"{', '.join(f'{s:.1f} s' for s in seconds)} in {workers} worker(s) x {threads} thread(s), {wall:.1f} s wall "
         f"with worker start-up = {ensemble_ms:.3f} ms per member-step")
    plain = {}
    for encoding in study.encodings:
        make = make_model(study, encoding)
        task = build_task("fixed_offset", m=study.m, K=study.K[0])
        train_plain(make, task, 0, study.train, steps=10)  # warm-up, not timed
        t0 = time.perf_counter()
        train_plain(make, task, 0, study.train, steps=plain_steps)
        plain[encoding] = (time.perf_counter() - t0) / plain_steps * 1e3
        echo(f"plain loop, {encoding}: {plain[encoding]:.3f} ms/step ({plain_steps} steps) = "
             f"{plain[encoding] / ensemble_ms:.1f}x the ensemble's ms per member-step")
    full = paper.train.steps  # the Table 1 protocol, whatever --steps timed
    plain_total = sum(ms * full * n_members for ms in plain.values()) / 1e3
    ens_total = ensemble_ms * full * n_members * len(study.encodings) / 1e3
    echo(f"Table 1 training ({full} steps x {n_members} members x {len(study.encodings)} encodings): ensemble "
         f"{ens_total:.0f} s{'' if steps == full else ' (projected)'}, plain loop {plain_total:.0f} s (projected), "
         f"speed-up {plain_total / ens_total:.1f}x")
    return dict(wall=wall, ensemble_ms=ensemble_ms, plain_ms=plain, speedup=plain_total / ens_total)
