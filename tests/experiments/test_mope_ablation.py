"""poslab run mope: the quick preset end to end, its refusals, and the analysis on hand-made rows."""

from __future__ import annotations

import csv
import json
import math

import pytest
import torch

from poslab.errors import ConfigError
from poslab.experiments import members, run_study
from poslab.experiments.config import apply_overrides
from poslab.store import Store
from poslab.studies import get_experiment
from poslab.studies import mope as exp


def test_quick_preset_end_to_end(tmp_path):
    study = exp.EXPERIMENT.study("quick")
    assert get_experiment("mope") is exp.EXPERIMENT
    groups = {m.group_key() for m in members("mope", study)}
    assert len(groups) == 6  # one ensemble per cell: its seeds train together
    with Store(tmp_path / "s.sqlite") as store:
        summary = run_study(exp.EXPERIMENT, study, store=store, out=tmp_path / "out", progress=False)
    assert summary["trained"] == 6 * study.seeds
    assert {p.name for p in summary["files"]} == {"rows.csv", "table.md", "claims.json", "pairs.png",
                                                  "positionwise.png", "pair_trajectory.png"}
    rows = list(csv.DictReader(open(tmp_path / "out" / "rows.csv")))
    member = [r for r in rows if r["probe"] == "member"]
    assert {(r["encoding"], r["energy_gate"]) for r in member} == {(e, g) for e in ("rope", "mope", "sinusoidal")
                                                                   for g in ("False", "True")}
    assert all(math.isfinite(float(r["val_loss"])) for r in member)
    gated = {r["energy_gate"]: int(r["gate_parameters"]) for r in member}
    D, H, L = study.model["d_model"], study.model["n_heads"], study.model["n_layers"]
    assert gated == {"False": 0, "True": L * (H * D + H)}
    pairs = [r for r in rows if r["probe"] == "pair"]
    steps = [0, *study.train.snapshot_steps, study.train.steps]  # initialization, snapshots, the end
    assert sorted({int(r["step"]) for r in pairs}) == steps
    assert {r["encoding"] for r in pairs} == {"mope"}
    assert len(pairs) == 2 * study.seeds * H * (D // H // 2) * len(steps)
    assert all(float(r["ratio"]) >= 1 for r in pairs)  # the boundary holds throughout training
    start = [r for r in pairs if r["step"] == "0"]
    assert all(float(r["sigma"]) == pytest.approx(5 / float(r["omega"]) + study.train.max_length) for r in start)
    end = {(r["energy_gate"], r["seed"], r["head"], r["pair"]): float(r["sigma"]) for r in pairs
           if int(r["step"]) == study.train.steps}
    assert any(abs(end[(r["energy_gate"], r["seed"], r["head"], r["pair"])] / float(r["sigma"]) - 1) > 1e-3
               for r in start)  # sigma moved: its own lr, no weight decay
    gates = [r for r in rows if r["probe"] == "gate"]
    assert {r["energy_gate"] for r in gates} == {"True"} and len(gates) == 3 * study.seeds * L * H
    positions = [r for r in rows if r["probe"] == "positionwise"]
    assert {int(r["length"]) for r in positions} == set(study.eval.lengths)
    moves = [r for r in rows if r["probe"] == "move"]
    assert len(moves) == 2 * study.seeds * H * (D // H // 2) and {r["sigma_init"] for r in moves} == {"context"}
    claims = {c["name"]: c for c in json.loads((tmp_path / "out" / "claims.json").read_text())}
    seed = {b: claims[f"MoPE + EGA: improvement over standard attention ({b} baseline, nats)"] for b in exp.BASELINES}
    assert [(c["paper"], c["role"]) for c in seed.values()] == [("+0.119", "paper"), ("+0.119", "control")]
    assert {c["role"] for c in claims.values() if c["paper"] in ("+0.092", "-0.032", "~0.35")} == {"external"}
    assert {n.split(":")[0] for n in claims if n.startswith("MoPE + EGA beats")} == {"MoPE + EGA beats EGA alone",
                                                                                     "MoPE + EGA beats MoPE alone"}
    table = (tmp_path / "out" / "table.md").read_text()
    assert "paper (nats, assumed)" in table and "+0.119" in table and "2 seeds (0, 1)" in table


@pytest.mark.parametrize("override", [['grid.encoding=["rope","alibi"]'], ['grid.model.energy_gate=[true]'],
                                      ["train.min_length=8"], ["eval.lengths=[32]"]])
def test_refuses_before_any_work(override, tmp_path):
    study = apply_overrides(exp.EXPERIMENT.study("quick"), override)
    with Store(tmp_path / "s.sqlite") as store:
        with pytest.raises(ConfigError):
            run_study(exp.EXPERIMENT, study, store=store, out=tmp_path / "out", progress=False)
        assert store.runs(experiment="mope") == []


def test_unknown_preset():
    with pytest.raises(ConfigError):
        exp.EXPERIMENT.study("large")


def test_gpu_preset_is_near_the_published_scale():
    from poslab.experiments.experiment import resolve_model_config, resolve_task
    from poslab.models.transformer import Transformer

    study = exp.EXPERIMENT.study("gpu")
    point = next(m.study for m in members("mope", study) if m.study.encoding == "mope" and m.study.model["energy_gate"])
    model = Transformer(resolve_model_config(point, resolve_task(point)))
    n = sum(p.numel() for p in model.parameters())
    assert 4e6 < n < 6e6 and study.train.max_length == 256
    assert model.encoding.omega.numel() == 128  # the abstract's pair count
    assert study.seeds >= 3 and point.model["dropout"] > 0  # the 2 x 2 ablation's seeds; regularised at 5M


def test_improvements_are_paired_by_seed():
    rows = []
    for (enc, gate), losses in {("rope", False): [2.0, 3.0], ("rope", True): [1.9, 2.7],
                                ("mope", False): [2.1, 3.0], ("mope", True): [1.85, 2.8],
                                ("sinusoidal", False): [1.8, 2.9], ("sinusoidal", True): [1.9, 2.9]}.items():
        rows += [dict(probe="member", encoding=enc, energy_gate=gate, seed=s, val_loss=v, parameters=100,
                      gate_parameters=2 if gate else 0) for s, v in enumerate(losses)]
    derived = exp.derived_rows(rows)
    gains = {}
    for g in derived:
        if g["probe"] == "gain":
            gains.setdefault((g["encoding"], g["energy_gate"], g["baseline"]), []).append(g["gain"])
    assert gains[("rope", True, "rope")] == pytest.approx([0.1, 0.3])
    assert gains[("mope", False, "rope")] == pytest.approx([-0.1, 0.0])
    assert gains[("mope", True, "rope")] == pytest.approx([0.15, 0.2])
    assert gains[("mope", True, "sinusoidal")] == pytest.approx([-0.05, 0.1])  # the other reading of "standard"
    assert ("sinusoidal", False, "sinusoidal") not in gains and ("rope", False, "rope") not in gains
    beats = {(g["component"], g["seed"]): g["diff"] for g in derived if g["probe"] == "beats"}
    assert beats == pytest.approx({("EGA alone", 0): 0.05, ("EGA alone", 1): -0.1,
                                   ("MoPE alone", 0): 0.25, ("MoPE alone", 1): 0.2})
    claims = {c.name: c for c in exp.judge_all(exp.CLAIMS, rows + derived)}
    rope = claims["MoPE + EGA: improvement over standard attention (rope baseline, nats)"]
    sinusoidal = claims["MoPE + EGA: improvement over standard attention (sinusoidal baseline, nats)"]
    assert (rope.holds, rope.role) == (True, "paper") and (sinusoidal.holds, sinusoidal.role) == (False, "control")
    alone = claims["MoPE alone: improvement over standard attention (rope baseline, nats)"]
    assert alone.holds is False and alone.role == "external"  # seed 1 ties
    # pair minus component, per seed: the mean less 2 standard errors of (0.05, -0.1) is below 0, of (0.25, 0.2) above
    ega = claims["MoPE + EGA beats EGA alone: loss(EGA alone) - loss(MoPE + EGA), paired by seed"]
    mope = claims["MoPE + EGA beats MoPE alone: loss(MoPE alone) - loss(MoPE + EGA), paired by seed"]
    assert ega.holds is False and ega.measured == pytest.approx(-0.025 - 2 * 0.075)
    assert mope.holds is True and mope.measured == pytest.approx(0.225 - 2 * 0.025)
    assert {g["share"] for g in derived if g["probe"] == "gate_share"} == {0.02}


def _pairs(step, ratios, init_sigma=64.0):
    return [dict(probe="pair", encoding="mope", energy_gate=False, seed=0, head=0, pair=f, step=step, omega=1.0,
                 sigma=5.0 * r, ratio=r, gap=abs(r - 1), init_sigma=init_sigma) for f, r in enumerate(ratios)]


def test_boundary_claims_read_initial_and_final_pairs():
    """Two pairs start off the boundary, one on it; one of the two reaches it."""
    rows = _pairs(0, [3.0, 1.5, 1.01]) + _pairs(50, [2.0, 1.2, 1.01]) + _pairs(100, [1.02, 1.3, 1.0])
    moves = [r for r in exp.derived_rows(rows) if r["probe"] == "move"]
    assert [m["initial_gap"] for m in moves] == pytest.approx([2.0, 0.5, 0.01])
    assert [m["final_gap"] for m in moves] == pytest.approx([0.02, 0.3, 0.0])
    assert {m["sigma_init"] for m in moves} == {"context"}
    claims = {c.name: c for c in exp.judge_all(exp.CLAIMS, rows + exp.derived_rows(rows))}
    final = claims["MoPE pairs within 5% of omega sigma = c after training (context start)"]
    reach = claims["MoPE pairs off omega sigma = c at initialization that reach it"]
    assert final.holds is False and final.measured == "66.7%" and final.role == "control"
    assert reach.holds is False and reach.measured == "50.0%" and reach.role == "control"
    common = claims["MoPE pairs within 5% of their model's common omega sigma = c' after training (context start)"]
    assert common.role == "paper" and common.holds is False and common.measured == "66.7%"  # 1.3 is 27% off 1.02
    boundary = _pairs(0, [1.001, 1.002], init_sigma=0.01) + _pairs(100, [1.0, 1.0], init_sigma=0.01)
    (na,) = [c for c in exp.judge_all(exp.CLAIMS, exp.derived_rows(boundary)) if "boundary start" in c.name]
    assert na.holds is None and na.na_kind == "undecidable" and "every pair starts on the boundary" in na.note


def test_pair_rows_read_a_snapshot_not_the_live_weights():
    from poslab.models.transformer import Transformer, TransformerConfig
    from poslab.probes.mope import pair_rows

    model = Transformer(TransformerConfig(vocab_size=11, d_model=16, n_heads=2, n_layers=1, max_len=32,
                                          encoding="mope", encoding_options=dict(
                                              admissibility="hard", admissibility_c=5.0, per_head=True,
                                              init_sigma=16.0)))
    state = {k: v.clone() for k, v in model.named_parameters()}
    state["encoding.log_sigma_scale"] = torch.full_like(state["encoding.log_sigma_scale"], math.log(2.0))
    rows = pair_rows(model.encoding, state, 7, 16)
    theta = model.encoding.theta.double()
    sigma = torch.tensor([r["sigma"] for r in rows], dtype=torch.float64).reshape(2, -1)
    torch.testing.assert_close(sigma, (5 / theta + 2 * 16.0).expand_as(sigma))  # c / omega + 2 sigma0
    assert all(r["step"] == 7 for r in rows)
    assert model.encoding.log_sigma_scale.abs().max() == 0  # the live weights are untouched


def test_a_common_boundary_is_found_without_assuming_c():
    """Pairs that all end at omega sigma = 7.5 (1.5 c) share one boundary c' and none is within 5% of c;
    one pair 6% off the others' product breaks it."""
    rows = _pairs(0, [3.0, 1.1, 2.0]) + _pairs(100, [1.5, 1.5, 1.52])
    moves = [r for r in exp.derived_rows(rows) if r["probe"] == "move"]
    assert [m["final_spread_gap"] for m in moves] == pytest.approx([0.0, 0.0, 0.02 / 1.5])
    assert [m["initial_spread_gap"] for m in moves] == pytest.approx([0.5, 0.45, 0.0])
    name = "MoPE pairs within 5% of their model's common omega sigma = c' after training (context start)"
    claims = {c.name: c for c in exp.judge_all(exp.CLAIMS, exp.derived_rows(rows))}
    assert claims[name].holds is True
    assert claims["MoPE pairs within 5% of omega sigma = c after training (context start)"].holds is False
    off = _pairs(0, [3.0, 1.1, 2.0]) + _pairs(100, [1.5, 1.5, 1.59])  # 6% above the median 1.5
    claims = {c.name: c for c in exp.judge_all(exp.CLAIMS, exp.derived_rows(off))}
    assert claims[name].holds is False and claims[name].measured == "66.7%"
    assert exp._common_share(_pairs(100, [1.5, 1.5, 1.52])) == 1.0
    assert exp._common_share(_pairs(100, [1.5, 1.5, 1.59])) == pytest.approx(2 / 3)
    assert exp._log_spread(_pairs(100, [2.0, 2.0])) == pytest.approx(0.0)
