"""``poslab bench leakage-memory``: peak memory of one pretrained-leakage worker, in a fresh process."""

from __future__ import annotations

import time

import torch

# ----------------------------------------------------------------------------- leakage memory

def _leakage_child(model: str, config: dict, queue) -> None:
    from poslab.pretrained.model import encode_text
    from poslab.studies.kit.checkpoints import checkpoint_source, loaded, source_path
    from poslab.studies.pretrained_leakage import evaluate_mode
    from poslab.tasks.text import CharText

    torch.set_num_threads(1)
    t0 = time.perf_counter()
    lm = loaded(source_path(checkpoint_source(model)), "float32", "cpu")
    loaded_at = time.perf_counter() - t0
    rows = evaluate_mode(lm, encode_text(lm, CharText(**config["text"]).text), config)
    queue.put(dict(load_s=loaded_at, seconds=time.perf_counter() - t0, rows=len(rows)))


def bench_leakage_memory(*, model: str = "smollm2-135m", length: int = 512, windows: int = 4, groups: int = 2,
                         bos: str = "with BOS", echo=print) -> dict:
    """Peak RSS of one pretrained-leakage worker: one (checkpoint, mode) job of the study
    (:func:`poslab.studies.pretrained_leakage.evaluate_mode`, every variant and swap of the mode) in
    a fresh process, read from the kernel's high-water mark of that child (``ru_maxrss``), beside
    the study's estimate (``worker_bytes``) that decides how many workers run side by side."""
    import multiprocessing as mp
    import resource

    from poslab.pretrained.loading import read_config
    from poslab.studies import pretrained_leakage as pl
    from poslab.studies.kit.checkpoints import checkpoint_source

    study = pl.study("quick")
    config = dict(study.model, checkpoint=model, name=model, length=length, windows=windows, groups=groups, bos=bos,
                  window=64, text=dict(study.task))
    estimate = pl.worker_bytes(length, read_config(checkpoint_source(model)))
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    child = ctx.Process(target=_leakage_child, args=(model, config, queue))
    child.start()
    got = queue.get()
    child.join()
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024  # kilobytes on Linux
    out = dict(model=model, length=length, windows=windows, groups=groups, bos=bos, peak_gib=peak / 2**30,
               estimate_gib=estimate / 2**30, **got)
    echo(f"pretrained-leakage worker, {model}, {bos}, {windows} windows of {length} tokens in {groups} groups: "
         f"peak RSS {out['peak_gib']:.2f} GiB (estimate {out['estimate_gib']:.2f} GiB), "
         f"{out['seconds']:.0f} s ({out['load_s']:.0f} s loading)")
    return out
