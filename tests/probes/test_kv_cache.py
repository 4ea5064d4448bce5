"""A KV cache under Dynamic NTK: the own-step rotation is what a cached decoder computes; it equals
the recompute within L0 and differs past it; on a checkpoint, the checkpoint's own cache."""

import pytest
import torch

from poslab import survey
from poslab.errors import ConfigError
from poslab.probes import kv_cache as kv

L0 = 16  # the registry's small schedules: original_max_position_embeddings 16


def tokens(L: int) -> torch.Tensor:
    return torch.randint(0, survey.TINY["vocab_size"], (2, L), generator=torch.Generator().manual_seed(0))


def test_own_step_rotation_is_causal_and_equals_the_model_within_L0():
    model = survey.tiny_model("rope_dynamic", 64)
    x = tokens(64)
    cached = kv.cached_model(model)
    with torch.no_grad():
        full = cached(x)
        assert torch.allclose(full[:, :40], cached(x[:, :40]), atol=1e-6)  # row t is fixed once step t is done
        assert torch.allclose(full[:, :L0], model(x[:, :L0]), atol=1e-6)  # scale 1 up to L0


def test_cached_and_recompute_agree_within_L0_and_differ_past_it():
    model = survey.tiny_model("rope_dynamic", 64)
    rows = {r["step"]: r for r in kv.cache_gap(model, tokens(64), [L0 - 1, L0, 40, 62])}
    assert rows[L0 - 1]["logit_gap"] < 1e-5
    assert rows[40]["logit_gap"] > 1e-3 and rows[62]["logit_gap"] > 1e-3


def test_own_step_refuses_a_schedule_that_is_not_length_dependent():
    with pytest.raises(ConfigError, match="length-dependent"):
        kv.cached_model(survey.tiny_model("rope", 32))


def test_survey_kv_cache_cell_is_measured_for_length_dependent_schedules():
    assert survey.kv_cache_cell("rope") == "yes" and survey.kv_cache_cell("alibi") == "yes"
    cell = survey.kv_cache_cell("rope_dynamic")
    assert cell.startswith("no (logit gap ") and float(cell.split()[3]) > 0


def test_checkpoint_cache_equals_recompute_with_its_own_rotary_and_not_under_dynamic(tmp_path):
    pytest.importorskip("transformers")
    from poslab.pretrained.model import load
    from poslab.pretrained.tiny import tiny_checkpoint
    from poslab.studies.implementation import with_dynamic

    model = load(str(tiny_checkpoint("llama", tmp_path / "llama")))
    x = torch.randint(3, 256, (1, 48), generator=torch.Generator().manual_seed(0))
    steps = [10, 15, 30, 46]
    kept, _ = kv.hf_cached_logits(model.hf, x, 8, steps)
    assert max((kept[t] - kv.hf_recompute_logits(model.hf, x, t)).abs().max() for t in steps) < 1e-5
    with_dynamic(model, dict(L0=16, factor=2.0))
    assert model.context == 64  # put back
    kept, _ = kv.hf_cached_logits(model.hf, x, 8, steps)
    gap = {t: float((kept[t] - kv.hf_recompute_logits(model.hf, x, t)).abs().max()) for t in steps}
    assert gap[10] < 1e-5 and gap[15] < 1e-5 and gap[30] > 1e-4 and gap[46] > 1e-4
    # the one greedy decoder (poslab.pretrained.model.greedy): recomputing, each token is the argmax of a
    # forward of everything before it; cached after a prefill of 8, each is the cached logits' argmax
    prompt = x[:, :40]
    recomputed = model.greedy(prompt, 3, cached=False)
    seq = prompt
    for token in recomputed:
        assert token == int(kv.hf_recompute_logits(model.hf, seq, seq.shape[1] - 1).argmax())
        seq = torch.cat((seq, torch.tensor([[token]])), 1)
    cached = model.greedy(prompt, 3, prefill=8)
    kept, _ = kv.hf_cached_logits(model.hf, torch.cat((prompt, torch.tensor([cached])), 1), 8, [39, 40, 41])
    assert cached == [int(kept[t].argmax()) for t in (39, 40, 41)]
    model.restore()  # the checkpoint's own rotary: a cache changes nothing, whatever the prefill
    assert model.greedy(prompt, 3) == model.greedy(prompt, 3, prefill=8) == model.greedy(prompt, 3, cached=False)
