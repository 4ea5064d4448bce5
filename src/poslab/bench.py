"""``poslab bench train``: the Table 1 protocol as ensembles against a plain loop, in one run.

Both sides train the same model on the same batches: the ensemble trains every (K, seed)
member of an encoding in one vectorized pass over the grid fast path, the plain loop trains one
model at a time through the direct forward. Times are taken in the same process, back to back,
and reported as ms per member-step and their ratio (absolute times on shared machines are
noisy; the ratio is the number to read).
"""

from __future__ import annotations

import time
from functools import partial

from poslab.experiments import phenomenon
from poslab.experiments.runner import model_config
from poslab.models.retrieval_head import RetrievalHead
from poslab.tasks import build_task
from poslab.train import train_ensemble, train_plain


def bench_train(*, steps: int = 4000, plain_steps: int = 200, device: str = "cpu", echo=print) -> dict:
    study = phenomenon.study("paper")
    members = [(K, s) for K in study.K for s in range(study.seeds)]
    report = {}
    for encoding in study.encodings:
        make = partial(RetrievalHead, model_config(study, encoding))
        tasks = [build_task("fixed_offset", m=study.m, K=K) for K, _ in members]
        train = study.train.__class__(**{**study.train.__dict__, "steps": steps})
        result = train_ensemble(make, tasks, [s for _, s in members], train, device=device, desc=f"ensemble {encoding}")
        ens = result.seconds / (steps * len(members)) * 1e3
        start = time.perf_counter()
        train_plain(make, tasks[0], 0, train, steps=plain_steps, device=device)
        plain = (time.perf_counter() - start) / plain_steps * 1e3
        report[encoding] = dict(ensemble_ms=ens, plain_ms=plain, ensemble_s=result.seconds,
                                plain_projected_s=plain * study.train.steps * len(members) / 1e3,
                                ensemble_projected_s=ens * study.train.steps * len(members) / 1e3)
        echo(f"{encoding:>8}: ensemble {ens:.3f} ms/member-step ({len(members)} members, {steps} steps, "
             f"{result.seconds:.1f} s) | plain loop {plain:.3f} ms/step ({plain_steps} steps) | "
             f"speed-up {plain / ens:.1f}x")
    total_ens = sum(r["ensemble_projected_s"] for r in report.values())
    total_plain = sum(r["plain_projected_s"] for r in report.values())
    echo(f"Table 1 training ({study.train.steps} steps x {len(members)} members x {len(study.encodings)} encodings): "
         f"ensemble {total_ens:.0f} s, plain loop {total_plain:.0f} s (projected), speed-up {total_plain / total_ens:.1f}x")
    return report
