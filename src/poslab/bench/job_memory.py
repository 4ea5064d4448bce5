"""``poslab bench leakage-memory``: the peak memory of one job of an evaluate-only study, in a fresh
process, beside the peak the study declares for it (``Job.memory``), which decides how many of its
jobs run side by side."""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch


def _job_child(experiment: str, job, queue) -> None:
    from poslab.experiments import EvaluateOnly
    from poslab.studies import get_experiment

    torch.set_num_threads(1)
    t0 = time.perf_counter()
    exp = get_experiment(experiment)
    assert isinstance(exp, EvaluateOnly)  # the parent took an evaluate-only study
    rows = exp.run_job(job, device="cpu")
    queue.put(dict(seconds=time.perf_counter() - t0, rows=len(rows)))


def bench_job_memory(experiment: str, *, preset: str = "quick", checkpoint: str | None = None,
                     overrides: Sequence[str] = (), echo=print) -> dict:
    """Peak RSS of the first job of ``experiment`` (an evaluate-only study; ``preset``, ``checkpoint``
    and ``overrides`` as ``poslab run`` takes them, validated as it validates them) run in a fresh
    process (loading included), read from the kernel's high-water mark of that child
    (``ru_maxrss``), beside the job's declared peak (``Job.memory``)."""
    import multiprocessing as mp
    import resource

    from poslab.errors import ConfigError
    from poslab.experiments import EvaluateOnly, validate
    from poslab.experiments.runner import prepare
    from poslab.studies import get_experiment

    exp = get_experiment(experiment)
    if not isinstance(exp, EvaluateOnly) or exp.prepare is not None:
        raise ConfigError("experiment", experiment, "an evaluate-only study whose jobs need no driver's work first")
    study = prepare(exp, preset, checkpoint=checkpoint, overrides=overrides)
    validate(study, "cpu", exp)
    job = exp.jobs(study)[0]
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    child = ctx.Process(target=_job_child, args=(experiment, job, queue))
    child.start()
    got = queue.get()
    child.join()
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024  # kilobytes on Linux
    out = dict(experiment=experiment, job=job.label, peak_gib=peak / 2**30,
               estimate_gib=None if job.memory is None else job.memory / 2**30, **got)
    declared = "none declared" if job.memory is None else f"declared {out['estimate_gib']:.2f} GiB"
    echo(f"{experiment}, one job ({job.label}): peak RSS {out['peak_gib']:.2f} GiB ({declared}), "
         f"{out['seconds']:.0f} s with loading")
    return out
