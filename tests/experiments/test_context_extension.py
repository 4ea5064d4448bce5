"""context-extension end to end in its quick preset (shrunk further), the method registry, the
LongRoPE / LongRoPE2 search and the bend rows (the survey table reads these rows: tests/test_survey.py)."""

from __future__ import annotations

import csv

import numpy as np
import pytest
import torch

from poslab.errors import ConfigError
from poslab.experiments import run_study, validate
from poslab.experiments.config import apply_overrides
from poslab.experiments.spec import check_flips
from poslab.experiments.stages import is_stage
from poslab.positional.scaling_laws import critical_dimension
from poslab.probes.passkey_eval import reasoning, reasoning_windows
from poslab.probes.positionwise import bend_rows
from poslab.store import Store
from poslab.studies import context_extension as ce
from poslab.studies.kit import rope_extension
from poslab.studies.kit.ranking import exact_rows, ranking_rows, wilson

TINY_SEARCH = ce.SearchConfig(population=4, generations=1, survivors=2)


def tiny():
    return apply_overrides(ce.EXPERIMENT.study("quick"),
                           ["train.steps=6", "eval.n_sequences=4", "eval.lengths=[32,128]"], fixed=ce.FIXED)


def test_quick_end_to_end_every_method_is_a_stored_run(tmp_path, monkeypatch):
    monkeypatch.setattr(ce, "SEARCH", TINY_SEARCH)
    study = tiny()
    with Store(tmp_path / "s.sqlite") as store:
        first = run_study(ce.EXPERIMENT, study, store=store, out=tmp_path / "out", progress=False)
        assert first["trained"] == 1 and first["variants"] == len(ce.METHODS) - 1
        names = {p.name for p in first["files"]}
        assert {"rows.csv", "table.md", "claims.json", "positionwise_loss.png", "bend.png",
                "passkey_heatmap.png", "reasoning.png"} <= names
        every = store.runs(experiment=ce.name)
        runs = [r for r in every if not is_stage(r["config"])]
        assert sorted(r["config"]["variant"] or "rope" for r in runs) == sorted(ce.METHODS)  # one run each
        stages = {r["config"]["stage"]: r for r in every if is_stage(r["config"])}  # searches and fine-tunes
        assert set(stages) == {f"context-extension/{m}" for m, spec in ce.METHODS.items() if spec.stored}
        assert all(bool(r["weights"]) == ce.METHODS[name.split("/")[1]].trains for name, r in stages.items()
                   if name != "context-extension/longrope-progressive")  # progressive: searched on longrope+ft
        assert len({r["key"] for r in runs}) == len(ce.METHODS)
        rows = list(csv.DictReader(open(tmp_path / "out" / "rows.csv")))
        for method in ce.METHODS:
            got = {(r["probe"], r["length"]) for r in rows if r["method"] == method}
            for L in ("32", "128"):
                assert {("loss", L), ("positionwise", L), ("passkey", L)} <= got, method
            # every reasoning task at 128 (at L0 = 32 only brackets fits: the others are left out)
            cells = {(r["task"], r["length"]) for r in rows if r["probe"] == "reasoning" and r["method"] == method}
            assert {(t, "128") for t in ce.REASONING} <= cells and ("brackets", "32") in cells, method
            assert all(0 <= float(r["exact"]) <= 1 for r in rows if r["probe"] == "reasoning")
        buckets = [r for r in rows if r["probe"] == "positionwise" and r["method"] == "rope" and r["length"] == "128"]
        assert len(buckets) == 128 // (32 // ce.BUCKETS)  # buckets of L0 / 4 positions
        table = (tmp_path / "out" / "table.md").read_text()
        assert all(f"| {m} |" in table for m in ce.METHODS) and "Methods without rows" not in table
        assert "Reasoning and code: exact match" in table and "| base2x+ft | code |" in table
        assert "Rankings: methods by exact match" in table and "ranking of the methods by exact match" in table
        assert "Computing positions past L0 is not using them" in table
        stored = store.rows(keys=[r["key"] for r in runs])
        results = [r for r in stored if r.get("probe") == "search_result"]
        assert {(r["method"], r["set"]) for r in results} == {
            ("longrope", "long"), ("longrope", "short"), ("longrope-progressive", "long"),
            ("longrope-progressive", "short"), ("longrope2", "long")}
        assert all(r["evaluations"] == TINY_SEARCH.evaluations and r["origin"] for r in results)
        for method, s in (("longrope", ce.FACTOR), ("longrope-progressive", ce.PROGRESSIVE), ("longrope2", ce.FACTOR)):
            long = [r["factor"] for r in sorted(stored, key=lambda r: r.get("pair", 0))
                    if r.get("probe") == "factors" and r.get("method") == method and r["set"] == "long"]
            assert long and long == sorted(long) and 1.0 <= long[0] and long[-1] <= 2 * s
        (lr2,) = [r for r in results if r["method"] == "longrope2"]
        assert 0 <= lr2["critical"] <= critical_dimension(10000.0, 32, 16) // 2
        law = {r["method"]: r for r in stored if r.get("probe") == "scaling_law"}
        assert law["base2x+ft"]["extrapolation_bound"] == pytest.approx(2 * law["rope"]["extrapolation_bound"])
        assert [r["gain"] for r in stored if r.get("probe") == "readjust"]
        again = run_study(ce.EXPERIMENT, study, store=store, out=tmp_path / "out", progress=False)
        assert again["trained"] == 0 and again["evaluated"] == 0
        # the stored methods' rows are lost; a fresh process reads their stages back: no search, no fine-tune
        lost = {r["key"]: r["config"]["variant"] for r in runs if ce.METHODS[r["config"]["variant"] or "rope"].stored}
        before = {k: [r for r in stored if r["run_key"] == k] for k in lost}
        for key in lost:
            store.delete(key)
        ce.EXTENSIONS.memo.clear()
        monkeypatch.setattr(ce, "search", lambda *a, **k: pytest.fail("searched again"))
        monkeypatch.setattr(rope_extension, "finetune", lambda *a, **k: pytest.fail("fine-tuned again"))
        resumed = run_study(ce.EXPERIMENT, study, store=store, out=tmp_path / "out", progress=False)
        assert resumed["evaluated"] == len(lost)
        for key, method in lost.items():
            got = store.rows(keys=[key])
            assert len(got) == len(before[key]), method
            for a, b in zip(got, before[key], strict=True):
                assert a.keys() == b.keys() and all(a[k] == pytest.approx(b[k], nan_ok=True) if isinstance(a[k], float)
                                                    else a[k] == b[k] for k in a if k != "seconds"), (method, a, b)


def test_bad_input_stops_before_work():
    for bad in (["grid.encoding=[\"learned\"]"], ["encoding_options={\"rope\": {\"scaling\": {\"rope_type\": "
                                                   "\"linear\", \"factor\": 2.0}}}"]):
        with pytest.raises(ConfigError):
            validate(apply_overrides(tiny(), bad, fixed=ce.FIXED), "cpu", ce.EXPERIMENT)
    with pytest.raises(ConfigError, match="train.max_length"):
        apply_overrides(tiny(), ["train.max_length=48"], fixed=ce.FIXED)


def test_every_method_is_a_variant_and_schedules_are_keyed_by_their_dict():
    study = ce.EXPERIMENT.study("quick")
    assert set(study.variants) | {"rope"} == set(ce.METHODS)
    for name, method in ce.METHODS.items():
        if method.scaling is not None:
            assert study.variants[name]["encoding_options"]["rope"]["scaling"] == ce.schedules(32)[name]
    assert {k for k, m in ce.METHODS.items() if m.trains} == {"pi+ft", "yarn+ft", "longrope+ft",
                                                              "longrope-progressive", "longrope2+ft", "base2x+ft"}


def _model():
    from poslab.models.transformer import Transformer, TransformerConfig

    return Transformer(TransformerConfig(vocab_size=11, d_model=16, n_layers=1, n_heads=2, max_len=64)).eval()


def test_search_covers_n_hat_and_keeps_factors_legal():
    """An objective that only rewards n-hat = 4 (read from the candidate's encoding) is solved by the
    search; a fixed n-hat is never changed and gives the plain HF longrope dict."""
    model, seen = _model(), []

    def objective(m):
        seen.append(m.encoding.n_hat)
        assert m.encoding.scaling["factor"] in (8.0, ce.FACTOR)
        return abs(m.encoding.n_hat - 4) + 1e-3 * float(m.encoding.rotary_frequencies().sum())

    space = ce.SearchSpace(L0=16, head_dim=8, base=10000.0, s=8.0, n_hats=ce.N_HATS)
    got = ce.search(model, objective, space, ce.SearchConfig(population=8, generations=3, survivors=3), seed=0)
    assert got.n_hat == 4 and len(set(seen)) > 2 and got.trace == sorted(got.trace, reverse=True)
    assert got.factors == sorted(got.factors) and 1.0 <= got.factors[0] and got.factors[-1] <= 16.0
    assert got.evaluations == 8 + 3 * 5 == len(seen)
    seen.clear()
    short = ce.search(model, objective, ce.SearchSpace(L0=16, head_dim=8, base=10000.0, s=4.0, kind="short"),
                      ce.SearchConfig(population=4, generations=1, survivors=2), seed=0)
    assert short.n_hat == 0 and set(seen) == {0} and short.origin == "rope"
    assert "n_hat" not in ce.longrope(16, [1.0] * 4, [4.0] * 4, 4.0)
    assert ce.longrope(16, [1.0] * 4, [4.0] * 4, 4.0, n_hat=2)["n_hat"] == 2


def test_longrope2_space_ntk_below_the_critical_pair_searched_in_s_2s_above():
    space = ce.SearchSpace(L0=64, head_dim=32, base=10000.0, s=4.0, critical=(0, 5))
    ntk = space.ntk()
    assert ntk == pytest.approx([4.0 ** (2 * i / 30) for i in range(16)])  # s^(2i/(r-2))
    f = space.legal(np.linspace(0.5, 20.0, 16), 3)
    assert list(f[:3]) == pytest.approx(list(ntk[:3])) and f[3:].min() >= 4.0 and f.max() <= 8.0
    assert list(f) == sorted(f)
    # an objective that rewards critical pair 2 and large factors: the search finds pair 2
    model = _model()

    def objective(m):
        theta = m.encoding.rotary_frequencies().double()
        plain = m.encoding.rotary_frequencies().new_tensor([10000.0 ** (-2 * i / 8) for i in range(4)]).double()
        factors = (plain / theta).numpy()
        crit = int(np.argmax(factors >= 4.0 - 1e-6))
        return abs(crit - 2) - 1e-3 * float(factors.sum())

    got = ce.search(model, objective, ce.SearchSpace(L0=16, head_dim=8, base=10000.0, s=4.0, critical=(0, 3)),
                    ce.SearchConfig(population=8, generations=4, survivors=3), seed=1)
    assert got.critical == 2 and got.factors[2] >= 4.0 and got.factors[1] < 4.0
    assert set(got.origin.split("+")) <= {"pi", "ramp", "2s"}


def _pos(method, seed, losses, width=8):
    return [dict(probe="positionwise", method=method, seed=seed, longest=True, bucket_start=i * width,
                 bucket_end=(i + 1) * width - 1, loss=v) for i, v in enumerate(losses)]


def test_bend_rows_flat_then_rising_and_the_shift():
    L0 = 32  # buckets of 8: reference = buckets [16, 32) = indices 2, 3
    rope = _pos("rope", 0, [3.0, 2.0, 1.0, 1.0, 1.02, 1.03, 1.5, 1.6, 1.7, 1.8, 1.9, 2.0])
    tuned = _pos("base2x+ft", 0, [3.0, 2.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.5, 1.6])
    law = [dict(probe="scaling_law", method="rope", seed=0, extrapolation_bound=48.0),
           dict(probe="scaling_law", method="base2x+ft", seed=0, extrapolation_bound=80.0)]
    rows = rope + tuned + law
    bends = {r["method"]: r for r in bend_rows(rows, L0, ce.BEND_DELTA, ce.BEND_SHARP)}
    assert bends["rope"]["ref"] == 1.0 and bends["rope"]["flat_rise"] == pytest.approx(0.025)  # [32, 48)
    assert bends["rope"]["past_rise"] == pytest.approx(np.mean([0.5, 0.6, 0.7, 0.8, 0.9, 1.0]))
    assert bends["rope"]["bend"] == 48 and bends["base2x+ft"]["bend"] == 80
    derived = ce.derived_rows([dict(r) for r in rows], L0)
    (shift,) = [r for r in derived if r["probe"] == "bend_shift"]
    assert shift["ratio"] == pytest.approx(80 / 48)
    # the control: the first rise above BEND_SHARP = 0.5 (a rise of exactly 0.5 is not above it)
    assert bends["rope"]["sharp_bend"] == 56 and bends["base2x+ft"]["sharp_bend"] == 88
    assert bends["rope"]["sharp_over_bound"] == pytest.approx(56 / 48)
    assert shift["sharp_ratio"] == pytest.approx(88 / 56)
    # a loss that rises right after L0 is not flat
    early = bend_rows(_pos("rope", 0, [3.0, 2.0, 1.0, 1.0, 1.5, 1.6, 1.7]) + law[:1], L0, ce.BEND_DELTA, ce.BEND_SHARP)
    assert early[0]["flat_rise"] > ce.BEND_DELTA and early[0]["bend"] == 32


def test_claims_flip():
    report = check_flips(ce.CLAIMS)
    assert not report.failures and len(report.judged) == len([c for c in ce.CLAIMS if c.op is not None])


def _unused_inputs(ntk_loss: float, ntk_keys_Lt: float, ntk_keys_L0: float = 0.8) -> list[dict]:
    """Plain RoPE and NTK, one seed, L0 = 32 (L_t = 128): losses at L_t and passkey exact match by depth."""
    rows = [dict(probe="loss", method="rope", seed=0, length=128, loss=2.3),
            dict(probe="loss", method="ntk", seed=0, length=128, loss=ntk_loss)]
    for method, at_L0, at_Lt in (("rope", 1.0, 0.0), ("ntk", ntk_keys_L0, ntk_keys_Lt)):
        rows += [dict(probe="passkey", method=method, seed=0, length=L, depth=d, accuracy=a)
                 for L, a in ((32, at_L0), (128, at_Lt)) for d in (0.0, 1.0)]
    return rows


@pytest.mark.parametrize("ntk_loss, keys_Lt, keys_L0, unused", [
    (2.05, 0.0, 0.8, 1.0),  # lower loss at L_t, the passkey lost there: computes positions without using them
    (2.35, 0.0, 0.8, 0.0),  # no loss gain over plain RoPE
    (2.05, 0.39, 0.8, 1.0),  # just below half its own share at L0
    (2.05, 0.4, 0.8, 0.0),  # half of it kept: not lost
    (2.05, 0.0, 0.4, 0.0),  # never kept the passkey within L0: its loss past L0 says nothing about using positions
])
def test_unused_rows_need_a_loss_gain_and_a_passkey_lost_past_L0(ntk_loss, keys_Lt, keys_L0, unused):
    rows = ce.unused_rows(_unused_inputs(ntk_loss, keys_Lt, keys_L0), 32)
    got = {r["method"]: r for r in rows}
    assert got["rope"]["unused"] == 0.0 and got["rope"]["gain"] == 0.0  # plain RoPE gains nothing over itself
    assert got["ntk"]["gain"] == pytest.approx(2.3 - ntk_loss) and got["ntk"]["passkey_Lt"] == keys_Lt
    assert got["ntk"]["unused"] == unused
    (claim,) = ce.judge_all(ce.CLAIMS[:1], rows)
    assert claim.holds is (unused == 1.0) and claim.role == "paper"


class Scripted(torch.nn.Module):
    """A causal oracle: at position t it predicts the character that follows tokens[:t + 1] in the
    first script that starts with them (else token 0). Scripts are windows with the continuation
    the oracle should write."""

    def __init__(self, scripts: list[torch.Tensor], vocab: int):
        super().__init__()
        self.scripts, self.vocab = scripts, vocab

    def forward(self, tokens):
        b, L = tokens.shape
        logits = torch.zeros(b, L, self.vocab)
        for i in range(b):
            for t in range(L):
                nxt = next((int(s[t + 1]) for s in self.scripts if len(s) > t + 1
                            and torch.equal(s[:t + 1], tokens[i, :t + 1])), 0)
                logits[i, t, nxt] = 1.0
        return logits


@torch.no_grad()
def naive_greedy(model, prompt: torch.Tensor, n_new: int) -> list[int]:
    """Greedy decoding the naive way: the whole window again for every new token."""
    tokens, out = prompt[None], []
    for _ in range(n_new):
        nxt = model(tokens)[0, -1].argmax()
        out.append(int(nxt))
        tokens = torch.cat([tokens, nxt.view(1, 1)], dim=1)
    return out


def test_reasoning_exact_match_is_greedy_decoding_and_its_strict_score():
    from poslab.tasks import reasoning as rs
    from poslab.tasks.passkey import PasskeyText

    task = PasskeyText(reasoning=("code", "multikey"))
    L, n = 96, 3
    scripts, wanted = [], {}
    for name in task.reasoning:
        for depth in ce.PASSKEY_DEPTHS:
            tokens, first = reasoning_windows(task, name, L, depth, n, 0)
            for i in range(n):
                answer = task.decode(tokens[i, first[i]:])
                # trial 0 writes the answer then "."; trial 1 runs on into a digit; trial 2 errs in the answer
                text = (answer + ".", answer + "7", answer[:-1] + ("1" if answer[-1] != "1" else "2") + ".")[i]
                scripts.append(torch.cat([tokens[i, :first[i]], task.encode(text)]))
                wanted[(name, depth, i)] = (tokens[i, :first[i]], answer, text)
    oracle = Scripted(scripts, task.vocab_size)
    rows = reasoning(lambda length: oracle, task, [L], n, 0, "cpu", depths=ce.PASSKEY_DEPTHS)
    assert {(r["task"], r["depth"]) for r in rows} == {(t, d) for t in task.reasoning for d in ce.PASSKEY_DEPTHS}
    assert all(r["exact"] == pytest.approx(1 / 3) for r in rows)
    for (_, _, i), (prompt, answer, text) in list(wanted.items())[:6]:  # explicit greedy decoding agrees
        got = task.decode(torch.tensor(naive_greedy(oracle, prompt, len(answer) + 1)))
        assert got == text[:len(answer) + 1]
        strict = got.startswith(answer) and not got[len(answer)].isalnum()
        assert strict == (i == 0) and rs.score(answer, got) == float(i == 0)


def test_ranking_rows_by_hand():
    L0 = 32
    loss = [dict(probe="loss", method=m, seed=0, length=128, loss=v) for m, v in (("rope", 5.0), ("pi", 4.0),
                                                                                  ("yarn", 3.0))]
    exact = [dict(probe="reasoning", method=m, seed=0, task="code", length=128, depth=d, exact=e)
             for m, e in (("rope", 0.0), ("pi", 1.0), ("yarn", 0.5)) for d in (0.0, 1.0)]
    at_L0 = [dict(probe="reasoning", method="rope", seed=0, task="code", length=32, depth=0.0, exact=1.0)]
    (got,) = ranking_rows(loss + exact + at_L0, L0)
    assert got["best_task"] == "pi" and got["best_loss"] == "yarn" and got["multiple"] == 4.0
    assert got["tau"] == pytest.approx(1 / 3)  # (rope, pi) and (rope, yarn) agree, (pi, yarn) does not
    flat = [dict(r, exact=0.0) for r in exact]
    (tied,) = ranking_rows(loss + flat, L0)
    assert tied["tau"] is None and tied["best_task"] is None and tied["best_loss"] == "yarn"


@pytest.mark.parametrize("setting, field", [("task.reasoning=[\"sudoku\"]", "reasoning"),
                                            ("task.reasoning_share=0.95", "reasoning_share"),
                                            ("task.reasoning_weight=0", "reasoning_weight")])
def test_bad_mixture_settings_stop_before_work(setting, field):
    with pytest.raises(ConfigError, match=field):
        validate(apply_overrides(tiny(), [setting], fixed=ce.FIXED), "cpu", ce.EXPERIMENT)


@pytest.mark.parametrize("k, n", [(0, 80), (20, 160), (54, 160), (40, 80), (80, 80), (3, 7)])
def test_wilson_interval_bounds_solve_the_score_equation(k, n):
    """Wilson's bounds are the p with |k/n - p| = z sqrt(p (1 - p) / n) (Wilson 1927), found here by bisection."""
    lo, hi = wilson(k, n)
    z, share = 1.959964, k / n

    def root(a, b):  # f changes sign on [a, b]
        f = lambda p: abs(share - p) - z * (p * (1 - p) / n) ** 0.5  # noqa: E731
        for _ in range(200):
            m = (a + b) / 2
            a, b = (m, b) if (f(a) > 0) == (f(m) > 0) else (a, m)
        return (a + b) / 2
    assert lo == pytest.approx(0.0 if k == 0 else root(0.0, share), abs=1e-9)
    assert hi == pytest.approx(1.0 if k == n else root(share, 1.0), abs=1e-9)


def _ceiling_rows(per_seed: list[int], task: str = "multivalue") -> list[dict]:
    """Plain RoPE's reasoning rows at L0 = 32: per seed, k correct of 80 spread over five depths of 16."""
    rows = []
    for seed, k in enumerate(per_seed):
        split = [k // 5 + (i < k % 5) for i in range(5)]
        rows += [dict(probe="reasoning", method="rope", seed=seed, task=task, length=32, depth=d, exact=c / 16,
                      examples=16) for d, c in zip(ce.PASSKEY_DEPTHS, split, strict=True)]
    return rows


@pytest.mark.parametrize("per_seed, holds", [
    ([52, 52], True),  # 0.65 each, Wilson [0.541, 0.745]: above 0.5 in both seeds
    ([30, 30], False),  # 0.375 each, [0.276, 0.486]: below
    ([52, 30], None),  # one seed above, one below (the pooled 0.513 alone would read yes)
    ([40, 40], None),  # 0.5 each: the interval holds the line
    ([44, 10], None),  # 54 of 160 (0.338, the 2026-12-01 multivalue ceiling) split 0.55 / 0.125: not decided
])
def test_reasoning_ceiling_is_decided_only_where_every_seed_is_clear_of_it(per_seed, holds):
    rows = _ceiling_rows(per_seed)
    rows = rows + ce.derived_rows(rows, 32)
    (claim,) = [c for c in ce.judge_all(ce.CLAIMS, rows) if c.name.startswith("multivalue: exact match within")]
    assert claim.holds is holds and claim.measured == pytest.approx(sum(per_seed) / 160)
    assert (claim.na_kind == "undecidable") == (holds is None)


def test_exact_rows_pool_the_depths_as_k_of_n():
    (row,) = exact_rows(_ceiling_rows([27]), 32)
    assert (row["correct"], row["examples"], row["multiple"]) == (27, 80, 1.0)
    assert (row["lo"], row["hi"]) == pytest.approx(wilson(27, 80)) and row["exact"] == pytest.approx(27 / 80)


def test_ranking_ties_methods_whose_exact_match_intervals_overlap():
    """rope 0/4, pi 4/4, yarn 2/4: only (rope, pi) is told apart (Wilson 0.490 < 0.510), and it agrees
    with the loss order; the other two pairs are ties in exact match: tau_b = 1 / sqrt(3 x 1)."""
    L0 = 32
    loss = [dict(probe="loss", method=m, seed=0, length=128, loss=v) for m, v in (("rope", 5.0), ("pi", 4.0),
                                                                                  ("yarn", 3.0))]
    exact = [dict(probe="reasoning", method=m, seed=0, task="code", length=128, depth=d, exact=e, examples=2)
             for m, e in (("rope", 0.0), ("pi", 1.0), ("yarn", 0.5)) for d in (0.0, 1.0)]
    (got,) = ranking_rows(loss + exact, L0)
    assert got["tau"] == pytest.approx(3 ** -0.5) and (got["resolved"], got["pairs"]) == (1, 3)
    assert got["best_task"] is None  # pi's interval overlaps yarn's
    many = [dict(r, examples=16) for r in exact]  # 32 examples a method: every pair told apart
    (clear,) = ranking_rows(loss + many, L0)
    assert clear["tau"] == pytest.approx(1 / 3) and clear["resolved"] == 3 and clear["best_task"] == "pi"
