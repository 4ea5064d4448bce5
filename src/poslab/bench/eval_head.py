"""``poslab bench eval``: the retrieval head's streamed evaluation to 10^6 positions, each length
in a fresh measured process."""

from __future__ import annotations

import time

import numpy as np
import torch

from poslab.bench.measure import MMAP_THRESHOLD, start_measured


def _eval_child(cfg, state, L: int, n: int, key_chunk: int, K: int, queue) -> None:
    """In a fresh process: peak RSS growth and time of one streamed evaluation at length L."""
    import resource

    from poslab.models.retrieval_head import RetrievalHead
    from poslab.probes.streaming import StreamedTokens, stream_length_row

    torch.set_num_threads(1)
    model = RetrievalHead(cfg)
    model.load_state_dict(state)
    model.eval()
    warm = StreamedTokens(b=n, m=cfg.vocab_size, L=2 * key_chunk, seed=1, chunk=key_chunk)
    stream_length_row(model, warm, 2 * key_chunk, K, key_chunk=key_chunk)  # allocator and kernels warm
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    row = stream_length_row(model, StreamedTokens(b=n, m=cfg.vocab_size, L=L, chunk=key_chunk), L, K,
                            key_chunk=key_chunk)
    seconds = time.perf_counter() - start
    queue.put(dict(row, length=L, seconds=seconds,
                   peak_mib=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                   growth_mib=(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) / 1024))


def bench_eval(*, lengths=(1_000, 10_000, 100_000, 1_000_000), n_sequences: int = 16, key_chunk: int = 4096,
               steps: int = 1000, K: int = 2, figure=None, echo=print) -> list[dict]:
    """Train one RoPE retrieval head (Table 1 model, K = 2), then evaluate it streamed at each length,
    each in a fresh process (so its peak resident memory is its own); with ``figure`` also draw
    accuracy and peak height against L beside the dilution law 1/a* = c (L - 1) + b fitted on
    L <= 48 by the ordinary (unchunked) evaluation."""
    import multiprocessing

    from poslab import probes
    from poslab.models.retrieval_head import RetrievalHead, RetrievalHeadConfig
    from poslab.tasks import build_task, eval_batch
    from poslab.train import TrainConfig, train_ensemble

    cfg = RetrievalHeadConfig(vocab_size=20, d_model=64, encoding="rope", max_len=48)
    task = build_task("fixed_offset", m=20, K=K)
    t0 = time.perf_counter()
    trained = train_ensemble(lambda: RetrievalHead(cfg), [task], [0], TrainConfig(steps=steps), progress=False)
    model = trained.models[0].eval()
    assert isinstance(model, RetrievalHead)
    echo(f"trained a RoPE head (d=64, m=20, K={K}, {steps} steps) in {time.perf_counter() - t0:.1f} s")
    short = (12, 16, 20, 24, 32, 40, 48)
    a_short, acc_short = [], []
    for L in short:
        acc, attn = probes.accuracy_and_attention(model, eval_batch(task, L, 1024, 0))
        a_short.append(probes.attention_at_offset(attn[0], L, -K))
        acc_short.append(acc)
    fit = probes.dilution_fit(short, a_short)
    echo(f"dilution law fitted on L <= 48: 1/a* = {fit['slope']:.4f} (L - 1) + {fit['intercept']:.3f}, "
         f"R^2 {fit['r2']:.3f}; unchunked accuracy at L = {', '.join(map(str, short))}: "
         f"{', '.join(f'{a:.3f}' for a in acc_short)}")
    ctx = multiprocessing.get_context("spawn")
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    rows = []
    echo(f"{'length':>9} {'seconds':>8} {'peak RSS MiB':>13} {'growth MiB':>11} {'accuracy':>9} {'peak':>7} "
         f"{'a*':>9} {'a* (law)':>9}   (n={n_sequences} sequences, key chunk {key_chunk}, 1 thread, "
         f"MALLOC_MMAP_THRESHOLD_={MMAP_THRESHOLD})")
    for L in lengths:
        queue = ctx.Queue()
        proc = start_measured(ctx, _eval_child, (cfg, state, L, n_sequences, key_chunk, K, queue))
        row = queue.get()
        proc.join()
        row["a_star_law"] = 1 / (fit["slope"] * (L - 1) + fit["intercept"])
        rows.append(row)
        echo(f"{L:>9} {row['seconds']:>8.2f} {row['peak_mib']:>13.1f} {row['growth_mib']:>11.1f} "
             f"{row['accuracy']:>9.3f} {row['peak_height']:>7.4f} {row['a_star']:>9.2e} {row['a_star_law']:>9.2e}")
    if figure is not None:
        echo(f"wrote {_draw(figure, rows, short, acc_short, a_short, fit, K)}")
    return rows


def _draw(figure, rows: list[dict], short: tuple[int, ...], acc_short: list, a_short: list, fit: dict, K: int):
    """Accuracy and peak height against L, unchunked and streamed, beside the dilution law fitted on ``short``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from poslab.experiments.outputs import save

    Ls = np.array([r["length"] for r in rows], dtype=float)
    grid = np.geomspace(min(short), max(Ls), 200)
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 3.6))
    a1.semilogx(short, acc_short,
                "o-", label="measured (unchunked)")
    a1.semilogx(Ls, [r["accuracy"] for r in rows], "s-", label="measured (streamed)")
    a1.axhline(1 / 20, color="grey", ls=":", lw=1, label="chance")
    a1.set(xlabel="evaluation length L", ylabel="accuracy", title=f"RoPE, K = {K}: accuracy", ylim=(-0.02, 1.02))
    a1.legend(fontsize=8)
    a2.loglog(short, a_short, "o", label="a* measured (unchunked)")
    a2.loglog(Ls, [r["peak_height"] for r in rows], "s", label="peak height (streamed)")
    a2.loglog(Ls, [r["a_star"] for r in rows], "x", label="a* (streamed)")
    a2.loglog(grid, 1 / (fit["slope"] * (grid - 1) + fit["intercept"]), "-", color="grey",
              label="dilution law 1/(c(L-1)+b), fit L<=48")
    a2.set(xlabel="evaluation length L", ylabel="attention weight", title="peak height vs the dilution law")
    a2.legend(fontsize=8)
    return save(fig, figure)
