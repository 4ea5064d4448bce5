"""model.collect(batch): the documented intermediates of both models, and chunked collection.

Shapes (Transformer, n = s + BOS): attn_scores, pattern [b, h, n, n]; q, k, rot_q, rot_k, v
[b, h, n, d]; resid_pre, resid_post [b, n, D]; logits [b, s, m]. The RetrievalHead has one
query row: q, rot_q [b, h, 1, d], pattern [b, h, 1, s], logits [b, m].
"""

from __future__ import annotations

import pytest
import torch

from poslab.models.intermediates import Intermediates
from poslab.models.retrieval_head import RetrievalHead, RetrievalHeadConfig
from poslab.models.transformer import Transformer, TransformerConfig
from poslab.probes import over_chunks
from poslab.tasks import build_task, eval_batch

M, D, H = 9, 32, 4  # vocabulary, width, heads (d = 8)


def transformer(bos: bool, encoding: str = "rope", seed: int = 0) -> Transformer:
    torch.manual_seed(seed)
    cfg = TransformerConfig(vocab_size=M, d_model=D, n_layers=2, n_heads=H, max_len=32, bos=bos, encoding=encoding)
    return Transformer(cfg).double()


def shift_batch(n: int = 10, length=(5, 12), seed: int = 0):
    return eval_batch(build_task("shift", m=M, K=2), length, n, seed)


@pytest.mark.parametrize("bos", [False, True])
@pytest.mark.parametrize("encoding", ["rope", "mope", "learned"])
def test_transformer_collect_shapes_and_unrotated_q_k(bos, encoding):
    model = transformer(bos, encoding)
    batch = shift_batch()
    inter = model.collect(batch)
    b, s = batch.tokens.shape
    n, d = s + bos, D // H
    assert isinstance(inter, Intermediates) and len(inter.layers) == 2
    assert inter.logits.shape == (b, s, M) and not inter.logits.requires_grad
    torch.testing.assert_close(inter.logits, model(batch.tokens, lengths=batch.lengths))
    assert torch.equal(inter.lengths, batch.lengths) and inter.prefix == int(bos)
    assert inter.embed.shape == (b, n, D) and inter.positions.tolist() == list(range(n))
    for layer in inter.layers:
        assert layer.attn_scores.shape == layer.pattern.shape == (b, H, n, n)
        for x in (layer.q, layer.k, layer.rot_q, layer.rot_k, layer.v):
            assert x.shape == (b, H, n, d) and not x.requires_grad
        assert layer.resid_pre.shape == layer.resid_post.shape == (b, n, D)
        # q and k are the projections rotate_qk turns into rot_q and rot_k
        rot_q, rot_k = model.encoding.rotate_qk(layer.q, layer.k, inter.positions, inter.positions)
        torch.testing.assert_close(rot_q, layer.rot_q)
        torch.testing.assert_close(rot_k, layer.rot_k)
        rotary = encoding != "learned"
        assert rotary == (not torch.allclose(layer.q, layer.rot_q))
    # layer 0's q is W_Q of the normalised embedding
    block = model.layers[0]
    q0 = (block.ln_attn(inter.embed) @ block.W_Q.T).view(b, n, H, d).transpose(1, 2)
    torch.testing.assert_close(inter.layers[0].q, q0)


def test_retrieval_head_collect_shapes_and_unrotated_q_k():
    torch.manual_seed(0)
    model = RetrievalHead(RetrievalHeadConfig(vocab_size=M, d_model=D, n_heads=2, max_len=32)).double()
    batch = eval_batch(build_task("fixed_offset", m=M, K=2), (6, 14), 20, seed=0)
    inter = model.collect(batch)
    b, s = batch.tokens.shape
    layer = inter.layers[0]
    assert inter.logits.shape == (b, M) and torch.equal(inter.lengths, batch.lengths) and inter.prefix == 0
    assert layer.q.shape == layer.rot_q.shape == (b, 2, 1, 16) and layer.k.shape == layer.rot_k.shape == (b, 2, s, 16)
    assert layer.pattern.shape == layer.attn_scores.shape == (b, 2, 1, s)
    torch.testing.assert_close(inter.logits, model(batch.tokens, batch.lengths))
    q_pos = (batch.lengths - 1)[:, None]  # [b, 1]
    rot_q, rot_k = model.encoding.rotate_qk(layer.q, layer.k, q_pos, torch.arange(s))
    torch.testing.assert_close(rot_q, layer.rot_q)
    torch.testing.assert_close(rot_k, layer.rot_k)
    last = inter.embed[torch.arange(b), batch.lengths - 1]  # [b, D]
    torch.testing.assert_close(layer.q[:, :, 0], (last @ model.W_Q.T).view(b, 2, 16))


@pytest.mark.parametrize("bos", [False, True])
def test_over_chunks_concatenates_to_one_collect(bos):
    model = transformer(bos)
    batch = shift_batch(n=11)
    whole = model.collect(batch)
    parts = list(over_chunks(model, batch, chunk=4))
    assert [p.tokens.shape[0] for p, _ in parts] == [4, 4, 3]
    torch.testing.assert_close(torch.cat([p.tokens for p, _ in parts]), batch.tokens)
    torch.testing.assert_close(torch.cat([i.logits for _, i in parts]), whole.logits)
    for name in ("attn_scores", "pattern", "q", "k", "rot_q", "rot_k", "resid_post"):
        for n in range(2):
            torch.testing.assert_close(torch.cat([getattr(i.layers[n], name) for _, i in parts]),
                                       getattr(whole.layers[n], name))
