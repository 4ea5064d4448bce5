"""Claims as data: every study's judged claims flip on synthetic rows either side of their line,
and the rendering of criteria from operators."""

import importlib
import pkgutil

import pytest

import poslab.studies
from poslab.experiments.spec import (
    Agreement,
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
    undecidable,
)

STUDY_MODULES = [m.name for m in pkgutil.iter_modules(poslab.studies.__path__) if not m.ispkg]  # not the kit


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
                     measure=minimum("accuracy"), na=undecidable("a monotone bias cannot prefer -2 over -1"))
    (claim,) = judge_all([spec], synthetic_rows(spec, 1.0))
    assert claim.holds is None and claim.na_kind == "undecidable"
    assert claim.note.startswith("n.a. (the task cannot decide it: a monotone bias")


def test_an_inverted_threshold_is_caught():
    good = ClaimSpec(name="x", paper="p", measure=mean("accuracy"), op=">=", threshold=0.9)
    assert not check_flips([good]).failures
    with pytest.raises(ValueError, match="op"):
        ClaimSpec(name="x", paper="p", measure=mean("accuracy"), op="=>", threshold=0.9)
    with pytest.raises(ValueError, match="not both"):
        ClaimSpec(name="x", paper="p", measure=mean("accuracy"), op=">=", threshold=0.9,
                  na=undecidable("why it cannot decide"))


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


# ----------------------------------------------------------------------------- roles and n.a. reasons


def _all_specs():
    for name in STUDY_MODULES:
        for spec in _specs(importlib.import_module(f"poslab.studies.{name}")):
            yield name, spec


def test_every_declared_claim_has_a_role_and_every_na_a_declared_reason_kind():
    from poslab.experiments.claims import NA_KINDS, ROLES
    from poslab.experiments.spec import NA
    seen = set()
    for name, spec in _all_specs():
        assert spec.role in ROLES, (name, spec.name)
        seen.add(spec.role)
        if spec.op is None:  # n.a. by declaration: one of the declared kinds, with its why in words
            assert isinstance(spec.na, NA) and spec.na.kind in NA_KINDS, (name, spec.name)
            assert len(spec.na.why.split()) >= 4, (name, spec.name, spec.na.why)
    assert {"paper", "control", "check"} <= seen


def test_no_paper_claim_is_na_where_its_operator_would_decide_it():
    """A paper claim left n.a. must say why no operator on its rows could decide it (undecidable),
    that the seed gives the number for comparison only, or what setting it needs (not run); and a
    judged claim evaluated on rows that exist always gets a verdict."""
    for name, spec in _all_specs():
        if spec.op is not None:
            (claim,) = spec.evaluate(synthetic_rows(spec, spec.threshold))
            assert claim.holds is not None and claim.na_kind is None, (name, spec.name)
        else:
            (claim,) = spec.evaluate(synthetic_rows(spec, 0.5)) if spec.measure is not None else (None,)
            if claim is not None:
                assert claim.holds is None and claim.na_kind == spec.na.kind, (name, spec.name)


def test_a_spec_without_operator_or_reason_and_a_bare_string_reason_are_refused():
    with pytest.raises(ValueError, match="op .* or an na"):
        ClaimSpec(name="x", paper="p", measure=mean("a"))
    with pytest.raises(ValueError, match="undecidable"):
        ClaimSpec(name="x", paper="p", measure=mean("a"), na="because")
    with pytest.raises(ValueError, match="role"):
        ClaimSpec(name="x", paper="p", measure=mean("a"), op=">", threshold=0, role="headline")
    with pytest.raises(ValueError, match="say why"):
        undecidable("no")


def test_checks_are_shown_but_never_counted_as_verdicts():
    from poslab.experiments.claims import Claim, counts_text, summary
    claims = [Claim(name="a", paper="p", measured=1.0, holds=True, role="paper"),
              Claim(name="b", paper="p", measured=1.0, holds=False, role="control"),
              Claim(name="c", paper="p", measured=1.0, holds=True, role="check"),
              Claim(name="d", paper="p", measured=None, holds=None, role="external", na_kind="not-run")]
    assert summary(claims) == dict(held=1, failed=1, not_judged=1)
    assert counts_text(claims) == "paper 1 / 0 / 0; control 0 / 1 / 0; external 0 / 0 / 1; check 1 / 0 / 0"
    with pytest.raises(ValueError, match="na_kind"):
        Claim(name="e", paper="p", measured=None, holds=None)


def test_nothing_measured_is_na_not_run():
    spec = ClaimSpec(name="x", paper="p", where=is_("length", 99), measure=mean("a"), op=">", threshold=0)
    (claim,) = spec.evaluate([dict(length=99, a=None, seed=0)])
    assert claim.holds is None and claim.na_kind == "not-run" and claim.note.startswith("n.a. (not run")


@pytest.mark.parametrize("op, lows, highs, holds", [
    (">=", (0.52, 0.55), (0.70, 0.75), True),  # every interval above the line
    (">=", (0.20, 0.25), (0.45, 0.49), False),  # every interval below it
    (">=", (0.30, 0.52), (0.49, 0.70), None),  # one seed below, one above: not decided
    (">=", (0.40, 0.45), (0.60, 0.65), None),  # intervals that hold the line
    ("<", (0.10, 0.20), (0.40, 0.49), True),
    ("<", (0.50, 0.60), (0.80, 0.90), False),
    ("<", (0.30, 0.30), (0.55, 0.55), None),
])
def test_an_interval_claim_is_decided_only_where_every_interval_is_on_one_side(op, lows, highs, holds):
    spec = ClaimSpec(name="x", paper="p", measure=mean("exact"), op=op, threshold=0.5, interval=("lo", "hi"))
    rows = [dict(seed=s, exact=(lo + hi) / 2, lo=lo, hi=hi) for s, (lo, hi) in enumerate(zip(lows, highs, strict=True))]
    (claim,) = spec.evaluate(rows)
    assert claim.holds is holds
    if holds is None:
        assert claim.na_kind == "undecidable" and f"span {min(lows):.3f} to {max(highs):.3f}" in claim.note
        assert claim.measured == pytest.approx(sum(r["exact"] for r in rows) / 2)  # the value is still shown
    else:
        assert claim.na_kind is None


@pytest.mark.parametrize("readings, holds", [
    ((-0.45, -0.35, -0.42), True),  # all three within 10 points of -40%: decided, yes
    ((-0.05, 0.10, 0.02), False),  # all three outside: decided, no
    ((-0.38, 0.10, 0.02), None),  # some within, some outside: the agreement rule makes it undecidable
])
def test_an_agreement_claim_is_decided_only_where_its_readings_agree(readings, holds):
    spec = ClaimSpec(name="x", paper="p", measure=mean("decisive"), op="~", threshold=-0.4, tol=0.1, percent=True,
                     agree=Agreement("agree", "lo", "hi", "they disagree, {lo} to {hi}"))
    within = [abs(v + 0.4) <= 0.1 for v in readings]
    agree = all(within) or not any(within)
    decisive = (max if all(within) else min)(readings, key=lambda v: abs(v + 0.4)) if agree else None
    (claim,) = spec.evaluate([dict(seed=0, decisive=decisive, agree=agree, lo=min(readings), hi=max(readings))])
    assert claim.holds is holds
    if holds is None:
        assert claim.na_kind == "undecidable" and claim.measured == "-38.0% to +10.0%"
        assert claim.note.startswith("n.a. (the task cannot decide it: they disagree, -38.0% to +10.0%)")
    else:
        assert claim.na_kind is None


def test_an_agreement_is_part_of_the_fingerprint():
    base = dict(name="x", paper="p", measure=mean("a"), op=">", threshold=0.0)
    assert ClaimSpec(**base).fingerprint() != ClaimSpec(**base, agree=Agreement("f", "lo", "hi")).fingerprint()
    assert ClaimSpec(**base, agree=Agreement("f", "lo", "hi", "one reason")).fingerprint() == \
        ClaimSpec(**base, agree=Agreement("f", "lo", "hi", "another reason")).fingerprint()  # its text is prose


def test_an_interval_needs_a_one_sided_operator():
    with pytest.raises(ValueError, match="one-sided"):
        ClaimSpec(name="x", paper="p", measure=mean("a"), op="~", threshold=1.0, tol=0.1, interval=("lo", "hi"))
