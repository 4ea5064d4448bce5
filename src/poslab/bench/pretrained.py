"""``poslab bench pretrained``: a checkpoint's position-wise loss against its own forward."""

from __future__ import annotations

import time

import torch

from poslab.bench.measure import peak_since_reset


def bench_pretrained(*, model: str = "smollm2-135m", lengths=(2048,), threads: int = 1, echo=print) -> list[dict]:
    """The position-wise loss of a pretrained checkpoint (``token_losses``: its body once, readout
    and loss in chunks) beside the checkpoint's own forward (full logits) at each length, one
    window of text, ``threads`` threads: seconds and peak resident memory added, side by side in
    one run (this machine is noisy: read the ratio)."""
    from poslab.errors import ConfigError
    from poslab.pretrained import encode_text, load
    from poslab.studies.kit.checkpoints import checkpoint_source
    from poslab.tasks.text import CharText

    torch.set_num_threads(threads)
    source = checkpoint_source(model)
    lm = load(source.path if source.kind != "hub" else source.name)
    ids = encode_text(lm, CharText(split="val").text)
    rows = []
    for L in lengths:
        if ids.numel() < L:
            raise ConfigError("--lengths", L, f"at most {ids.numel()} (the validation split's tokens)")
        tokens = ids[:L][None]
        got = {}
        for name, fn in (("forward", lambda t=tokens: lm(t)), ("token_losses", lambda t=tokens: lm.token_losses(t))):
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            rss0, _ = peak_since_reset()
            start = time.perf_counter()
            with torch.no_grad():
                fn()
            got[name] = (time.perf_counter() - start, peak_since_reset()[1] - rss0)
        row = dict(length=L, threads=threads, forward_s=got["forward"][0], losses_s=got["token_losses"][0],
                   ratio=got["token_losses"][0] / got["forward"][0], forward_peak_mib=got["forward"][1],
                   losses_peak_mib=got["token_losses"][1])
        rows.append(row)
        echo(f"L={L:,}: forward {row['forward_s']:.1f} s (+{row['forward_peak_mib']:.0f} MiB peak), "
             f"token_losses {row['losses_s']:.1f} s (+{row['losses_peak_mib']:.0f} MiB peak): "
             f"{row['ratio']:.2f}x the forward's time, {threads} thread(s)")
    return rows
