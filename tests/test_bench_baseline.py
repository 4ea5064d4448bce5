"""The benchmarks' own code: the plain-SDPA baseline of ``poslab bench lm`` computes what poslab's
Transformer computes (the same logits with copied weights, for both encodings the benchmark
compares); ``poslab bench profile``'s phases add up to the wall time, and timing a study changes
nothing it computes."""

import pytest
import torch

from poslab.bench import PlainGPT
from poslab.models.transformer import Transformer, TransformerConfig


@pytest.mark.parametrize("encoding", ["rope", "learned"])
def test_plain_gpt_equals_transformer_with_copied_weights(encoding):
    torch.manual_seed(0)
    V, D, layers, heads, context = 13, 32, 2, 4, 24
    ours = Transformer(TransformerConfig(vocab_size=V, d_model=D, n_layers=layers, n_heads=heads, encoding=encoding,
                                         max_len=context, bias=False)).eval()
    plain = PlainGPT(V, D, layers, heads, context, encoding).eval()
    with torch.no_grad():
        plain.W_E.copy_(ours.W_E)
        if encoding == "learned":
            plain.W_pos.copy_(ours.encoding.W_pos[:context])
        for mine, block in zip(plain.layers, ours.layers, strict=True):
            mine["ln_1"].weight.copy_(block.ln_attn.weight)
            mine["qkv"].weight.copy_(torch.cat((block.W_Q, block.W_K, block.W_V)))
            mine["out"].weight.copy_(block.W_O)
            mine["ln_2"].weight.copy_(block.ln_mlp.weight)
            mine["mlp"].load_state_dict(block.MLP.state_dict())
        plain.ln_f.weight.copy_(ours.ln_final.weight)
        plain.U.weight.copy_(ours.U)
        tokens = torch.randint(0, V, (3, context))
        torch.testing.assert_close(plain(tokens), ours(tokens), atol=1e-5, rtol=1e-5)
        # and it is not vacuous: another readout gives other logits
        plain.U.weight.mul_(1.5)
        assert not torch.allclose(plain(tokens), ours(tokens), atol=1e-3)


TINY = ("seeds=1", "train.steps=5", "eval.n_sequences=16", "eval.lengths=[12]")


def test_bench_profile_splits_a_study_into_phases_that_add_up_to_its_wall_time():
    from poslab.bench import PHASES, bench_profile

    got = bench_profile("k1", preset="quick", overrides=TINY, echo=lambda *_: None)
    seconds = {r["phase"]: r["seconds"] for r in got["rows"]}
    assert list(seconds) == [*PHASES, "other", "wall"]
    wall = seconds.pop("wall")
    assert wall == got["wall"] and all(v >= 0 for v in seconds.values())
    assert sum(seconds.values()) == pytest.approx(wall, rel=1e-9)  # "other" is the remainder ...
    assert seconds["other"] < 0.1 * wall  # ... and small: the spans cover the run
    for phase in ("setup", "sampling", "forward", "backward", "optimizer", "evaluation", "store",
                  "tables and figures"):
        assert seconds[phase] > 0, phase
    per = {r["phase"]: r["ms_per_member_step"] for r in got["rows"]}
    assert per["forward"] == pytest.approx(1e3 * seconds["forward"] / got["member_steps"])


def test_a_timed_study_stores_bit_for_bit_the_weights_and_rows_of_an_untimed_one(tmp_path):
    from poslab.experiments import run_study
    from poslab.experiments.config import apply_overrides
    from poslab.experiments.executors import Inline
    from poslab.store import Store
    from poslab.studies import get_experiment
    from poslab.train import PhaseTimer

    exp = get_experiment("k1")
    study = apply_overrides(exp.study("quick"), list(TINY), fixed=exp.fixed)
    stored = []
    for name, timer in (("untimed", None), ("timed", PhaseTimer())):
        with Store(tmp_path / name / "s.sqlite") as store:
            run_study(exp, study, store=store, out=tmp_path / name / "out", progress=False, executor=Inline(),
                      timer=timer)
            runs = store.runs(experiment="k1")
            stored.append(({r["key"]: store.load_weights(r["key"]) for r in runs if r["weights"]},
                           [{k: v for k, v in row.items() if "seconds" not in k} for row in store.rows()]))
        assert timer is None or timer.seconds["forward"] > 0
    (untimed, rows_untimed), (timed, rows_timed) = stored
    assert untimed.keys() == timed.keys() and untimed
    for key, weights in untimed.items():
        for name, w in weights.items():
            assert torch.equal(w, timed[key][name]), (key, name)
    assert repr(rows_untimed) == repr(rows_timed)  # repr: NaN (no weight to measure) equals NaN


def test_a_timer_needs_the_inline_executor_and_its_spans_do_not_nest(tmp_path):
    from poslab.experiments import run_study
    from poslab.experiments.executors import ProcessPool
    from poslab.store import Store
    from poslab.studies import get_experiment
    from poslab.train import PhaseTimer

    exp = get_experiment("k1")
    timer = PhaseTimer()
    with Store(tmp_path / "s.sqlite") as store, pytest.raises(ValueError, match="inline"):
        run_study(exp, exp.study("quick"), store=store, out=tmp_path / "out", progress=False,
                  executor=ProcessPool(2), timer=timer)
    with pytest.raises(RuntimeError, match="nest"), timer("forward"), timer("backward"):
        pass


class _Linear(torch.nn.Module):
    def __init__(self, n_in: int, n_out: int):
        super().__init__()
        self.W = torch.nn.Parameter(torch.randn(n_out, n_in))

    def loss(self, x):
        return (x @ self.W.T).square().mean()


def test_step_flops_counts_a_matmul_forward_and_its_two_backward_products():
    """x [b, n] @ W^T [n, k]: 2 b n k forward, then 2 b n k for dW (x needs no gradient)."""
    from poslab.bench import step_flops

    flops = step_flops(_Linear(32, 16), [torch.randn(8, 32) for _ in range(3)])
    assert flops == 2 * (2 * 8 * 32 * 16)


def test_bench_floor_sums_groups_members_and_steps_and_divides_by_the_matmul_rate():
    from poslab.bench import bench_floor
    from poslab.errors import ConfigError

    lines = []
    out = bench_floor(("k1", "pretrained-extension"), preset="quick", batches=2, echo=lines.append)
    (row,) = out["rows"]  # the pretrained study trains nothing
    assert row["experiment"] == "k1" and row["members"] >= row["groups"] >= 1 and row["flops"] > 0
    assert out["floor_s"] == pytest.approx(out["flops"] / (out["gflops"] * 1e9))
    assert "skipped" in lines[1] and "at least" in lines[-1]
    with pytest.raises(ConfigError):
        bench_floor(("no-such-study",), preset="quick")


def test_ensemble_scaling_fits_fixed_plus_marginal_cost_and_repeats_members_past_the_group():
    """Two sizes: the line through both points; members past the group's own repeat it; one
    thread while timing (as a worker trains), the caller's threads after."""
    from poslab.bench import ensemble_scaling
    from poslab.experiments import members
    from poslab.studies import k1

    group = members("bench", k1.EXPERIMENT.study("quick"))[:2]
    threads = torch.get_num_threads()
    fit = ensemble_scaling(group, sizes=(1, 3), steps=2)
    assert torch.get_num_threads() == threads
    assert list(fit["ms"]) == [1, 3] and all(ms > 0 for ms in fit["ms"].values())
    for E, ms in fit["ms"].items():
        assert fit["fixed_ms"] + fit["marginal_ms"] * E == pytest.approx(ms)
    single = ensemble_scaling(group, sizes=(4,), steps=2)  # one size: all of it marginal
    assert single["fixed_ms"] == 0.0 and single["marginal_ms"] == pytest.approx(single["ms"][4] / 4)


def test_scaling_report_predicts_the_shares_and_caps_the_engine_at_its_marginal_cost(monkeypatch):
    """Parts go costliest first to the least loaded worker (fixed + marginal x members each); the
    cap is every member at its marginal cost, shared by the workers, with no fixed cost."""
    from poslab.bench import train as bench

    class Member:
        def __init__(self, key: str):
            self.key = key

        def group_key(self) -> str:
            return self.key

    groups = {"a": [Member("a")] * 3, "b": [Member("b")] * 2}
    fits = {"a": dict(ms={}, fixed_ms=1.0, marginal_ms=0.5), "b": dict(ms={}, fixed_ms=2.0, marginal_ms=1.0)}
    monkeypatch.setattr(bench, "ensemble_scaling", lambda group, sizes, steps: fits[group[0].key])
    lines = []
    parts = [groups["a"][:2], groups["a"][2:], groups["b"]]  # 2.0, 1.5 and 4.0 ms a step
    out = bench._scaling_report(groups, parts, 2, (1, 2), 5, 1000, 70.0, 3.0, lines.append)
    assert out["scaling_predicted"] == pytest.approx(4.0)  # b alone on one worker; a's parts, 3.5 ms, on the other
    assert out["cap_seconds"] == pytest.approx((0.5 * 3 + 1.0 * 2) * 1000 / 1e3 / 2)
    assert out["cap_speedup"] == pytest.approx(70.0 / 1.75) and "at most 40.0x" in lines[-1]


def test_bench_parity_trains_each_group_as_an_ensemble_and_alone_and_finds_the_weights_bit_for_bit():
    from poslab.bench import bench_parity

    lines = []
    rows = bench_parity(members=2, steps=5, echo=lines.append)
    assert [r["group"].split(",")[0] for r in rows] == ["encoding=rope", "encoding=learned"]
    assert all(r["members"] == 2 and r["steps"] == 5 and r["device"] == "cpu" for r in rows)
    assert all(r["max_weight_diff"] == 0 and r["weights_bit_for_bit"] for r in rows)  # ensemble = solo on CPU
    assert all(0 <= r["max_loss_diff"] < 1e-5 for r in rows) and len(lines) == 2 and "bit for bit" in lines[0]
