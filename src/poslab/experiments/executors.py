"""Executors: where groups of ensemble members train, behind one small protocol.

    executor.map_unordered(fn, jobs) -> iterator of fn(*job), in the order they finish

``fn`` and every job are picklable and ``fn`` never touches the store, so the runner (the only
writer) records each result as it arrives, whichever executor produced it. ``EXECUTORS`` maps
the names ``--executor`` takes to factories; another backend is one class and one entry.

- ``inline``: in this process, one job after another;
- ``local``: a pool of fresh worker processes (``spawn``: safe after torch has started threads),
  each with its share of the CPU cores; one worker, or a CUDA device, runs inline.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor, as_completed
from typing import Protocol

import torch

from poslab.errors import ConfigError


class Executor(Protocol):
    def map_unordered(self, fn: Callable, jobs: Iterable[tuple]) -> Iterator: ...


class Inline:
    """Run each job in this process, in order."""

    def map_unordered(self, fn: Callable, jobs: Iterable[tuple]) -> Iterator:
        for job in jobs:
            yield fn(*job)


class ProcessPool:
    """Run jobs in ``workers`` fresh processes, each with ``threads`` CPU threads."""

    def __init__(self, workers: int):
        self.workers = workers
        self.threads = max(1, (os.cpu_count() or 1) // workers)

    def map_unordered(self, fn: Callable, jobs: Iterable[tuple]) -> Iterator:
        jobs = list(jobs)
        if not jobs:
            return
        pool = ProcessPoolExecutor(self.workers, mp_context=multiprocessing.get_context("spawn"),
                                   initializer=torch.set_num_threads, initargs=(self.threads,))
        with pool:
            futures = [pool.submit(fn, *job) for job in jobs]
            for future in as_completed(futures):
                yield future.result()


def worker_pool(workers: int) -> tuple[ProcessPoolExecutor, int]:
    """A raw spawn pool of ``workers`` processes and the threads each should use."""
    local = ProcessPool(workers)
    return ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"),
                               initializer=torch.set_num_threads, initargs=(local.threads,)), local.threads


def _local(workers: int = 1, device: str = "cpu", **_) -> Executor:
    return Inline() if workers <= 1 or device != "cpu" else ProcessPool(workers)


def _inline(**_) -> Executor:
    return Inline()


def _ray(address: str | None = None, device: str = "cpu", **_) -> Executor:
    raise ConfigError("executor", "ray", "local or inline (the Ray executor is not built yet)")


EXECUTORS: dict[str, Callable[..., Executor]] = {
    "local": _local,
    "inline": _inline,
    "ray": _ray,
}


def make_executor(name: str, **options) -> Executor:
    if name not in EXECUTORS:
        raise ConfigError("executor", name, sorted(EXECUTORS))
    return EXECUTORS[name](**options)
