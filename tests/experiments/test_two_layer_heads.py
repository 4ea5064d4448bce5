"""Section 5.2 (two-layer) and the head-count study: the equivariance / uniqueness probes they
judge with, and the heads study's derived rows and per-class peak, on inputs with known answers."""

import numpy as np
import pytest
import torch

from poslab.models import model_classes
from poslab.probes import accuracy_and_attention, rotary_kernel
from poslab.probes.equivariance import secondary_peak, total_variation, window_profile
from poslab.probes.per_head import class_peaks
from poslab.studies import heads as heads_study
from poslab.studies import two_layer
from poslab.tasks import build_task, eval_batch


def _softmax(x):
    e = np.exp(x - x.max())
    return e / e.sum()


def test_a_pure_offset_logit_gives_the_same_window_profile_at_every_length():
    def f(delta):  # any function of the offset alone
        return -0.3 * (delta + 2) ** 2 + 0.1 * np.cos(delta)

    rows = {L: _softmax(f(np.arange(L) - (L - 1))) for L in (8, 16, 48)}
    prof = {L: window_profile(r, L, 8) for L, r in rows.items()}
    assert all(abs(p.sum() - 1) < 1e-12 for p in prof.values())
    assert max(total_variation(prof[L], prof[16]) for L in prof) < 1e-12
    assert {int(p.argmax()) - 7 for p in prof.values()} == {-2}
    # a logit pinned to absolute position 5 moves within the window as L grows
    pinned = {L: _softmax(-0.3 * (np.arange(L) - 5.0) ** 2) for L in (8, 16)}
    assert total_variation(window_profile(pinned[8], 8, 8), window_profile(pinned[16], 16, 8)) > 0.5


def test_window_profile_is_the_renormalized_tail_and_refuses_bad_widths():
    row = np.array([0.1, 0.2, 0.3, 0.4])
    assert np.allclose(window_profile(row, 4, 2), [3 / 7, 4 / 7])
    with pytest.raises(ValueError, match="width"):
        window_profile(row, 4, 5)
    with pytest.raises(ValueError, match="shapes"):
        total_variation(np.ones(2) / 2, np.ones(3) / 3)


def test_secondary_peak_of_a_16_dim_rotary_kernel_sits_where_high_frequencies_realign():
    deltas = np.arange(-47, 1)
    for d, base in ((16, 1e4), (64, 1e4)):
        theta = base ** (-np.arange(0, d, 2) / d)
        g = rotary_kernel(theta, deltas + 2)  # a carrier pre-rotated to -K = -2
        top = secondary_peak(g, deltas)
        assert top["argmax"] == -2 and top["unique"] and 0 < top["ratio"] < 1
        assert top["second"] != -2 and g[top["second"] + 47] == pytest.approx(top["ratio"] * g.max())
    # two equal maxima are not a single peak
    assert not secondary_peak([0, 1, 0, 1, 0], np.arange(5))["unique"]
    assert secondary_peak([0, 1, 2], np.arange(3)) == dict(argmax=2, second=None, ratio=pytest.approx(np.nan,
                                                                                                        nan_ok=True),
                                                           unique=True)


def _peak_rows(task, seed, peaks):
    """L=48 rows of the heads study: peaks {(H, d_head): peak_height}."""
    return [dict(probe="length", length=48, task=task, K2=3, seed=seed, n_heads=H, d_head=d, d_model=H * d,
                 peak_height=p) for (H, d), p in peaks.items()]


def test_heads_resource_row_is_the_share_of_the_drop_that_per_head_width_undoes():
    rows = _peak_rows("cc", 0, {(1, 64): 0.7, (4, 16): 0.3, (4, 64): 0.6})
    rows += _peak_rows("cc", 1, {(1, 64): 0.7, (4, 16): 0.68, (4, 64): 0.6})  # drop < MIN_DROP: no share
    derived = heads_study.derived_rows(rows)
    (res,) = [r for r in derived if r["probe"] == "resource"]
    assert res["seed"] == 0 and res["recovered"] == pytest.approx((0.6 - 0.3) / (0.7 - 0.3))
    sweeps = [(r["sweep"], r["n_heads"]) for r in derived if r["probe"] == "sweep" and r["seed"] == 0]
    assert sorted(sweeps) == [("d_head = 64", 1), ("d_head = 64", 4), ("d_model = 64", 1), ("d_model = 64", 4)]
    claims = heads_study.judge_all([c for c in heads_study.CLAIMS if c.where(derived[-1])], rows + derived)
    assert [c.holds for c in claims] == [True]


def test_class_peaks_average_each_query_class_on_its_own():
    task = build_task("content_conditioned", m=20, K1=2, K2=3)
    cls, cfg_cls = model_classes("retrieval_head")
    torch.manual_seed(0)
    model = cls(cfg_cls(vocab_size=20, d_model=16, n_heads=2, max_len=32)).eval()
    batch = eval_batch(task, 12, 64, 0)
    got = class_peaks(model, batch, 20, chunk=16)
    query = batch.tokens[:, 11]
    for c, keep in enumerate((query < 10, query >= 10)):
        _, attn = accuracy_and_attention(model, batch[keep.nonzero()[:, 0]])
        assert np.allclose(got[c], attn.max(-1))
    _, pooled = accuracy_and_attention(model, batch)
    assert (pooled.max(-1) <= got.max(0) + 1e-12).all()  # a mixture never peaks above its parts


def test_two_layer_grid_makes_per_head_width_an_axis_with_the_paper_width_first():
    study = two_layer.EXPERIMENT.study("paper")
    assert study.grid["setting"][0] == "d_head=64" and study.model["n_heads"] == 4
    assert {name: b["model.d_model"] // 4 for name, b in study.settings.items()} == {"d_head=64": 64, "d_head=16": 16}


def test_absolute_peak_tells_a_pinned_head_from_a_relative_one_and_allows_a_small_drift():
    from poslab.probes.layer_heads import absolute_peak

    unseen = [20, 24, 32, 40, 48]
    fixed = absolute_peak(unseen, [9] * 5, 16)
    assert fixed["slope"] == pytest.approx(0.0, abs=1e-12) and fixed["absolute_peak"] == 1
    drift = absolute_peak(unseen, [10, 9, 9, 8, 8], 16)  # one position at a time, as two APE seeds did
    assert -0.1 < drift["slope"] < -0.05 and drift["absolute_peak"] == 1
    relative = absolute_peak(unseen, [L - 3 for L in unseen], 16)  # an offset-equivariant head
    assert relative["slope"] == pytest.approx(1.0) and relative["absolute_peak"] == 0
    assert absolute_peak(unseen, [17] * 5, 16)["absolute_peak"] == 0  # fixed, but outside the training range
    creeping = absolute_peak(unseen, [3, 4, 5, 6, 7], 16)  # inside the range, but just past the slope line
    assert 0.1 < creeping["slope"] < 0.2 and creeping["absolute_peak"] == 0
    lone = absolute_peak([20], [9], 16)
    assert np.isnan(lone["slope"]) and lone["absolute_peak"] == 0


def test_two_layer_control_width_is_judged_by_the_headlines_criteria_as_a_control():
    from poslab.experiments.spec import judge_all

    def member(setting, seed, single_peak, at_minus_K, pinned):
        return dict(probe="member", encoding="rope" if pinned is None else "learned", setting=setting, seed=seed,
                    kernel_single_peak=single_peak, at_minus_K=at_minus_K, pinned=pinned, random_direction_head=0.1)
    rows = [member(two_layer.HEADLINE, s, 1, 1, None) for s in range(3)]
    rows += [member(two_layer.CONTROL, s, int(s == 0), int(s == 0), None) for s in range(3)]  # 1 of 3, as measured
    rows += [member(w, s, None, None, int(w == two_layer.CONTROL)) for w in (two_layer.HEADLINE, two_layer.CONTROL)
             for s in range(3)]
    claims = {c.name: c for c in judge_all(two_layer.CLAIMS, rows)}
    single = "rope, {}: carrier kernel phi_c over [-47, 0] has its single maximum at -K (Lemma 2)"
    assert (claims[single.format("d_head=64")].role, claims[single.format("d_head=64")].holds) == ("paper", True)
    assert (claims[single.format("d_head=16")].role, claims[single.format("d_head=16")].holds) == ("control", False)
    assert claims[single.format("d_head=16")].criterion == claims[single.format("d_head=64")].criterion
    strict = "learned, {}: retrieving head peaks at one absolute position < 16 at every unseen length"
    assert [(claims[strict.format(w)].role, claims[strict.format(w)].holds) for w in ("d_head=64", "d_head=16")] == \
        [("paper", False), ("control", True)]  # Proposition 2's literal reading at the headline width (issue 53)
    baseline = claims["rope, d_head=64: the carrier probe's random-direction baseline 1/d_head"]
    assert baseline.role == "check" and baseline.holds is None and baseline.na_kind == "comparison"
    for spec in two_layer.CLAIMS:  # every paper claim at the headline width has its control twin at d_head = 16
        if spec.role == "paper":
            twin = [c for c in two_layer.CLAIMS if c.role == "control" and c.name == spec.name]
            assert len(twin) == 1 and (twin[0].op, twin[0].threshold, twin[0].tol) == (spec.op, spec.threshold,
                                                                                      spec.tol), spec.name


def _head_rows(K2, H, shares):
    """Head rows of the heads study at d_model = 64: shares[seed][head] of W's top singular value."""
    task = "fixed offset K=2" if K2 == 2 else "content-conditioned K1=2, K2=3"
    return [dict(probe="head", task=task, K2=K2, n_heads=H, d_model=64, d_head=64 // H, seed=s, head=h,
                 rank_concentration=v) for s, heads in enumerate(shares) for h, v in enumerate(heads)]


def test_heads_singular_value_range_is_judged_by_its_overlap_with_the_seeds_range():
    rows = _head_rows(3, 2, [[0.589, 0.70], [0.741, 0.60]])  # all above 0.57: a one-sided test would pass it
    rows += _head_rows(3, 4, [[0.544, 0.759, 0.6, 0.65]])  # meets the range over [0.544, 0.57]
    rows += _head_rows(2, 2, [[0.372, 0.491]])  # inside, on fixed offset: a control
    ranges = {(r["task"][:5], r["n_heads"]): r for r in heads_study.sv_range_rows(rows)}
    assert ranges["conte", 2]["overlap"] == 0.0 and ranges["conte", 2]["range"] == "[0.589, 0.741]"
    assert ranges["conte", 4]["overlap"] == pytest.approx(0.026) and ranges["conte", 4]["seeds"] == 1
    assert ranges["fixed", 2]["covered"] == pytest.approx((0.491 - 0.39) / 0.18)
    specs = [c for c in heads_study.CLAIMS if "singular-value" in c.name]
    got = {(c.name[:5], c.name.split("H=")[1][0]): c for c in heads_study.judge_all(specs, list(ranges.values()))}
    assert got["conte", "2"].holds is False and got["conte", "4"].holds is True
    assert got["fixed", "2"].holds is True and got["fixed", "2"].role == "control" and got["conte", "2"].role == "paper"
    below = heads_study.sv_range_rows(_head_rows(3, 2, [[0.20, 0.389]]))  # just short of 0.39
    assert [c.holds for c in heads_study.judge_all(specs, below)] == [False]
