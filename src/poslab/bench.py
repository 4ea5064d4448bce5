"""``poslab bench train``: Table 1 training as ``poslab run`` does it, against a plain loop.

Both sides train the same model on the same batches. The ensemble side trains every (K, seed)
member of an encoding in one vectorized pass over the grid fast path, the encodings' groups in
parallel worker processes exactly as ``poslab run`` schedules them; the plain side trains one
model at a time through the direct forward, in this process, right after. Machines like these
are noisy, so the ratio of the two, measured in one run, is the number to read.
"""

from __future__ import annotations

import os
import time
from dataclasses import replace

import torch

from poslab.experiments import phenomenon
from poslab.experiments.config import apply_overrides
from poslab.experiments.executors import worker_pool
from poslab.experiments.runner import members, train_members

members_of = members
from poslab.train import train_plain


def bench_train(*, steps: int = 4000, plain_steps: int = 200, workers: int | None = None, echo=print) -> dict:
    paper = phenomenon.study("paper")
    study = apply_overrides(paper, [f"train.steps={steps}"])
    everyone = members("bench", study)
    groups: dict[str, list] = {}
    for m in everyone:
        groups.setdefault(m.group_key(), []).append(m)
    encodings = study.axis("encoding")
    n_members = len(everyone) // len(groups)
    workers = min(workers or os.cpu_count() or 1, len(groups))
    start = time.perf_counter()
    pool, threads = worker_pool(workers)
    with pool:
        futures = [pool.submit(train_members, group, desc=f"ensemble {group[0].ids['encoding']}", position=i)
                   for i, group in enumerate(groups.values())]
        seconds = [f.result().seconds for f in futures]
    wall = time.perf_counter() - start
    # groups run side by side, so the slowest one sets the pace (worker start-up is in `wall`)
    ensemble_ms = max(seconds) / (steps * n_members * len(encodings)) * 1e3 if workers > 1 else \
        sum(seconds) / (steps * n_members * len(encodings)) * 1e3
    echo(f"ensemble: {len(encodings)} groups x {n_members} members x {steps} steps: training "
         f"{', '.join(f'{s:.1f} s' for s in seconds)} in {workers} worker(s) x {threads} thread(s), {wall:.1f} s wall "
         f"with worker start-up = {ensemble_ms:.3f} ms per member-step")
    plain = {}
    for group in groups.values():
        encoding, make, task = group[0].ids["encoding"], group[0].make_model(), group[0].task
        train_plain(make, task, 0, study.train, steps=10)  # warm-up, not timed
        t0 = time.perf_counter()
        train_plain(make, task, 0, study.train, steps=plain_steps)
        plain[encoding] = (time.perf_counter() - t0) / plain_steps * 1e3
        echo(f"plain loop, {encoding}: {plain[encoding]:.3f} ms/step ({plain_steps} steps) = "
             f"{plain[encoding] / ensemble_ms:.1f}x the ensemble's ms per member-step")
    full = paper.train.steps  # the Table 1 protocol, whatever --steps timed
    plain_total = sum(ms * full * n_members for ms in plain.values()) / 1e3
    ens_total = ensemble_ms * full * n_members * len(encodings) / 1e3
    echo(f"Table 1 training ({full} steps x {n_members} members x {len(encodings)} encodings): ensemble "
         f"{ens_total:.0f} s{'' if steps == full else ' (projected)'}, plain loop {plain_total:.0f} s (projected), "
         f"speed-up {plain_total / ens_total:.1f}x")
    return dict(wall=wall, ensemble_ms=ensemble_ms, plain_ms=plain, speedup=plain_total / ens_total)


# ----------------------------------------------------------------------------- poslab bench lm

class PlainGPT(torch.nn.Module):
    """The LM written plainly, for ``bench_lm``: the same layers, widths and parameters as poslab's
    Transformer with ``bias=False`` (pre-LN, GELU MLP, untied readout), nanoGPT-style code with one
    fused q/k/v projection and ``F.scaled_dot_product_attention(is_causal=True)``; positions are
    a learned table added at the input, or RoPE applied to q and k."""

    def __init__(self, vocab_size: int, d_model: int, n_layers: int, n_heads: int, context: int, encoding: str):
        super().__init__()
        from torch import nn

        self.h, self.encoding = n_heads, encoding
        self.W_E = nn.Parameter(torch.randn(vocab_size, d_model))
        if encoding == "learned":
            self.W_pos = nn.Parameter(torch.randn(context, d_model))
        d = d_model // n_heads
        theta = 10000.0 ** (-torch.arange(0, d, 2).float() / d)  # [d / 2]
        angle = torch.arange(context)[:, None] * theta  # [s, d / 2]
        self.register_buffer("cos", angle.cos().repeat_interleave(2, -1), persistent=False)  # [s, d]
        self.register_buffer("sin", angle.sin().repeat_interleave(2, -1), persistent=False)
        self.layers = nn.ModuleList(nn.ModuleDict(dict(
            ln_1=nn.LayerNorm(d_model, bias=False), qkv=nn.Linear(d_model, 3 * d_model, bias=False),
            out=nn.Linear(d_model, d_model, bias=False), ln_2=nn.LayerNorm(d_model, bias=False),
            mlp=nn.Sequential(nn.Linear(d_model, 4 * d_model, bias=False), nn.GELU(),
                              nn.Linear(4 * d_model, d_model, bias=False)))) for _ in range(n_layers))
        self.ln_f = nn.LayerNorm(d_model, bias=False)
        self.U = nn.Linear(d_model, vocab_size, bias=False)

    def _rope(self, x):  # x [b, h, s, d], pairs (2i, 2i + 1) rotated by angle s theta_i
        s = x.shape[-2]
        pair = torch.stack((-x[..., 1::2], x[..., 0::2]), dim=-1).flatten(-2)
        return x * self.cos[:s] + pair * self.sin[:s]

    def forward(self, tokens):
        b, s = tokens.shape
        x = torch.nn.functional.embedding(tokens, self.W_E)
        if self.encoding == "learned":
            x = x + self.W_pos[:s]
        for layer in self.layers:
            q, k, v = layer["qkv"](layer["ln_1"](x)).view(b, s, 3, self.h, -1).permute(2, 0, 3, 1, 4)
            if self.encoding == "rope":
                q, k = self._rope(q), self._rope(k)
            o = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + layer["out"](o.transpose(1, 2).reshape(b, s, -1))
            x = x + layer["mlp"](layer["ln_2"](x))
        return self.U(self.ln_f(x))


def bench_lm(*, steps: int = 100, members: int = 2, encoding: str = "learned", preset: str = "paper",
             echo=print) -> dict:
    """The LM training step as ``poslab run lm`` takes it (the ensemble trainer, one member) beside
    the plain model above in a plain loop, same recipe and batches, in this process, interleaved
    twice (the better time of each side counts); then the ensemble's cost per member for 1 and
    ``members`` members, with the fused kernel looped under vmap and with the explicit path."""
    import torch.nn.functional as F

    from poslab import attention as attention_module
    from poslab.errors import ConfigError
    from poslab.experiments.lm import lm_study
    from poslab.train import DataStream, _optimizer, _set_lr, train_ensemble

    if encoding not in ("learned", "rope"):
        raise ConfigError("--encoding", encoding, "learned or rope (the plain model writes these two)")
    for field, value in (("--steps", steps), ("--members", members)):
        if not (isinstance(value, int) and value >= 1):
            raise ConfigError(field, value, "a positive integer")
    study = lm_study(preset, encodings=(encoding,), seeds=members)
    group = members_of("bench", study)
    make, task, cfg = group[0].make_model(), group[0].task, study.train
    m, L = group[0].model_config, cfg.max_length
    warm = 3

    def poslab_ms(E: int) -> float:
        result = train_ensemble(make, [task] * E, list(range(E)), replace(cfg, steps=steps + warm, warmup_steps=0),
                                progress=False)
        return result.seconds / (steps + warm) * 1e3

    def plain_ms() -> float:
        torch.manual_seed(0)
        model = PlainGPT(m.vocab_size, m.d_model, m.n_layers, m.n_heads, L, encoding)
        opt = _optimizer(dict(model.named_parameters()), cfg)
        stream = DataStream(task, 0, cfg)
        for step in range(steps + warm):
            if step == warm:
                start = time.perf_counter()
            batch = stream.next()
            loss = F.cross_entropy(model(batch.tokens).flatten(0, 1), batch.targets.flatten())
            opt.zero_grad(set_to_none=True)
            _set_lr(opt, cfg, step)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
            opt.step()
        return (time.perf_counter() - start) / steps * 1e3

    ours, plain = [], []
    for _ in range(2):
        ours.append(poslab_ms(1))
        plain.append(plain_ms())
    params = sum(p.numel() for p in make().parameters())
    echo(f"lm {preset} ({encoding}, {params:,} parameters, batch {cfg.batch_size} x {L}), {steps} steps, "
         f"{torch.get_num_threads()} thread(s): poslab {min(ours):.1f} ms/step (runs {', '.join(f'{t:.1f}' for t in ours)}),"
         f" plain SDPA model {min(plain):.1f} ms/step (runs {', '.join(f'{t:.1f}' for t in plain)}): "
         f"ratio {min(ours) / min(plain):.2f}x (target <= 1.1x)")
    per_member = {}
    for E in sorted({1, members}):
        per_member[E] = poslab_ms(E) / E
        echo(f"ensemble of {E}: {per_member[E] * E:.1f} ms/step = {per_member[E]:.1f} ms per member-step")
    explicit = None
    if members > 1:
        saved = attention_module.FUSED_UNDER_VMAP
        attention_module.FUSED_UNDER_VMAP = False
        try:
            explicit = poslab_ms(members) / members
        finally:
            attention_module.FUSED_UNDER_VMAP = saved
        echo(f"ensemble of {members}, explicit attention under vmap instead of the looped fused kernel: "
             f"{explicit:.1f} ms per member-step")
    return dict(poslab_ms=min(ours), plain_ms=min(plain), ratio=min(ours) / min(plain), per_member_ms=per_member,
                explicit_under_vmap_ms=explicit)
