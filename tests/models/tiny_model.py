"""The tiny float64 Transformer the model tests build (vocabulary M, d_model 16, 2 layers, 2 heads), and a batch
of its tokens; each test file binds its own sequence length and defaults (functools.partial)."""

import torch

from poslab.models.transformer import Transformer, TransformerConfig

M = 7  # vocabulary


def make(seed=0, **overrides):
    torch.manual_seed(seed)
    options = dict(vocab_size=M, d_model=16, n_layers=2, n_heads=2, max_len=32) | overrides
    return Transformer(TransformerConfig(**options)).double()


def tokens(b=3, s=6, seed=1):
    return torch.randint(0, M, (b, s), generator=torch.Generator().manual_seed(seed))
