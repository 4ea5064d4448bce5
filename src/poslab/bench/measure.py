"""What the memory benchmarks share: a child process whose peak memory is its working set."""

from __future__ import annotations

import os

MMAP_THRESHOLD = 131072  # bytes: the evaluation children's fixed glibc mmap threshold


def start_measured(ctx, target, args):
    """Start ``target(*args)`` in a fresh ``ctx`` process whose peak memory is its working set.

    glibc's dynamic mmap threshold otherwise lets freed chunk buffers pile up on the heap (a
    bounded growth, some 30 MiB, that reads as if memory grew with L); the child starts with a
    fixed one, ``MMAP_THRESHOLD``, and this process's environment is left as it was."""
    proc = ctx.Process(target=target, args=args)
    saved = os.environ.get("MALLOC_MMAP_THRESHOLD_")
    os.environ["MALLOC_MMAP_THRESHOLD_"] = str(MMAP_THRESHOLD)
    try:
        proc.start()
    finally:
        if saved is None:
            del os.environ["MALLOC_MMAP_THRESHOLD_"]
        else:
            os.environ["MALLOC_MMAP_THRESHOLD_"] = saved
    return proc


def peak_since_reset() -> tuple[float, float]:
    """(VmRSS, VmHWM) in MiB; write "5" to /proc/self/clear_refs first to reset the high-water mark."""
    with open("/proc/self/status") as f:
        status = f.read()
    rss, hwm = (int(status.split(f"{key}:")[1].split()[0]) / 1024 for key in ("VmRSS", "VmHWM"))
    return rss, hwm
