"""The plain reference models the benchmarks time poslab against: :class:`PlainGPT`, the character
LM written plainly (nanoGPT style). The plain training loop is :func:`poslab.train.train_plain`."""

from __future__ import annotations

import torch


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
