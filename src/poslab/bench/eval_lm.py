"""``poslab bench eval --model lm``: the character LM's position-wise loss, streamed, at long lengths."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch

from poslab.bench.measure import MMAP_THRESHOLD, peak_since_reset, start_measured


def _eval_lm_child(cfg, state, L: int, chunk: int, memory_limit: int, device: str, queue) -> None:
    """In a fresh process: time and peak RSS of the streamed position-wise loss at length L."""
    import torch

    from poslab.models.transformer import Transformer
    from poslab.probes.lm_streaming import positionwise_loss, text_window

    torch.set_num_threads(1)
    model = Transformer(cfg)
    model.load_state_dict(state)
    model.eval().to(device)
    tokens, source = text_window(None, L)
    positionwise_loss(model, text_window(None, 2 * chunk)[0], chunk=chunk, memory_limit=memory_limit)  # warm
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # the high-water mark restarts at the current resident size (Linux >= 4.0)
    before, _ = peak_since_reset()
    start = time.perf_counter()
    out = positionwise_loss(model, tokens, chunk=chunk, memory_limit=memory_limit, device=device)
    if device != "cpu":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    _, peak = peak_since_reset()
    queue.put(dict(length=L, seconds=seconds, peak_mib=peak, growth_mib=peak - before, loss=out.loss,
                   accuracy=out.accuracy, source=source, storage=out.storage,
                   last_bucket=out.rows()[-1], buckets=out.rows()))


def bench_eval_lm(*, lengths=(1_000, 10_000, 30_000), steps: int = 200, chunk: int = 512, encoding: str = "rope",
                  device: str = "cpu", extrapolate_to: int = 1_000_000, figure: Path | None = None,
                  echo=print) -> dict:
    """Position-wise loss of the paper-preset character LM (4 layers, width 128, context 64; trained
    ``steps`` steps of its recipe, 0: random weights) on one TinyShakespeare window per length,
    streamed, each length in a fresh process: wall time and peak resident memory. On CPU the stream
    and keys go to scratch files (memory_limit 0), so memory is bounded whatever L is. Reports the
    time exponent between the two longest lengths and extrapolates seconds = a L^2, a from the
    longest, to ``extrapolate_to`` (not run unless it is one of the lengths). ``figure``: loss per
    log-spaced position bucket for each length, and time and peak memory against length."""
    import multiprocessing

    from poslab.experiments import members
    from poslab.studies import DEFAULTS, get_experiment
    from poslab.studies.kit.charlm import lm_study
    from poslab.train import train_ensemble

    study = lm_study("paper", encodings=(encoding,), seeds=1,
                     train=dict(steps=max(steps, 1), warmup_steps=min(100, steps // 2)))
    member = members(get_experiment(DEFAULTS["bench-lm"]), study)[0]
    t0 = time.perf_counter()
    if steps > 0:
        model = train_ensemble(member.make_model(), [member.task], [0], study.train, progress=False).models[0]
        echo(f"trained the paper-preset LM ({encoding}, {steps} steps of its recipe) in "
             f"{time.perf_counter() - t0:.1f} s")
    else:
        torch.manual_seed(0)
        model = member.make_model()()
        echo(f"the paper-preset LM ({encoding}), randomly initialised")
    cfg = model.cfg
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    memory_limit = 0 if device == "cpu" else 16 << 30
    ctx = multiprocessing.get_context("spawn")
    echo(f"{'length':>9} {'seconds':>9} {'peak RSS MiB':>13} {'growth MiB':>11} {'loss':>7} {'last bucket':>22} "
         f"  (chunk {chunk}, 1 thread, {device}, {'scratch files' if memory_limit == 0 else 'device tensors'}, "
         f"MALLOC_MMAP_THRESHOLD_={MMAP_THRESHOLD}; growth = peak over the evaluation minus resident before it)")
    rows = []
    for L in lengths:
        queue = ctx.Queue()
        proc = start_measured(ctx, _eval_lm_child, (cfg, state, L, chunk, memory_limit, device, queue))
        row = queue.get()
        proc.join()
        rows.append(row)
        b = row["last_bucket"]
        last = f"[{b['bucket_start']}, {b['bucket_end']}] {b['loss']:.3f}"
        echo(f"{L:>9} {row['seconds']:>9.2f} {row['peak_mib']:>13.1f} {row['growth_mib']:>11.1f} {row['loss']:>7.3f} "
             f"{last:>22}  {row['source']}")
    # The L^2 law anchored at the longest run: exact causal attention is quadratic, and the per-token
    # work (embedding, projections, MLP, readout) only makes an extrapolation from there an over-estimate.
    longest = max(rows, key=lambda r: r["length"])
    a = longest["seconds"] / longest["length"] ** 2
    fit = dict(a=a, exponent=float("nan"), extrapolated_seconds=a * extrapolate_to ** 2)
    if len(rows) >= 2:
        (L1, s1), (L2, s2) = sorted((r["length"], r["seconds"]) for r in rows)[-2:]
        fit["exponent"] = float(np.log(s2 / s1) / np.log(L2 / L1))
    ran = extrapolate_to in {r["length"] for r in rows}
    echo(f"time law: seconds ~ L^{fit['exponent']:.2f} between the two longest lengths; seconds = {a:.3e} L^2 "
         f"at L = {longest['length']:,}; at L = {extrapolate_to:,}: {fit['extrapolated_seconds']:,.0f} s = "
         f"{fit['extrapolated_seconds'] / 3600:.1f} h on this {device} "
         f"({'measured above' if ran else 'extrapolated, not run'})")
    if figure is not None:
        _lm_eval_figure(rows, fit, encoding, steps, figure)
        echo(f"wrote {figure}")
    return dict(rows=rows, fit=fit, encoding=encoding, steps=steps, chunk=chunk, device=device)


def _lm_eval_figure(rows: list[dict], fit: dict, encoding: str, steps: int, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from poslab.experiments.outputs import save

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8))
    for row in sorted(rows, key=lambda r: r["length"]):
        buckets = [b for b in row["buckets"] if b["bucket_end"] >= 1]  # log axis: from position 1
        left.plot([(b["bucket_start"] + b["bucket_end"]) / 2 for b in buckets], [b["loss"] for b in buckets],
                  marker=".", label=f"L = {row['length']:,}")
    left.set(xscale="log", xlabel="position (log-spaced buckets)", ylabel="loss (nats)",
             title=f"{encoding} LM ({steps} steps at context 64): loss by position")
    left.legend(fontsize=7)
    lengths = [r["length"] for r in rows]
    right.loglog(lengths, [r["seconds"] for r in rows], "o-", label="seconds (measured)")
    grid = np.geomspace(min(lengths), max(max(lengths), 1_000_000), 50)
    right.loglog(grid, fit["a"] * grid ** 2, ":", color="grey", label="a L^2 (from the longest run)")
    twin = right.twinx()
    twin.plot(lengths, [r["peak_mib"] for r in rows], "s--", color="C3", label="peak RSS MiB")
    twin.set(ylabel="peak RSS (MiB)", ylim=(0, 1.5 * max(r["peak_mib"] for r in rows)))
    right.set(xlabel="length L", ylabel="seconds", title="streamed evaluation: time and memory")
    right.legend(fontsize=7, loc="upper left")
    twin.legend(fontsize=7, loc="lower right")
    save(fig, path)
