"""Section 5.1's grid and the routing of its cells to the account's predictions."""

from poslab.experiments.config import apply_point
from poslab.experiments.spec import judge_all
from poslab.studies import bias_comparison as bc


def test_every_setting_resolves_to_its_encoding_options_and_label():
    study = bc.EXPERIMENT.study("paper")
    labels = set()
    for name in study.grid["setting"]:
        member = apply_point(study, {"setting": name})
        options = member.encoding_options.get(member.encoding, {})
        label = bc.setup_label(member.encoding, options)
        assert name == f"{label} K={member.task['K']}"
        labels.add(label)
    assert {"alibi m=2^-8", "alibi m=0.5", "t5 32/128 N(0,1)", "t5 16/16 N(0,1)", "rope"} <= labels
    assert {apply_point(study, {"setting": n}).task["K"] for n in study.grid["setting"] if "alibi" in n} == {1, 2, 3}


def cells(setup, encoding, kind, K, offsets, **extra):
    return [dict(probe="length", setup=setup, encoding=encoding, kind=kind, K=K, seed=0, length=L, accuracy=0.5,
                 peak_offset=o, **extra) for L, o in zip((12, 16, 20, 24), offsets, strict=True)]


def verdicts(rows):
    return {c.name: c.holds for c in judge_all(bc.CLAIMS, rows) if "accuracy" not in c.name}


def test_alibi_is_judged_by_what_a_monotone_bias_can_do():
    rows = cells("alibi m=0.5", "alibi", "relative", 1, [-1, -1, -1, -1], slope=0.5)
    rows += cells("alibi m=0.5", "alibi", "relative", 2, [-1, -1, -1, -1], slope=0.5)
    rows += cells("alibi m=2^-8", "alibi", "relative", 1, [0, 0, -1, 0], slope=2 ** -8)
    got = verdicts(rows)
    assert got["alibi m=0.5, K=1: cells selecting -1 (usable slope)"] is True
    assert got["alibi m=0.5, K=2: cells selecting -K (monotone bias: predicted none)"] is True
    assert "alibi m=2^-8, K=1: cells selecting -1 (usable slope)" not in got  # too flat: n.a. only
    rows[4]["peak_offset"] = -2  # a monotone bias selecting -2 would contradict the account
    assert verdicts(rows)["alibi m=0.5, K=2: cells selecting -K (monotone bias: predicted none)"] is False
    # at a flat slope -1 and -2 tie within sampling noise: a -2 argmax there decides nothing
    flat = cells("alibi m=2^-8", "alibi", "relative", 2, [-1, -1, -2, -1], slope=2 ** -8)
    (claim,) = [c for c in judge_all(bc.CLAIMS, flat) if "accuracy" not in c.name]
    assert claim.holds is None and claim.measured == "25.0%" and "noise" in claim.note


def test_t5_is_judged_at_every_length_the_published_buckets_as_the_paper_setting():
    rows = cells("t5 32/128 N(0,1)", "t5", "relative", 2, [-2, -2, -7, -30])
    rows += cells("t5 16/16 N(0,1)", "t5", "relative", 2, [-2, -2, -2, -2])
    for r in rows:
        r["coverage"] = 1.0 if r["length"] <= 16 or r["setup"].startswith("t5 16") else 16 / r["length"]
    claims = {c.name: c for c in judge_all(bc.CLAIMS, rows) if "accuracy" not in c.name}
    paper = claims["t5 32/128 N(0,1), K=2: cells selecting -K, every length"]
    assert paper.role == "paper" and paper.holds is False and paper.measured == "50.0%"  # untrained buckets count
    control = claims["t5 16/16 N(0,1), K=2: cells selecting -K, every length"]
    assert control.role == "control" and control.holds is True
    for r in rows[2:4]:
        r["peak_offset"] = -2
    assert verdicts(rows)["t5 32/128 N(0,1), K=2: cells selecting -K, every length"] is True
    rows[5]["peak_offset"] = -3
    assert verdicts(rows)["t5 16/16 N(0,1), K=2: cells selecting -K, every length"] is False


def test_the_monotone_bias_rows_are_checks_and_unseen_accuracy_is_for_comparison():
    rows = cells("alibi m=0.5", "alibi", "relative", 2, [-1, -1, -1, -1], slope=0.5, in_range=False)
    got = {c.name: c for c in judge_all(bc.CLAIMS, rows)}
    assert got["alibi m=0.5, K=2: cells selecting -K (monotone bias: predicted none)"].role == "check"
    accuracy = got["alibi m=0.5, K=2: mean accuracy at unseen lengths"]
    assert accuracy.holds is None and accuracy.na_kind == "comparison"


def _accuracy_rows(setup, encoding, kind, unseen_acc, K=2, in_range_acc=1.0, prediction="offset", **extra):
    return [dict(probe="length", setup=setup, encoding=encoding, kind=kind, K=K, seed=0, length=L, in_range=L <= 16,
                 accuracy=in_range_acc if L <= 16 else unseen_acc, peak_offset=-K, chance=0.05, by_kind=False,
                 prediction=prediction, **extra) for L in (12, 16, 32, 48)]


def test_unseen_accuracy_is_judged_on_phenomenons_line_and_the_ordering_over_the_same_rows():
    rows = _accuracy_rows("rope", "rope", "rotary", 0.99) + _accuracy_rows("t5 32/128 N(0,1)", "t5", "relative", 0.553)
    rows += _accuracy_rows("sinusoidal", "sinusoidal", "absolute", 0.06, prediction="no offset")
    rows += bc.ordering_rows(rows)
    got = {c.name: c for c in judge_all(bc.CLAIMS, rows, bc.GATE)}
    rope = got["rope, K=2: mean accuracy at unseen lengths"]
    t5 = got["t5 32/128 N(0,1), K=2: mean accuracy at unseen lengths"]
    assert (rope.role, rope.holds) == ("paper", True) and (t5.role, t5.holds) == ("paper", False)  # 0.553 < 0.97
    sinus = got["sinusoidal, K=2: mean accuracy at unseen lengths"]
    assert (sinus.role, sinus.holds) == ("control", True)  # <= 2 x chance
    (order,) = [c for n, c in got.items() if n.startswith("relative over absolute, K=2")]
    assert order.role == "paper" and order.holds is True and abs(float(order.measured) - (0.553 - 0.06)) < 1e-9
    # an absolute head past the range above the lowest relative one reverses the ordering
    rows = [r for r in rows if r["probe"] == "length" and r["setup"] != "sinusoidal"]
    rows += _accuracy_rows("sinusoidal", "sinusoidal", "absolute", 0.6, prediction="no offset")
    rows += bc.ordering_rows(rows)
    (order,) = [c for c in judge_all(bc.CLAIMS, rows, bc.GATE) if c.name.startswith("relative over absolute")]
    assert order.holds is False
    # a model that did not learn in range: n.a., of that kind, with its in-range score
    rows = _accuracy_rows("t5 32/128 N(0,1)", "t5", "relative", 0.553, in_range_acc=0.5)
    (t5,) = [c for c in judge_all(bc.CLAIMS, rows, bc.GATE) if "mean accuracy" in c.name]
    assert t5.holds is None and t5.na_kind == "not-learned" and "0.500" in t5.note
