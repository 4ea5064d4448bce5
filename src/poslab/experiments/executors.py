"""Executors: where groups of ensemble members train, behind one small protocol.

    executor.map_unordered(fn, jobs) -> iterator of fn(*job), in the order they finish

``fn`` and every job are picklable and ``fn`` never touches the store, so the runner (the only
writer) records each result as it arrives, whichever executor produced it. ``EXECUTORS`` maps
the names ``--executor`` takes to factories; another backend is one class and one entry.

- ``inline``: in this process, one job after another;
- ``local``: a pool of fresh worker processes (``spawn``: safe after torch has started threads),
  each with its share of the CPU cores; one worker, or a CUDA device, runs inline;
- ``auto`` (``poslab run``'s default): ``local``, except that a run whose training is estimated
  (:func:`~poslab.experiments.schedule.step_costs`) under ``WORKER_START_SECONDS`` trains in this
  process, where starting the workers would cost more than the training (:class:`Auto`);
- ``ray``: each job a Ray task on a Ray cluster (``--address``, or a local instance), with
  ``cpus`` CPUs (and one GPU when the device is ``cuda``) reserved per task. Only the driver
  (the process that called ``poslab run``) writes the store: workers return results.
  Ray is the optional extra ``poslab[ray]``.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor, as_completed
from typing import Protocol

import torch

from poslab.errors import ConfigError
from poslab.machine import MEMORY_FRACTION, memory_bytes


class Executor(Protocol):
    def map_unordered(self, fn: Callable, jobs: Iterable[tuple]) -> Iterator: ...


class Inline:
    """Run each job in this process, in order."""

    slots = 1  # jobs at once

    def map_unordered(self, fn: Callable, jobs: Iterable[tuple]) -> Iterator:
        for job in jobs:
            yield fn(*job)


WORKER_START_SECONDS = 4.0  # two spawned workers, from start to their first (empty) results: 4.3-5.0 s here (2 cores)


class ProcessPool:
    """Run jobs in ``workers`` fresh processes, each with ``threads`` CPU threads; with fewer jobs
    than workers, one process per job and the cores shared among them (one group alone gets every
    core, not 1 / workers of them)."""

    def __init__(self, workers: int):
        self.workers = workers
        self.threads = max(1, (os.cpu_count() or 1) // workers)

    @property
    def slots(self) -> int:  # jobs at once
        return self.workers

    def map_unordered(self, fn: Callable, jobs: Iterable[tuple]) -> Iterator:
        jobs = list(jobs)
        if not jobs:
            return
        workers = min(self.workers, len(jobs))
        threads = max(1, (os.cpu_count() or 1) // workers)
        pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"),
                                   initializer=worker_init, initargs=(threads, os.getpid()))
        try:
            futures = [pool.submit(fn, *job) for job in jobs]
            for future in as_completed(futures):
                yield future.result()
        except BaseException:  # a job failed, or its results could not be kept: stop now, not after every job
            _stop(pool)
            raise
        pool.shutdown()


class Auto:
    """A :class:`ProcessPool` of ``workers``, or this process for small work: :meth:`choose` takes a
    run's estimated training seconds (one thread, the schedule's estimate) and gives :class:`Inline`
    below ``WORKER_START_SECONDS``, the pool otherwise. Jobs handed to :meth:`map_unordered` without
    a choice (evaluate-only members, which have no estimate) go to the pool. Both give the same
    rows (an ensemble member computes what it computes alone; tests/experiments/test_experiments.py)."""

    def __init__(self, workers: int):
        self.pool = ProcessPool(workers)

    @property
    def slots(self) -> int:
        return self.pool.slots

    def choose(self, training_seconds: float) -> Inline | ProcessPool:
        return Inline() if training_seconds < WORKER_START_SECONDS else self.pool

    def map_unordered(self, fn: Callable, jobs: Iterable[tuple]) -> Iterator:
        return self.pool.map_unordered(fn, jobs)


def _stop(pool: ProcessPoolExecutor) -> None:
    """Cancel ``pool``'s waiting jobs and kill its workers, so an error surfaces at once (a plain shutdown
    waits for every running job, hours on a long study, and the error with it)."""
    pool.shutdown(wait=False, cancel_futures=True)
    terminate = getattr(pool, "terminate_workers", None)  # Python 3.14
    if terminate is not None:
        terminate()
        return
    for process in list((getattr(pool, "_processes", None) or {}).values()):
        process.terminate()


def worker_pool(workers: int) -> tuple[ProcessPoolExecutor, int]:
    """A raw spawn pool of ``workers`` processes and the threads each should use."""
    local = ProcessPool(workers)
    return ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"),
                               initializer=worker_init, initargs=(local.threads, os.getpid())), local.threads


def worker_init(threads: int, parent: int) -> None:
    """A pool worker's start: its share of the cores, and an exit as soon as its parent dies.

    A parent killed with SIGKILL cannot shut its pool down; without this its workers go on
    training and then wait forever for work, holding their memory. On Linux the kernel sends
    the worker SIGKILL when the parent goes (``PR_SET_PDEATHSIG``); everywhere, a daemon thread
    sees the parent change (re-parented to init or a subreaper) within half a second."""
    torch.set_num_threads(threads)
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG
        except OSError:
            pass
    if os.getppid() != parent:  # the parent died before the signal was armed
        os._exit(1)
    threading.Thread(target=_exit_with_parent, args=(parent,), daemon=True, name="poslab-parent-watch").start()


def _exit_with_parent(parent: int, every: float = 0.5) -> None:
    while os.getppid() == parent:
        time.sleep(every)
    os._exit(1)


def _local(workers: int = 1, device: str = "cpu", **_) -> Executor:
    return Inline() if workers <= 1 or device != "cpu" else ProcessPool(workers)


def _auto(workers: int = 1, device: str = "cpu", **_) -> Executor:
    return Inline() if workers <= 1 or device != "cpu" else Auto(workers)


def _inline(**_) -> Executor:
    return Inline()


class Ray:
    """Run each job as a Ray task with ``cpus`` CPUs (and ``gpus`` GPUs) reserved for it.

    Connects to the cluster at ``address`` (``"auto"``: the one this machine belongs to), or
    starts a local instance when ``address`` is None and none is running. Each task sets torch's
    thread count to its CPU reservation, so a group computes exactly what an inline run with
    that many threads computes; results come back to the driver as they finish.
    """

    def __init__(self, address: str | None = None, cpus: int = 1, gpus: float = 0):
        ray = _import_ray()
        self.ray, self.cpus, self.gpus = ray, cpus, gpus
        if address not in (None, "auto"):
            _check_reachable(address)  # ray.init retries an unreachable address for minutes
        if not ray.is_initialized():
            try:
                ray.init(address=address, include_dashboard=False, log_to_driver=False,
                         configure_logging=False)
            except (ConnectionError, ValueError, RuntimeError) as e:
                raise ConfigError("--address", address, f"the address of a running Ray cluster "
                                                        f"(host:port or auto): {str(e).splitlines()[0]}") from None

    def map_unordered(self, fn: Callable, jobs: Iterable[tuple]) -> Iterator:
        ray = self.ray
        task = ray.remote(num_cpus=self.cpus, num_gpus=self.gpus, max_retries=2)(_ray_call)
        pending = [task.remote(fn, self.cpus, *job) for job in jobs]
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            yield ray.get(done[0])


def _check_reachable(address: str, timeout: float = 5.0) -> None:
    """One TCP connection to ``host:port`` (or ``ray://host:port``) before Ray is asked."""
    allowed = "the address of a running Ray cluster (host:port, ray://host:port, or auto)"
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        raise ConfigError("--address", address, allowed)
    try:
        socket.create_connection((host, int(port)), timeout=timeout).close()
    except OSError as e:
        raise ConfigError("--address", address, f"{allowed}: cannot connect ({e.strerror or e})") from None


def _ray_call(fn: Callable, threads: int, *job):
    torch.set_num_threads(threads)
    return fn(*job)


def _import_ray():
    try:
        import ray
    except ImportError:
        raise ConfigError("--executor", "ray", "auto, local or inline; ray needs the extra: "
                                               "pip install 'poslab[ray]'") from None
    return ray


def _ray(address: str | None = None, device: str = "cpu", cpus: int | None = None, **_) -> Executor:
    return Ray(address, cpus=cpus or 1, gpus=1 if device == "cuda" else 0)


EXECUTORS: dict[str, Callable[..., Executor]] = {
    "auto": _auto,
    "local": _local,
    "inline": _inline,
    "ray": _ray,
}


def workers_that_fit(workers: int, worker_bytes: float | None, available: float | None = None) -> int:
    """``workers``, fewer where that many processes of ``worker_bytes`` each (a job's measured or
    estimated peak) would not fit in ``available`` bytes (default: MEMORY_FRACTION of this
    machine's memory); never fewer than one (a job that cannot fit at all is its study's check
    to refuse). ``worker_bytes`` None: no estimate, no cap."""
    if not worker_bytes:
        return workers
    available = memory_bytes() * MEMORY_FRACTION if available is None else available
    return max(1, min(workers, int(available // worker_bytes)))


def make_executor(name: str, **options) -> Executor:
    if name not in EXECUTORS:
        raise ConfigError("executor", name, sorted(EXECUTORS))
    return EXECUTORS[name](**options)
