"""The hybrid study (issue 57): its quick preset end to end, the settings it builds (each layout's
model fields), the rows its claims read derived from known numbers, and its claims either side of
each line."""

import json

import pytest

from poslab.errors import ConfigError
from poslab.experiments import members, run_study
from poslab.experiments.config import apply_overrides
from poslab.experiments.spec import check_flips
from poslab.store import Store
from poslab.studies import EXPERIMENTS, get_experiment
from poslab.studies import hybrid as hy


def test_hybrid_quick_end_to_end(tmp_path):
    exp = get_experiment("hybrid")
    assert "hybrid" in EXPERIMENTS and set(exp.presets) == {"paper", "cpu", "quick"}
    assert exp.study("paper").train.steps >= exp.study("cpu").train.steps > exp.study("quick").train.steps
    study = exp.study("quick")
    with Store(tmp_path / "s.sqlite") as store:
        summary = run_study(exp, study, store=store, out=tmp_path / "out", progress=False)
        rows = store.rows()
    assert summary["trained"] == summary["members"] == 3 * len(hy.SCALES["quick"].layouts)
    assert {p.name for p in summary["files"]} >= {"rows.csv", "table.md", "claims.json", "layers.csv", "leakage.csv",
                                                  "carriers.csv", "lm_positionwise.png", "retrieval_accuracy.png",
                                                  "reverse_exact.png"}
    # reverse: exact match at lengthgen's few lengths (trained 2 .. 20), in range and past it
    reverse = [r for r in rows if r["probe"] == "length" and r["task"] == "reverse"]
    assert sorted({r["length"] for r in reverse}) == [10, 20, 21, 27, 34, 40]
    assert all(0 <= r["exact"] <= r["accuracy"] + 1e-9 <= 1 + 1e-9 and r["in_range"] == (r["length"] <= 20)
               for r in reverse)
    # YaRN variants on the LM members with rope layers, evaluated past the context
    long = [r for r in rows if r["probe"] == "long"]
    assert {(r["layout"], r["schedule"]) for r in long} == {(n, s) for n in ("rope", "swan", "irope")
                                                              for s in ("none", "yarn")}
    assert max(r["length"] for r in long) == 2 * 32
    # every layer of every as-trained member has its targets and leakage rows, typed by the layout
    targets = [r for r in rows if r["probe"] == "targets"]
    types = {(r["task"], r["layout"], r["layer"]): r["layer_type"] for r in targets}
    assert types[("lm", "swan", 0)] == "rope+window 8" and types[("lm", "swan", 3)] == "nope"
    assert types[("retrieval", "irope", 1)] == "rope+chunk 6" and types[("lm", "rope", 3)] == "rope"
    leak = [r for r in rows if r["probe"] == "layer_leakage"]
    assert all(r["component_b"] is None for r in leak if r["chunk"] is not None)
    assert all(r["component_b"] is not None for r in leak if r["chunk"] is None)
    # carriers on rope layers only; one member row per retrieval member
    assert {r["rotary"] for r in rows if r["probe"] == "carrier"} == {True}
    assert len([r for r in rows if r["probe"] == "member"]) == len(hy.SCALES["quick"].layouts)
    claims = json.loads((tmp_path / "out" / "claims.json").read_text())
    assert {c["role"] for c in claims} >= {"external", "control", "prediction"}
    # 12 steps learn nothing: every claim that reads trained behaviour is n.a. by the gate, none judged
    assert all(c["holds"] is None for c in claims)


def test_each_layout_sets_its_model_fields():
    exp = get_experiment("hybrid")
    ms = {m.ids["setting"]: m.model_config for m in members(exp, exp.study("cpu"))}
    assert ms["lm-rope"].layout is None and ms["lm-rope"].encoding == "rope"
    assert ms["lm-nope"].encoding == "nope" and ms["lm-nope"].layout is None
    assert ms["lm-rnope"].layout == "rope,rope,rope,nope" and not ms["lm-rnope"].qk_norm
    assert ms["lm-swan"].layout == ",".join(["rope:window=16"] * 3 + ["nope"])
    assert ms["lm-irope"].layout == ",".join(["rope:chunk=16"] * 3 + ["nope"]) and ms["lm-irope"].qk_norm
    assert ms["retrieval-swan"].layout.startswith("rope:window=8") and ms["retrieval-irope"].n_layers == 4
    assert (ms["lm-rope"].d_model, ms["retrieval-rope"].d_model) == (128, 64)
    # reverse: the decoder of issue 56's calibration (4 layers of d_model 64), windows of 16 on its 43 tokens
    assert ms["reverse-swan"].layout.startswith("rope:window=16") and ms["reverse-swan"].causal
    assert (ms["reverse-nope"].n_layers, ms["reverse-nope"].d_model, ms["reverse-nope"].n_heads) == (4, 64, 4)
    steps = {m.ids["setting"]: m.study.train.steps for m in members(exp, exp.study("cpu"))}
    assert steps["reverse-rope"] == 4000 and steps["retrieval-rope"] == 1200


def test_reverse_trains_as_lengthgen_calibrated_it_with_nothing_from_the_lms_recipe():
    """reverse-rope's training equals lengthgen's reverse x rope at the calibrated scale (4 layers, cosine after
    240 warm-up steps): no field falls through from the LM's AdamW recipe (weight decay 0.1 once did, as Adam's
    coupled L2, and held the loss at uniform)."""
    from poslab.experiments.config import apply_overrides

    hybrid, lengthgen = get_experiment("hybrid"), get_experiment("lengthgen")
    mine = next(m for m in members(hybrid, hybrid.study("cpu")) if m.ids["setting"] == "reverse-rope")
    theirs = members(lengthgen, apply_overrides(lengthgen.study("cpu"), [
        'grid.setting=["reverse"]', 'grid.encoding=["rope"]', "grid.model.random_positions=[null]",
        'settings.reverse.only={"encoding":["rope"]}']))[0]  # the cpu preset's scale; its plan runs their five
    assert mine.study.train == theirs.study.train and mine.config()["model"] == theirs.config()["model"]
    assert mine.study.train.weight_decay == 0.0 and mine.study.train.grad_clip is None


def test_a_setting_outside_task_x_layout_is_refused_before_any_work(tmp_path):
    exp = get_experiment("hybrid")
    study = apply_overrides(exp.study("quick"), ['grid.setting=["lm-rope"]'])
    study = apply_overrides(study, ['settings={"lm-xyz": {"task_type": "text"}}', 'grid.setting=["lm-xyz"]'])
    with pytest.raises(ConfigError) as err:
        exp.check(study)
    assert err.value.field == "grid.setting"


def _long(layout, seed, schedule, loss, L=512, task="lm"):
    return dict(probe="long", task=task, layout=layout, seed=seed, schedule=schedule, length=L, loss=loss)


def test_derived_rows_compare_each_layout_with_rope_of_the_same_seed_and_schedule():
    rows = [_long("rope", 0, "none", 2.0), _long("rnope", 0, "none", 1.5), _long("rope", 0, "yarn", 1.8),
            _long("rnope", 0, "yarn", 1.7), _long("rnope", 0, "none", 9.0, L=64),
            dict(probe="lm", layout="rope", seed=0, schedule="none", val_loss=1.6),
            dict(probe="lm", layout="rnope", seed=0, schedule="none", val_loss=1.5)]
    pairs = {(r["layout"], r["schedule"]): r for r in hy.derived_rows(rows) if r["probe"] == "pair"}
    assert pairs[("rnope", "none")]["minus_rope_long"] == pytest.approx(-0.5)  # the longest length only
    assert pairs[("rnope", "yarn")]["minus_rope_long"] == pytest.approx(-0.1)
    assert pairs[("rnope", "none")]["minus_rope_val"] == pytest.approx(-0.1)
    assert pairs[("rnope", "none")]["long_over_context"] == pytest.approx(1.0)
    assert pairs[("rope", "none")]["minus_rope_long"] is None
    sched = {r["layout"]: r["yarn_minus_none"] for r in hy.derived_rows(rows) if r["probe"] == "schedule"}
    assert sched == pytest.approx({"rope": -0.2, "rnope": 0.2})


def _reverse(layout, seed, L, exact):
    return dict(probe="length", task="reverse", layout=layout, seed=seed, length=L, in_range=L <= 20, exact=exact,
                accuracy=exact)


def test_versus_rows_compare_each_layout_with_rope_past_training_on_reverse_and_the_gate_reads_both():
    rows = [_reverse("rope", 0, 20, 1.0), _reverse("rope", 0, 21, 0.4), _reverse("rope", 0, 40, 0.0),
            _reverse("rnope", 0, 20, 0.95), _reverse("rnope", 0, 21, 0.6), _reverse("rnope", 0, 40, 0.2),
            _reverse("swan", 1, 21, 0.9),  # no rope member of seed 1: no pair
            dict(probe="length", task="retrieval", layout="rnope", seed=0, length=40, in_range=False, accuracy=1.0)]
    versus = [r for r in hy.derived_rows(rows) if r["probe"] == "versus"]
    assert [(r["versus"], r["layout"], r.get("minus_rope_past")) for r in versus] == [
        ("rnope", "rnope", pytest.approx(0.4 - 0.2)), ("rnope", "rope", None)]
    claim = next(c for c in hy.CLAIMS if c.name.startswith("RNoPE: exact match"))
    learned = [dict(probe="learned", task="reverse", layout=name, seed=0, learned=score)
               for name, score in (("rnope", 1.05), ("rope", 1.1))]
    [judged] = claim.evaluate(rows + versus + learned, hy.GATE)
    assert judged.holds is True and judged.measured == pytest.approx(0.2)
    learned[1]["learned"] = 0.8  # uniform RoPE did not learn in range: the pair is n.a., though RNoPE did
    [gated] = claim.evaluate(rows + versus + learned, hy.GATE)
    assert gated.holds is None and gated.na_kind == "not-learned" and "0.800" in gated.note


def test_labour_and_leak_rows_average_each_layer_kind_of_a_member():
    def t(layer, rotary, recent, key0, uniform_recent=0.0, uniform_key0=0.0):
        return dict(probe="targets", task="lm", layout="rnope", seed=0, layer=layer, head=0, rotary=rotary,
                    recent=recent, key0=key0, uniform_recent=uniform_recent, uniform_key0=uniform_key0)

    # the rope layers' recency beyond their masks' (a window's 0.5 and 0.1), against the no-rope layer's
    rows = [t(0, True, 0.8, 0.1, 0.5), t(1, True, 0.6, 0.1, 0.1), t(2, False, 0.2, 0.5, 0.0, 0.3)]
    rows += [dict(probe="layer_leakage", task="lm", layout="rnope", seed=0, layer=0, rotary=True, component_b=0.1,
                  component_b_key0=0.05), dict(probe="layer_leakage", task="lm", layout="rnope", seed=0, layer=1,
                                               rotary=False, component_b=None, component_b_key0=None)]
    derived = hy.derived_rows(rows)
    labour = [r for r in derived if r["probe"] == "labour"]
    assert len(labour) == 1 and labour[0]["rope_minus_nope_recent"] == pytest.approx((0.3 + 0.5) / 2 - 0.2)
    assert labour[0]["nope_minus_rope_key0"] == pytest.approx(0.2 - 0.1)
    leak = [r for r in derived if r["probe"] == "leak"]
    assert [(r["kind"], r["component_b_key0"]) for r in leak] == [("rope", 0.05)]  # a row without (b) is left out


def test_every_hybrid_claim_flips_at_its_line():
    report = check_flips(hy.CLAIMS)
    assert not report.failures and len(report.judged) == len(hy.CLAIMS)
    assert all(s.source is not None and s.setting is not None for s in hy.CLAIMS)


@pytest.mark.parametrize("setting", ["retrieval-irope", "lm-swan"])
def test_a_study_layout_trains_as_an_ensemble_whose_members_equal_each_seed_alone(setting):
    """The acceptance's parity on the study's own members (chunked rope + nope + qk-norm; windowed rope +
    nope): two seeds trained as one ensemble equal each seed trained alone (tests/test_train.py's LAYOUT
    covers a layout with every option; this is the study's members through the engine's configs)."""
    import dataclasses

    import torch

    from poslab.train import train_ensemble

    exp = get_experiment("hybrid")
    study = apply_overrides(exp.study("quick"), [f'grid.setting=["{setting}"]', "seeds=2"])
    group = members(exp, study)
    assert [m.seed for m in group] == [0, 1] and len({m.group_key() for m in group}) == 1
    cfg = dataclasses.replace(group[0].study.train, steps=4, warmup_steps=1)
    make = group[0].make_model()
    ens = train_ensemble(make, [m.task for m in group], [0, 1], cfg, progress=False)
    for seed in (0, 1):
        alone = train_ensemble(make, [group[seed].task], [seed], cfg, progress=False).models[0]
        for key, p in ens.models[seed].state_dict().items():
            torch.testing.assert_close(p, alone.state_dict()[key], rtol=1e-5, atol=1e-6, msg=key)
    curve = torch.as_tensor(ens.loss_curve)
    assert curve.shape == (4, 2) and bool((curve[0] != curve[-1]).all())  # both members took their steps
    w0, w1 = (ens.models[s].layers[0].W_Q for s in (0, 1))
    assert not torch.equal(w0, w1)  # two seeds, two models
