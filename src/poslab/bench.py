"""``poslab bench train``: Table 1 training as ``poslab run`` does it, against a plain loop.

Both sides train the same model on the same batches. The ensemble side trains every (K, seed)
member of an encoding in one vectorized pass over the grid fast path, the encodings' groups in
parallel worker processes exactly as ``poslab run`` schedules them; the plain side trains one
model at a time through the direct forward, in this process, right after. Machines like these
are noisy, so the ratio of the two, measured in one run, is the number to read.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
import time
from concurrent.futures import ProcessPoolExecutor
from functools import partial

import torch

from poslab.experiments import phenomenon
from poslab.experiments.runner import model_config
from poslab.models.retrieval_head import RetrievalHead
from poslab.tasks import build_task
from poslab.train import train_ensemble, train_plain


def _train_group(study, encoding: str, threads: int, position: int) -> float:
    torch.set_num_threads(threads)
    make = partial(RetrievalHead, model_config(study, encoding))
    members = [(K, s) for K in study.K for s in range(study.seeds)]
    tasks = [build_task("fixed_offset", m=study.m, K=K) for K, _ in members]
    result = train_ensemble(make, tasks, [s for _, s in members], study.train, desc=f"ensemble {encoding}",
                            position=position)
    return result.seconds


def bench_train(*, steps: int = 4000, plain_steps: int = 200, workers: int | None = None, echo=print) -> dict:
    study = phenomenon.study("paper")
    study = dataclasses.replace(study, train=dataclasses.replace(study.train, steps=steps))
    n_members = len(study.K) * study.seeds
    workers = min(workers or os.cpu_count() or 1, len(study.encodings))
    threads = max(1, (os.cpu_count() or 1) // workers)
    start = time.perf_counter()
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        seconds = list(pool.map(_train_group, [study] * len(study.encodings), study.encodings,
                                [threads] * len(study.encodings), range(len(study.encodings))))
    wall = time.perf_counter() - start
    # groups run side by side, so the slowest one sets the pace (worker start-up is in `wall`)
    ensemble_ms = max(seconds) / (steps * n_members * len(study.encodings)) * 1e3 if workers > 1 else \
        sum(seconds) / (steps * n_members * len(study.encodings)) * 1e3
    echo(f"ensemble: {len(study.encodings)} groups x {n_members} members x {steps} steps: training "
         f"{', '.join(f'{s:.1f} s' for s in seconds)} in {workers} worker(s) x {threads} thread(s), {wall:.1f} s wall "
         f"with worker start-up = {ensemble_ms:.3f} ms per member-step")
    plain = {}
    for encoding in study.encodings:
        make = partial(RetrievalHead, model_config(study, encoding))
        task = build_task("fixed_offset", m=study.m, K=study.K[0])
        train_plain(make, task, 0, study.train, steps=10)  # warm-up, not timed
        t0 = time.perf_counter()
        train_plain(make, task, 0, study.train, steps=plain_steps)
        plain[encoding] = (time.perf_counter() - t0) / plain_steps * 1e3
        echo(f"plain loop, {encoding}: {plain[encoding]:.3f} ms/step ({plain_steps} steps) = "
             f"{plain[encoding] / ensemble_ms:.1f}x the ensemble's ms per member-step")
    full = study.train.steps if steps == 4000 else 4000
    plain_total = sum(ms * 4000 * n_members for ms in plain.values()) / 1e3
    ens_total = ensemble_ms * full * n_members * len(study.encodings) / 1e3
    echo(f"Table 1 training (4000 steps x {n_members} members x {len(study.encodings)} encodings): ensemble "
         f"{ens_total:.0f} s{'' if steps == 4000 else ' (projected)'}, plain loop {plain_total:.0f} s (projected), "
         f"speed-up {plain_total / ens_total:.1f}x")
    return dict(wall=wall, ensemble_ms=ensemble_ms, plain_ms=plain, speedup=plain_total / ens_total)
