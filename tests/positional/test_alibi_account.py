"""The kernel account's prediction for a monotone bias, on the paper's task (i.i.d. uniform tokens).

- K = 1 (the paper's K = 1 remark): a kernel peaked at 0 plus a suppressed self-logit selects -1.
  Built by hand: ALiBi with a usable slope, W_Q^T W_K = -c I (a key equal to the query token is
  suppressed), W_V and U the identity on one-hot tokens. It retrieves -1 at every length; the
  one-head published slope 2^-8 gives the same selection too little margin to concentrate.
- K >= 2 is unreachable: for any content weights and any slope m > 0 the mean attention at -1 is
  at least that at -K, because the tokens at -1 and -K are exchangeable. Pairing each sequence with
  its swap makes the inequality exact per pair, so the test has no sampling tolerance; the same
  check fails for a T5 table that favours -2, so it can fail.
"""

from __future__ import annotations

import pytest
import torch

from poslab.models.retrieval_head import RetrievalHead, RetrievalHeadConfig
from poslab.tasks import build_task, eval_batch

M, D = 20, 64


def one_hot_head(slope: float, self_suppression: float = 40.0) -> RetrievalHead:
    head = RetrievalHead(RetrievalHeadConfig(vocab_size=M, d_model=D, encoding="alibi", max_len=64,
                                             encoding_options={"slope": slope}))
    eye = torch.eye(D)
    with torch.no_grad():
        head.W_E.copy_(eye[:M])  # token a -> e_a
        head.W_Q.copy_(-self_suppression * D ** 0.5 * eye)  # q . k / sqrt(d) = -c [a == b]
        head.W_K.copy_(eye)
        head.W_V.copy_(eye)
        head.U.copy_(eye[:M])  # logit of token a = attention mass on keys holding a
    return head


def mean_attention(model, tokens: torch.Tensor) -> torch.Tensor:
    """Mean attention of the last query over keys [L], by the direct forward."""
    with torch.no_grad():
        _, inter = model(tokens, return_intermediates=True)
    return inter.layers[0].pattern[:, 0, -1, :].mean(0)  # [b, h, 1, L] -> [L]


@pytest.mark.parametrize("L", [12, 16, 48])
def test_k1_kernel_peaked_at_zero_plus_self_suppression_selects_minus_one(L):
    batch = eval_batch(build_task("fixed_offset", m=M, K=1), L, 2048, 0)
    head = one_hot_head(slope=2.0)
    with torch.no_grad():
        acc = (head(batch.tokens).argmax(-1) == batch.targets.reshape(-1)).float().mean()
    attn = mean_attention(head, batch.tokens)
    assert int(attn.argmax()) == L - 2  # offset -1
    assert acc > 0.95
    flat = one_hot_head(slope=2.0 ** -8)  # the published slope for one head: no margin to speak of
    with torch.no_grad():
        flat_acc = (flat(batch.tokens).argmax(-1) == batch.targets.reshape(-1)).float().mean()
    assert flat_acc < 0.6 and float(mean_attention(flat, batch.tokens).max()) < 2.0 / (L - 1)


def random_head(encoding: str, seed: int, **options) -> RetrievalHead:
    torch.manual_seed(seed)
    head = RetrievalHead(RetrievalHeadConfig(vocab_size=M, d_model=16, encoding=encoding, max_len=64,
                                             encoding_options=options))
    with torch.no_grad():
        for p in (head.W_Q, head.W_K):
            p.mul_(12 * torch.rand(()))  # content logits up to order 10
    return head


def swapped_pairs(L: int, K: int, n: int = 512) -> torch.Tensor:
    g = torch.Generator().manual_seed(K)
    tokens = torch.randint(0, M, (n, L), generator=g)
    swap = tokens.clone()
    swap[:, [L - 2, L - 1 - K]] = tokens[:, [L - 1 - K, L - 2]]
    return torch.cat((tokens, swap))


@pytest.mark.parametrize("K", [2, 3])
@pytest.mark.parametrize("seed", range(6))
def test_a_monotone_bias_never_puts_more_mean_attention_on_minus_k_than_on_minus_one(seed, K):
    slope = [2.0 ** -8, 0.05, 0.5, 2.0, 0.01, 1.0][seed]
    head = random_head("alibi", seed, slope=slope)
    L = 20
    attn = mean_attention(head, swapped_pairs(L, K))
    assert float(attn[L - 2]) >= float(attn[L - 1 - K]) - 1e-6
    assert int(attn.argmax()) != L - 1 - K


def test_the_same_check_fails_for_a_bias_that_favours_minus_two():
    head = random_head("t5", 0, num_buckets=16, max_distance=16)
    with torch.no_grad():
        head.encoding.relative_attention_bias[2] += 8.0  # bucket of distance 2
    L = 20
    attn = mean_attention(head, swapped_pairs(L, 2))
    assert float(attn[L - 3]) > float(attn[L - 2]) and int(attn.argmax()) == L - 3


def test_a_learned_slope_trains_through_the_models_fast_path():
    torch.manual_seed(0)
    head = RetrievalHead(RetrievalHeadConfig(vocab_size=M, d_model=16, encoding="alibi", max_len=32,
                                             encoding_options={"learned_slope": True}))
    task = build_task("fixed_offset", m=M, K=1)
    batch = task.sample(torch.Generator().manual_seed(0), 64, 12)
    head.loss(batch).backward()
    grad = head.encoding.log_slopes.grad
    assert grad is not None and torch.isfinite(grad).all() and float(grad.abs()) > 0
    with torch.no_grad():  # the fast path and the direct forward agree with a learned slope
        fast, direct = head.forward_table(batch.tokens, batch.lengths), head(batch.tokens, batch.lengths)
        torch.testing.assert_close(fast, direct, atol=1e-5, rtol=1e-5)
