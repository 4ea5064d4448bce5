"""The streamed position-wise LM loss equals the model's own forward where both fit (several
encodings, BOS, windows, energy gating, chunks that do not divide L, in-memory and on-disk
storage), refuses what it cannot stream, and its peak memory does not grow with L."""

from __future__ import annotations

import multiprocessing

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from poslab import sampling
from poslab.errors import ConfigError
from poslab.models.energy_gate import EnergyGate
from poslab.models.transformer import Transformer, TransformerConfig
from poslab.probes.lm_streaming import check_streamable, linear_buckets, log_buckets, positionwise_loss


def model_of(encoding="rope", **changes):
    torch.manual_seed(0)
    cfg = dict(vocab_size=11, d_model=16, n_layers=2, n_heads=2, encoding=encoding, max_len=64)
    return Transformer(TransformerConfig(**{**cfg, **changes})).eval()


def reference(model, tokens):
    with torch.no_grad():  # the model's own forward over the whole window
        return F.cross_entropy(model(tokens[None, :-1])[0], tokens[1:], reduction="none").double().numpy()


@pytest.mark.parametrize("encoding,changes", [
    ("rope", {}), ("nope", {}), ("alibi", {}), ("t5", {}), ("learned", {}), ("sinusoidal", {}),
    ("transformer_xl", {}), ("mope", {}), ("rope", dict(bos=True)), ("rope", dict(window=7)),
    ("alibi", dict(energy_gate=True)), ("rope", dict(energy_gate=EnergyGate(renormalize=True))),
    ("rope_yarn", {}), ("learned", dict(max_len=16, encoding_options=dict(out_of_range="clamp"))),
    # per-layer layouts (issue 57): each layer's own encoding, chunk, window, temperature and qk-norm
    ("rope", dict(n_layers=4, layout="rope:chunk=6,t5:window=8:temperature=0.5,rope:base=100,nope", qk_norm=True)),
    ("learned", dict(layout="rope:chunk=11,alibi", bos=True)),
])
@pytest.mark.parametrize("memory_limit", [1 << 30, 0], ids=["memory", "disk"])
def test_streamed_equals_the_forward(encoding, changes, memory_limit, tmp_path):
    model = model_of(encoding, **changes)
    L = 45 if not changes.get("bos") else 44  # 45 internal positions either way
    tokens = torch.randint(11, (L + 1,), generator=torch.Generator().manual_seed(1))
    ref = reference(model, tokens)
    out = positionwise_loss(model, tokens, chunk=7, key_chunk=5, memory_limit=memory_limit, workdir=str(tmp_path),
                            per_position=True)  # 7 and 5 divide neither 45 nor each other
    assert out.storage == ("disk" if memory_limit == 0 else "memory")
    np.testing.assert_allclose(out.per_position, ref, rtol=1e-5, atol=2e-6)
    assert out.loss == pytest.approx(ref.mean(), rel=1e-6)
    with torch.no_grad():
        hits = (model(tokens[None, :-1])[0].argmax(-1) == tokens[1:]).sum()
    assert out.correct == int(hits)
    assert list(tmp_path.iterdir()) == []  # the scratch files are gone


def test_buckets_are_the_means_of_their_positions():
    model = model_of("rope")
    tokens = torch.randint(11, (61,), generator=torch.Generator().manual_seed(2))
    for buckets in (None, linear_buckets(60, 16)):
        out = positionwise_loss(model, tokens, chunk=9, buckets=buckets, per_position=True)
        assert out.buckets == (buckets or [(0, 1), (1, 2), (2, 4), (4, 8), (8, 16), (16, 32), (32, 60)])
        for row, (lo, hi) in zip(out.rows(), out.buckets, strict=False):
            assert (row["bucket_start"], row["bucket_end"], row["positions"]) == (lo, hi - 1, hi - lo)
            assert row["loss"] == pytest.approx(out.per_position[lo:hi].mean(), rel=1e-9)
    assert log_buckets(1) == [(0, 1)] and log_buckets(5)[-1] == (4, 5)
    assert linear_buckets(10, 4) == [(0, 4), (4, 8), (8, 10)]


@pytest.mark.parametrize("changes,field", [
    (dict(encoding="shaw"), "encoding"), (dict(encoding="rope_dynamic"), "encoding"),
    (dict(encoding="learned", encoding_options=dict(out_of_range="interpolate")), "encoding"),
    (dict(causal=False), "causal"), (dict(attention="linear"), "attention"),
    (dict(encoding="learned", max_len=16), "length"),  # the model's own check: a table of 16 rows
    (dict(layout="rope,shaw"), "layout"), (dict(layout="nope,rope_dynamic"), "layout"),  # a layer's encoding
])
def test_refuses_what_it_cannot_stream(changes, field):
    model = model_of(**changes)
    with pytest.raises(ConfigError) as err:
        positionwise_loss(model, torch.zeros(41, dtype=torch.long), chunk=8)
    assert err.value.field == field
    if "layout" in changes:  # the config alone says so too (the char LM's check before any work)
        with pytest.raises(ConfigError) as err:
            check_streamable(model.cfg)
        assert err.value.field == "layout"


def test_refuses_bad_tokens_and_chunks():
    model = model_of()
    for tokens in (torch.zeros(1, dtype=torch.long), torch.zeros(2, 5, dtype=torch.long), torch.zeros(5)):
        with pytest.raises(ConfigError):
            positionwise_loss(model, tokens)
    with pytest.raises(ConfigError):
        positionwise_loss(model, torch.zeros(9, dtype=torch.long), chunk=0)


def _peaks(queue) -> None:
    """In a fresh process: peak RSS growth (MiB) of L = 2k and 16k on disk, then 16k in memory, each
    from a reset high-water mark (whatever the process's start-up peaked at does not mask them)."""
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = Transformer(TransformerConfig(vocab_size=11, d_model=64, n_layers=1, n_heads=2, encoding="rope",
                                          max_len=64)).eval()
    g = torch.Generator().manual_seed(0)

    def status(key):
        with open("/proc/self/status") as f:
            return int(f.read().split(f"{key}:")[1].split()[0]) / 1024  # MiB

    def peak(L, limit):  # the growth of the resident high-water mark over this call
        tokens = torch.randint(11, (L + 1,), generator=g)
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # reset VmHWM to the current resident size (Linux >= 4.0)
        before = status("VmRSS")
        positionwise_loss(model, tokens, chunk=512, memory_limit=limit)
        return status("VmHWM") - before

    for _ in range(2):  # allocator and kernels warm
        peak(2048, 0)
    queue.put([peak(L, limit) for L, limit in ((2048, 0), (16384, 0), (16384, 1 << 30))])


def test_peak_memory_is_flat_past_the_chunk():
    """8x the length on disk adds under a quarter of the O(L) buffer that holding the same length in
    memory needs (3 L D float32s: 12 MiB at L = 16k, D = 64), and holding it shows at least 3/4 of
    that buffer, so the measurement sees an O(L) buffer; both lines are relative to the buffer's size."""
    from poslab.bench import start_measured

    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    proc = start_measured(ctx, _peaks, (queue,))  # freed chunk buffers go back to the system
    short, long, in_memory = queue.get(timeout=120)
    proc.join()
    buffer = 3 * 16384 * 64 * 4 / 2 ** 20  # MiB: what the in-memory path holds and the streamed one must not
    assert long - short < 0.25 * buffer, (short, long, in_memory, buffer)
    assert in_memory - long > 0.75 * buffer, (short, long, in_memory, buffer)


# ----------------------------------------------------------------------------- the LM study

def lm_run(corpus, tmp_path, encodings=("rope",), lengths=(32, 300, 1000)):
    from poslab.experiments import run_study
    from poslab.store import Store
    from poslab.studies import lm

    study = lm.lm_study("quick", encodings=encodings, task=dict(corpus=str(corpus)),
                        train=dict(steps=12, batch_size=4), eval=dict(lengths=lengths))
    with Store(tmp_path / "s.sqlite") as store:
        try:
            run_study(lm.EXPERIMENT, study, store=store, out=tmp_path / "out", progress=False, executor="inline")
        finally:
            runs = store.runs(experiment="lm")
        return runs, sampling.load_member(store, encoding=encodings[0])[0] if runs else None


def test_lm_study_streams_long_lengths(corpus, tmp_path):
    import csv

    from poslab.tasks.text import load_corpus

    _, model = lm_run(corpus, tmp_path)
    rows = list(csv.DictReader(open(tmp_path / "out" / "rows.csv")))
    long = {int(r["length"]): r for r in rows if r["probe"] == "long"}
    assert sorted(long) == [32, 300, 1000]
    assert long[32]["storage"] == "forward" and int(long[32]["windows"]) == 399 // 32
    (val,) = [r for r in rows if r["probe"] == "lm"]  # at the context: the whole-split validation loss
    assert float(long[32]["loss"]) == pytest.approx(float(val["val_loss"]), rel=1e-5)
    assert long[300]["source"] == "validation split" and long[300]["storage"] == "streamed (memory)"
    assert long[1000]["source"] == "corpus start (includes training text)"
    data = load_corpus(str(corpus))
    for L, ids in ((300, data.ids[data.bounds("val")][:301]), (1000, data.ids[:1001])):
        assert float(long[L]["loss"]) == pytest.approx(reference(model, ids).mean(), rel=1e-5)
        buckets = [r for r in rows if r["probe"] == "positionwise" and int(r["length"]) == L and r["scale"] == "log"]
        assert sum(int(r["positions"]) for r in buckets) == L
    assert (tmp_path / "out" / "lm_positionwise.png").stat().st_size > 0
    assert "includes training text" in (tmp_path / "out" / "table.md").read_text()


@pytest.mark.parametrize("encodings,lengths,field", [
    (("rope",), (32, 4000), "eval.lengths"),  # the corpus has 4,000 characters: at most L = 3,999
    (("shaw",), (32, 300), "encoding"),  # a value bias cannot stream
    (("learned",), (32, 300), "length"),  # a table of the training context (32), out_of_range="error"
])
def test_lm_study_refuses_before_any_work(corpus, tmp_path, encodings, lengths, field):
    with pytest.raises(ConfigError) as err:
        lm_run(corpus, tmp_path, encodings, lengths)
    assert err.value.field == field
    assert not (tmp_path / "out").exists()


# ----------------------------------------------------------------------------- poslab bench eval --model lm

def test_bench_eval_lm_prints_time_and_memory_per_length(tmp_path):
    from click.testing import CliRunner

    from poslab.bench import bench_eval_lm
    from poslab.cli import main

    lines = []
    out = bench_eval_lm(lengths=(300, 1200), steps=0, chunk=256, figure=tmp_path / "lm.png", echo=lines.append)
    assert (tmp_path / "lm.png").stat().st_size > 0 and lines[-1] == f"wrote {tmp_path / 'lm.png'}"
    assert sum(b["positions"] for b in out["rows"][1]["buckets"]) == 1200
    assert [r["length"] for r in out["rows"]] == [300, 1200]
    for r in out["rows"]:
        assert r["seconds"] > 0 and r["peak_mib"] > r["growth_mib"] > 0 and r["storage"] == "disk"
        assert 0 < r["loss"] < 10 and r["source"] == "validation split"
    assert out["fit"]["extrapolated_seconds"] == pytest.approx(out["fit"]["a"] * 1e12)
    assert "extrapolated, not run" in lines[-2]
    for args, field in ((["--lengths", "1"], "--lengths"), (["--steps", "-1"], "--steps"),
                        (["--key-chunk", "0"], "--key-chunk")):
        result = CliRunner().invoke(main, ["bench", "eval", "--model", "lm", *args])
        assert result.exit_code != 0 and field in result.output


def test_lm_study_tables_stay_the_training_context(corpus, tmp_path):
    """Long eval lengths do not lengthen the model's tables: the trained model is the default run's."""
    from poslab.experiments import members
    from poslab.studies import lm

    short = lm.lm_study("quick", task=dict(corpus=str(corpus)))
    long = lm.lm_study("quick", task=dict(corpus=str(corpus)), eval=dict(lengths=(32, 3000)))
    for a, b in zip(members(lm.EXPERIMENT, short), members(lm.EXPERIMENT, long), strict=False):
        assert a.model_config == b.model_config and a.model_config.max_len < 3000
        assert a.group_key() == b.group_key()
