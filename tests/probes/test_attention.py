"""Mean attention per layer and head: on hand-built patterns with known means, and on a Transformer
(with and without BOS), chunked equal to unchunked."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from poslab import probes
from poslab.models.intermediates import Intermediates, LayerIntermediates
from poslab.models.transformer import Transformer, TransformerConfig
from poslab.tasks import build_task, eval_batch


def with_pattern(pattern: torch.Tensor, lengths: torch.Tensor | None, prefix: int = 0) -> Intermediates:
    b, _, _, s = pattern.shape
    z = torch.zeros(b, s, 1)
    layer = LayerIntermediates(attn_scores=pattern, pattern=pattern, q=pattern, k=pattern, rot_q=pattern,
                               rot_k=pattern, v=pattern, resid_pre=z, resid_post=z)
    return Intermediates(embed=z, positions=torch.arange(s), layers=[layer], lengths=lengths, prefix=prefix)


def one_hot_rows(b: int, h: int, s: int, columns: list[list[int]]) -> torch.Tensor:
    """pattern [b, h, s, s] whose query i of sequence b, head r attends to key columns[b][r] only."""
    pattern = torch.zeros(b, h, s, s, dtype=torch.float64)
    for i in range(b):
        for r in range(h):
            pattern[i, r, :, columns[i][r]] = 1.0
    return pattern


def test_attention_sum_reads_each_sequences_last_query():
    # sequence 0 (L=4): last query at 3; sequence 1 (L=2): at 1. Give those rows distinct weights.
    pattern = torch.zeros(2, 1, 4, 4, dtype=torch.float64)
    pattern[0, 0, 3] = torch.tensor([0.1, 0.2, 0.3, 0.4])
    pattern[1, 0, 1] = torch.tensor([0.5, 0.5, 0.0, 0.0])
    pattern[1, 0, 3] = 9.0  # a padded query's row: never read
    inter = with_pattern(pattern, torch.tensor([4, 2]))
    torch.testing.assert_close(probes.attention_sum(inter), torch.tensor([[0.6, 0.7, 0.3, 0.4]], dtype=torch.float64))
    torch.testing.assert_close(probes.attention_sum(inter, L=2), torch.tensor([[0.6, 0.7]], dtype=torch.float64))
    torch.testing.assert_close(probes.last_query_attention(inter)[1, 0], pattern[1, 0, 1])


def test_pattern_sum_counts_only_real_queries():
    pattern = one_hot_rows(2, 2, 3, [[0, 2], [1, 1]])
    inter = with_pattern(pattern, torch.tensor([3, 1]))
    total, live = probes.pattern_sum(inter)
    assert live.tolist() == [2, 1, 1]
    expected = torch.zeros(2, 3, 3, dtype=torch.float64)
    expected[0, :, 0] += torch.tensor([1.0, 1, 1])  # sequence 0, head 0, every query real
    expected[1, :, 2] += torch.tensor([1.0, 1, 1])  # sequence 0, head 1
    expected[:, 0, 1] += 1.0  # sequence 1: only query 0 is real
    torch.testing.assert_close(total, expected)


def model(bos: bool) -> Transformer:
    torch.manual_seed(0)
    return Transformer(TransformerConfig(vocab_size=6, d_model=16, n_layers=2, n_heads=4, max_len=24, bos=bos))


@pytest.mark.parametrize("bos", [False, True])
def test_transformer_mean_attention_by_layer_is_chunk_invariant_and_naive(bos):
    net = model(bos)
    L = 10
    batch = eval_batch(build_task("shift", m=6, K=2), L, 40, seed=0)
    by_layer = probes.mean_attention_by_layer(net, batch)
    assert by_layer.shape == (2, 4, L + bos)
    np.testing.assert_allclose(by_layer.sum(-1), 1.0, rtol=1e-6)
    np.testing.assert_allclose(probes.mean_attention_by_layer(net, batch, chunk=9), by_layer, rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(probes.mean_attention(net, batch), by_layer[0])
    with torch.no_grad():
        _, inter = net(batch.tokens, return_intermediates=True)
    for n in range(2):
        naive = inter.layers[n].pattern[:, :, -1].mean(0).numpy()  # every sequence is full: last row
        np.testing.assert_allclose(by_layer[n], naive, rtol=1e-5, atol=1e-7)
    p = probes.peak(by_layer[0][0], L + bos)
    assert p["peak_offset"] == p["peak_position"] - (L + bos - 1)


@pytest.mark.parametrize("bos", [False, True])
def test_transformer_mean_pattern_on_mixed_lengths_is_chunk_invariant(bos):
    net = model(bos)
    batch = eval_batch(build_task("shift", m=6, K=2), (3, 9), 30, seed=1)
    whole = probes.mean_pattern(net, batch)
    n = batch.tokens.shape[1] + bos
    assert whole.shape == (2, 4, n, n)
    np.testing.assert_allclose(probes.mean_pattern(net, batch, chunk=7), whole, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(whole.sum(-1), 1.0, rtol=1e-6)  # every query row is some sequence's real one
    assert (np.triu(whole, 1) == 0).all()  # causal
    # naive: the mean of query i's row over the sequences in which it is real
    inter = net.collect(batch)
    for i in range(n):
        real = (batch.lengths + bos) > i
        naive = inter.layers[1].pattern[real][:, :, i].double().mean(0).numpy()
        np.testing.assert_allclose(whole[1, :, i], naive, rtol=1e-6, atol=1e-9)
