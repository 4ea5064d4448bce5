"""The seed paper's next steps (issue 39 item 3): nope-depth and induction end to end in their quick
presets, their probes on patterns with known answers, and their claims on both sides of each line."""

import json

import numpy as np
import pytest

from poslab.experiments import run_study
from poslab.experiments.config import apply_overrides
from poslab.experiments.spec import check_flips, judge_all
from poslab.store import Store
from poslab.studies import EXPERIMENTS, PAPER_STUDIES, get_experiment
from poslab.studies import induction as ind
from poslab.studies import nope_depth as nd
from poslab.studies.kit.depth_probes import argmax_share, last_query_rows, offset_share


def _run(name, overrides, tmp_path):
    exp = get_experiment(name)
    assert set(exp.presets) == {"paper", "quick", "cpu"} and name not in PAPER_STUDIES and name in EXPERIMENTS
    assert exp.study("paper").train.steps >= exp.study("cpu").train.steps > exp.study("quick").train.steps
    study = apply_overrides(exp.study("quick"), overrides)
    with Store(tmp_path / "s.sqlite") as store:
        summary = run_study(exp, study, store=store, out=tmp_path / "out", progress=False)
        assert summary["trained"] == summary["members"] > 0
        rows = store.rows()
    claims = json.loads((tmp_path / "out" / "claims.json").read_text())
    # a next step's own statements are predictions (the seed names the step, not its outcome), beside
    # controls of the seed's own statements; studies not yet restated by source x setting still say paper
    assert claims and {c["role"] for c in claims} >= {"control"} and {c["role"] for c in claims} & {"paper",
                                                                                                  "prediction"}
    return summary, rows, claims


def test_nope_depth_quick_end_to_end(tmp_path):
    summary, rows, claims = _run("nope-depth", ["train.steps=10", "eval.lengths=[12,20]"], tmp_path)
    assert {p.name for p in summary["files"]} == {"rows.csv", "heads.csv", "members.csv", "table.md", "claims.json",
                                                   "accuracy.png", "attention_by_offset.png"}
    heads = [r for r in rows if r["probe"] == "head"]
    assert len(heads) == 3 * (1 + 2) * 2  # encodings x layers over depths 1, 2 x lengths
    assert all(-(r["length"] - 1) <= r["peak_offset"] <= 0 for r in heads)
    for m in (r for r in rows if r["probe"] == "member"):
        mine = sorted((r for r in heads if (r["encoding"], r["n_layers"], r["seed"]) ==
                       (m["encoding"], m["n_layers"], m["seed"]) and r["retrieving"]), key=lambda r: r["length"])
        assert [r["length"] for r in mine] == [12, 20] and m["head_name"] == f"{m['layer']}.{m['head']}"
        assert m["invariant"] == (len({r["peak_offset"] for r in mine}) == 1)
    profile = [r for r in rows if r["probe"] == "attention" and r["encoding"] == "nope" and r["n_layers"] == 2]
    for L in (12, 20):  # the longest trained length evaluated, and the longest: weights sum to 1
        for layer in (0, 1):
            assert sum(r["weight"] for r in profile if r["length"] == L and r["layer"] == layer) == pytest.approx(1)
    one_layer = [c for c in claims if c["name"].startswith("nope, 1 layer")]
    assert {c["role"] for c in one_layer} == {"check"}


def test_induction_quick_end_to_end(tmp_path):
    summary, rows, claims = _run("induction", ["train.steps=8", "eval.lengths=[12,20]"], tmp_path)
    assert {p.name for p in summary["files"]} >= {"table.md", "claims.json", "accuracy.png",
                                                  "previous_token_head.png", "induction_head.png"}
    members = [r for r in rows if r["probe"] == "member"]
    assert {r["encoding"] for r in members} == set(ind.ENCODINGS)
    assert all(r["prev_head"].startswith("0.") and r["ind_head"].startswith("1.") for r in members)
    heads = [r for r in rows if r["probe"] == "head"]
    assert len(heads) == 5 * 2 * 2 * 4  # encodings x lengths x layers x heads
    assert all(r["prev_argmax_out"] is None for r in heads if r["length"] == 12)  # no query at t >= 16
    assert all(0 <= r["prev_share_all"] <= 1 and 0 <= r["ind_argmax_all"] <= 1 for r in heads)
    lengths = [r for r in rows if r["probe"] == "length"]
    assert all(0 <= r["exact_match"] <= r["accuracy"] + 1e-9 or r["exact_match"] == 0 for r in lengths)
    # issue 53: the seed's statements on a next step's task are controls; the circuit and NoPE's outcome predictions
    assert {c["role"] for c in claims if c["name"].startswith("rope: accuracy on the second copy at trained")} \
        == {"control"}
    assert {c["role"] for c in claims if "previous-token head, queries" in c["name"]} == {"prediction"}
    assert {c["role"] for c in claims if c["name"].startswith("nope")} == {"prediction"}
    assert {c["role"] for c in claims if c["name"].startswith("alibi") and "layer-" not in c["name"]} == {"control"}


def _pattern(L, key_of):
    """A one-layer, one-head mean pattern [1, 1, L, L] putting all of query i's weight on key_of(i) (itself if None)."""
    p = np.zeros((1, 1, L, L))
    for i in range(L):
        j = key_of(i)
        p[0, 0, i, i if j is None or j < 0 else j] = 1.0
    return p


def test_previous_token_and_induction_probes_on_known_patterns():
    L, Lmax = 20, 16
    prev = _pattern(L, lambda i: i - 1)
    t = np.arange(L)
    assert offset_share(prev, -1)[0, 0] == 1 and argmax_share(prev, t - 1, t >= 1)[0, 0] == 1
    assert offset_share(prev, -2)[0, 0] == 0
    got = ind.head_probes(prev, L, Lmax)
    assert got["prev_argmax_out"][0, 0] == 1 and got["ind_argmax_all"][0, 0] == 0
    P = (L + 1) // 2
    induction = _pattern(L, lambda i: i - P + 1 if i >= P else None)
    got = ind.head_probes(induction, L, Lmax)
    assert got["ind_argmax_all"][0, 0] == 1 and got["ind_share_out"][0, 0] == 1 and got["prev_argmax_all"][0, 0] == 0
    short = _pattern(12, lambda i: i - 5 if i >= 6 else None)  # L = 12, P = 6: every query before t = 16
    assert np.isnan(ind.head_probes(short, 12, Lmax)["ind_share_out"][0, 0])
    assert ind.head_probes(short, 12, Lmax)["ind_argmax_in"][0, 0] == 1


def test_last_query_rows_read_each_layers_peak():
    attn = np.zeros((2, 1, 10))
    attn[0, 0, 7], attn[1, 0, 3] = 1.0, 1.0  # layer 0 peaks at -2, layer 1 at -6 (L = 10)
    rows = last_query_rows(attn, 10, K=2)
    assert [(r["layer"], r["peak_offset"], r["a_star"]) for r in rows] == [(0, -2, 1.0), (1, -6, 0.0)]


@pytest.mark.parametrize("module", [nd, ind])
def test_claims_flip_on_synthetic_rows(module):
    report = check_flips(module.CLAIMS)
    assert report.judged and not report.failures, report.failures


def test_nope_hypothesis_claims_read_the_retrieving_head_only():
    spec = next(s for s in nd.CLAIMS if s.name.startswith("nope, {n_layers} layers: retrieving head's peak"))
    base = dict(probe="head", encoding="nope", n_layers=2, K=2, seed=0)
    rows = [dict(base, retrieving=True, peak_offset=-2, length=L) for L in (12, 48)]
    rows += [dict(base, retrieving=False, peak_offset=-7, length=L) for L in (12, 48)]  # another layer's head
    (claim,) = judge_all([spec], rows)
    assert claim.holds is True
    rows[1]["peak_offset"] = -1
    (claim,) = judge_all([spec], rows)
    assert claim.holds is False
