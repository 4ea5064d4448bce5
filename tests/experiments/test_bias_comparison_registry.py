"""bias-comparison takes every registered encoding by kind (issue 38 item 3): the quick preset's
grid holds every registry entry, a run through the engine tables each one's accuracy in and past
the training range, the paper preset keeps its stored cells' run keys, each encoding's form is
computed from its class, and every claim of the registry routing flips on synthetic rows."""

from __future__ import annotations

import json
from functools import partial

import torch

from poslab.experiments import run_study
from poslab.experiments.config import apply_overrides, apply_point
from poslab.experiments.experiment import members
from poslab.experiments.spec import check_flips, judge_all, synthetic_rows
from poslab.positional import ENCODINGS, PositionalEncoding, registered
from poslab.positional.base import relative_positions
from poslab.store import Store
from poslab.studies import bias_comparison as bc

TINY = ["train.steps=2", "train.batch_size=4", "task.m=5", "model.d_model=8", "eval.n_sequences=8",
        "eval.lengths=[12,20]", "seeds=1"]  # every code path, in seconds

# run keys of the paper preset's 21 hand settings (seed 0), recorded before the registry settings existed:
# stored results stay valid
PAPER_KEYS = {
    "rope K=2": "7626532b41b9c6cd", "mope K=2": "da8ba21b20f6c603", "shaw K=2": "8a38aaf3190bda78",
    "transformer_xl K=2": "4950f57cc188132d", "nope K=2": "4f735643d64083f2", "sinusoidal K=2": "476bbea206643f62",
    "alibi m=2^-8 K=1": "c50d8c9c80d21ad0", "alibi m=2^-8 K=2": "38651b74b7ec965c",
    "alibi m=2^-8 K=3": "0dfc63a1c1efca5e", "alibi m=0.5 K=1": "317614420e4d454b",
    "alibi m=0.5 K=2": "7ab195cc7854a961", "alibi m=0.5 K=3": "38969da762db614a",
    "alibi learned m (from 2^-8) K=1": "3be4be07a1b59460", "alibi learned m (from 2^-8) K=2": "8d242b0f80cb00d5",
    "alibi learned m (from 2^-8) K=3": "9acfdbdea8837b54", "alibi learned m (from 0.5) K=1": "71f83ea72ea5ddf8",
    "alibi learned m (from 0.5) K=2": "93bc120bbe5e6ea1", "alibi learned m (from 0.5) K=3": "732f97348e2a8d14",
    "t5 32/128 N(0,1) K=2": "51c6e78eb9082038", "t5 32/128 zeros K=2": "837d371273e98f15",
    "t5 16/16 N(0,1) K=2": "8f0b8ff9c9f0db11",
}


def test_every_registered_encoding_is_in_the_quick_and_paper_grids_at_the_study_K():
    for preset, ks in (("quick", bc.QUICK_KS), ("paper", bc.KS)):
        study = bc.EXPERIMENT.study(preset)
        points = [apply_point(study, {"setting": s}) for s in study.grid["setting"]]
        ran = {(p.encoding, p.task["K"]) for p in points}
        assert {(enc, K) for enc in registered() for K in ks} <= ran, preset
    assert set(bc.HAND) <= set(bc.EXPERIMENT.study("quick").grid["setting"])  # hand settings kept as they were


def test_the_quick_preset_through_the_engine_tables_every_encoding_past_the_training_range(tmp_path):
    exp = bc.EXPERIMENT
    quick = exp.study("quick")
    by_kind = [s for s in quick.grid["setting"] if s not in bc.HAND]
    chosen = [*by_kind, "rope K=2", "alibi m=0.5 K=2"]  # every encoding outside the hand settings, and two inside
    study = apply_overrides(quick, [*TINY, f"grid.setting={json.dumps(chosen)}"])
    with Store(tmp_path / "s.sqlite") as store:
        summary = run_study(exp, study, store=store, out=tmp_path / "out", progress=False, executor="inline")
    assert summary["trained"] == summary["members"] == len(chosen)
    table = (tmp_path / "out" / "table.md").read_text()
    section = table.split("## Every encoding: accuracy in and past the training range")[1].split("\n## ")[0]
    header = next(line for line in section.splitlines() if line.startswith("| setup |"))
    assert "acc. past training range" in header and "kind" in header
    lines = {line.split(" | ")[0].strip("| "): line for line in section.splitlines() if line.startswith("| ")}
    for name in registered():
        if name in bc.SEED_FAMILIES and name not in ("rope", "alibi"):
            continue
        setup = bc.setup_label(name, {"slope": 0.5} if name == "alibi" else {})
        cells = lines[setup].strip("| ").split(" | ")
        assert cells[1] == bc.encoding_class(name).kind and cells[3] == bc.prediction(name, "{}", 12, 20)
        past = float(cells[5].split(" ± ")[0])
        assert 0 <= past <= 1, cells
    claims = json.loads((tmp_path / "out" / "claims.json").read_text())
    names = {c["name"] for c in claims}
    assert "xpos, K=2: cells selecting -K, every length" in names  # Lemma 1 by kind: a control
    assert "cope, K=2: cells selecting -K" in names and "fire, K=2: cells selecting -K" in names
    assert all(f"{n}, K=2: mean accuracy at unseen lengths" in names for n in ("fox", "sandwich", "learned"))
    roles = {c["name"]: c["role"] for c in claims}
    assert roles["xpos, K=2: cells selecting -K, every length"] == "control"
    assert roles["rope, K=2: cells selecting -K"] == "paper"  # the seed's claims keep their roles


def test_the_paper_preset_keeps_the_hand_settings_run_keys():
    got = {(dict(m.point)["setting"], m.seed): m.key for m in members(bc.EXPERIMENT, bc.EXPERIMENT.study("paper"))}
    assert {s: k for (s, seed), k in got.items() if seed == 0 and s in bc.HAND} == PAPER_KEYS
    assert len(got) == 3 * len(bc.EXPERIMENT.study("paper").grid["setting"])  # no two settings resolve to one run


def test_each_form_is_computed_from_the_class():
    expected = {"rope": "offset", "xpos": "offset", "dynamic_position_bias": "offset", "t5": "offset",
                "alibi": "nearest-first", "kerple_log": "nearest-first", "kerple_power": "nearest-first",
                "sandwich": "nearest-first", "rope_dynamic": "not offset-only", "rope_longrope": "not offset-only",
                "fire": "not offset-only", "cope": "contextual", "fox": "contextual", "nope": "no offset",
                "learned": "no offset", "mope_additive": "no offset"}
    assert {n: bc.prediction(n) for n in expected} == expected
    assert set(map(bc.prediction, registered())) <= set(bc.PREDICTIONS)


class FarBias(PositionalEncoding):
    """A content-free bias that favours offset 3 over offset 1: not nearest-first, so Lemma 1's claim."""
    kind, extra_parameters, cost, reference = "relative", "none", "none", "a test"

    def score_bias(self, q, k, q_pos, k_pos):
        rel = relative_positions(q_pos, k_pos).to(q.dtype)
        return -(rel - 3).abs()  # [1 | b, 1, i, j] or [i, j]: broadcasts over heads


def test_an_added_encoding_is_routed_by_its_form_without_a_line_changed(monkeypatch):
    monkeypatch.setitem(ENCODINGS, "far_bias", partial(FarBias))
    assert bc.prediction("far_bias") == "offset"
    assert "far_bias K=1" in bc.registry_settings() and "far_bias K=2" in bc.EXPERIMENT.study("quick").grid["setting"]
    bc.prediction.cache_clear()


def test_nearest_gap_reads_the_trained_bias():
    enc = bc._encoding("alibi", {"slope": 0.5}, 20)
    assert abs(bc.nearest_gap(enc, 20) - 0.5) < 1e-6
    enc = bc._encoding("kerple_log", {}, 20)  # r1 = r2 = 1: log 3 - log 2
    assert abs(bc.nearest_gap(enc, 20) - float(torch.log(torch.tensor(1.5)))) < 1e-5


def registry_claims():
    """The selection claims on the encodings taken by kind (their unseen accuracy, shown for comparison, reads the
    same cells by design: every cell's accuracy is tabled)."""
    return [c for c in bc.CLAIMS if "by_kind" in {t.column for t in c.where.terms} and c.measure is bc.AT_K]


def test_registry_claims_flip_on_synthetic_rows_either_side():
    specs = registry_claims()
    assert len(specs) == 6
    report = check_flips(specs, base=dict(probe="length", in_range=False))
    assert not report.failures and len(report.judged) == 3, report
    for spec in specs:  # every spec sees its own synthetic rows, and no other spec's
        rows = synthetic_rows(spec, 0.5, dict(probe="length", in_range=False))
        hit = [s.name for s in specs if judge_all([s], rows)]
        assert hit == [spec.name], (spec.name, hit)


def test_registry_rows_are_judged_by_their_form():
    def cells(setup, prediction, K, offsets, **extra):
        return [dict(probe="length", setup=setup, encoding=setup, kind="relative", K=K, seed=0, length=L,
                     in_range=L <= 16, accuracy=0.5, peak_offset=o, by_kind=True, prediction=prediction, **extra)
                for L, o in zip((12, 16, 20, 24), offsets, strict=True)]

    rows = cells("kerple_log", "nearest-first", 1, [-1, -1, -1, -1], gap=0.4)
    rows += cells("kerple_log", "nearest-first", 2, [-1, -1, -2, -1], gap=0.4)
    rows += cells("sandwich", "nearest-first", 2, [-1, -2, -1, -1], gap=0.01)
    rows += cells("xpos", "offset", 2, [-2, -2, -2, -7])
    rows += cells("fox", "contextual", 2, [-2, -2, -2, -2])
    got = {c.name: c for c in judge_all(bc.CLAIMS, rows) if "accuracy" not in c.name}
    assert got["kerple_log, K=1: cells selecting -1 (usable gap)"].holds is True
    check = got["kerple_log, K=2: cells selecting -K (nearest-first bias: predicted none)"]
    assert check.role == "check" and check.holds is False  # a -2 selection would contradict the derivation
    assert got["sandwich, K=2: cells selecting -K, gap too flat to order the offsets"].holds is None
    xpos = got["xpos, K=2: cells selecting -K, every length"]
    assert xpos.role == "control" and xpos.holds is False and xpos.measured == "75.0%"
    fox = got["fox, K=2: cells selecting -K"]
    assert fox.holds is None and fox.na_kind == "comparison" and "contextual" in fox.note
    assert not any(name.startswith("kerple_log") and "Lemma" in c.paper and "every length" in name
                   for name, c in got.items())
