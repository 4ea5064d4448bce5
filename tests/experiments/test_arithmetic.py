"""arithmetic (issue 56 item 4, the seed's arithmetic next step): the head probes on patterns with known
answers, the settings' check, every claim on both sides of its line (the gate too), the presets' scale,
and the quick preset end to end."""

import json

import numpy as np
import pytest
import torch

from poslab.errors import ConfigError
from poslab.experiments import members, run_study
from poslab.experiments.config import apply_overrides
from poslab.experiments.spec import check_flips, flip_values, judge_all, synthetic_rows
from poslab.store import Store
from poslab.studies import EXPERIMENTS, PAPER_STUDIES
from poslab.studies import arithmetic as ar
from poslab.tasks import build_task


def _sources(task, batch):
    """Queries before a sum digit and their source keys, written here from the rendered symbols."""
    b, s = batch.tokens.shape
    queries, sources = np.zeros((b, s), bool), np.zeros((b, s, s), bool)
    for r in range(b):
        sym = [task.symbols[int(t)] for t in batch.tokens[r, :int(batch.lengths[r])]]
        plus, eq = sym.index("+"), sym.index("=")
        a_at = [i for i in range(plus) if sym[i].isdigit()]
        b_at = [i for i in range(plus, eq) if sym[i].isdigit()]
        n = len(a_at)
        out = [i for i in range(eq, len(sym)) if sym[i].isdigit()]
        for k, i in enumerate(out):
            place = k if task.format != "plain" else n - k
            queries[r, i - 1] = True
            sources[r, i - 1, a_at[n - 1 - place]] = place < n
            sources[r, i - 1, b_at[n - 1 - place]] = place < n
    return queries, sources


def test_head_probe_reads_hits_offsets_and_pinning_on_known_patterns():
    task = build_task("digit_addition")
    batch = task.sample(torch.Generator().manual_seed(0), 6, 4)  # both operands 4 digits: 16 tokens each
    queries, sources = _sources(task, batch)
    b, s = batch.tokens.shape
    on_source = np.zeros((b, 1, 2, s, s))
    for r in range(b):
        for i in range(s):
            on_source[r, 0, :, i, 4] = 1.0  # both heads default to key 4, '+' (no source, inside [0, 8))
            keys = np.flatnonzero(sources[r, i])
            if len(keys):
                on_source[r, 0, 0, i, keys[0]] = 2.0  # head 0 follows the source (operand a's digit)
    got = ar.head_stats(on_source, queries, sources, T=8)
    assert got["hit"][0, 0] == 1.0 and got["hit"][0, 1] == 0.0
    # head 1 sits on '+': pinned off-source at every query past T = 8; head 0 is on sources but for the top digit
    assert got["pin_out"][0, 1] == 1.0 and got["pin_out"][0, 0] == pytest.approx(1 / 5)
    assert got["peak_offset"][0, 1] == 4 - 13  # queries 9 .. 13, each offset once: the mode is the smallest
    # reversed, 4 digits: the query before the sum digit of significance k sits at 9 + k (k = 0 at '='), a's digit
    # at 3 - k: head 0's offsets are -(6 + 2k) for k = 0 .. 3, and the top digit's query (no source) reads '+',
    # -9; each once per row, so the mode is the smallest: -12
    assert got["peak_offset"][0, 0] == -12.0


def test_member_row_picks_the_best_trained_head_and_pins_only_at_every_length():
    base = dict(encoding="learned", format="reversed", n=3, T=13)
    heads = [dict(base, length=L, in_range=L <= 3, layer=0, head=h, hit=hit, peak_offset=-5.0, pin_out=pin)
             for L, h, hit, pin in ((3, 0, 0.9, None), (3, 1, 0.2, None), (6, 0, 0.1, 0.95), (6, 1, 0.0, 0.5),
                                    (9, 0, 0.0, 0.92), (9, 1, 0.0, 0.1))]
    m = ar.member_row(heads, base)
    assert m["head_name"] == "0.0" and m["hit_trained"] == 0.9 and m["hit_unseen"] == pytest.approx(0.05)
    assert m["pinned"] and m["peak_offsets"] == "-5 -5"
    heads[4]["pin_out"] = 0.8
    assert not ar.member_row(heads, base)["pinned"]


@pytest.mark.parametrize("spec", ar.CLAIMS, ids=lambda s: s.name)
def test_every_claim_flips_at_its_line_and_the_gate_holds_back_unlearned_settings(spec):
    assert not check_flips([spec]).failures and spec.source is not None and spec.setting == "other"
    inside, outside = flip_values(spec)
    for value, verdict in ((inside, True), (outside, False)):
        rows = synthetic_rows(spec, value)
        if spec.trained:  # the gate reads the same setting's in-range exact match
            setting = rows[0].get("setting", 0)
            learned = [dict(probe="length", in_range=True, setting=setting, exact=0.95, seed=0)]
            unlearned = [dict(probe="length", in_range=True, setting=setting, exact=0.5, seed=0)]
            assert [c.holds for c in judge_all([spec], rows + learned, ar.GATE)] == [verdict]
            got = judge_all([spec], rows + unlearned, ar.GATE)
            assert [c.holds for c in got] == [None] and got[0].na_kind == "not-learned"
        else:
            assert [c.holds for c in judge_all([spec], rows, ar.GATE)] == [verdict]


def test_roles_follow_from_source_and_setting():
    roles = {s.name: s.role for s in ar.CLAIMS}
    assert {r for n, r in roles.items() if "past training" in n and ("coupling: exact" in n or "abacus" in n)} \
        == {"external"}
    assert roles["learned: copy heads pinned off-source inside the trained positions at every length past "
                 "training (≥ 90% of argmax keys)"] == "control"
    assert set(roles.values()) == {"external", "prediction", "control"}


def test_presets_scale_and_the_tables_hold_the_longest_addition():
    assert set(ar.EXPERIMENT.presets) == {"paper", "cpu", "quick"} and "arithmetic" in EXPERIMENTS
    assert "arithmetic" not in PAPER_STUDIES
    cpu, paper, quick = (ar.EXPERIMENT.study(p) for p in ("cpu", "paper", "quick"))
    assert paper.train.steps >= cpu.train.steps > quick.train.steps
    assert cpu.train.max_length == 5 and cpu.eval.lengths == (2, 5, 10, 15, 20)
    assert paper.train.max_length == 30 and max(paper.eval.lengths) == 180
    assert cpu.settings["coupling"]["encoding_options"] == {"position_coupling": {"max_pos": 22}}
    assert cpu.settings["abacus"]["encoding_options"] == {"abacus": {"max_offset": 20, "max_position": 26}}
    for study in (cpu, paper, quick):
        ar.check(study)
    by_setting = {dict(m.point)["setting"]: m for m in members(ar.EXPERIMENT, cpu) if m.seed == 0}
    assert by_setting["hints rope"].model_config.max_len == build_task("digit_addition",
                                                                       format="index_hints").max_tokens(20)
    assert by_setting["learned"].model_config.max_len == build_task("digit_addition").max_tokens(20)


@pytest.mark.parametrize("change, field", [
    ({"task.positions": "index"}, "settings.coupling.task.positions"),
    ({"encoding_options": {"position_coupling": {"max_pos": 12}}}, "max_pos"),
])
def test_a_setting_whose_encoding_cannot_read_its_task_is_refused(change, field):
    study = ar.EXPERIMENT.study("cpu")
    bad = dict(study.settings, coupling={**study.settings["coupling"], **change})
    with pytest.raises(ConfigError) as e:
        ar.check(apply_overrides(study, [f"settings={json.dumps(bad)}"]))
    assert e.value.field == field


def test_quick_preset_end_to_end(tmp_path):
    study = apply_overrides(ar.EXPERIMENT.study("quick"), ["train.steps=4", "eval.n_sequences=8"])
    with Store(tmp_path / "s.sqlite") as store:
        summary = run_study(ar.EXPERIMENT, study, store=store, out=tmp_path / "out", progress=False)
        assert summary["trained"] == summary["members"] == len(ar.SETTINGS)
        rows = store.rows()
    assert {p.name for p in summary["files"]} == {"rows.csv", "heads.csv", "members.csv", "table.md",
                                                   "claims.json", "exact.png"}
    lengths = [r for r in rows if r["probe"] == "length"]
    assert {(r["setting"], r["length"]) for r in lengths} == {(s, L) for s in ar.SETTINGS for L in (1, 3, 6)}
    assert all(0 <= r["exact"] <= r["accuracy"] + 1e-9 <= 1 + 1e-9 for r in lengths)
    members = [r for r in rows if r["probe"] == "member"]
    assert {r["setting"] for r in members} == set(ar.SETTINGS)
    claims = json.loads((tmp_path / "out" / "claims.json").read_text())
    assert {c["role"] for c in claims} == {"external", "prediction", "control"}
