"""poslab's rotary in place of a checkpoint's: its cos/sin against the model's own, for every Hugging
Face rope type, on the model's own config; and the loss under the identity schedule."""

from __future__ import annotations

import warnings

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="the pretrained extra (transformers) is not installed")
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding  # noqa: E402

from poslab.errors import ConfigError  # noqa: E402
from poslab.positional.rope_scaling import ROPE_SCHEDULES  # noqa: E402
from poslab.pretrained import PoslabRotary, load  # noqa: E402

HEAD, CONTEXT = 32, 512
PAIRS = HEAD // 2
HF_TYPES = {  # every rope type Hugging Face's ROPE_INIT_FUNCTIONS has that poslab also has
    "default": {"rope_type": "default", "rope_theta": 1e5},
    "linear": {"rope_type": "linear", "factor": 4.0, "rope_theta": 1e4},
    "dynamic": {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4},
    "yarn": {"rope_type": "yarn", "factor": 2.0, "rope_theta": 1e4, "original_max_position_embeddings": 256},
    "yarn-mscale": {"rope_type": "yarn", "factor": 2.0, "rope_theta": 1e4, "original_max_position_embeddings": 256,
                    "mscale": 1.0, "mscale_all_dim": 0.5},
    "longrope": {"rope_type": "longrope", "rope_theta": 1e4, "original_max_position_embeddings": 256,
                 "short_factor": [1.0 + 0.05 * i for i in range(PAIRS)],
                 "long_factor": [1.5 + 0.25 * i for i in range(PAIRS)]},
    "llama3": {"rope_type": "llama3", "factor": 8.0, "rope_theta": 5e5, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 128},
}


def hf_rotary(params: dict) -> LlamaRotaryEmbedding:
    config = transformers.LlamaConfig(hidden_size=4 * HEAD, num_attention_heads=4, num_key_value_heads=2,
                                      num_hidden_layers=1, intermediate_size=64, vocab_size=256,
                                      max_position_embeddings=CONTEXT, rope_parameters=dict(params))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return LlamaRotaryEmbedding(config)


def ulps(a, b):
    return int((a.view(torch.int32).long() - b.view(torch.int32).long()).abs().max())


@pytest.mark.parametrize("name", HF_TYPES)
@pytest.mark.parametrize("length", [200, 700])  # inside and past L0 = 256 / L = 512 for the length-dependent
def test_cos_sin_equal_the_models_own(name, length):
    params = HF_TYPES[name]
    theirs = hf_rotary(params)
    ours = PoslabRotary(HEAD, params["rope_theta"], params, max_position_embeddings=CONTEXT)
    pos = torch.arange(length)[None]
    x = torch.zeros(1)
    cos, sin = theirs(x, pos)
    our_cos, our_sin = ours(x, pos)
    assert ours.attention_scaling == pytest.approx(theirs.attention_scaling, rel=1e-12)
    # poslab's frequencies: float64 rounded once; Hugging Face's: float32 arithmetic. At most 2 ulp apart.
    inv_theirs = theirs.inv_freq  # after the forward: the length-dependent update has run
    assert ulps(ours.frequencies(length), inv_theirs) <= 2
    angle_err = length * float(inv_theirs.abs().max()) * 2.4e-7 + 1e-6
    torch.testing.assert_close(our_cos, cos, rtol=0, atol=angle_err * ours.attention_scaling)
    torch.testing.assert_close(our_sin, sin, rtol=0, atol=angle_err * ours.attention_scaling)
    # the assembly itself is the model's, bit for bit: given the model's frequencies, the same cos/sin
    ours.inv_freq = inv_theirs.clone()
    ours.frequencies = lambda seq_len=None: ours.inv_freq
    c2, s2 = ours(x, pos)
    assert torch.equal(c2, cos) and torch.equal(s2, sin)


def test_every_poslab_schedule_runs_on_a_checkpoint(tiny):
    model = load(tiny("llama"))
    tokens = torch.randint(0, 256, (1, 96), generator=torch.Generator().manual_seed(1))
    base = model.token_losses(tokens)
    configs = {"linear": {"factor": 2.0}, "ntk": {"factor": 2.0}, "dynamic": {"factor": 2.0},
               "ntk_by_parts": {"factor": 2.0}, "yarn": {"factor": 2.0}, "llama3": {
                   "factor": 2.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0},
               "longrope": {"short_factor": 1.0, "long_factor": [1.0 + i for i in range(8)], "factor": 2.0},
               "proportional": {"partial_rotary_factor": 0.5}, "default": {}}
    assert set(configs) == set(ROPE_SCHEDULES)  # a new schedule must be added here
    for rope_type, options in configs.items():
        model.set_schedule({"rope_type": rope_type, **options})
        got = model.token_losses(tokens)
        assert torch.isfinite(got).all()
        if rope_type != "default":
            assert float((got - base).abs().max()) > 1e-4, rope_type  # the schedule reaches the attention
    model.set_schedule({"rope_type": "longrope", "short_factor": 1.0, "long_factor": 3.0, "factor": 2.0,
                        "n_hat": 8})
    assert torch.isfinite(model.token_losses(tokens)).all()


@pytest.mark.parametrize("name", ["default", "linear", "dynamic", "yarn", "longrope", "llama3"])
def test_identity_schedule_keeps_the_loss(tiny, name):
    params = dict(HF_TYPES[name])
    if name == "longrope":
        params.update(short_factor=params["short_factor"][:8], long_factor=params["long_factor"][:8],
                      original_max_position_embeddings=32)
    if name in ("yarn",):
        params["original_max_position_embeddings"] = 32
    if name == "llama3":
        params["original_max_position_embeddings"] = 16
    model = load(tiny("llama", rope_parameters=params))
    tokens = torch.randint(0, 256, (2, 60), generator=torch.Generator().manual_seed(2))
    own = model.token_losses(tokens)
    model.set_schedule(None)  # the checkpoint's own schedule, computed by poslab
    torch.testing.assert_close(model.token_losses(tokens), own, rtol=1e-6, atol=1e-6)
    model.restore()
    assert torch.equal(model.token_losses(tokens), own)


def test_rotary_frequencies_follow_the_schedule(tiny):
    model = load(tiny("gpt_neox"))
    theta = model.rotary_frequencies()
    assert theta.shape == (2,)  # partial rotary 0.25 of head 16: 4 channels, 2 pairs
    model.set_schedule({"rope_type": "linear", "factor": 4.0})
    torch.testing.assert_close(model.rotary_frequencies(), theta / 4, rtol=1e-6, atol=0)


def test_bad_schedule_is_one_config_error(tiny):
    model = load(tiny("llama"))
    with pytest.raises(ConfigError, match="rope_type"):
        model.set_schedule({"rope_type": "warp", "factor": 2.0})
