"""Table 1, K = 1 and Fig. 4 controls: which rows each claim judges and in which role (K = 1 as the
paper's, the APE controls by the headline's criteria as controls), the derived rows the claims read,
and Measure(by=...)."""

import numpy as np
import pytest
import torch

from poslab.experiments.config import StudyConfig
from poslab.experiments.spec import ClaimSpec, check_flips, judge_all, minimum
from poslab.probes.weights import table_row_norms
from poslab.studies import controls, k1, phenomenon
from poslab.studies.kit import fixed_offset


def test_minimum_by_takes_the_lowest_group_mean():
    spec = ClaimSpec(name="x", paper="p", measure=minimum("accuracy", by=("length",)), op=">=", threshold=0.9)
    rows = [dict(length=12, accuracy=a, seed=s) for s, a in enumerate((1.0, 0.9))] + \
           [dict(length=48, accuracy=a, seed=s) for s, a in enumerate((0.95, 0.8))]
    (claim,) = judge_all([spec], rows)
    assert claim.measured == pytest.approx(0.875) and claim.holds is False  # the cells' min would be 0.8
    assert not check_flips([spec]).failures


def _cells(encoding, K, seed, init=0.02, variant=None, acc=1.0, peak=None, Lmax=16):
    out = []
    for L in (12, 16, 20, 24, 32):
        pos = peak if peak is not None else L - 1 - K
        out.append(dict(probe="length", encoding=encoding, init_std=init, variant=variant, K=K, seed=seed, length=L,
                        in_range=L <= Lmax, accuracy=acc if L <= Lmax else (acc if encoding == "rope" else 0.05),
                        peak_offset=pos - (L - 1), peak_position=pos, in_range_mass=0.9, chance=0.05,
                        length_sampling="batch"))
    return out


def _phenomenon_claims(rows):
    labelled = fixed_offset.ape_conditions(rows, 16, phenomenon.HEADLINE_INIT)
    cells = [r for r in labelled if r["probe"] == "length"]
    heads = fixed_offset.head_pinning([r for r in cells if r["kind"] == "absolute"], 16)
    return {c.name: c for c in judge_all(phenomenon.CLAIMS, cells + heads)}


def test_rope_accuracy_is_judged_as_the_papers_at_every_k_including_k1():
    rows = [*_cells("rope", 1, 0, acc=0.8), *_cells("rope", 2, 0, acc=0.99)]
    claims = _phenomenon_claims(rows)
    k1_acc = claims["rope, K=1: lowest mean accuracy over evaluation lengths"]
    assert k1_acc.holds is False and k1_acc.measured == pytest.approx(0.8) and k1_acc.role == "paper"
    assert _phenomenon_claims([*_cells("rope", 1, 0, acc=0.98)])[k1_acc.name].holds is True
    assert claims["rope, K=2: lowest mean accuracy over evaluation lengths"].holds is True
    assert claims["rope, K=1: seed x length cells selecting offset -K"].holds is True  # selection is judged at K=1
    rows = [*_cells("rope", 1, 0, acc=0.8), *_cells("rope", 2, 0, acc=0.9)]
    assert _phenomenon_claims(rows)["rope, K=2: lowest mean accuracy over evaluation lengths"].holds is False


def test_ape_controls_are_judged_by_the_headlines_criteria_as_controls():
    drift = None  # the control's peak follows the length (not pinned)
    rows = [*_cells("learned", 2, 0, peak=13), *_cells("learned", 2, 0, init=1.0, peak=drift),
            *_cells("learned", 2, 0, variant="clamp", peak=drift)]
    claims = _phenomenon_claims(rows)
    pin = "(seed, K) heads whose peak is one position < L_max at every unseen length"
    assert claims[f"learned 0.02 (headline): {pin}"].holds is True
    assert claims[f"learned 0.02 (headline): {pin}"].role == "paper"
    for cond in ("learned 1.0", "learned 0.02 clamp"):
        assert claims[f"{cond} (control): {pin}"].holds is False  # judged: pinning fails in this control
        assert claims[f"{cond} (control): {pin}"].role == "control"
        assert claims[f"{cond} (control): accuracy at unseen lengths (> L_max)"].holds is True
    pinned = _phenomenon_claims([*_cells("learned", 2, 0, init=1.0, peak=12)])
    assert pinned[f"learned 1.0 (control): {pin}"].holds is True
    trained = "accuracy at trained lengths (<= L_max)"
    assert claims[f"learned 1.0 (control): {trained}"].role == "control"
    assert claims[f"learned 0.02 clamp (control): {trained}"].role == "check"  # the clamp reads no row < L_max
    rows = [*_cells("learned", 2, 0, peak=None)]  # a headline head that drifts: pinning is "no"
    assert _phenomenon_claims(rows)[f"learned 0.02 (headline): {pin}"].holds is False


def _member(K, seed, peak, self_w, target_w, cov=-1.0, cos0=0.8, cost=0.5):
    return dict(probe="member", K=K, seed=seed, profile_peak=peak, self_weight=self_w, target_weight=target_w,
                uniform=1 / 16, content_covariance=cov, cos_0=cos0, cos_target=cost, carrier_k=0.8)


def test_k1_claims_read_the_profile_argmax_the_two_attentions_and_the_covariance():
    good = [_member(1, s, 0, 0.1, 0.8) for s in range(3)] + [_member(2, s, -2, 0.01, 0.8, cos0=0.2, cost=0.8)
                                                                for s in range(3)]
    got = {c.name: c.holds for c in judge_all(k1.CLAIMS, k1.derived(good, 48))}
    # issue 53: both former n.a. are judged (cos_0 > 0.5, validation's bar; attention at 0 below 1/L, the original
    # line); at 0.1 > 1/16 the 1/L line says no while the target's attention says yes: two readings, both shown
    assert got["K=1: attention at delta = 0 minus a uniform head's 1/L (L = L_max)"] is False
    assert got["K=1: cos(m_Q, R_0 m_K)"] is True
    assert sum(v is True for v in got.values()) == 6 and None not in got.values()
    assert got["K=1: attention at delta = -1 exceeds attention at delta = 0 (L = L_max)"] is True
    low = [_member(1, s, 0, 0.05, 0.8) for s in range(3)]  # below a uniform head's 1/16
    assert {c.name: c.holds for c in judge_all(k1.CLAIMS, k1.derived(low, 48))}[
        "K=1: attention at delta = 0 minus a uniform head's 1/L (L = L_max)"] is True
    bad = [_member(1, 0, -1, 0.5, 0.4, cov=0.3)] + good[1:]
    got = {c.name: c.holds for c in judge_all(k1.CLAIMS, k1.derived(bad, 48))}
    assert got["K=1: carrier profile argmax over delta <= 0 at 0 (kernel centred at 0)"] is False
    assert got["K=1: attention at delta = -1 exceeds attention at delta = 0 (L = L_max)"] is False
    assert got["K=1: content covariance (diag - off-diag of G at delta = 0, in std of G)"] is True  # mean < 0


KERNEL_MARGIN = ("base: relative range of the kernel's margin over the evaluation lengths (mean logits, then the max "
                 "over competing offsets)")
SEQUENCE_MARGIN = ("base: relative range of the seed-mean margin mu over the evaluation lengths (per sequence, over "
                   "the strongest competitor)")


def _controls_rows(carrier_by_step, margins=(3.0, 3.0, 3.0), slopes=None):
    rows = []
    for seed in (0, 1):
        for step, v in carrier_by_step.items():
            rows.append(dict(probe="snapshot", setting="base", seed=seed, step=step, carrier_k=v, carrier_q=v,
                             rank_concentration=v))
        for setting, c in (slopes or {"d=32": 0.02, "base": 0.01, "d=128": 0.001}).items():
            for L, mu in zip((12, 24, 48), margins, strict=False):
                rows.append(dict(probe="length", setting=setting, seed=seed, length=L, in_range=L <= 16,
                                 accuracy=1.0, peak_offset=-2, a_star=1 / (1 + c * (L - 1)), margin=mu - 0.5,
                                 margin_profile=mu, bound=0.5, chance=0.05))
    return rows


def _controls_claims(rows):
    study = StudyConfig(model_type="retrieval_head", task_type="fixed_offset", task=dict(K=2))
    every = controls.derived_rows(rows, study)
    return every, {c.name: c for c in judge_all(controls.CLAIMS, every, controls.GATE)}  # as its report judges


def test_controls_co_emergence_plateau_margin_range_and_width_trend():
    every, claims = _controls_claims(
        _controls_rows({0: 0.05, 100: 0.5, 200: 0.75, 1000: 0.8, 2000: 0.8}))
    em = {r["quantity"]: r for r in every if r["probe"] == "emergence"}
    assert em["carrier_k"]["reach_step"] == 200 and em["carrier_k"]["late_change"] == 0.0
    assert claims["base: carrier_k at >= 90% of its final value by step"].holds is True
    assert claims["base: carrier_k largest relative change from step 500 on"].holds is True
    assert claims[KERNEL_MARGIN].holds is True
    # issue 53: the seed's own margin in the seed's own setting is paper (was control)
    assert claims[SEQUENCE_MARGIN].holds is True and claims[SEQUENCE_MARGIN].role == "paper"
    assert claims["dilution rate c by width (d=32, base d=64, d=128): smallest drop from one width to the next"
                  ].holds is True
    _, claims = _controls_claims(_controls_rows({0: 0.05, 100: 0.1, 1000: 0.5, 2000: 0.8}, margins=(2.0, 3.0, 4.0),
                                                slopes={"d=32": 0.01, "base": 0.02, "d=128": 0.001}))
    assert claims["base: carrier_k at >= 90% of its final value by step"].holds is False  # step 2000
    assert claims["base: carrier_k largest relative change from step 500 on"].holds is False  # 0.5 -> 0.8
    assert claims[KERNEL_MARGIN].holds is False
    assert claims[SEQUENCE_MARGIN].holds is False  # judged with the kernel margin's line
    assert claims["dilution rate c by width (d=32, base d=64, d=128): smallest drop from one width to the next"
                  ].holds is False


def test_row_norms_read_the_rows_past_lmax_against_their_initial_values():
    from poslab.models.retrieval_head import RetrievalHead, RetrievalHeadConfig

    make = lambda: RetrievalHead(RetrievalHeadConfig(encoding="learned", d_model=16, max_len=48))  # noqa: E731
    torch.manual_seed(0)
    trained, untrained = make(), make()
    trained.load_state_dict(untrained.state_dict())
    with torch.no_grad():
        trained.encoding.W_pos[16:] *= 0.5
    got = table_row_norms(trained, untrained, 16)
    assert got["unseen_row_norm_ratio"] == pytest.approx(0.5) and got["seen_row_norm_ratio"] == pytest.approx(1.0)
    rope = RetrievalHead(RetrievalHeadConfig(encoding="rope", d_model=16, max_len=48))
    assert table_row_norms(rope, rope, 16) == dict(unseen_row_norm_ratio=None, seen_row_norm_ratio=None)
    assert np.isfinite(got["unseen_row_norm_ratio"])


def test_the_decay_failure_is_judged_only_where_the_head_learned_the_task_in_range():
    def rows(setting, in_range_acc, far_acc):
        return [dict(probe="length", setting=setting, seed=0, length=L, in_range=L <= 16,
                     accuracy=in_range_acc if L <= 16 else far_acc, peak_offset=3, a_star=0.1, margin=1.0,
                     bound=0.05, chance=0.05) for L in (12, 16, 48)]
    _, claims = _controls_claims(rows("ape l2=0.01", 0.13, 0.09) + rows("ape wd=0.01", 1.0, 0.07))
    name = "{}: APE accuracy at the longest length"
    assert claims[name.format("ape l2=0.01")].holds is None  # never learned: n.a., not a "yes"
    assert claims[name.format("ape l2=0.01")].na_kind == "not-learned"  # the study's gate (issue 53)
    assert claims[name.format("ape wd=0.01")].holds is True
    _, claims = _controls_claims(rows("ape wd=0.01", 1.0, 0.5))
    assert claims[name.format("ape wd=0.01")].holds is False


def test_a_loose_bound_is_a_gap_present_beyond_two_standard_errors_and_validity_is_a_check():
    def rows(gaps):
        return [dict(probe="length", setting="base", seed=seed, length=L, in_range=L <= 16, accuracy=1.0,
                     peak_offset=-2, a_star=0.6, margin=1.0, margin_profile=1.0, bound=0.6 - gap, chance=0.05)
                for seed, gap in enumerate(gaps) for L in (12, 24)]
    loose = "base: a* - bound (lengths x seeds), seed mean less 2 standard errors"
    valid = "base: 1/(1+(L-1)e^-mu) at the mean margin <= measured a* (lengths x seeds)"
    _, claims = _controls_claims(rows((0.40, 0.45, 0.50)))
    assert claims[loose].holds is True and claims[loose].role == "paper"
    assert claims[valid].holds is True and claims[valid].role == "check"
    _, claims = _controls_claims(rows((0.0, 0.01, -0.005)))  # a tight bound: the gap is not beyond its noise
    assert claims[loose].holds is False and claims[valid].holds is False


def test_the_rotary_kernel_claims_are_checks_judged_against_the_seeds_range():
    from poslab.probes.weights import rotary_kernel_rows

    rows = [dict(probe="kernel", **k) for k in rotary_kernel_rows(controls.WIDTHS, controls.BASES)]
    claims = judge_all([c for c in controls.CLAIMS if c.where(rows[0])], rows)
    assert claims and all(c.role == "check" for c in claims)
    assert all(c.holds is True for c in claims)  # the seed's 0.67-0.79 is reproduced (within 0.05) at each width
    ratio = {c.name: float(c.measured) for c in claims if "g(s)/g(0)" in c.name}
    assert ratio["lowest max_(4<=s<=47) g(s)/g(0) over bases [1000.0, 10000.0, 100000.0], d=64"] == \
        pytest.approx(0.671, abs=1e-3)


def test_ape_conditions_flag_the_evaluate_only_clamp_and_the_headline_init():
    rows = [*_cells("rope", 2, 0), *_cells("rope", 2, 0, init=1.0), *_cells("learned", 2, 0),
            *_cells("learned", 2, 0, init=1.0), *_cells("learned", 2, 0, variant="clamp"),
            *_cells("learned", 2, 0, init=1.0, variant="clamp")]
    labelled = fixed_offset.ape_conditions(rows, 16, phenomenon.HEADLINE_INIT)
    flags = {r["condition"]: (r["role"], r["clamp"]) for r in labelled}
    assert flags == {"rope": (None, None), "learned 0.02": ("headline", False), "learned 1.0": ("control", False),
                     "learned 0.02 clamp": ("control", True), "learned 1.0 clamp": ("control", True)}
    assert sum(r["condition"] == "rope" for r in labelled) == 5  # RoPE's N(0, 1) copy is dropped: no table
