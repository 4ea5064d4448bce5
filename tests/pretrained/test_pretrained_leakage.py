"""pretrained-leakage end to end on tiny random checkpoints: the sink share against a plain HF
forward, BOS windows, the closed-system check, derived rows, storage and resume, refusals."""

from __future__ import annotations

import dataclasses

import pytest

pytest.importorskip("transformers", reason="the pretrained extra (transformers) is not installed")
import torch

from poslab.errors import ConfigError
from poslab.experiments import run_study, validate
from poslab.store import Store
from poslab.studies import get_experiment
from poslab.studies.pretrained_leakage import bos_id, derived_rows, evaluate_mode, windows

EXP = get_experiment("pretrained-leakage")
TEXT = "To be, or not to be, that is the question. Whether 'tis nobler in the mind to suffer. " * 8


def config(**kw):
    return dict(dict(bos="with BOS", length=40, windows=4, first_query=16, ntk_factor=4.0, window=8), **kw)


def test_sink_share_is_the_attention_on_key_0_of_a_plain_eager_forward(tiny):
    from poslab.pretrained import encode_text, load

    model = load(str(tiny("llama")))
    ids = encode_text(model, TEXT)
    rows = evaluate_mode(model, ids, config(bos="without BOS"))
    tokens = windows(model, ids, config(bos="without BOS"))
    model.hf.set_attn_implementation("eager")
    with torch.no_grad():
        att = model.hf(input_ids=tokens, output_attentions=True).attentions  # per layer [b, h, n, n]
    for r in (r for r in rows if r["probe"] == "head"):
        want = float(att[r["layer"]][:, r["head"], 16:, 0].mean())
        assert r["sink_share"] == pytest.approx(want, abs=1e-5)
    assert not any(r["probe"] == "closed" for r in rows)  # the closed-system check runs in the BOS mode


def test_bos_mode_puts_the_bos_first_and_the_closed_system_check_separates_the_inputs(tiny):
    from poslab.pretrained import encode_text, load

    model = load(str(tiny("llama")))
    ids = encode_text(model, TEXT)
    tokens = windows(model, ids, config())
    assert tokens.shape == (4, 40) and (tokens[:, 0] == bos_id(model)).all()
    assert torch.equal(tokens[0, 1:], ids[:39])
    rows = evaluate_mode(model, ids, config())
    closed = [r for r in rows if r["probe"] == "closed"]
    heads = {r["variant"] for r in rows if r["probe"] == "head"}
    assert heads == {"standard", "NTK RoPE (inference)", "sliding window (inference)"}
    assert {r["intervention"] for r in rows if r["probe"] == "intervention"} == {"bos_token", "bos_random", "bos_mean"}
    assert model.schedule is None and model.window is None  # variants undone
    assert [r["layer"] for r in closed] == [0, 1, 2]
    assert all(r["bos_at_0"] == pytest.approx(1.0, abs=1e-6) for r in closed)
    assert all(r["content_at_0"] < 0.99 for r in closed)  # different first tokens, different trajectories


def test_a_sliding_window_checkpoint_runs_with_its_own_window(tiny):
    from poslab.pretrained import encode_text, load

    model = load(str(tiny("mistral")))
    rows = evaluate_mode(model, encode_text(model, TEXT), config(length=32))
    assert len([r for r in rows if r["probe"] == "head" and r["variant"] == "standard"]) == 2 * 4
    assert model.window == 16  # the inference window (8) is undone: the checkpoint's own again


def test_derived_rows_count_sink_heads_per_mode():
    rows = [dict(probe="head", bos=m, layer=0, head=h, sink_share=s, sink=float(s >= 0.3), component_a=0.1,
                 component_b=0.2, component_b_key0=0.15, component_b_rest=0.05, early_component_b=0.3,
                 early_component_b_key0=0.2) for m, shares in (("with BOS", (0.9, 0.1, 0.5)),
                                                               ("without BOS", (0.0, 0.2, 0.1)))
            for h, s in enumerate(shares)]
    got = {r["bos"]: r for r in derived_rows(rows) if r["probe"] == "model"}
    assert got["with BOS"]["sink_heads"] == 2 and got["without BOS"]["sink_heads"] == 0
    assert got["with BOS"]["sink_share"] == pytest.approx(0.5)


def test_derived_rows_order_the_variants_and_relate_each_swap_to_the_standard_model():
    def heads(variant, b, early):
        return [dict(probe="head", bos="with BOS", variant=variant, layer=0, head=h, sink_share=0.5, sink=1.0,
                     component_a=0.1, component_b=b, component_b_key0=b / 2, component_b_rest=b / 2,
                     early_component_b=early, early_component_b_key0=early / 2) for h in range(2)]

    rows = heads("standard", 0.2, 0.5) + heads("NTK RoPE (inference)", 0.15, 0.4) + \
        heads("sliding window (inference)", 0.3, 0.6)
    rows += [dict(probe="intervention", intervention=name, layer=0, head=h, early_component_b=early)
             for h in range(2) for name, early in (("bos_token", 0.3), ("bos_mean", 0.25), ("bos_random", 0.32))]
    got = derived_rows(rows)
    (contrast,) = [r for r in got if r["probe"] == "contrast"]
    assert contrast["standard_minus_ntk"] == pytest.approx(0.05) and contrast["margin"] == pytest.approx(0.05)
    assert contrast["standard_minus_ntk_key0"] == pytest.approx(0.025)
    swap = {r["intervention"]: r for r in got if r["probe"] == "swap"}
    assert swap["bos_token"]["change"] == pytest.approx(-0.4)  # (0.3 - 0.5) / 0.5
    (three,) = [r for r in got if r["probe"] == "swap3"]  # -40%, -50%, -36%: all within 20 points of -40%
    assert three["swap_agree"] and three["swap_decisive"] == pytest.approx(-0.5)  # the farthest decides
    assert (three["swap_min"], three["swap_max"]) == pytest.approx((-0.5, -0.36))


def test_claims_in_the_checkpoints_own_set_up_are_paper_and_the_bos_swap_needs_all_three():
    from poslab.studies import pretrained_leakage as plk
    from poslab.studies.kit.leakage_rows import three_swaps

    specs = {c.name: c for c in plk.CLAIMS}
    assert all(c.role in ("control", "check") for n, c in specs.items() if "not its set-up" in n)
    assert specs["{label}, {bos}, its own set-up: component (b) at key 0 present"].role == "paper"
    assert specs["{label}: BOS swap changes early (b) (the checkpoint's set-up)"].na.kind == "undecidable"

    def swap_claims(changes, setup):
        rows = [dict(probe="swap3", seed=None, label="M", setup=setup, **three_swaps(changes))]
        study = dataclasses.replace(EXP.study("cpu"))
        return {c.name: c for c in plk.judge_all(plk.claims_for(study), rows)}

    own = "M, with BOS, its own set-up: BOS swap changes early (b), all three replacements"
    got = swap_claims(dict(token=-0.45, mean=-0.3, random=-0.5), "own")
    assert got[own].holds is True and got[own].role == "paper"
    assert swap_claims(dict(token=0.168, mean=0.051, random=0.5), "own")[own].holds is False
    split = swap_claims(dict(token=0.168, mean=0.051, random=-0.263), "other")  # the stored SmolLM2 run's three
    other = split["M, with BOS, not its set-up: BOS swap changes early (b), all three replacements"]
    assert other.holds is None and other.na_kind == "undecidable" and other.measured == "-26.3% to +16.8%"
    assert other.role == "control" and split["M: BOS swap changes early (b) (the checkpoint's set-up)"].holds is None


def test_replacements_have_the_published_definitions(tiny):
    from poslab.pretrained import encode_text, load
    from poslab.studies.pretrained_leakage import replacements

    model = load(str(tiny("llama")))
    tokens = windows(model, encode_text(model, TEXT), config())
    got = replacements(model, tokens)
    W_E = model.hf.get_input_embeddings().weight.detach()
    assert torch.equal(got["token"], W_E[int(torch.bincount(tokens[:, 1:].flatten()).argmax())])
    assert float(got["random"].norm()) == pytest.approx(float(W_E[bos_id(model)].norm()), rel=1e-5)
    torch.testing.assert_close(got["mean"], W_E.mean(0))


def test_swap_rows_on_windows_cut_at_first_query_equal_the_full_windows(tiny):
    """Early (b) reads queries i < first_query only, which under a causal mask see positions
    < first_query only: the swaps' cut windows give what the full windows give."""
    from poslab.models.intervention import Intervention
    from poslab.pretrained import encode_text, load
    from poslab.probes import leakage as lk
    from poslab.studies.pretrained_leakage import replacements, swap_intervention_rows
    from poslab.tasks.base import Batch

    model = load(str(tiny("llama")))
    cfg = config()
    tokens = windows(model, encode_text(model, TEXT), cfg)
    batch = Batch(tokens=tokens, targets=tokens, lengths=torch.full((len(tokens),), tokens.shape[1]),
                  loss_mask=torch.ones_like(tokens, dtype=torch.bool))
    rows = swap_intervention_rows(model, batch, cfg)
    x0 = replacements(model, tokens)["random"]
    full = lk.leakage(model, batch, intervention=Intervention(bos_embedding=x0), early=cfg["first_query"], chunk=2)
    got = {(r["layer"], r["head"]): r["early_component_b"] for r in rows if r["intervention"] == "bos_random"}
    assert len(got) == model.n_layers * model.n_heads
    for (layer, head), value in got.items():
        assert value == pytest.approx(float(full["early_component_b"][layer, head]), abs=1e-6)


def test_quick_runs_stores_resumes_and_judges_the_architectural_claims(tmp_path):
    study = dataclasses.replace(EXP.study("quick"), model={**EXP.study("quick").model, "windows": 4, "length": 32})
    with Store(tmp_path / "s.sqlite") as store:
        first = run_study(EXP, study, store=store, out=tmp_path / "out", progress=False)
        assert first["members"] == 2 and first["trained"] == 2
        again = run_study(EXP, study, store=store, out=tmp_path / "out", progress=False)
        assert again["trained"] == 0 and again["reused"] == 2
    text = (tmp_path / "out" / "table.md").read_text()
    assert ("| check | tiny Llama, with BOS: position-0 residual identical across inputs | constant "
            "fingerprint with BOS | 1.000 | > 0.9999 | yes |") in text
    assert "| control | tiny Llama, with BOS, not its set-up: sink heads exist" in text
    assert "n.a. (not run: a trained checkpoint (the cpu preset)" in text
    assert "| paper | tiny Llama, content token at 0: position-0 residual varies with it at every layer |" in text


@pytest.mark.parametrize("model, field", [(dict(first_query=64), "model.first_query"),
                                          (dict(windows=1), "model.windows"), (dict(dtype="bfloat16"), "model.dtype"),
                                          (dict(heads=3), "model.heads")])
def test_bad_settings_are_refused_before_any_work(model, field):
    study = EXP.study("quick")
    with pytest.raises(ConfigError) as e:
        validate(dataclasses.replace(study, model={**study.model, **model}), "cpu", EXP)
    assert e.value.field == field


def test_bad_mode_is_refused():
    study = dataclasses.replace(EXP.study("quick"), grid={"model.bos": ("with BOS", "sometimes")})
    with pytest.raises(ConfigError) as e:
        validate(study, "cpu", EXP)
    assert e.value.field == "model.bos"


def test_a_length_whose_leakage_fit_cannot_fit_in_memory_is_refused_with_the_estimate(monkeypatch):
    import poslab.machine
    from poslab.probes.leakage import leakage_bytes

    study = EXP.study("quick")
    monkeypatch.setattr(poslab.machine, "memory_bytes", lambda: 2**20)
    with pytest.raises(ConfigError, match="leakage fit fits in memory") as e:
        validate(study, "cpu", EXP)
    assert e.value.field == "model.length" and "GiB" in str(e.value)
    assert 3.5 < leakage_bytes(1024, 30, 9) / leakage_bytes(512, 30, 9) < 4.5  # the per-pair sums grow as n^2
    # without the earlier definitions, streamed: 2 of the 9 [l, h, n, n] arrays, no per-layer collect
    assert leakage_bytes(512, 30, 9, old=False) < 0.25 * leakage_bytes(512, 30, 9)


@pytest.mark.parametrize("bad, field", [(dict(ntk_factor=1.0), "model.ntk_factor"), (dict(window=0), "model.window")])
def test_bad_variant_settings_are_refused(bad, field):
    study = EXP.study("quick")
    with pytest.raises(ConfigError) as e:
        validate(dataclasses.replace(study, model={**study.model, **bad}), "cpu", EXP)
    assert e.value.field == field


def test_window_groups_are_fitted_on_their_own_and_carry_the_group_as_seed(tiny):
    """groups = 2: each group's per-head rows equal a one-group evaluation of that group's windows
    alone (its own cross-fit), with the group index in ``seed``; the derived rows are per group."""
    from poslab.pretrained import encode_text, load

    model = load(str(tiny("llama")))
    ids = encode_text(model, TEXT * 2)
    cfg = config(windows=8, length=32)
    rows = evaluate_mode(model, ids, dict(cfg, groups=2))
    text_len = 32 - 1  # with BOS
    for g in (0, 1):
        alone = evaluate_mode(model, ids[g * 4 * text_len:], dict(cfg, windows=4, groups=1))
        key = lambda r: (r["probe"], r.get("variant"), r.get("intervention"), r["layer"], r.get("head"))  # noqa: E731
        want = {key(r): r for r in alone if r["probe"] in ("head", "intervention")}
        got = {key(r): r for r in rows if r.get("seed") == g and r["probe"] in ("head", "intervention")}
        assert got.keys() == want.keys()
        for k, r in got.items():
            for col in ("component_b", "early_component_b", "sink_share"):
                if col in r and k[2] is None:
                    assert r[col] == pytest.approx(want[k][col], abs=1e-6)
    derived = derived_rows(rows)
    assert sorted(r["seed"] for r in derived if r["probe"] == "contrast") == [0, 1]
    assert {r["seed"] for r in derived if r["probe"] == "model"} == {0, 1}


def test_groups_must_divide_the_windows_into_cross_fittable_groups():
    study = EXP.study("quick")
    for groups in (3, 5, 0):
        with pytest.raises(ConfigError) as e:
            validate(dataclasses.replace(study, model={**study.model, "groups": groups}), "cpu", EXP)
        assert e.value.field == "model.groups"


def test_modes_run_side_by_side_only_where_their_fits_fit_in_memory():
    from poslab.experiments.executors import workers_that_fit
    from poslab.studies.pretrained_leakage import worker_bytes

    smollm2 = dict(vocab_size=49152, hidden_size=576, num_hidden_layers=30, intermediate_size=1536,
                   num_attention_heads=9)
    need = worker_bytes(512, smollm2)  # a SmolLM2 worker at 512 tokens: lean sums, streamed layers
    assert need < 4 * 2**30
    assert workers_that_fit(2, need, 0.8 * 23 * 2**30) == 2  # two side by side on the 23 GiB machine now
    assert workers_that_fit(2, need, 2 * need) == 2
    assert workers_that_fit(4, need, 0.5 * need) == 1  # never fewer than one: check() refuses what cannot fit
    assert workers_that_fit(3, None) == 3  # no estimate, no cap