"""Claims registered before they are judged (issue 53): fingerprints, the ledger's rules, roles computed
from source x setting, the learned-in-range gate, and the registered verdict shown beside the current one."""

import importlib
import json
import os
import pkgutil
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import poslab
import poslab.studies
from poslab.experiments import registry
from poslab.experiments.claims import Claim, claims_markdown, counts_both, read_claims
from poslab.experiments.spec import (
    ClaimSpec,
    InRange,
    cited,
    derivation,
    is_,
    judge_all,
    mean,
    next_step,
    probe,
    role_of,
    seed_states,
    survey_names,
    synthetic_rows,
)

ROOT = Path(__file__).resolve().parents[2]
STUDY_MODULES = [m.name for m in pkgutil.iter_modules(poslab.studies.__path__) if not m.ispkg]
STORED = sorted([*ROOT.glob("docs/paper-preset/*/claims.json"), *ROOT.glob("docs/next-steps/*/claims.json")])


def _spec(**changes):
    base = dict(name="{encoding}: accuracy at unseen lengths", paper="high", where=probe("length"),
                per=("encoding",), measure=mean("accuracy"), op=">=", threshold=0.9)
    return ClaimSpec(**{**base, **changes})


def test_fingerprint_reads_what_judges_never_the_prose():
    spec = _spec()
    assert _spec(paper="other words", note="n={n}").fingerprint() == spec.fingerprint()
    assert _spec(measure=mean("accuracy", text="another label")).fingerprint() == spec.fingerprint()
    for changed in (_spec(threshold=0.8), _spec(op=">"), _spec(where=probe("other")), _spec(per=()),
                    _spec(measure=mean("loss")), _spec(role="control"), _spec(trained=True)):
        assert changed.fingerprint() != spec.fingerprint(), changed
    gate = InRange(where=probe("length") & is_("in_range", True), column="accuracy", threshold=0.9)
    assert _spec(trained=True).fingerprint(gate) != _spec(trained=True).fingerprint()
    assert spec.fingerprint(gate) == spec.fingerprint()  # a claim that reads no trained behaviour is not gated


def test_role_follows_from_source_and_setting_by_one_rule():
    s = seed_states("§4: a relative encoding selects -K at every length")
    assert (role_of(s, "seed"), role_of(s, "usual"), role_of(s, "other")) == ("paper", "paper", "control")
    assert role_of(cited("Ruoss et al. 2023, arXiv 2305.16843"), "other") == "external"
    assert role_of(derivation("a causal mask makes it so"), "seed") == "check"
    assert role_of(next_step("NoPE at depth"), "seed") == role_of(survey_names("KV cache"), "usual") == "prediction"
    spec = _spec(source=s, setting="other")
    assert spec.role == "control"
    with pytest.raises(ValueError, match="source and setting come together"):
        _spec(source=s)
    with pytest.raises(ValueError, match="setting must be one of"):
        _spec(source=s, setting="somewhere")


def test_prediction_is_judged_and_counted_apart_from_paper():
    spec = _spec(source=next_step("the seed names NoPE at depth, not its outcome"), setting="seed")
    (yes,) = judge_all([spec], synthetic_rows(spec, 0.95))
    (no,) = judge_all([spec], synthetic_rows(spec, 0.85))
    assert (yes.role, yes.holds, no.holds) == ("prediction", True, False)
    paper = Claim(name="p", paper="x", measured=1.0, holds=True)
    assert "prediction 1 / 0 / 0" in counts_both([paper, yes]) and "paper 1 / 0 / 0" in counts_both([paper, yes])


def test_learned_in_range_gate_on_both_sides_of_its_line():
    gate = InRange(where=probe("length") & is_("in_range", True), column="accuracy", threshold=0.9,
                   text="in-range accuracy")
    spec = _spec(where=probe("length") & is_("in_range", False), trained=True, threshold=0.5)

    def rows(in_range: float, unseen: float) -> list[dict]:
        return [dict(probe="length", encoding="nope", in_range=True, accuracy=in_range, seed=0),
                dict(probe="length", encoding="nope", in_range=False, accuracy=unseen, seed=0),
                dict(probe="length", encoding="rope", in_range=True, accuracy=0.2, seed=0)]  # another model's

    (learned,) = judge_all([spec], rows(0.9, 0.3), gate)
    assert learned.holds is False and learned.na_kind is None
    (not_learned,) = judge_all([spec], rows(0.899, 0.3), gate)
    assert not_learned.holds is None and not_learned.na_kind == "not-learned"
    assert "did not learn in range: in-range accuracy 0.899, below 0.9" in not_learned.note
    (ungated,) = judge_all([_spec(where=spec.where, threshold=0.5)], rows(0.5, 0.3), gate)
    assert ungated.holds is False  # a claim that declares no trained behaviour is never gated
    # nothing measured past the range (e.g. a rank correlation of methods that all score 0): not learned where
    # the models were measured below the line in range, not run where they learned or were not measured
    (unlearned_none,) = judge_all([spec], rows(0.899, None), gate)
    assert unlearned_none.holds is None and unlearned_none.na_kind == "not-learned"
    (learned_none,) = judge_all([spec], rows(0.9, None), gate)
    assert learned_none.holds is None and learned_none.na_kind == "not-run"


@pytest.mark.parametrize("name", STUDY_MODULES)
def test_every_study_is_registered_consistently(name):
    module = importlib.import_module(f"poslab.studies.{name}")
    specs = module.CLAIMS() if callable(module.CLAIMS) else module.CLAIMS
    found = registry.problems(module.EXPERIMENT.name, specs, getattr(module, "GATE", None))
    assert not found, "\n".join(found)


@pytest.mark.parametrize("path", STORED, ids=lambda p: f"{p.parent.parent.name}/{p.parent.name}")
def test_every_stored_claim_has_its_registration_record(path):
    ledger = registry.load(path.parent.name)
    assert ledger is not None, f"no ledger for {path.parent.name}: run scripts/register_claims.py"
    missing = [c.name for c in read_claims(path) if c.name not in ledger["claims"]]
    assert not missing, missing


def test_the_historys_named_revisions_are_shown_beside_the_current_verdict():
    """f193f74 (the BOS swap, no -> n.a.) and c7831de (W's singular-value energy, no -> yes), issue 53."""
    leakage = {c.name: c for c in read_claims(ROOT / "docs/paper-preset/leakage/claims.json")}
    swap = leakage["standard RoPE: BOS swap changes early (b), all three replacements"]
    assert swap.holds is None and swap.registered["verdict"] == "no" and "f193f74" in swap.registered["reason"]
    heads = [c for c in read_claims(ROOT / "docs/paper-preset/heads/claims.json")
             if "content-conditioned" in c.name and "H=4" in c.name and "singular-value energy" in c.name]
    assert [(c.holds, c.registered["verdict"]) for c in heads] == [(True, "no")]
    assert "c7831de" in heads[0].registered["reason"]
    table = (ROOT / "docs/paper-preset/leakage/table.md").read_text()
    assert "registered (first criterion → verdict)" in table and "within 20% of -40% → **no**" in table


def test_annotate_shows_the_first_judgement_only_where_the_claim_reads_otherwise():
    ledger = {"study": "x", "specs": {}, "claims": {
        "a": {"first": {"criterion": "≥ 0.9", "role": "paper", "verdict": "no", "na_kind": None},
              "revisions": [{"reason": "2026-12-07: the line the seed states"}]},
        "b": {"first": {"criterion": "≥ 0.9", "role": "paper", "verdict": "yes", "na_kind": None},
              "revisions": [{"reason": "a rewrite of the spec"}]}}}
    a = Claim(name="a", paper="p", measured=0.85, holds=True, criterion="≥ 0.8")
    b = Claim(name="b", paper="p", measured=0.95, holds=True, criterion="≥ 0.9")
    out = registry.annotate_stored([a, b], ledger)
    assert out[0].registered["verdict"] == "no" and out[1].registered is None
    md = claims_markdown(out)
    assert "≥ 0.9 → **no**" in md and "revised: 2026-12-07: the line the seed states" in md
    assert counts_both(out) == "registered: paper 1 / 1 / 0; revised: paper 2 / 0 / 0"
    assert registry.annotate_stored(out, ledger) == out  # judging again under the same record adds nothing


def test_revised_note_must_say_when_and_why():
    with pytest.raises(ValueError, match="YYYY-MM-DD: the reason"):
        _spec(revised="changed it")
    assert _spec(revised="2026-12-07: the seed's own line").revised


# ----------------------------------------------------------------------------- a scratch copy of the package

CHECK = ("import importlib, sys; from poslab.experiments import registry; m = importlib.import_module("
         "'poslab.studies.k1'); p = registry.problems('k1', m.CLAIMS, getattr(m, 'GATE', None)); "
         "print('\\n'.join(p)); sys.exit(bool(p))")
K1_LINE = ('measure=mean("content_covariance"),\n              op="<", threshold=0.0, source=K1_PARAGRAPH, '
           'setting="seed", trained=True, revised=GATED,')


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    src = tmp_path_factory.mktemp("scratch") / "src"
    shutil.copytree(Path(poslab.__file__).parent, src / "poslab", ignore=shutil.ignore_patterns("__pycache__"))
    return src


def _check(src: Path, edit) -> subprocess.CompletedProcess:
    path = src / "poslab" / "studies" / "k1.py"
    original = path.read_text()
    assert K1_LINE in original, "the k1 spec this test edits moved: update K1_LINE"
    try:
        path.write_text(edit(original))
        env = {**os.environ, "PYTHONPATH": str(src)}
        return subprocess.run([sys.executable, "-c", CHECK], env=env, capture_output=True, text=True, timeout=120)
    finally:
        path.write_text(original)


def test_a_changed_threshold_fails_until_a_revised_note_is_added(scratch):
    changed = _check(scratch, lambda t: t.replace(K1_LINE, K1_LINE.replace("threshold=0.0", "threshold=-0.5")))
    assert changed.returncode == 1 and "changed what judges it" in changed.stdout, changed.stdout + changed.stderr
    revised = _check(scratch, lambda t: t.replace(K1_LINE, K1_LINE.replace("threshold=0.0,", "threshold=-0.5,").replace(
        "revised=GATED,", 'revised="2026-12-07: a test of the rule",')))
    assert revised.returncode == 0, revised.stdout + revised.stderr


def test_a_renamed_claim_fails_until_renamed_from_is_declared(scratch):
    old = "K=1: content covariance (diag - off-diag of G at delta = 0, in std of G)"
    new = "K=1: the content covariance"
    renamed = _check(scratch, lambda t: t.replace(f'name="{old}"', f'name="{new}"'))
    assert renamed.returncode == 1 and "no longer given by any spec" in renamed.stdout, renamed.stdout + renamed.stderr
    declared = _check(scratch, lambda t: t.replace(f'name="{old}"', f'name="{new}", renamed_from="{old}"'))
    assert declared.returncode == 0, declared.stdout + declared.stderr


def test_ledgers_are_json_with_the_documented_fields():
    for path in sorted(registry.LEDGERS.glob("*.json")):
        ledger = json.loads(path.read_text())
        assert set(ledger) == {"study", "specs", "claims"} and ledger["study"] == path.stem
        for claim in ledger["claims"].values():
            assert {"spec", "first", "revisions", "withdrawn"} <= set(claim)
            assert {"criterion", "role", "verdict", "revision", "date"} <= set(claim["first"])
            assert all(r.get("reason") for r in claim["revisions"])


# ----------------------------------------------------------------------------- restating stored claims

def _script():
    import importlib.util

    spec = importlib.util.spec_from_file_location("register_claims", ROOT / "scripts" / "register_claims.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_stored_comparison_is_judged_from_its_measured_value_on_both_sides_of_the_line():
    script = _script()
    spec = _spec(threshold=0.9)
    stored = Claim(name="t5: accuracy at unseen lengths", paper="high", measured=0.553, holds=None,
                   na_kind="comparison", note="n.a. (a number for comparison only: x); 3 seeds")
    no = script._rejudged(stored, spec)
    assert (no.holds, no.na_kind, no.criterion) == (False, None, "≥ 0.9") and "stored as n.a." in no.note
    yes = script._rejudged(Claim(**{**stored.__dict__, "measured": 0.9}), spec)
    assert yes.holds is True
    missing = Claim(**{**stored.__dict__, "measured": None, "na_kind": "not-run"})
    assert script._rejudged(missing, spec) == missing  # nothing measured: nothing to judge
    pct = _spec(threshold=1.0, percent=True)
    assert script._rejudged(Claim(**{**stored.__dict__, "measured": "100.0%"}), pct).holds is True
    assert script._rejudged(Claim(**{**stored.__dict__, "measured": "99.9%"}), pct).holds is False


def test_a_stored_verdict_becomes_na_where_the_spec_now_declares_it():
    from poslab.experiments.spec import undecidable

    script = _script()
    spec = _spec(op=None, threshold=None, na=undecidable("the seed names no line for this quantity"))
    judged = Claim(name="x", paper="p", measured=0.4, holds=False, criterion="≥ 0.9", note="3 seeds")
    got = script._rejudged(judged, spec)
    assert (got.holds, got.na_kind, got.criterion) == (None, "undecidable", "") and "was judged no" in got.note


def test_a_stored_rows_csv_without_the_gates_rows_leaves_the_verdict_as_stored(tmp_path):
    """The hybrid study keeps only some kinds in rows.csv (not its gate's ``learned`` rows): restating must not
    read that as 'in-range score not measured' and take the verdict away; with the gate's rows it applies."""
    import csv

    script = _script()
    stored = [Claim(name="swan: lowest mean accuracy over the unseen lengths (retrieval at depth 4)",
                    paper="p", measured=1.0, holds=True, criterion="≥ 0.97", note="2 seeds", role="control")]

    def restated(rows: list[dict]):
        with open(tmp_path / "rows.csv", "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=sorted({k for r in rows for k in r}))
            w.writeheader()
            w.writerows(rows)
        return script.recompute("hybrid", stored, tmp_path)[0]

    kept = restated([dict(probe="lm", task="lm", layout="swan", seed=0, val_loss=1.8)])
    assert (kept.holds, kept.na_kind) == (True, None)
    gated = restated([dict(probe="learned", task="retrieval", layout="swan", seed=s, learned=0.5) for s in (0, 1)])
    assert (gated.holds, gated.na_kind) == (None, "not-learned") and "0.500" in gated.note


def test_a_renamed_claim_follows_its_new_spec_so_a_later_commit_adds_no_revision():
    """A rename (renamed_from=) records a revision and the claim then carries the new spec's fingerprint: a later
    commit that re-dumps the unchanged spec (it touched the module for another reason) adds nothing."""
    script = _script()
    old_name, new_name = "H=2: range [0.5, 0.7] overlaps", "H=2: range overlaps"
    spec = dict(name="H={n_heads}: range overlaps", renamed_from="H={n_heads}: range {range} overlaps",
                fingerprint="new-fp", revised="renamed", criterion="> 0", role="paper", na_kind=None, terms=[])
    ledger = dict(study="heads", specs={}, claims={old_name: dict(
        spec="H={n_heads}: range {range} overlaps", fingerprint="old-fp", revised=None,
        first=dict(criterion="> 0", role="paper", verdict="no", na_kind=None, revision="a", date="d"),
        revisions=[], withdrawn=None)})
    stored = [dict(name=new_name, holds=True, criterion="> 0", role="paper", na_kind=None, note="")]
    script._judge(ledger, stored, [spec], "b" * 40, "2026-12-07", "rename")
    claim = ledger["claims"][new_name]
    assert claim["fingerprint"] == "new-fp" and len(claim["revisions"]) == 1
    script._revise(ledger, [spec], "c" * 40, "2026-12-07", "another change to the module")
    assert len(claim["revisions"]) == 1


def test_results_page_counts_are_the_stored_claims():
    text = (ROOT / "docs" / "results.md").read_text()
    assert _script().counts_block() in text, "docs/results.md is stale: run scripts/register_claims.py --restate"


# ----------------------------------------------------------------------------- the run's store

def test_a_runs_store_registers_each_claim_once_and_shows_a_changed_line(tmp_path, monkeypatch):
    import dataclasses

    sys.path.insert(0, str(Path(__file__).parent))
    import demo_shift

    from poslab.experiments.runner import run_study
    from poslab.store import Store
    from poslab.studies import EXPERIMENTS

    monkeypatch.setitem(EXPERIMENTS, "demo_shift", demo_shift.EXPERIMENT)
    study = demo_shift.EXPERIMENT.study("quick")
    with Store(tmp_path / "s.sqlite") as store:
        run_study(demo_shift.EXPERIMENT, study, store=store, out=tmp_path / "out", progress=False)
        first = store.judgements("demo_shift")
        run_study(demo_shift.EXPERIMENT, study, store=store, out=tmp_path / "out", progress=False)
        assert store.judgements("demo_shift") == first  # the same fingerprint adds nothing
        assert sorted(first) == ["learned: accuracy at trained lengths", "learned: accuracy past training",
                                 "rope: accuracy at trained lengths", "rope: accuracy past training"]
        moved = [dataclasses.replace(demo_shift.CLAIMS[0], threshold=-1.0), demo_shift.CLAIMS[1]]
        monkeypatch.setattr(demo_shift, "CLAIMS", moved)
        run_study(demo_shift.EXPERIMENT, study, store=store, out=tmp_path / "out", progress=False)
        history = store.judgements("demo_shift")
    assert [len(history[n]) for n in sorted(history)] == [2, 1, 2, 1]
    claims = {c.name: c for c in read_claims(tmp_path / "out" / "claims.json")}
    trained = claims["rope: accuracy at trained lengths"]
    assert trained.holds is True and trained.criterion == "≥ -1"
    assert trained.registered["criterion"] == "≥ 0.9" and "no revised= note" in trained.registered["reason"]
    assert claims["rope: accuracy past training"].registered is None


@pytest.mark.parametrize("name", STUDY_MODULES)
def test_every_claim_says_what_it_is_and_paper_only_where_a_seed_states_it(name):
    """Roles are computed, never chosen: every spec declares its source and setting, and a paper claim has a
    seed as its source."""
    module = importlib.import_module(f"poslab.studies.{name}")
    specs = module.CLAIMS() if callable(module.CLAIMS) else module.CLAIMS
    undeclared = [s.name for s in specs if s.source is None or s.setting is None]
    assert not undeclared, undeclared
    assert all(s.role == role_of(s.source, s.setting) for s in specs)
    assert all(s.source.kind == "seed" for s in specs if s.role == "paper")


def test_poslab_claims_shows_the_registered_verdict_beside_the_current_one(tmp_path):
    from click.testing import CliRunner

    from poslab.cli import main

    got = CliRunner().invoke(main, ["claims", "leakage", "--results", str(ROOT / "docs" / "paper-preset" / "leakage")])
    assert got.exit_code == 0, got.output
    assert "registered (first criterion → verdict)" in got.output and "f193f74" in got.output
    assert "counts (yes / no / n.a.): registered: paper 6 / 9 / 4" in got.output
    missing = CliRunner().invoke(main, ["claims", "leakage", "--results", str(tmp_path)])
    assert missing.exit_code == 2 and "--results" in missing.output
    unknown = CliRunner().invoke(main, ["claims", "no-such-study", "--results", str(tmp_path)])
    assert unknown.exit_code == 2 and "allowed" in unknown.output
