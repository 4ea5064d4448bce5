"""Table 2 and Section 7 declarations: the derived dilution-fit rows, Proposition 1's comparison,
the width condition of the linear control, and the spec helpers they need, on hand-built rows."""

import numpy as np
import pytest

from poslab.experiments.fixed_offset import dilution_fit_rows
from poslab.experiments.spec import ClaimSpec, Ref, judge_all, probe, share, synthetic_rows
from poslab.probes.interpolant import min_norm_interpolant, off_support
from poslab.studies import linear_control, validation

KEY = ("encoding", "K", "length_sampling", "seed")  # a member of the validation study


def cells(a_of_L, K=2, seed=0, sampling="batch", lengths=(12, 16, 20, 24, 32, 40, 48)):
    return [dict(probe="length", encoding="rope", K=K, length_sampling=sampling, seed=seed, length=L,
                 a_star=a_of_L(L)) for L in lengths]


def test_fit_rows_recover_an_exact_inverse_linear_law_and_split_unseen_lengths():
    rows = cells(lambda L: 1 / (1 + 0.01 * (L - 1)))
    fits = {r["span"]: r for r in dilution_fit_rows(rows, Lmax=16, key=KEY)}
    assert set(fits) == {"all", "unseen"}
    assert fits["all"]["slope"] == pytest.approx(0.01) and fits["all"]["intercept"] == pytest.approx(1.0)
    assert fits["all"]["r2"] == pytest.approx(1.0) and fits["all"]["max_rel_residual"] < 1e-9
    assert fits["unseen"]["lengths"] == "[20, 24, 32, 40, 48]"
    linear = [s for s in validation.CLAIMS if "linear in L-1" in s.name][0]
    assert all(c.holds for c in judge_all([linear], list(fits.values())))


def test_a_curved_decay_is_judged_not_linear():
    rows = cells(lambda L: 1 / (1 + ((L - 1) - 30) ** 2 / 100))  # 1/a* falls then rises: not a line
    fits = dilution_fit_rows(rows, Lmax=16, key=KEY)
    linear = [s for s in validation.CLAIMS if "linear in L-1" in s.name][0]
    claims = judge_all([linear], fits)
    all_span = [c for c in claims if "all lengths" in c.name][0]
    assert all_span.holds is False and float(all_span.measured) < validation.R2_LINEAR


def test_proposition_1_compares_two_columns_of_each_member():
    prop = [s for s in validation.CLAIMS if "Proposition 1" in s.name][0]
    base = dict(probe="member", encoding="rope", K=2, length_sampling="batch")
    rows = [dict(base, seed=s, profile_peak=-2, logit_peak=-2) for s in range(3)]
    assert [c.holds for c in judge_all([prop], rows)] == [True]
    rows[1]["logit_peak"] = 0  # a residual term moved one seed's expected argmax to the self key
    (claim,) = judge_all([prop], rows)
    assert claim.holds is False and claim.measured == "66.7%"


def test_synthetic_rows_fill_the_column_a_share_is_compared_with():
    spec = ClaimSpec(name="x", paper="p", where=probe("member"), measure=share("a", "==", Ref("b")), op=">=",
                     threshold=1.0)
    rows = synthetic_rows(spec, 1.0)
    assert all("b" in r for r in rows) and spec.measure(rows) == 1.0


def test_mean_logit_is_the_average_of_the_last_query_scores():
    import torch

    from poslab.models.retrieval_head import RetrievalHead, RetrievalHeadConfig
    from poslab.probes import mean_logit_profile
    from poslab.tasks import build_task, eval_batch

    torch.manual_seed(0)
    model = RetrievalHead(RetrievalHeadConfig(d_model=16, max_len=16)).eval()
    batch = eval_batch(build_task("fixed_offset", m=20, K=2), 12, 10, 0)
    with torch.no_grad():
        scores = model.collect(batch).layers[0].attn_scores[:, 0, -1].double()  # [b, L]
        got = mean_logit_profile(model, batch)
    assert np.allclose(got, scores.mean(0).numpy())


def width_rows(d, acc, chance=0.05):
    return dict(probe="length", attention="linear", d=d, frequencies=d // 2, train_offsets=16,
                excess_frequencies=d // 2 - 16, excess_coefficients=d - 16, longest=True, length=48, in_range=False,
                accuracy=acc, chance=chance, seed=0)


def test_the_width_sweep_is_judged_by_the_coefficient_count_and_the_frequency_reading_is_shown():
    claims = judge_all(linear_control.CLAIMS, [width_rows(64, 0.06), width_rows(32, 0.06), width_rows(16, 0.5)])
    by = {c.name: c for c in claims if c.name.startswith("linear, d=") and "accuracy at L=48" in c.name}
    d64 = [c for n, c in by.items() if n.startswith("linear, d=64 (")]
    d32 = [c for n, c in by.items() if n.startswith("linear, d=32 (")]
    d16 = [c for n, c in by.items() if n.startswith("linear, d=16 (")]
    assert [c.holds for c in d64] == [True]  # 32 frequencies > 16 offsets: destroyed (<= 2 x chance)
    assert [c.holds for c in d32] == [True]  # 32 coefficients > 16 offsets: underdetermined, destroyed
    assert [c.holds for c in d16] == [True]  # 16 coefficients = 16 offsets: determined, not destroyed
    earlier = [c for n, c in by.items() if n.startswith("linear, d=32: accuracy at L=48 read by the frequency")]
    assert [c.holds for c in earlier] == [None] and earlier[0].note.startswith("n.a.")
    # the other side of each line
    flipped = judge_all(linear_control.CLAIMS, [width_rows(32, 0.5), width_rows(16, 0.06)])
    assert [c.holds for c in flipped if c.name.startswith(("linear, d=32 (", "linear, d=16 ("))] == [False, False]


def test_min_norm_interpolant_off_support_is_what_the_claim_reads():
    theta = 10000.0 ** (-np.arange(0, 16, 2) / 16)  # d = 16: 8 frequencies, 16 coefficients
    offsets = np.arange(-47, 1)
    on = (offsets >= -11) & (offsets < 0)  # 11 offsets: under-determined
    basis = np.concatenate([np.cos(np.outer(offsets, theta)), np.sin(np.outer(offsets, theta))], axis=1)
    spike = np.where(offsets[on] == -2, 1.0, 0.0)
    rc = linear_control.INTERPOLANT_RCOND
    truth = min_norm_interpolant(theta, offsets[on], spike, offsets, rcond=rc)
    g = min_norm_interpolant(theta, offsets[on], truth[on], offsets, rcond=rc)
    assert np.allclose(g, truth, rtol=1e-6, atol=1e-6)  # a min-norm profile is its own interpolant
    assert off_support(truth, g, offsets < -11) == pytest.approx(1.0)
    null = np.linalg.svd(basis[on])[2][-1]  # coefficients invisible on the support
    other = truth + np.abs(truth).max() * basis @ null / np.abs(basis @ null).max()
    assert np.allclose(other[on], truth[on], atol=1e-6 * np.abs(truth).max())
    assert off_support(other, g, offsets < -11) < 0.9  # same support values, not min-norm
