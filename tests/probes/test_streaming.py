"""Streamed (chunked, online-softmax) evaluation equals the unchunked fast path where both fit,
and its memory does not grow with the length."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from poslab import probes
from poslab.errors import ConfigError
from poslab.models.retrieval_head import RetrievalHead, RetrievalHeadConfig
from poslab.probes.streaming import StreamedTokens, TensorTokens, stream_attend, stream_length_row
from poslab.tasks import build_task, eval_batch


@pytest.mark.parametrize("encoding", ["rope", "learned", "alibi", "nope", "t5"])
def test_streamed_equals_unchunked(encoding):
    torch.manual_seed(0)
    L, K = 37, 2
    model = RetrievalHead(RetrievalHeadConfig(vocab_size=7, d_model=16, n_heads=2, encoding=encoding,
                                              max_len=64)).eval()
    batch = eval_batch(build_task("fixed_offset", m=7, K=K), L, 9, 3)
    with torch.no_grad():
        ref_logits, ref_w = model.attend(batch.tokens, batch.lengths, L - 1, 1)  # [b, m], [h, b, L]
    src = TensorTokens(batch.tokens)
    logits, lse = stream_attend(model, src, L, key_chunk=5)  # 8 chunks, the last one short
    torch.testing.assert_close(logits, ref_logits, rtol=1e-5, atol=1e-5)
    row = stream_length_row(model, src, L, K, key_chunk=5, mass_below=16)
    acc, attn = probes.accuracy_and_attention(model, batch)
    assert row["accuracy"] == acc
    mean = ref_w[0].double().mean(0).numpy()
    assert row["peak_position"] == int(mean.argmax())
    assert row["peak_height"] == pytest.approx(float(mean.max()), rel=1e-5)
    assert row["a_star"] == pytest.approx(float(mean[L - 1 - K]), rel=1e-5)
    assert row["in_range_mass"] == pytest.approx(float(mean[:16].sum()), rel=1e-5)
    assert row["peak_height"] == pytest.approx(probes.peak(attn[0], L)["peak_height"], rel=1e-5)


def test_streamed_tokens_are_reproducible_and_chunk_consistent():
    src = StreamedTokens(b=3, m=5, L=50, seed=1, chunk=8)
    whole = src(0, 50)
    assert whole.shape == (3, 50) and int(whole.max()) < 5
    assert torch.equal(src(13, 29), whole[:, 13:29])
    assert torch.equal(StreamedTokens(b=3, m=5, L=50, seed=1, chunk=8)(0, 50), whole)


def test_streaming_refuses_length_dependent_rope():
    model = RetrievalHead(RetrievalHeadConfig(vocab_size=5, d_model=8, encoding="rope_dynamic", max_len=64))
    with pytest.raises(ConfigError):
        stream_attend(model, StreamedTokens(b=1, m=5, L=20), 20)


def test_long_length_runs_in_bounded_memory():
    """A length 64x the chunk: finite numbers, a normalised attention (sum of the mean weights ~1)."""
    model = RetrievalHead(RetrievalHeadConfig(vocab_size=5, d_model=8, encoding="rope", max_len=64)).eval()
    L = 64 * 256
    row = stream_length_row(model, StreamedTokens(b=4, m=5, L=L, chunk=256), L, 2, key_chunk=256)
    assert 0 <= row["accuracy"] <= 1 and 0 < row["peak_height"] <= 1 and np.isfinite(row["a_star"])
