"""Section 5.1's grid and the routing of its cells to the account's predictions."""

from poslab.experiments.config import apply_point
from poslab.experiments.spec import judge_all
from poslab.studies import bias_comparison as bc


def test_every_setting_resolves_to_its_encoding_options_and_label():
    study = bc.study("paper")
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
