"""The lengthgen study: its grid over tasks of two model forms, n.a. cells, derived rows, claims, and the
quick preset end to end. Two throwaway benchmark tasks live in this file only (never in the registry
outside a test): an encoder task (reverse a bit string into empty slots, Ruoss et al.'s form) and a
decoder task (copy after a separator, Kazemnejad et al.'s form)."""

from __future__ import annotations

import dataclasses
import json
import time
from typing import ClassVar

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
    study = lengthgen.study("quick")
    assert set(study.axis("setting")) == {"toy_reverse", "toy_copy"}
    got = {(m.study.task_type, m.model_config.causal) for m in members(lengthgen.EXPERIMENT, study)}
    assert got == {("toy_reverse", False), ("toy_copy", True)}
    paper = lengthgen.study("paper")
    ruoss = paper.settings["toy_reverse"]
    assert (ruoss["model.n_layers"], ruoss["model.d_model"], ruoss["model.n_heads"], ruoss["train.steps"],
            ruoss["train.batch_size"]) == (5, 64, 8, 10_000, 128)
    assert ruoss["eval.lengths"] == list(range(1, 9))  # every length through the task's test range
    kz = paper.settings["toy_copy"]
    assert (kz["model.n_layers"], kz["model.d_model"], kz["train.steps"], kz["train.lr"], kz["train.weight_decay"],
            kz["train.batch_size"]) == (12, 768, 40_000, 3e-5, 0.05, 64)
    assert paper.seeds == 3 and paper.axis("model.random_positions") == (None, 2048)


def test_every_registered_encoding_is_in_the_cpu_and_paper_grids(toy_tasks):
    from poslab.positional import ENCODINGS

    for preset in ("cpu", "paper"):
        assert set(lengthgen.study(preset).axis("encoding")) == set(ENCODINGS)


def test_causal_only_encoding_is_na_on_encoder_tasks(toy_tasks):
    study = lengthgen.study("quick")
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


def _score(task, encoding, seed, score, *, randomized=False, benchmark="kazemnejad"):
    return dict(probe="score", task=task, cell=lengthgen.cell_name(encoding, randomized), encoding=encoding,
                seed=seed, score=score, randomized=randomized, benchmark=benchmark)


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
    assert len(gains) == 3  # fire's gain counts only for the control
    assert [r["encoding"] for r in ruoss] == ["rope"] and abs(ruoss[0]["gain"] - 0.1) < 1e-12
    claims = {c.role: c for c in judge_all(lengthgen.CLAIMS, gains)}
    assert claims["external"].holds is True and claims["control"].holds is False  # (0.1 - 0.3) / 2 < 0


def test_claims_not_run_are_na_not_missing():
    claims = judge_all(lengthgen.CLAIMS, lengthgen.kazemnejad_rows([]) + lengthgen.gain_rows([]))
    assert len(claims) == len(lengthgen.CLAIMS)
    assert all(c.holds is None and c.na_kind == "not-run" for c in claims)


def test_every_claim_flips_at_its_line():
    report = check_flips(lengthgen.CLAIMS)
    assert not report.failures and len(report.judged) == len(lengthgen.CLAIMS)


def test_published_numbers_sit_beside_the_measured_score():
    scores = [_score("parity_check", "rope", 0, 0.5, benchmark="ruoss"),
              _score("parity_check", "rope", 1, 0.7, benchmark="ruoss")]
    got = lengthgen.published_rows(scores, {("ruoss", "parity_check", "RoPE"): (52.0, "% accuracy", "src")})
    assert got[0]["measured"] == pytest.approx(0.6) and got[0]["published"] == 52.0
    assert got[0]["source encoding"] == "RoPE (rope)"


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
    assert (tmp_path / "out" / "accuracy_by_length.png").exists()
    claims = json.loads((tmp_path / "out" / "claims.json").read_text())
    assert {c["role"] for c in claims} <= {"external", "control"}
    scores = (tmp_path / "out" / "scores.csv").read_text().splitlines()
    assert len(scores) > 1
