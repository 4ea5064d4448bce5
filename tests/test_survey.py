"""The survey table: the KV-cache column checked by prefix consistency for every registry entry,
extrapolation read through each study's declaration, and the measured cost."""

import pytest
import torch
from click.testing import CliRunner

from poslab import survey
from poslab.cli import main
from poslab.positional import registered, small_encoding
from poslab.store import Store


@pytest.mark.parametrize("name", registered())
def test_kv_cache_column_is_prefix_consistency(name):
    """With a KV cache, the keys (and outputs) of the first P positions are computed once and
    reused as the sequence grows: valid exactly when the output at a prefix equals the prefix of
    the output. Entries declaring kv_cache False (a length-dependent schedule) must differ."""
    model = survey.tiny_model(name, max_len=48)
    x = torch.randint(0, survey.TINY["vocab_size"], (2, 48), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        full, prefix = model(x)[:, :12], model(x[:, :12])
    same = torch.allclose(full, prefix, atol=1e-5, rtol=1e-5)
    assert same == small_encoding(name).meta.kv_cache, (name, (full - prefix).abs().max().item())


def record(store, key, experiment, rows, L_train=16, variant=None, encoding="rope"):
    store.record(key, experiment=experiment, rows=rows,
                 config=dict(variant=variant, model=dict(encoding=encoding), train=dict(max_length=L_train)))


def test_extrapolation_is_read_through_each_studys_declaration(tmp_path):
    path = tmp_path / "s.sqlite"
    with Store(path) as store:
        cell = lambda L, acc, seed=0: dict(probe="length", encoding="rope", length=L, in_range=L <= 16,  # noqa: E731
                                           accuracy=acc, seed=seed)
        record(store, "a", "phenomenon", [cell(12, 1.0), cell(20, 0.9), cell(48, 0.7)])
        record(store, "b", "phenomenon", [cell(20, 0.1)], variant="clamp")  # evaluate-only: not read
        record(store, "c", "leakage", [cell(20, 0.0)])  # no declaration: not read
        record(store, "c2", "two-layer", [dict(probe="length", encoding="learned", length=L, accuracy=0.5,
                                               accuracy_out=v, seed=0) for L, v in ((16, None), (48, 0.25))])
        record(store, "c3", "mope", [dict(probe="loss", length=L, loss=v, seed=0, energy_gate=False)
                                     for L, v in ((64, 1.5), (128, 1.6))] +
               [dict(probe="loss", length=128, loss=9.0, seed=0, energy_gate=True)], L_train=64, encoding="mope")
        record(store, "d", "linear-control", [dict(cell(20, 0.05), attention="linear"),
                                              dict(cell(20, 0.5), attention="softmax")])
        record(store, "e", "lm", [dict(probe="long", length=L, loss=v, seed=0) for L, v in
                                  ((64, 1.5), (128, 1.75), (256, 2.0), (1000, 3.0))], L_train=64, encoding="alibi")
        record(store, "f", "lm", [dict(probe="lm", length=1000, loss=9.0, seed=0)], L_train=64, encoding="nope")
    got = survey.measurements(path)
    assert got["rope"]["fixed_offset"] == ("0.800 (L 20-48, 1 seeds, phenomenon); "
                                           "0.500 (L 20-20, 1 seeds, linear-control)")
    assert got["alibi"]["lm"] == "1.750 / 2.000 (1x: 1.500; L0 64, 1 seeds, lm; 15.625x 3.000)"
    assert "nope" not in got  # a row the declaration does not name
    assert got["learned"]["fixed_offset"] == "0.250 (L 48-48, 1 seeds, two-layer)"  # positions past the range
    assert got["mope"]["lm"] == "1.600 / - (1x: 1.500; L0 64, 1 seeds, mope)"  # the energy-gated cell not read
    only_lm = survey.measurements(path, {"lm": survey.declared()["lm"]})
    assert set(only_lm) == {"alibi"}


def test_allocated_bytes_counts_new_tensors_not_views():
    x = torch.zeros(10, 10)
    assert survey.allocated_bytes(lambda: torch.zeros(10, 10) + 1) == 2 * 400
    assert survey.allocated_bytes(lambda: x.view(-1)) == 0
    assert survey.allocated_bytes(lambda: x.add_(1)) == 0


def test_measured_cost_sees_a_bias_table():
    nope, t5 = survey.measured_cost("nope", (64, 256), repeats=1), survey.measured_cost("t5", (64, 256), repeats=1)
    assert t5[256][1] > nope[256][1]  # T5 builds a [h, i, j] bias nope has not
    assert t5[256][1] - nope[256][1] > 4 * (t5[64][1] - nope[64][1])  # ... which grows as L^2
    assert nope[256][1] >= 4 * nope[64][1]  # activations grow at least linearly
    assert all(s > 0 for s, _ in nope.values())


def test_encodings_command_measures_cost_and_refuses_bad_lengths(tmp_path):
    out = CliRunner().invoke(main, ["encodings", "--store", str(tmp_path / "none.sqlite"), "--cost-lengths", "32"])
    assert out.exit_code == 0, out.output
    assert "32: " in out.output and "MiB" in out.output and survey.NOT_MEASURED in out.output
    bad = CliRunner().invoke(main, ["encodings", "--cost-lengths", "1,x"])
    assert bad.exit_code == 2 and "--cost-lengths" in bad.output


def test_context_extension_schedules_fill_their_scaled_rope_rows(tmp_path):
    """context-extension's training-free methods are evaluate-only variants of the RoPE member, and
    each is a registry entry (pi -> rope_pi); a fine-tuned method is no encoding and is not read."""
    path = tmp_path / "s.sqlite"
    loss = lambda method, L, v: dict(probe="loss", method=method, length=L, loss=v, seed=0)  # noqa: E731
    with Store(path) as store:
        record(store, "a", "context-extension", [loss("rope", 64, 1.5), loss("rope", 128, 3.0)], L_train=64)
        record(store, "b", "context-extension", [loss("pi", 64, 1.6), loss("pi", 128, 2.0)], L_train=64,
               variant="pi")
        record(store, "c", "context-extension", [loss("yarn+ft", 128, 1.9)], L_train=64, variant="yarn+ft")
    got = survey.measurements(path)
    assert got["rope"]["lm"].startswith("3.000 / - (1x: 1.500; L0 64")
    assert got["rope_pi"]["lm"].startswith("2.000 / - (1x: 1.600; L0 64")
    assert set(got) == {"rope", "rope_pi"}


# ----------------------------------------------------------------------------- layouts (issue 57)

def test_a_layout_run_counts_for_its_layout_by_name_not_for_its_encoding(tmp_path):
    from poslab.models.layout import NAMED

    path = tmp_path / "s.sqlite"
    with Store(path) as store:
        for key, layout, v in (("a", NAMED["rnope"], 2.0), ("b", "rope:window=8,nope", 2.5), ("c", None, 3.0)):
            rows = [dict(probe="long", length=L, loss=v + L / 64, seed=0) for L in (64, 128)]
            store.record(key, experiment="lm", rows=rows,
                         config=dict(variant=None, model=dict(encoding="rope", layout=layout),
                                     train=dict(max_length=64)))
    got = survey.measurements(path)
    assert set(got) == {"rnope", "rope:window=8,nope", "rope"}
    assert got["rnope"]["lm"].startswith("4.000 / - (1x: 3.000; L0 64")
    assert got["rope"]["lm"].startswith("5.000 / - (1x: 4.000; L0 64")  # the uniform run alone
    rows = survey.layout_rows(path, ["rnope", "rope:window=8,nope", "swan"], cost_lengths=(16, 64))
    assert [r["encoding"] for r in rows] == ["rnope", "rope:window=8,nope", "swan"]
    rnope, pair, swan = rows
    assert rnope["kind"] == "layout" and rnope["lm"] == got["rnope"]["lm"] and swan["lm"] == survey.NOT_MEASURED
    assert rnope["sites"] == "rotate_qk" and rnope["kv_cache"] == "yes"
    assert rnope["measured_cost"].startswith("16: ") and rnope["measured_cost"].endswith("(4 layers)")
    assert pair["measured_cost"].endswith("(2 layers)")


def test_a_layouts_cost_is_its_layers_and_windows_cost():
    """Four layers allocate more than one; a window (even a full-width one) allocates the mask no window needs."""
    one = survey.measured_cost("rope", (64,), repeats=1)
    four = survey.measured_cost("nope", (64,), repeats=1, layout="rope,rope,rope,rope")
    assert four[64][1] > one[64][1]
    plain = survey.measured_cost("nope", (64,), repeats=1, layout="rope,nope")
    windowed = survey.measured_cost("nope", (64,), repeats=1, layout="rope:window=64,nope")
    assert windowed[64][1] > plain[64][1]  # the window's explicit mask and weights


def test_encodings_command_takes_layouts_and_refuses_a_bad_one_before_any_work(tmp_path):
    store = str(tmp_path / "none.sqlite")
    out = CliRunner().invoke(main, ["encodings", "--store", store, "--cost-lengths", "none", "--layout", "irope",
                                    "--layout", "rope,nope"])
    assert out.exit_code == 0, out.output
    lines = [line.split()[:2] for line in out.output.splitlines() if " layout " in line]
    assert lines == [["irope", "layout"], ["rope,nope", "layout"]]
    bad = CliRunner().invoke(main, ["encodings", "--store", store, "--layout", "rope,learned"])
    assert bad.exit_code != 0 and "--layout" in bad.output and "MiB" not in bad.output
