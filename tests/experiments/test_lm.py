"""The character LM: quick preset end to end, the validation loss against a hand loop, sampling,
--corpus, the bench smoke, and the Transformer options the LM recipe added."""

import csv
import math
import os

import pytest
import torch
import torch.nn.functional as F
from click.testing import CliRunner

from poslab import sampling
from poslab.cli import main
from poslab.errors import ConfigError
from poslab.experiments import run_study
from poslab.models.transformer import Transformer, TransformerConfig
from poslab.store import Store
from poslab.studies import lm
from poslab.tasks import CharText


def tiny(corpus, **changes):
    return lm.lm_study("quick", task=dict(corpus=str(corpus)), train=dict(steps=12, batch_size=4),
                       eval=dict(n_sequences=1 << 20), **changes)


def test_quick_preset_end_to_end(corpus, tmp_path):
    study = tiny(corpus)
    with Store(tmp_path / "s.sqlite") as store:
        summary = run_study(lm.EXPERIMENT, study, store=store, out=tmp_path / "out", progress=False, executor="inline")
        assert summary["trained"] == 2
    assert {p.name for p in summary["files"]} == {"rows.csv", "table.md", "claims.json", "lm_loss.png",
                                                  "lm_positionwise.png"}
    rows = [r for r in csv.DictReader(open(tmp_path / "out" / "rows.csv")) if r["probe"] == "lm"]
    assert [r["encoding"] for r in rows] == ["learned", "rope"]
    val = CharText(corpus=str(corpus), split="val")
    for r in rows:
        assert r["whole_split"] == "True" and int(r["val_windows"]) == (val.ids.numel() - 1) // 32
        assert int(r["val_targets"]) == int(r["val_windows"]) * 32
        assert 0 < float(r["val_loss"]) < math.log(val.vocab_size) + 1  # it learned something or is near chance
        assert float(r["tokens_per_s"]) > 0 and float(r["train_seconds"]) > 0 and r["group_size"] == "1"
    assert "nanoGPT" in (tmp_path / "out" / "table.md").read_text()


def test_validation_loss_is_the_mean_over_every_window(corpus):
    task = CharText(corpus=str(corpus))
    torch.manual_seed(0)
    model = Transformer(TransformerConfig(vocab_size=task.vocab_size, d_model=16, n_layers=1, n_heads=2,
                                          encoding="rope", max_len=16)).eval()
    got = lm.validation_loss(model, task, 16, chunk=5)  # chunks that do not divide the window count
    ids = CharText(corpus=str(corpus), split="val").ids
    n = (ids.numel() - 1) // 16
    losses = []
    with torch.no_grad():
        for k in range(n):  # one window at a time, by hand
            x, y = ids[k * 16:(k + 1) * 16], ids[k * 16 + 1:(k + 1) * 16 + 1]
            losses.append(F.cross_entropy(model(x[None])[0], y, reduction="sum"))
    assert got["windows"] == n and got["targets"] == 16 * n and got["whole_split"]
    assert got["loss"] == pytest.approx(float(sum(losses)) / (16 * n), rel=1e-5)
    assert lm.validation_loss(model, task, 16, limit=3)["whole_split"] is False


def test_presets_carry_the_nanogpt_recipe():
    paper, gpu = lm.lm_study("paper"), lm.lm_study("gpu")
    assert paper.model == dict(d_model=128, n_layers=4, n_heads=4, bias=False, dropout=0.0)
    t = paper.train
    assert (t.steps, t.batch_size, t.max_length, t.lr, t.min_lr, t.warmup_steps, t.weight_decay, t.grad_clip,
            t.betas, t.decay_1d) == (2000, 12, 64, 1e-3, 1e-4, 100, 0.1, 1.0, (0.9, 0.99), False)
    assert paper.grid == {"encoding": ("learned", "rope")} and paper.seeds == 2
    assert gpu.model["d_model"] == 384 and gpu.model["dropout"] == 0.2 and gpu.train.max_length == 256
    assert lm.lm_study("paper", encodings=("alibi",), seeds=1).grid == {"encoding": ("alibi",)}
    with pytest.raises(ConfigError):
        lm.lm_study("nope")


def test_sample_from_a_stored_model_and_cli_errors(corpus, tmp_path):
    store_path = tmp_path / "s.sqlite"
    with Store(store_path) as store:
        run_study(lm.EXPERIMENT, tiny(corpus, encoding_options={}), store=store, out=tmp_path / "out", progress=False,
                  executor="inline")
        model, task, run = sampling.load_member(store, encoding="rope", seed=0)
    text = sampling.generate(model, task, "to", 50, generator=torch.Generator().manual_seed(1))
    assert len(text) == 50 and set(text) <= set(task.vocab)
    again = sampling.generate(model, task, "to", 50, generator=torch.Generator().manual_seed(1))
    assert text == again  # the sampler's seed fixes the text
    runner = CliRunner()
    ok = runner.invoke(main, ["sample", "--store", str(store_path), "--encoding", "learned", "--length", "20"])
    assert ok.exit_code == 0, ok.output
    bad = runner.invoke(main, ["sample", "--store", str(store_path), "--encoding", "alibi"])
    assert bad.exit_code == 2 and "alibi" in bad.output
    bad = runner.invoke(main, ["sample", "--store", str(store_path), "--prompt", "€"])
    assert bad.exit_code == 2


def test_corpus_option_of_run(tmp_path):
    runner = CliRunner()
    missing = runner.invoke(main, ["run", "lm", "--preset", "quick", "--corpus", str(tmp_path / "none.txt"),
                                   "--store", str(tmp_path / "s.sqlite")])
    assert missing.exit_code == 2 and "none.txt" in missing.output and len(missing.output.strip().splitlines()) == 1
    assert not (tmp_path / "s.sqlite").exists()  # nothing written
    other = runner.invoke(main, ["run", "phenomenon", "--preset", "quick", "--corpus", str(tmp_path / "x.txt")])
    assert other.exit_code == 2 and "--corpus" in other.output


def test_bench_lm_smoke():
    from poslab.bench import bench_lm

    lines = []
    out = bench_lm(steps=2, members=2, preset="quick", rounds=1, compile=False, side_by_side=False,
                   echo=lines.append)
    assert out["poslab_ms"] > 0 and out["plain_ms"] > 0 and out["ratio"] > 0
    assert set(out["per_member_ms"]) == {1, 2}
    assert any("plain" in line for line in lines)
    assert out["best_arm"] in out["ms"] and out["best_ratio"] == out["ms"][out["best_arm"]] / out["plain_ms"]
    assert out["achieved_gflops"] > 0 and out["matmul_gflops"] > 0


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="one member per core needs two cores")
def test_bench_lm_side_by_side_times_poslab_and_the_plain_loop_in_one_thread_workers():
    from poslab.bench import bench_lm

    out = bench_lm(steps=2, members=2, preset="quick", rounds=1, compile=False, echo=lambda line: None)
    side = [name for name in out["ms"] if "side by side" in name]
    assert len(side) == 2 and {name.split(",")[0] for name in side} == {"poslab", "plain SDPA"}
    assert all(out["ms"][name] > 0 for name in side)


def test_lm_step_flops_agrees_with_torch_flop_counter():
    """bench lm's flop formula against torch.utils.flop_counter over one forward + backward, on the
    explicit attention path (a learned T5 bias keeps attention off the fused kernel, which the
    counter does not see)."""
    from torch.utils.flop_counter import FlopCounterMode

    from poslab.bench import lm_step_flops
    from poslab.tasks.base import Batch

    model = small(encoding="t5", bias=False)
    b, L = 3, 10
    tokens = torch.randint(0, model.cfg.vocab_size, (b, L))
    batch = Batch(tokens=tokens, targets=tokens, loss_mask=torch.ones(b, L, dtype=torch.bool),
                  lengths=torch.full((b,), L))
    with FlopCounterMode(display=False) as counter:
        model.loss(batch).backward()
    assert lm_step_flops(model.cfg, b, L) == pytest.approx(counter.get_total_flops(), rel=0.01)


# ----------------------------------------------------------------------------- Transformer options

def small(**kw):
    torch.manual_seed(0)
    return Transformer(TransformerConfig(vocab_size=11, d_model=16, n_layers=2, n_heads=2, max_len=12, **kw))


@pytest.mark.parametrize("encoding", ["rope", "learned", "alibi"])
def test_causal_fast_path_equals_the_dense_mask(encoding):
    model = small(encoding=encoding).eval()
    x = torch.randint(0, 11, (3, 9))
    fast = model(x)  # plain causal: is_causal, no mask tensor
    dense = model(x, lengths=torch.full((3,), 9))  # the same mask, built densely
    explicit, _ = model(x, return_intermediates=True)  # the explicit (non-fused) path
    torch.testing.assert_close(fast, dense)
    torch.testing.assert_close(fast, explicit)


def test_no_bias_and_dropout():
    names = [n for n, _ in small(bias=False).named_parameters()]
    assert not any(n.endswith("bias") for n in names) and any(n.endswith("bias") for n, _ in small().named_parameters())
    model = small(dropout=0.5)
    x = torch.randint(0, 11, (2, 9))
    model.eval()
    torch.testing.assert_close(model(x), model(x))  # no dropout at evaluation
    model.train()
    assert not torch.allclose(model(x), model(x))
    with pytest.raises(ConfigError):
        small(dropout=1.0)
