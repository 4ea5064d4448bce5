"""The lengthgen study: its grid over tasks of two model forms, n.a. cells, derived rows, claims, and the
quick preset end to end. Two throwaway benchmark tasks live in this file only (never in the registry
outside a test): an encoder task (reverse a bit string into empty slots, Ruoss et al.'s form) and a
decoder task (copy after a separator, Kazemnejad et al.'s form)."""

from __future__ import annotations

import dataclasses
import json
import time
from typing import ClassVar

import numpy as np
import pytest
import torch

from poslab.errors import ConfigError
from poslab.experiments import inapplicable, members
from poslab.experiments.runner import prepare, run_study
from poslab.experiments.schedule import one_thread
from poslab.experiments.spec import check_flips, judge_all
from poslab.store import Store
from poslab.studies import EXPERIMENTS, lengthgen
from poslab.tasks import TASKS
from poslab.tasks.base import Batch, length_range
from poslab.tasks.decoder_format import decoder_batch


def _lengths(generator, batch_size, length):
    lo, hi = length_range(length)
    return torch.randint(lo, hi + 1, (batch_size,), generator=generator)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ToyReverse:
    """Encoder form: bits b_1..b_n (tokens 2, 3), then n empty slots (token 1) whose targets are the bits
    reversed (classes 0, 1); e.g. 0 1 1 -> tokens 2 3 3 1 1 1, targets at slots 3..5: 1 1 0."""

    name: ClassVar[str] = "toy_reverse"
    target_kind: ClassVar[str] = "sequence"
    model_form: ClassVar[str] = "encoder"
    benchmark: ClassVar[str] = "ruoss"
    train_range: ClassVar[tuple[int, int]] = (1, 4)
    test_range: ClassVar[tuple[int, int]] = (1, 8)
    length_unit: ClassVar[str] = "input tokens"
    vocab_size: ClassVar[int] = 4
    chance: ClassVar[float] = 0.5

    def max_tokens(self, length: int) -> int:
        return 2 * length

    def validate(self, min_length: int) -> None:
        if min_length < 1:
            raise ConfigError("length", min_length, "at least 1")

    def sample(self, generator, batch_size, length) -> Batch:
        n = _lengths(generator, batch_size, length)
        hi = length_range(length)[1]
        bits = torch.randint(0, 2, (batch_size, hi), generator=generator)
        s = torch.arange(2 * hi)[None, :]
        tokens = torch.where(s < n[:, None], bits.gather(1, s.clamp(max=hi - 1).expand(batch_size, -1)) + 2, 0)
        slot = (s >= n[:, None]) & (s < 2 * n[:, None])
        tokens = torch.where(slot, 1, tokens)
        source = (2 * n[:, None] - 1 - s).clamp(0, hi - 1)  # slot p holds bit 2n - 1 - p
        targets = torch.where(slot, bits.gather(1, source), 0)
        width = int(2 * n.max())
        return Batch(tokens=tokens[:, :width], targets=targets[:, :width], loss_mask=slot[:, :width],
                     lengths=2 * n)

    def label(self, tokens, lengths):
        raise NotImplementedError


@dataclasses.dataclass(frozen=True, kw_only=True)
class ToyCopy:
    """Decoder form: x_1..x_n SEP x_1..x_n EOS (symbols 3..6, SEP 1, EOS 2), loss on the copy and EOS."""

    name: ClassVar[str] = "toy_copy"
    target_kind: ClassVar[str] = "sequence"
    model_form: ClassVar[str] = "decoder"
    benchmark: ClassVar[str] = "kazemnejad"
    train_range: ClassVar[tuple[int, int]] = (1, 4)
    test_range: ClassVar[tuple[int, int]] = (1, 8)
    length_unit: ClassVar[str] = "input tokens"
    vocab_size: ClassVar[int] = 7
    chance: ClassVar[float] = 0.25

    def max_tokens(self, length: int) -> int:
        return 2 * length + 2

    def validate(self, min_length: int) -> None:
        if min_length < 1:
            raise ConfigError("length", min_length, "at least 1")

    def sample(self, generator, batch_size, length) -> Batch:
        n = _lengths(generator, batch_size, length)
        x = torch.randint(3, 7, (batch_size, length_range(length)[1]), generator=generator)
        return decoder_batch(x, n, x, n, sep=1, eos=2)

    def label(self, tokens, lengths):
        raise NotImplementedError


@pytest.fixture
def toy_tasks(monkeypatch):
    """The two toy tasks as the only benchmark tasks of the registry, for this test only."""
    for name, cls in list(TASKS.items()):
        if getattr(cls, "benchmark", None) is not None:
            monkeypatch.delitem(TASKS, name)
    monkeypatch.setitem(TASKS, "toy_reverse", ToyReverse)
    monkeypatch.setitem(TASKS, "toy_copy", ToyCopy)


def test_registered_outside_run_all():
    assert EXPERIMENTS["lengthgen"] is lengthgen.EXPERIMENT
    assert not lengthgen.EXPERIMENT.in_run_all


def test_each_task_gets_its_sources_model_form(toy_tasks):
    study = lengthgen.EXPERIMENT.study("quick")
    assert set(study.axis("setting")) == {"toy_reverse", "toy_copy"}
    got = {(m.study.task_type, m.model_config.causal) for m in members(lengthgen.EXPERIMENT, study)}
    assert got == {("toy_reverse", False), ("toy_copy", True)}
    paper = lengthgen.EXPERIMENT.study("paper")
    ruoss = paper.settings["toy_reverse"]
    assert (ruoss["model.n_layers"], ruoss["model.d_model"], ruoss["model.n_heads"], ruoss["train.steps"],
            ruoss["train.batch_size"]) == (5, 64, 8, 10_000, 128)
    assert ruoss["eval.lengths"] == list(range(1, 9))  # every length through the task's test range
    kz = paper.settings["toy_copy"]
    assert (kz["model.n_layers"], kz["model.d_model"], kz["train.steps"], kz["train.lr"], kz["train.weight_decay"],
            kz["train.batch_size"]) == (12, 768, 40_000, 3e-5, 0.05, 64)
    assert paper.seeds == 3 and paper.axis("model.random_positions") == (None, 2048)


def test_every_registered_encoding_is_in_the_paper_grid_and_the_cpu_preset_runs_its_plan():
    """paper: the whole product. cpu (issue 56's calibrated scale): Kazemnejad et al.'s five, plain, at 4 layers on
    copy and reverse; RoPE plain and randomized (drawn per length) at 2 or 4 layers on the Ruoss tasks; 3 seeds."""
    from poslab.positional import registered

    # every entry that runs on the model's own positions (position coupling and Abacus need the task's)
    assert set(lengthgen.EXPERIMENT.study("paper").axis("encoding")) == set(registered())
    study = lengthgen.EXPERIMENT.study("cpu")
    trained = members(lengthgen.EXPERIMENT, study)
    cells: dict[str, set] = {}
    for m in trained:
        randomized = m.study.model.get("random_positions")
        cells.setdefault(m.study.task_type, set()).add((m.study.encoding, json.dumps(randomized)))
        train = m.study.train  # a cosine after 6% warm-up; four Ruoss tasks learn at 12000 steps, not 4000
        assert train.lr_schedule == "cosine" and train.warmup_steps == round(0.06 * train.steps)
        deep = m.study.task_type in ("stack_manipulation", "reverse_string", "duplicate_string")
        assert train.steps == (12_000 if deep or m.study.task_type == "missing_duplicate_string" else 4000)
        kazemnejad = TASKS[m.study.task_type].benchmark == lengthgen.KAZEMNEJAD
        assert m.study.model["n_layers"] == (4 if kazemnejad or deep else 2)
    five = set(lengthgen.KAZEMNEJAD_ENCODINGS.values())
    assert cells["copy"] == cells["reverse"] == {(e, "null") for e in five}
    ruoss = [t for t in cells if TASKS[t].benchmark == lengthgen.RUOSS]
    assert len(ruoss) >= 6 and all(cells[t] == {("rope", "null"), ("rope", '{"N": 1024, "draw": "length"}')}
                                   for t in ruoss)
    assert len(trained) == 3 * (2 * 5 + 2 * len(ruoss)) and study.seeds == 3
    assert inapplicable(lengthgen.EXPERIMENT, study) == []  # no cell of the plan is n.a.: the rest is not run


def test_causal_only_encoding_is_na_on_encoder_tasks(toy_tasks):
    study = lengthgen.EXPERIMENT.study("quick")
    causal_only = [e for e in study.axis("encoding") if lengthgen.encoding_class(e).causal_only]
    assert causal_only, "the quick preset carries a causal-only encoding"
    enc = causal_only[0]
    skipped = inapplicable(lengthgen.EXPERIMENT, study)
    reasons = {(p["setting"], p["encoding"], p["random_positions"]): why for p, why in skipped}
    assert ("toy_reverse", enc, None) in reasons and "causal attention only" in reasons[("toy_reverse", enc, None)]
    assert not any(k[0] == "toy_copy" and k[1] == enc for k in reasons)  # a decoder task runs it
    trained = {(m.study.task_type, m.study.encoding) for m in members(lengthgen.EXPERIMENT, study)}
    assert ("toy_copy", enc) in trained and ("toy_reverse", enc) not in trained
    rows = lengthgen.na_rows(study)
    assert any(r["cell"] == enc and r["task"] == "toy_reverse" and r["score"] is None for r in rows)


def test_order_only_encodings_get_no_randomized_cell():
    assert lengthgen.order_only("nope")
    assert not lengthgen.order_only("rope") and not lengthgen.order_only("learned")
    assert not lengthgen.order_only("alibi")


def test_seeds_of_a_cell_share_one_ensemble(toy_tasks):
    study = prepare(lengthgen.EXPERIMENT, "quick", seeds=2)
    groups: dict[str, set] = {}
    for m in members(lengthgen.EXPERIMENT, study):
        groups.setdefault(m.group_key(), set()).add((m.study.task_type, m.study.encoding,
                                                     m.model_config.random_positions))
    assert all(len(cells) == 1 for cells in groups.values())  # another encoding is another forward
    sizes = {}
    for m in members(lengthgen.EXPERIMENT, study):
        sizes[m.group_key()] = sizes.get(m.group_key(), 0) + 1
    assert set(sizes.values()) == {2}


def test_unknown_task_in_an_override_is_one_config_error(toy_tasks):
    with pytest.raises(ConfigError) as e:
        prepare(lengthgen.EXPERIMENT, "quick", overrides=['grid.setting=["toy_copy","no_such_task"]'])
    assert e.value.field == "grid.setting" and "no_such_task" in str(e.value)


def _score(task, encoding, seed, score, *, randomized=False, benchmark="kazemnejad", in_range=1.0):
    """A score row as score_rows makes it; ``in_range``: the cell's in-range score (1.0: learned)."""
    return dict(probe="score", task=task, cell=lengthgen.cell_name(encoding, randomized), encoding=encoding,
                seed=seed, score=score, randomized=randomized, benchmark=benchmark, in_range_score=in_range,
                learned=in_range is not None and in_range >= lengthgen.LEARNED_IN_RANGE)


JUDGED = [s for s in lengthgen.CLAIMS if s.op is not None]  # each comparison's judged spec (its twin: n.a.)


def test_kazemnejad_ordering_from_scores():
    five = ["nope", "t5", "alibi", "rope_partial", "sinusoidal"]
    # task a: nope best ... sinusoidal worst; task b: t5 first, nope second: mean ranks 1.5 1.5 3 4 5
    rows = [_score("a", e, 0, 1.0 - 0.1 * i) for i, e in enumerate(five)]
    rows += [_score("b", e, 0, s) for e, s in zip(five, (0.8, 0.9, 0.5, 0.4, 0.3), strict=True)]
    derived = lengthgen.kazemnejad_rows(rows)
    ranks = {r["encoding"]: r["mean_rank"] for r in derived if r["probe"] == "kz_rank"}
    assert ranks == {"nope": 1.5, "t5": 1.5, "alibi": 3.0, "rope_partial": 4.0, "sinusoidal": 5.0}
    claims = {c.name: c for c in judge_all(lengthgen.CLAIMS, derived)}
    assert claims["Kazemnejad et al.: NoPE ≈ T5"].holds is True  # gap 0
    assert claims["Kazemnejad et al.: T5 > ALiBi"].holds is True  # 1.5 places
    assert claims["Kazemnejad et al.: ALiBi > Rotary"].holds is True  # 1 place
    assert claims["Kazemnejad et al.: Rotary ≈ APE"].holds is False  # 1 place apart: not within 0.5
    assert all(c.role == "external" for c in claims.values())


def test_ruoss_gain_only_counts_their_position_reading_encodings():
    rows = [_score("t", "rope", 0, 0.5, benchmark="ruoss"), _score("t", "rope", 0, 0.6, randomized=True,
                                                                   benchmark="ruoss"),
            _score("t", "fire", 0, 0.5, benchmark="ruoss"), _score("t", "fire", 0, 0.2, randomized=True,
                                                                   benchmark="ruoss")]
    gains = lengthgen.gain_rows(rows)
    ruoss = [r for r in gains if r["probe"] == "ruoss_gain"]
    assert len(gains) == 3  # fire's gain is in the gain_all rows (shown), not in Ruoss et al.'s claim
    assert [r["encoding"] for r in ruoss] == ["rope"] and abs(ruoss[0]["gain"] - 0.1) < 1e-12
    claims = {c.role: c for c in judge_all(lengthgen.CLAIMS, gains)}
    assert set(claims) == {"external"}  # issue 53: the control on the same pairs is withdrawn
    assert claims["external"].holds is True


def test_claims_not_run_are_na_not_missing():
    claims = judge_all(lengthgen.CLAIMS, lengthgen.kazemnejad_rows([]) + lengthgen.gain_rows([]))
    assert len(claims) == len(JUDGED) == 5  # one per comparison: the judged spec's not-run, not its twin
    assert all(c.holds is None and c.na_kind == "not-run" for c in claims)


def test_every_claim_flips_at_its_line():
    report = check_flips(lengthgen.CLAIMS)
    assert not report.failures and len(report.judged) == len(JUDGED)


# ----------------------------------------------------------------------------- the in-range learning gate

FIVE = ["nope", "t5", "alibi", "rope_partial", "sinusoidal"]


def _length(task, cell, seed, length, score, *, in_range, benchmark="kazemnejad"):
    encoding = cell.removesuffix(lengthgen.RANDOMIZED)
    return dict(probe="length", task=task, cell=cell, encoding=encoding, randomized=cell != encoding, seed=seed,
                benchmark=benchmark, length=length, in_range=in_range, accuracy=score, exact=score, score=score)


def test_in_range_score_is_the_seed_mean_over_lengths_inside_training_and_the_gate_reads_it():
    gate = lengthgen.LEARNED_IN_RANGE
    rows = [_length("t", "rope", 0, 2, gate, in_range=True), _length("t", "rope", 0, 4, gate, in_range=True),
            _length("t", "rope", 1, 4, gate, in_range=True), _length("t", "rope", 0, 8, 0.1, in_range=False),
            _length("t", "nope", 0, 4, gate - 0.002, in_range=True),
            _length("t", "nope", 0, 2, gate, in_range=True), _length("t", "nope", 0, 8, 0.3, in_range=False)]
    assert lengthgen.in_range_scores(rows) == pytest.approx({("t", "rope"): gate, ("t", "nope"): gate - 0.001})
    got = {r["cell"]: r for r in lengthgen.score_rows(rows)}
    assert got["rope"]["learned"] is True and got["rope"]["score"] == pytest.approx(0.1)  # the score: past training
    assert got["nope"]["learned"] is False and got["nope"]["in_range_score"] == pytest.approx(gate - 0.001)
    assert got["nope"]["in_range_seed"] == pytest.approx(gate - 0.001)  # seed 0's own, the pivot's value


def test_kazemnejad_ranks_only_tasks_all_five_learned_in_range():
    # task a: all five learned, ranks nope t5 alibi rope_partial sinusoidal; task b (sinusoidal did not learn
    # it in range) would reverse them, and is left out: the ordering is task a's alone
    rows = [_score("a", e, 0, 1.0 - 0.1 * i) for i, e in enumerate(FIVE)]
    rows += [_score("b", e, 0, 0.1 * i, in_range=0.5 if e == "sinusoidal" else 1.0) for i, e in enumerate(FIVE)]
    derived = lengthgen.kazemnejad_rows(rows)
    ranks = {r["encoding"]: r["mean_rank"] for r in derived if r["probe"] == "kz_rank"}
    assert ranks == {"nope": 1.0, "t5": 2.0, "alibi": 3.0, "rope_partial": 4.0, "sinusoidal": 5.0}
    assert {(r["ranked"], r["left_out"]) for r in derived if r["probe"] == "kz_pair"} == {("a", 1)}
    claims = {c.name: c for c in judge_all(lengthgen.CLAIMS, derived)}
    assert len(claims) == 4 and all(c.na_kind is None for c in claims.values())  # decided: yes and no
    assert claims["Kazemnejad et al.: T5 > ALiBi"].holds is True  # one place
    assert claims["Kazemnejad et al.: NoPE ≈ T5"].holds is False  # one place apart
    assert "a; 1 left out" in claims["Kazemnejad et al.: T5 > ALiBi"].note


def test_kazemnejad_ordering_is_not_learned_where_no_task_was_learned_in_range():
    # copy: rope_partial best at 0.531; reverse: nope learned it (0.95), the other four did not
    in_range = {("copy", "rope_partial"): 0.531, ("reverse", "nope"): 0.95}
    rows = [_score(t, e, 0, 0.0, in_range=in_range.get((t, e), 0.02)) for t in ("copy", "reverse") for e in FIVE]
    derived = lengthgen.kazemnejad_rows(rows)
    assert {r["probe"] for r in derived} == {"kz_pair_unlearned"}
    claims = judge_all(lengthgen.CLAIMS, derived)
    assert len(claims) == 4 and all(c.holds is None and c.na_kind == "not-learned" for c in claims)  # issue 53
    assert [c.name for c in claims] == [f"Kazemnejad et al.: {lengthgen._pair_label(*p)}" for p in lengthgen.KZ_PAIRS]
    note = claims[0].note
    assert note.startswith("n.a. (did not learn in range: no Kazemnejad et al. task was learned in range")
    assert note.endswith("best in-range exact match 0.950 (reverse, nope)")


def test_gain_judges_only_pairs_whose_two_cells_learned_in_range():
    def pair(encoding, plain, randomized, *, learned_plain=1.0, learned_random=1.0, task="t"):
        return [_score(task, encoding, 0, plain, benchmark="ruoss", in_range=learned_plain),
                _score(task, encoding, 0, randomized, randomized=True, benchmark="ruoss", in_range=learned_random)]

    # rope gains +0.1 (both cells learned); learned's randomized cell did not learn: its -0.5 is left out
    gains = lengthgen.gain_rows(pair("rope", 0.5, 0.6) + pair("learned", 0.9, 0.4, learned_random=0.6))
    claims = {c.role: c for c in judge_all(lengthgen.CLAIMS, gains)}
    assert set(claims) == {"external"}  # issue 53: the control on the same pairs counted the number twice
    assert claims["external"].holds is True
    assert "1 pairs whose plain and randomized cells both learned in range" in claims["external"].note
    assert "1 pairs left out" in claims["external"].note
    # the same cells with rope's gain negative: decided, no
    gains = lengthgen.gain_rows(pair("rope", 0.6, 0.5) + pair("learned", 0.4, 0.9, learned_random=0.6))
    assert [c.holds for c in judge_all(lengthgen.CLAIMS, gains)] == [False]


def test_gain_is_not_learned_where_no_pair_learned_in_range():
    rows = [_score("even_pairs", "rope", 0, 0.5, benchmark="ruoss", in_range=0.52),
            _score("even_pairs", "rope", 0, 0.9, randomized=True, benchmark="ruoss", in_range=0.53),
            _score("even_pairs", "fire", 0, 1.0, benchmark="ruoss", in_range=1.0),  # not one of Ruoss et al.'s
            _score("even_pairs", "fire", 0, 0.5, randomized=True, benchmark="ruoss", in_range=0.5)]
    gains = lengthgen.gain_rows(rows)
    assert {r["probe"] for r in gains} == {"gain_all_unlearned", "ruoss_gain_unlearned"}
    claims = {c.role: c for c in judge_all(lengthgen.CLAIMS, gains)}
    assert set(claims) == {"external"}  # issue 53: the control on the same pairs is withdrawn
    assert all(c.holds is None and c.na_kind == "not-learned" for c in claims.values())
    assert claims["external"].note.endswith("best in-range per-token accuracy 0.530 (even_pairs, rope+randomized)")
    assert "no task x encoding pair learned in range" in claims["external"].note


def test_gate_table_lists_per_task_the_cells_that_passed():
    rows = [_score("copy", "rope", 0, 0.0, in_range=0.95), _score("copy", "nope", 0, 0.0, in_range=0.2),
            _score("reverse", "rope", 0, 0.0, in_range=0.1),
            dict(probe="score", task="reverse", cell="fire", encoding="fire", score=None, exact=None, na="why",
                 benchmark="kazemnejad")]  # an n.a. cell: not run, not counted
    table = next(t for t in lengthgen.TABLES if t.title.startswith("The in-range learning gate"))
    text = table.markdown(rows)
    assert "| copy | exact match | rope | 1 / 2 | 0.950 (rope) |" in text
    assert "| reverse | exact match | none | 0 / 1 | 0.100 (rope) |" in text


def test_published_numbers_sit_beside_the_measured_score():
    scores = [_score("parity_check", "rope", 0, 0.5, benchmark="ruoss"),
              _score("parity_check", "rope", 1, 0.7, benchmark="ruoss")]
    got = lengthgen.published_rows([], scores, {("ruoss", "parity_check", "RoPE"): lengthgen.Published(
        52.0, "% accuracy", "src")})
    assert got[0]["measured"] == pytest.approx(0.6) and got[0]["published"] == 52.0
    assert got[0]["source encoding"] == "RoPE (rope)"
    assert got[0]["published_at"] is None and got[0]["gap"] is None  # no per-length numbers: nothing to read at


def test_published_numbers_are_read_at_the_lengths_the_run_measured():
    """The source's per-length numbers averaged over exactly the lengths past training this run measured (a
    length the source lacks is left out and not named); in-range lengths never enter."""
    pub = lengthgen.Published(0.5, "exact", "src", by_length={21: 0.9, 27: 0.5, 34: 0.1, 40: 0.0, 30: 0.7})
    lengths = [_length("copy", "nope", 0, n, 0.2, in_range=False) for n in (21, 34, 41)] + [
        _length("copy", "nope", 0, 10, 1.0, in_range=True), _length("copy", "alibi", 0, 27, 0.2, in_range=False)]
    scores = [_score("copy", "nope", 0, 0.2, in_range=0.95)]
    got = lengthgen.published_rows(lengths, scores, {("kazemnejad", "copy", "NoPE"): pub})[0]
    assert got["published_at"] == pytest.approx((0.9 + 0.1) / 2) and got["lengths"] == "21, 34"
    assert got["gap"] == pytest.approx(0.2 - 0.5) and got["in_range_score"] == 0.95
    unmeasured = lengthgen.published_rows([], [], {("kazemnejad", "copy", "NoPE"): pub})[0]
    assert unmeasured["measured"] is None and unmeasured["published_at"] is None


def test_recorded_published_numbers_name_what_lengthgen_runs():
    """Kazemnejad et al.'s recorded runs: their five encodings on registered tasks, every length inside the
    task's test range, the whole-range number the mean of the seeds'."""
    from poslab.studies.kit.published import RUNS

    assert {their for _, their in RUNS} == set(lengthgen.KAZEMNEJAD_ENCODINGS)
    for (task, _), run in RUNS.items():
        low, high = TASKS[task].test_range
        assert all(low <= n <= high for n in run["by_length"]) and len(run["seeds"]) == 3
        assert run["overall"] == pytest.approx(np.mean(run["seeds"]), abs=1e-4)
        if task in ("copy", "reverse"):  # equal bins of 21..40, the analyzer's exact match
            assert sorted(run["by_length"]) == list(range(21, 41))
            assert run["exact_match"] == pytest.approx(np.mean(list(run["by_length"].values())), abs=1e-3)
    assert set(lengthgen.PUBLISHED) == {("kazemnejad", task, their) for task, their in RUNS}


def test_published_numbers_recomputed_from_the_source_runs_like_with_like():
    """Every recorded number from the shipped extract of their results files (origin in its ORIGIN.md), by
    this test's own reading: token-level exact match (test_seq_acc) where a run logged it, else the analyzer's
    exact match where its in-distribution exact match is above 0; the analyzer's exact match over the runs
    where it worked. SCAN: 10 of the 15 runs' analyzer gives 0 on test and in distribution alike."""
    import gzip
    import json

    from poslab.studies.kit import published

    runs = [json.loads(line) for line in gzip.open(published.EXTRACT, "rt")]
    assert len(runs) == 45 and (published.EXTRACT.parent / "ORIGIN.md").exists()
    by_cell: dict = {}
    for run in runs:
        by_cell.setdefault(published.parse_group(run["run_group"]), []).append(run)
    assert len(by_cell) == 15 and all(len(v) == 3 for v in by_cell.values())
    failed = [r for (task, _), rs in by_cell.items() if task == "scan" for r in rs
              if r["sum__pred/valid_acc_overall"] == 0]
    assert len(failed) == 10 and all(r["sum__pred/test_acc_overall"] == 0 for r in failed)
    assert all(r["sum__pred/test_seq_acc"] > 0.25 or "abs_sin" in r["run_group"] for r in failed)
    for (task, their), rs in by_cell.items():
        token = [r["sum__pred/test_seq_acc"] if "sum__pred/test_seq_acc" in r else r["sum__pred/test_acc_overall"]
                 for r in rs if "sum__pred/test_seq_acc" in r or r["sum__pred/valid_acc_overall"] > 0]
        worked = [r["sum__pred/test_acc_overall"] for r in rs if r["sum__pred/valid_acc_overall"] > 0]
        got = published.RUNS[(task, their)]
        assert got["overall"] == pytest.approx(np.mean(token), abs=5e-5), (task, their)
        assert got["exact_match"] == (pytest.approx(np.mean(worked), abs=5e-5) if worked else None), (task, their)
        assert got["left_out"] == 3 - len(worked)
        if task == "copy":  # their string comparison tops out near 0.9 in distribution, tokens near 1
            assert all(0.89 <= r["sum__pred/valid_acc_overall"] <= 0.9 for r in rs)
            assert all(r["sum__pred/valid_seq_acc"] >= 0.99 for r in rs) and got["overall"] > got["exact_match"]
        if task == "reverse":  # the two statistics agree
            assert got["overall"] == got["exact_match"]
    assert published.RUNS[("scan", "NoPE")]["overall"] == pytest.approx((0.7844 + 0.8087 + 0.7194) / 3, abs=5e-5)
    assert lengthgen.PUBLISHED[("kazemnejad", "copy", "T5")].other == published.RUNS[("copy", "T5")]["exact_match"]


def test_quick_preset_end_to_end(toy_tasks, tmp_path):
    start = time.perf_counter()
    study = prepare(lengthgen.EXPERIMENT, "quick")
    with Store(tmp_path / "s.sqlite") as store, one_thread():  # as a worker trains: tiny models lose on two threads
        summary = run_study(lengthgen.EXPERIMENT, study, store=store, out=tmp_path / "out", progress=False)
    assert time.perf_counter() - start < 60
    assert summary["trained"] == summary["members"] > 0
    table = (tmp_path / "out" / "table.md").read_text()
    assert "toy_reverse" in table and "toy_copy" in table and "n.a." in table
    assert "## Cells that cannot run" in table and "causal attention only" in table
    assert "The in-range learning gate" in table and "In-range score, per cell and task" in table
    assert (tmp_path / "out" / "accuracy_by_length.png").exists()
    claims = json.loads((tmp_path / "out" / "claims.json").read_text())
    assert {c["role"] for c in claims} <= {"external", "control"}
    scores = (tmp_path / "out" / "scores.csv").read_text().splitlines()
    assert len(scores) > 1


def test_set_reaches_one_key_of_a_setting_bundle(toy_tasks):
    """``--set settings.NAME.model.n_layers=4`` changes that key of the bundle NAME only; an unknown bundle
    and a bad path inside one are each one ConfigError naming the field."""
    from poslab.experiments.config import apply_overrides, apply_point, grid_points

    study = lengthgen.EXPERIMENT.study("quick")
    name = study.axis("setting")[0]
    deeper = apply_overrides(study, [f"settings.{name}.model.n_layers=4", f"settings.{name}.train.steps=7"])
    assert deeper.settings[name]["model.n_layers"] == 4 and deeper.settings[name]["train.steps"] == 7
    others = {n: b for n, b in deeper.settings.items() if n != name}
    assert others == {n: b for n, b in study.settings.items() if n != name}
    member = apply_point(deeper, next(p for p in grid_points(deeper) if p["setting"] == name))
    assert (member.model["n_layers"] if isinstance(member.model, dict) else member.model.n_layers) == 4
    assert member.train.steps == 7
    with pytest.raises(ConfigError, match="--set") as e:
        apply_overrides(study, ["settings.no_such_bundle.train.steps=3"])
    assert name in str(e.value)
    with pytest.raises(ConfigError, match=f"settings.{name}.train.no_such_field"):
        apply_point(apply_overrides(study, [f"settings.{name}.train.no_such_field=3"]),
                    next(p for p in grid_points(study) if p["setting"] == name))


def test_a_scale_per_task_changes_that_task_only():
    """Scale.per_task: a task's own model and training over its benchmark's (the cpu preset's per-task scale)."""
    from poslab.studies.kit.benchmarks import task_setting

    cpu = lengthgen.PRESETS["cpu"]
    deeper = dataclasses.replace(cpu, per_task={"copy": {"model.n_layers": 4, "train.steps": 8000}})
    copy, reverse = task_setting("copy", deeper), task_setting("reverse", deeper)
    assert (copy["model.n_layers"], copy["train.steps"]) == (4, 8000)
    assert task_setting("reverse", cpu) == reverse and reverse["model.n_layers"] == cpu.model["kazemnejad"]["n_layers"]
    assert {k: v for k, v in copy.items() if k not in ("model.n_layers", "train.steps")} == \
        {k: v for k, v in task_setting("copy", cpu).items() if k not in ("model.n_layers", "train.steps")}


def test_randomized_positions_drawn_per_length_run_cropped_end_to_end_and_their_rows_name_the_setting(tmp_path):
    """A grid value that is an object (randomized positions drawn per length) reaches the rows as its JSON text:
    a row holds scalars, and the store once refused the object after the first group had trained (while the
    pool went on training every other group before the error surfaced)."""
    from poslab.experiments.config import apply_overrides

    study = apply_overrides(prepare(lengthgen.EXPERIMENT, "quick"), [
        'grid.setting=["even_pairs"]', 'grid.encoding=["rope"]', "train.crop_padding=true",
        'grid.model.random_positions=[null,{"N":512,"draw":"length"}]'])
    with Store(tmp_path / "s.sqlite") as store, one_thread():
        summary = run_study(lengthgen.EXPERIMENT, study, store=store, out=tmp_path / "out", progress=False)
        rows = [r for r in store.rows() if r["probe"] == "length"]
    assert summary["trained"] == 2
    assert {(r["randomized"], r["random_positions"]) for r in rows} == {(False, None),
                                                                        (True, '{"N":512,"draw":"length"}')}
    assert "randomized positions off/on (N = 512)" in (tmp_path / "out" / "table.md").read_text()


def test_randomized_positions_without_room_for_a_tasks_tokens_fail_before_any_work(tmp_path):
    """N below the most tokens of a task's longest sequence cannot draw a position per token: one ConfigError
    naming model.random_positions before training (a cpu-preset override of the tasks once crashed 48 minutes in)."""
    from click.testing import CliRunner

    from poslab.cli import main

    store = tmp_path / "s.sqlite"
    result = CliRunner().invoke(main, ["run", "lengthgen", "--preset", "cpu", "--store", str(store), "--out",
                                       str(tmp_path / "out"), "--set", 'grid.setting=["duplicate_string"]',
                                       "--set", 'grid.encoding=["rope"]', "--set",
                                       "grid.model.random_positions=[null,256]",  # N too small: refused
                                       "--set", "settings.duplicate_string.train.steps=1"])  # were it not, brief
    assert result.exit_code == 2 and "model.random_positions: got 256" in result.output, result.output
    assert "duplicate_string has 300 tokens at length 100" in result.output and not store.exists()
    ok = CliRunner().invoke(main, ["run", "lengthgen", "--preset", "cpu", "--print-config", "--set",
                                   'grid.setting=["duplicate_string"]',
                                   "--set", "grid.model.random_positions=[null,300]"])
    assert ok.exit_code == 0, ok.output


def test_every_length_of_a_ruoss_task_in_one_batch_is_what_one_at_a_time_poses():
    """The paper preset's "every" lengths of a task that draws mixed lengths come from one batched draw;
    they are the lengths a one-length sample poses (checked on 1..60, where one at a time is cheap), and a
    task that refuses a length loses it (a throwaway task that cannot pose odd lengths)."""
    from poslab.studies.kit.benchmarks import _every_length, _poses, benchmark_tasks
    from poslab.tasks.chomsky.context_free import StackManipulation

    for name in benchmark_tasks():
        cls = TASKS[name]
        if cls.benchmark != "ruoss":
            continue
        every, poses = _every_length(name, cls), _poses(name, cls)
        lo, test_hi = cls.train_range[0], cls.test_range[1]
        assert [L for L in every if L <= 60] == [L for L in range(lo, 61) if poses(L)], name
        assert every[-1] == test_hi, name

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class EvenOnly(StackManipulation):
        def validate(self, min_length: int) -> None:
            super().validate(min_length)
            if min_length % 2:
                raise ConfigError("length", min_length, "an even length")

    assert _every_length("EvenOnly", EvenOnly) == tuple(range(2, 501, 2))


def test_the_gpu_preset_is_kazemnejads_five_on_copy_and_reverse_with_three_seeds_and_no_randomized_cells():
    study = prepare(EXPERIMENTS["lengthgen"], "gpu")
    cells = {(m.ids["setting"], m.ids["encoding"], m.model_config.random_positions, m.seed)
             for m in members(EXPERIMENTS["lengthgen"], study)}
    five = set(lengthgen.KAZEMNEJAD_ENCODINGS.values())
    assert cells == {(t, e, None, s) for t in ("copy", "reverse") for e in five for s in range(3)}
    copy = next(m for m in members(EXPERIMENTS["lengthgen"], study) if m.ids["setting"] == "copy")
    assert (copy.model_config.n_layers, copy.model_config.d_model, copy.study.train.steps) == (6, 256, 5000)
