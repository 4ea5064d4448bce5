"""The plain-SDPA baseline of ``poslab bench lm`` computes what poslab's Transformer computes: the
same logits with copied weights, for both encodings the benchmark compares."""

import pytest
import torch

from poslab.bench import PlainGPT
from poslab.models.transformer import Transformer, TransformerConfig


@pytest.mark.parametrize("encoding", ["rope", "learned"])
def test_plain_gpt_equals_transformer_with_copied_weights(encoding):
    torch.manual_seed(0)
    V, D, layers, heads, context = 13, 32, 2, 4, 24
    ours = Transformer(TransformerConfig(vocab_size=V, d_model=D, n_layers=layers, n_heads=heads, encoding=encoding,
                                         max_len=context, bias=False)).eval()
    plain = PlainGPT(V, D, layers, heads, context, encoding).eval()
    with torch.no_grad():
        plain.W_E.copy_(ours.W_E)
        if encoding == "learned":
            plain.W_pos.copy_(ours.encoding.W_pos[:context])
        for mine, block in zip(plain.layers, ours.layers, strict=True):
            mine["ln_1"].weight.copy_(block.ln_attn.weight)
            mine["qkv"].weight.copy_(torch.cat((block.W_Q, block.W_K, block.W_V)))
            mine["out"].weight.copy_(block.W_O)
            mine["ln_2"].weight.copy_(block.ln_mlp.weight)
            mine["mlp"].load_state_dict(block.MLP.state_dict())
        plain.ln_f.weight.copy_(ours.ln_final.weight)
        plain.U.weight.copy_(ours.U)
        tokens = torch.randint(0, V, (3, context))
        torch.testing.assert_close(plain(tokens), ours(tokens), atol=1e-5, rtol=1e-5)
        # and it is not vacuous: another readout gives other logits
        plain.U.weight.mul_(1.5)
        assert not torch.allclose(plain(tokens), ours(tokens), atol=1e-3)


def test_bench_profile_splits_a_study_into_phases_that_add_up():
    from poslab.bench import PHASES, bench_profile

    got = bench_profile("k1", preset="quick", overrides=("seeds=1", "train.steps=5", "eval.n_sequences=16",
                                                          "eval.lengths=[12]"), echo=lambda *_: None)
    seconds = {r["phase"]: r["seconds"] for r in got["rows"]}
    assert set(seconds) == {*PHASES, "other"} and all(v >= 0 for v in seconds.values())
    assert sum(seconds.values()) <= got["wall"] * 1.001  # the phases never count time twice
    for phase in ("sampling", "forward", "backward", "optimizer", "evaluation", "tables and figures"):
        assert seconds[phase] > 0, phase
