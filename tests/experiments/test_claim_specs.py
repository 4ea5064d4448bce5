"""Claims as data: every study's judged claims flip on synthetic rows either side of their line,
and the rendering of criteria from operators."""

import importlib
import pkgutil

import pytest

import poslab.studies
from poslab.experiments.spec import (
    ClaimSpec,
    at_least,
    check_flips,
    is_,
    judge_all,
    kind,
    mean,
    minimum,
    neg,
    share,
    synthetic_rows,
)

STUDY_MODULES = [m.name for m in pkgutil.iter_modules(poslab.studies.__path__)]


def _specs(module):
    specs = getattr(module, "CLAIMS", None)
    return specs() if callable(specs) else specs


@pytest.mark.parametrize("name", STUDY_MODULES)
def test_every_declared_claim_flips_at_its_threshold(name):
    module = importlib.import_module(f"poslab.studies.{name}")
    specs = _specs(module)
    assert specs, f"{name} declares no CLAIMS"
    report = check_flips(specs)
    assert not report.failures, report.failures
    assert report.judged or all(s.op is None for s in specs)


def test_demo_study_claims_flip():
    import demo_shift

    report = check_flips(demo_shift.CLAIMS)
    assert report.judged and not report.failures


def test_criterion_is_rendered_from_the_operator():
    spec = ClaimSpec(name="x", paper="p", measure=mean("accuracy"), op=">=", threshold=0.97)
    assert spec.criterion() == "≥ 0.97"
    pct = ClaimSpec(name="x", paper="p", measure=share("peak_offset", "==", neg("K")), op=">=", threshold=1.0,
                    percent=True)
    assert pct.criterion() == "≥ 100%"
    near = ClaimSpec(name="x", paper="p", measure=mean("a"), op="~", threshold=0.5, tol=0.1)
    assert near.criterion() == "within 0.1 of 0.5"
    chance = ClaimSpec(name="x", paper="p", measure=mean("accuracy"), op="<=", threshold=2, scale_by="chance")
    assert chance.criterion() == "≤ 2 x chance"


def test_share_against_another_column_of_the_row():
    spec = ClaimSpec(name="{encoding} K={K}", paper="100%", where=kind("rotary") & at_least("K", 2),
                     per=("encoding", "K"), measure=share("peak_offset", "==", neg("K")), op=">=", threshold=1.0)
    rows = [dict(kind="rotary", encoding="rope", K=2, peak_offset=-2, seed=s) for s in range(3)]
    rows += [dict(kind="rotary", encoding="rope", K=1, peak_offset=0, seed=0)]  # K = 1 is not judged here
    rows += [dict(kind="absolute", encoding="learned", K=2, peak_offset=5, seed=0)]
    (claim,) = judge_all([spec], rows)
    assert claim.name == "rope K=2" and claim.holds is True
    rows[0]["peak_offset"] = -1
    (claim,) = judge_all([spec], rows)
    assert claim.holds is False and abs(float(claim.measured) - 2 / 3) < 1e-12


def test_na_claims_carry_their_reason_and_never_a_verdict():
    spec = ClaimSpec(name="alibi K={K}", paper="not RoPE-specific", where=is_("encoding", "alibi"), per=("K",),
                     measure=minimum("accuracy"), na="a monotone bias cannot prefer -2 over -1")
    (claim,) = judge_all([spec], synthetic_rows(spec, 1.0))
    assert claim.holds is None and claim.note.startswith("n.a.: a monotone bias")


def test_an_inverted_threshold_is_caught():
    good = ClaimSpec(name="x", paper="p", measure=mean("accuracy"), op=">=", threshold=0.9)
    assert not check_flips([good]).failures
    with pytest.raises(ValueError, match="op"):
        ClaimSpec(name="x", paper="p", measure=mean("accuracy"), op="=>", threshold=0.9)
    with pytest.raises(ValueError, match="not both"):
        ClaimSpec(name="x", paper="p", measure=mean("accuracy"), op=">=", threshold=0.9, na="why")


def test_lower_bound_is_the_seed_mean_less_two_standard_errors_of_the_seed_means():
    from poslab.experiments.spec import lower_bound
    rows = [dict(seed=0, x=0.1), dict(seed=0, x=0.3), dict(seed=1, x=0.4), dict(seed=2, x=0.5)]
    means = [0.2, 0.4, 0.5]
    m = sum(means) / 3
    se = (sum((v - m) ** 2 for v in means) / 2) ** 0.5 / 3 ** 0.5
    assert lower_bound("x")(rows) == pytest.approx(m - 2 * se)
    assert lower_bound("x")([dict(seed=0, x=1.0), dict(seed=0, x=2.0)]) is None  # one seed: no spread
    spec = ClaimSpec(name="x present", paper="present", measure=lower_bound("x"), op=">", threshold=0.0)
    assert [c.holds for c in spec.evaluate([dict(seed=0, x=0.01), dict(seed=1, x=-0.01)])] == [False]
    assert [c.holds for c in spec.evaluate([dict(seed=0, x=0.01), dict(seed=1, x=0.012)])] == [True]
