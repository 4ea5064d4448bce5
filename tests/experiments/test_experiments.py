"""Every experiment end to end in its quick preset; resume; overrides; bad input."""

import csv
import dataclasses
import json

import pytest
import torch

from poslab.errors import ConfigError
from poslab.experiments import members, run_study
from poslab.experiments.config import StudyConfig, apply_overrides, grid_points, quick
from poslab.store import Store
from poslab.studies import EXPERIMENTS, get_experiment

EXPECTED_FILES = {
    "phenomenon": {"rows.csv", "pinning.csv", "table.md", "claims.json", "fig1_accuracy.png", "fig1_attention.png"},
    "validation": {"rows.csv", "members.csv", "profiles.csv", "table.md", "claims.json", "fig2_carrier_profile.png",
                   "fig3_dilution.png"},
}


def n_members(study):
    return len(grid_points(study)) * study.seeds


def tiny(name):
    exp = get_experiment(name)
    return exp, apply_overrides(exp.study("quick"), ["train.steps=20", "eval.n_sequences=32", "eval.lengths=[12,20]"])


def table1_grid(**changes):
    """A Table 1 study written out here, so engine tests do not depend on the experiment's preset."""
    cfg = StudyConfig(model_type="retrieval_head", task_type="fixed_offset", task=dict(m=20),
                      grid={"encoding": ("rope", "learned"), "task.K": (1, 2, 3)}, seeds=2)
    return apply_overrides(quick(cfg), ["train.steps=20", "eval.n_sequences=32", "eval.lengths=[12,20]",
                                        *[f"{k}={v}" for k, v in changes.items()]])


# Experiments writing the Table 1 row format; the others (context-extension, ...) have their own end-to-end test.
@pytest.mark.parametrize("name", [n for n in EXPERIMENTS if n in EXPECTED_FILES])
def test_quick_preset_end_to_end_and_rerun_trains_nothing(name, tmp_path):
    exp = get_experiment(name)
    study = exp.study("quick")
    with Store(tmp_path / "s.sqlite") as store:
        first = run_study(exp, study, store=store, out=tmp_path / "out", progress=False)
        members = n_members(study)
        assert first["trained"] == members and first["reused"] == 0
        assert {p.name for p in first["files"]} == EXPECTED_FILES[name]
        rows = list(csv.DictReader(open(tmp_path / "out" / "rows.csv")))
        # encoding x K x seed x length, and each evaluate-only variant's rows
        assert len(rows) == (members + first["variants"]) * len(study.eval.lengths)
        assert {"encoding", "K", "seed", "length", "accuracy", "peak_offset", "peak_height"} <= set(rows[0])
        table = (tmp_path / "out" / "table.md").read_text()
        assert "paper" in table and "measured" in table
        before = store.rows(experiment=name)
        again = run_study(exp, study, store=store, out=tmp_path / "out", progress=False)
        assert again["trained"] == 0 and again["reused"] == members
        assert store.rows(experiment=name) == before
        forced = run_study(exp, study, store=store, out=tmp_path / "out", progress=False, force=True)
        assert forced["trained"] == members
        assert len(store.runs(experiment=name)) == members + forced["variants"]  # variants are stored runs too


def test_an_interrupted_sweep_resumes_with_what_is_missing(tmp_path):
    exp, study = get_experiment("phenomenon"), table1_grid()
    with Store(tmp_path / "s.sqlite") as store:
        part = apply_overrides(study, ["grid.encoding=[\"rope\"]"])
        run_study(exp, part, store=store, out=tmp_path / "a", progress=False)
        full = run_study(exp, study, store=store, out=tmp_path / "b", progress=False)
        assert full["reused"] == len(study.axis("task.K")) * study.seeds
        assert full["trained"] == len(study.axis("task.K")) * study.seeds
        assert len(store.runs(experiment="phenomenon")) == full["members"]


@pytest.mark.parametrize("override, field", [
    (["grid.encoding=[\"nosuch\"]"], "encoding"),
    (["grid.task.K=[8]"], "K"),
    (["model.d_head=7"], "d_head"),
    (["encoding_options={\"learned\": {\"max_position\": 16}}", "eval.lengths=[12,48]"], "length"),
    (["train.stepz=3"], "--set"),
])
def test_bad_input_stops_before_anything_is_written(override, field, tmp_path):
    exp = get_experiment("phenomenon")
    path = tmp_path / "s.sqlite"
    with Store(path) as store:
        with pytest.raises(ConfigError, match=field):
            study = apply_overrides(exp.study("quick"), override)
            run_study(exp, study, store=store, out=tmp_path / "out", progress=False)
        assert store.runs() == []
    assert not (tmp_path / "out").exists()


def test_validation_refuses_a_non_rotary_encoding_before_any_work(tmp_path):
    exp = get_experiment("validation")
    study = apply_overrides(exp.study("quick"), ['grid.encoding=["rope","learned"]'])
    with Store(tmp_path / "s.sqlite") as store:
        with pytest.raises(ConfigError, match="encoding.*learned.*rotary"):
            run_study(exp, study, store=store, out=tmp_path / "out", progress=False)
        assert store.runs() == []


def test_every_registry_encoding_runs_the_phenomenon_protocol(tmp_path):
    from poslab.positional import registered

    # every entry on the model's own positions (position coupling and Abacus read the task's, which the
    # retrieval head refuses: tests/positional/test_task_positions.py)
    encodings = registered()
    exp = get_experiment("phenomenon")
    study = apply_overrides(exp.study("quick"), ["seeds=1", "grid.task.K=[2]", "train.steps=3", "eval.n_sequences=8",
                                                 "eval.lengths=[12,24]",
                                                 f"grid.encoding={list(encodings)}".replace("'", '"')])
    with Store(tmp_path / "s.sqlite") as store:
        summary = run_study(exp, study, store=store, out=tmp_path / "out", progress=False)
        assert summary["trained"] == len(encodings)
        assert {r["encoding"] for r in store.rows()} == set(encodings)


def test_unknown_experiment():
    with pytest.raises(ConfigError, match="experiment.*phenomenon"):
        get_experiment("table9")


def test_overrides_are_typed():
    cfg = apply_overrides(StudyConfig(model_type="transformer", task_type="shift"),
                          ["train.lr=0.01", "eval.lengths=[12]", "grid.task.K=[2]", "encoding_options={}",
                           "train.betas=[0.9,0.99]"])
    assert cfg.train.lr == 0.01 and cfg.eval.lengths == (12,) and cfg.axis("task.K") == (2,)
    assert cfg.train.betas == (0.9, 0.99)
    for bad in ["train.steps=1.5", "grid.train.steps=[\"a\"]", "nokey", "train=3", "train.lr=NaN",
                "train.lr=Infinity", "grid.task.K=[]", "grid.task.K=3", "=3"]:
        with pytest.raises(ConfigError, match="--set"):
            apply_overrides(StudyConfig(model_type="transformer", task_type="shift"), [bad])


@pytest.mark.parametrize("override, named", [
    ("task.K=3", "task.K"),  # a grid axis
    ("encoding=\"alibi\"", "encoding"),  # a grid axis
    ("model.encoding=\"no-such-encoding\"", "model.encoding"),  # set by the study
    ("model.vocab_size=7", "model.vocab_size"),  # set from the task
    ("model.encoding_options={}", "model.encoding_options"),
])
def test_set_never_overwrites_an_axis_or_a_field_the_study_fixes(override, named):
    study = get_experiment("phenomenon").study("quick")
    with pytest.raises(ConfigError, match=f"--set.*{named}"):
        apply_overrides(study, [override])


def test_model_and_task_options_are_checked_by_name_and_type(tmp_path):
    exp = get_experiment("phenomenon")
    for override, field in [("model.d_modle=3", "model.d_modle"), ("model.d_model=\"wide\"", "model.d_model"),
                            ("task.m=2.5", "task.m"), ("task.Q=1", "task.Q")]:
        study = apply_overrides(exp.study("quick"), [override])
        with Store(tmp_path / "s.sqlite") as store:
            with pytest.raises(ConfigError, match=field):
                run_study(exp, study, store=store, out=tmp_path / "out", progress=False)
            assert store.runs() == []


def test_grid_members_are_keyed_by_their_resolved_config_and_grouped_by_shape():
    study = table1_grid()
    everyone = members("phenomenon", study)
    assert len(everyone) == 2 * 3 * study.seeds and len({m.key for m in everyone}) == len(everyone)
    assert len({m.group_key() for m in everyone}) == 2  # one ensemble per encoding: K only changes the data
    assert everyone[0].ids == {"encoding": "rope", "K": 1, "seed": 0}
    assert everyone[0].model_config.vocab_size == 20 and everyone[0].model_config.max_len == 48
    wide = apply_overrides(study, ["grid.model.d_model=[32,64]"])
    assert len({m.group_key() for m in members("phenomenon", wide)}) == 4


def test_worker_processes_give_the_same_rows_as_one_process(tmp_path):
    exp = get_experiment("phenomenon")
    study = apply_overrides(table1_grid(), ["seeds=1", "grid.task.K=[2]"])
    with Store(tmp_path / "a.sqlite") as one, Store(tmp_path / "b.sqlite") as two:
        run_study(exp, study, store=one, out=tmp_path / "a", progress=False, workers=1)
        summary = run_study(exp, study, store=two, out=tmp_path / "b", progress=False, workers=2)
        assert summary["trained"] == 2
        strip = lambda rows: sorted(tuple(sorted((k, v) for k, v in r.items() if k != "run_key")) for r in rows)  # noqa: E731
        assert strip(one.rows()) == strip(two.rows())


def test_a_new_experiment_is_one_module_and_one_registry_entry(tmp_path, monkeypatch):
    import demo_shift

    from poslab.experiments.claims import read_claims

    monkeypatch.setitem(EXPERIMENTS, "demo_shift", demo_shift.EXPERIMENT)
    exp = get_experiment("demo_shift")
    study = exp.study("paper")
    with Store(tmp_path / "s.sqlite") as store:
        summary = run_study(exp, study, store=store, out=tmp_path / "out", progress=False)
        assert summary["trained"] == 4 and len({r["encoding"] for r in store.rows()}) == 2
        rows = store.rows(experiment="demo_shift")
        assert {(r["encoding"], r["seed"], r["length"]) for r in rows} == \
            {(e, s, L) for e in ("rope", "learned") for s in (0, 1) for L in (8, 16)}
        assert all(0 <= r["accuracy"] <= 1 and r["loss"] > 0 for r in rows)
        config = store.runs(experiment="demo_shift")[0]["config"]
        assert config["model_type"] == "transformer" and config["model"]["n_layers"] == 2
        assert config["task"] == {"m": 10, "K": 2}
    assert len(read_claims(tmp_path / "out" / "claims.json")) == 4


def test_evaluate_only_variants_reuse_trained_weights_and_resume(tmp_path, monkeypatch):
    exp = get_experiment("phenomenon")
    study = apply_overrides(table1_grid(), ["seeds=1", "grid.task.K=[2]", "eval.lengths=[12,24]",
                                    'encoding_options={"learned": {"out_of_range": "error"}}',
                                    'variants={"clamp_policy": {"encoding_options.learned.out_of_range": "clamp"}, '
                                    '"pi": {"where": {"encoding": "rope"}, "encoding": "rope_pi"}}'])
    # the learned table has 48 rows here, so both lengths fit; clamp changes nothing in range
    with Store(tmp_path / "s.sqlite") as store:
        first = run_study(exp, study, store=store, out=tmp_path / "out", progress=False)
        assert first["trained"] == 2 and first["variants"] == 3 and first["evaluated"] == 3
        rows = store.rows(experiment="phenomenon")
        base = {(r["encoding"], r["length"]): r["accuracy"] for r in rows if r.get("probe") == "length"
                and "variant" not in r}
        clamp = {(r["encoding"], r["length"]): r["accuracy"] for r in rows if r.get("variant") == "clamp_policy"
                 and r.get("probe") == "length"}
        assert clamp == base  # positions < 48 are never clamped: the same weights give the same numbers
        pi = {r["length"]: r for r in rows if r.get("variant") == "pi" and r.get("probe") == "length"
              and r["encoding"] == "rope"}
        assert set(pi) == {12, 24}  # rope evaluated under position interpolation, no retraining
        again = run_study(exp, study, store=store, out=tmp_path / "out", progress=False)
        assert again["trained"] == 0 and again["evaluated"] == 0
        assert len(store.rows(experiment="phenomenon")) == len(rows)


def test_a_variant_that_changes_parameter_shapes_is_refused_before_any_work(tmp_path):
    exp = get_experiment("phenomenon")
    study = apply_overrides(table1_grid(), ['variants={"wide": {"model.d_model": 32}}'])
    with Store(tmp_path / "s.sqlite") as store:
        with pytest.raises(ConfigError, match="variants.wide"):
            run_study(exp, study, store=store, out=tmp_path / "out", progress=False)
        assert store.runs() == []


def test_grid_points_that_resolve_to_one_config_are_one_run():
    study = table1_grid(**{"grid.encoding_options.learned.init_std": "[0.02,1.0]"})
    everyone = members("phenomenon", study)
    rope = [m for m in everyone if m.ids["encoding"] == "rope"]
    learned = [m for m in everyone if m.ids["encoding"] == "learned"]
    assert len(rope) == 3 * study.seeds and {m.ids["init_std"] for m in rope} == {0.02}  # not trained twice
    assert len(learned) == 2 * 3 * study.seeds and len({m.key for m in everyone}) == len(everyone)


def test_a_settings_only_keeps_the_cells_it_lists_and_the_rest_are_not_in_the_study():
    """A plan that is not a product: a setting's ``only`` keeps, on the other axes, the values it lists."""
    from poslab.experiments.config import apply_point
    from poslab.experiments.outputs import Pivot

    base = StudyConfig(model_type="retrieval_head", task_type="fixed_offset", seeds=1,
                       grid={"setting": ("a", "b"), "encoding": ("rope", "learned"), "train.lr": (1e-3, 1e-2)},
                       settings={"a": {"task.K": 1, "only": {"encoding": ["rope"]}}, "b": {"task.K": 2}})
    points = grid_points(base)
    assert [(p["setting"], p["encoding"]) for p in points] == [
        ("a", "rope"), ("a", "rope"), ("b", "rope"), ("b", "rope"), ("b", "learned"), ("b", "learned")]
    assert len(members("phenomenon", base)) == 6
    resolved = apply_point(base, points[0])
    assert resolved.task == {"K": 1} and resolved.settings == {}  # "only" plans; it sets no field
    both = apply_overrides(base, ['settings.a.only={"encoding":["rope"],"train.lr":[0.01]}'])
    assert [(p["setting"], p["encoding"], p["train.lr"]) for p in grid_points(both)][:1] == [("a", "rope", 0.01)]
    assert len(grid_points(both)) == 5
    for bad in ('settings.a.only={"task.K":[1]}', 'settings.a.only={"encoding":"rope"}', "settings.a.only=[1]"):
        with pytest.raises(ConfigError, match="settings.a.only") as e:
            grid_points(apply_overrides(base, [bad]))
        assert "encoding" in str(e.value) and "train.lr" in str(e.value)  # the allowed axes, named
    with pytest.raises(ConfigError, match="settings.a.only") as e:  # a plan that keeps none of the grid's cells
        grid_points(apply_overrides(base, ['grid.encoding=["learned"]']))
    assert "'encoding': ['learned']" in str(e.value)
    # a table cell with no row (a point not in the study) is not n.a. where the table says so
    pivot = Pivot("task", "score", empty="n.a.", missing="not run")
    cells = (pivot.cell([]), pivot.cell([{"score": None}]), pivot.cell([{"score": 0.5}]))
    assert cells == ("not run", "n.a.", "0.500 ± 0.000")
    assert Pivot("task", "score", empty="n.a.").cell([]) == "n.a."


def test_process_pool_gives_a_lone_job_every_core():
    """With fewer groups than workers the cores are shared among the jobs that exist: one job alone
    computes with all of them, two with half each."""
    import os

    import torch

    from poslab.experiments.executors import ProcessPool

    cores = os.cpu_count() or 1
    assert list(ProcessPool(cores).map_unordered(torch.get_num_threads, [()])) == [cores]
    if cores >= 2:
        assert sorted(ProcessPool(2).map_unordered(torch.get_num_threads, [(), ()])) == [cores // 2] * 2


def test_an_error_while_the_pool_runs_surfaces_at_once_not_after_every_job():
    """A job's results that cannot be kept (or a job that fails) stops the pool: the waiting jobs are
    cancelled and the running ones killed, where a plain shutdown would wait for all of them first."""
    import time

    from poslab.experiments.executors import ProcessPool

    start = time.perf_counter()
    with pytest.raises(RuntimeError, match="cannot keep"):
        for _ in ProcessPool(2).map_unordered(time.sleep, [(0.0,), (120.0,), (120.0,)]):
            raise RuntimeError("cannot keep this result")
    assert time.perf_counter() - start < 60  # spawning two workers takes seconds; the jobs 120 s each


def test_split_groups_halves_the_largest_until_every_slot_has_one():
    from poslab.experiments.schedule import split_groups

    assert split_groups([list("abcde")], 2) == [list("abc"), list("de")]
    assert split_groups([list("a"), list("bc")], 4) == [list("a"), list("b"), list("c")]  # no more to split
    assert split_groups([list("ab"), list("cdef")], 3) == [list("ab"), list("cd"), list("ef")]
    assert split_groups([list("abcd")], 1) == [list("abcd")]  # one slot: as it was
    assert split_groups([], 2) == []


def test_split_groups_balances_groups_that_do_not_share_out_evenly():
    from poslab.experiments.schedule import MIN_SPLIT, split_groups, wall_estimate

    table1 = [[f"{g}{i}" for i in range(24)] for g in "abc"]  # Table 1: three groups of 24 on two workers
    parts = split_groups(table1, 2)
    assert sorted(len(p) for p in parts) == [12, 12, 24, 24]  # one group halved: each worker 24 + 12
    assert [len(p) for p in parts] == [24, 24, 12, 12]  # longest first
    assert sorted(m for p in parts for m in p) == sorted(m for g in table1 for m in g)  # every member once
    assert wall_estimate(parts, 2) < wall_estimate(table1, 2)
    assert split_groups(table1[:2], 2) == table1[:2]  # two on two: nothing to balance
    small = [list("abc"), list("def"), list("ghi")]  # parts below MIN_SPLIT are never halved to balance
    assert len(small[0]) < MIN_SPLIT and split_groups(small, 2) == small


def test_split_groups_weighs_each_group_by_its_cost_per_member():
    """The heads study's shape: five groups of six, one of them (d_model 256) about 2.6x the cost
    of the cheapest. By members they go out in any order (one worker got 38 + 50 + 100 s of them,
    the other 42 + 53); by cost the costliest goes first and the loads even out."""
    from poslab.experiments.schedule import SPLIT_OVERHEAD, split_groups

    groups = [[f"{g}{i}" for i in range(6)] for g in "abcde"]
    costs = [1.0, 1.1, 1.3, 1.4, 2.6]  # seconds per member, as step_costs gives them
    parts = split_groups(groups, 2, costs)
    assert parts[0] == groups[4] and parts[1] == groups[3]  # costliest first
    loads = [0.0, 0.0]
    for part in parts:  # the pool hands parts out in this order to the first free worker
        cost = (len(part) + SPLIT_OVERHEAD) * costs[groups.index(part)]
        loads[loads.index(min(loads))] += cost
    assert max(loads) / sum(loads) < 0.55  # within 10% of an even share
    assert split_groups(groups, 2) == groups  # without costs: by members, all equal, as given
    with pytest.raises(ValueError):
        split_groups(groups, 2, costs[:2])


def test_a_cropped_group_trains_member_by_member_and_the_rest_as_ensembles():
    """A cropped ensemble's step is as wide as its widest member's: each member alone gets its own
    width whatever the schedule. Where nothing is cropped (off, or randomized positions drawn for
    the padded width) the group stays one ensemble. Building a model to ask leaves torch's generator
    as it was."""
    import torch

    from poslab.experiments.config import apply_overrides
    from poslab.experiments.schedule import alone_where_cropped
    from poslab.studies import get_experiment

    exp = get_experiment("lengthgen")

    def groups(*sets: str) -> list[list]:
        study = apply_overrides(exp.study("quick"), ['grid.setting=["even_pairs"]', 'grid.encoding=["rope"]',
                                                     "seeds=3", *sets])
        out: dict[str, list] = {}
        for m in members("lengthgen", study):
            out.setdefault(m.group_key(), []).append(m)
        return list(out.values())

    plain = groups("grid.model.random_positions=[null]")
    assert [len(g) for g in plain] == [3] and alone_where_cropped(plain) == plain
    cropped = groups("grid.model.random_positions=[null]", "train.crop_padding=true")
    state = torch.random.get_rng_state()
    assert alone_where_cropped(cropped) == [[m] for m in cropped[0]]
    assert torch.equal(torch.random.get_rng_state(), state)
    width = groups('grid.model.random_positions=[{"N": 256, "draw": "width"}]', "train.crop_padding=true")
    assert alone_where_cropped(width) == width  # positions drawn for the padded width: not padding-inert


def test_a_run_trains_cropped_seeds_one_by_one(tmp_path):
    import json
    import sqlite3

    from poslab.experiments.config import apply_overrides
    from poslab.experiments.executors import Inline
    from poslab.store import Store
    from poslab.studies import get_experiment

    exp = get_experiment("lengthgen")
    study = apply_overrides(exp.study("quick"), ['grid.setting=["even_pairs"]', 'grid.encoding=["rope"]',
                                                 "grid.model.random_positions=[null]", "seeds=2",
                                                 "train.crop_padding=true", "train.steps=2"])
    with Store(tmp_path / "s.sqlite") as store:
        run_study(exp, study, store=store, out=tmp_path / "out", progress=False, executor=Inline())
    with sqlite3.connect(tmp_path / "s.sqlite") as db:
        sizes = [json.loads(t)["group_size"] for (t,) in db.execute("SELECT timings_json FROM runs")]
    assert sizes == [1, 1]


def test_step_costs_measure_each_group_on_one_thread_and_restore_the_threads():
    import math

    import torch

    from poslab.experiments.schedule import step_costs
    from poslab.studies import heads

    study = heads.EXPERIMENT.study("quick")
    groups: dict[str, list] = {}
    for m in members("heads", study):
        groups.setdefault(m.group_key(), []).append(m)
    threads = torch.get_num_threads()
    costs = step_costs(list(groups.values()))
    assert torch.get_num_threads() == threads
    assert len(costs) == len(groups) and all(math.isfinite(c) and c > 0 for c in costs)


def test_heatmap_declaration_draws_the_mean_over_seeds_on_its_grid(tmp_path, monkeypatch):
    """A Heatmap averages ``value`` over seeds per (y, x) cell, leaves missing cells blank, draws one
    panel per value of its panel columns, and draws nothing without rows."""
    import numpy as np

    from poslab.experiments.outputs import Heatmap
    from poslab.experiments.spec import probe

    drawn = []
    real_imshow = __import__("matplotlib.axes", fromlist=["Axes"]).Axes.imshow
    monkeypatch.setattr("matplotlib.axes.Axes.imshow",
                        lambda self, grid, **kw: drawn.append(np.array(grid)) or real_imshow(self, grid, **kw))
    rows = [dict(probe="p", m=m, depth=d, length=L, acc=v, seed=s)
            for m in ("a", "b") for d in (0.0, 1.0) for L in (8, 16) for s, v in ((0, 0.2), (1, 0.6))
            if not (m == "b" and d == 1.0 and L == 16)]
    fig = Heatmap("h.png", value="acc", y="depth", x="length", panel=("m",), where=probe("p"))
    assert fig.draw(rows, tmp_path) == tmp_path / "h.png" and (tmp_path / "h.png").is_file()
    assert len(drawn) == 2 and np.allclose(drawn[0], 0.4)  # mean of 0.2 and 0.6 in every cell of panel a
    assert np.isnan(drawn[1][1, 1]) and np.allclose(drawn[1][0], 0.4)  # panel b: its missing cell is blank
    assert fig.draw([], tmp_path) is None


def test_reevaluate_probes_the_stored_weights_again_and_trains_nothing(tmp_path):
    exp = get_experiment("phenomenon")
    study = apply_overrides(table1_grid(), ["seeds=1", "grid.task.K=[2]",
                                            'variants={"pi": {"where": {"encoding": "rope"}, "encoding": "rope_pi"}}'])
    with Store(tmp_path / "s.sqlite") as store:
        run_study(exp, study, store=store, out=tmp_path / "out", progress=False)
        runs = {r["key"]: r for r in store.runs(experiment="phenomenon")}
        before = store.rows(experiment="phenomenon")
        weights = {k: store.load_weights(k) for k, r in runs.items() if r["weights"]}
        same = run_study(exp, study, store=store, out=tmp_path / "again", progress=False, reevaluate=True)
        assert same["trained"] == 0 and same["reevaluated"] == 2 and same["evaluated"] == 1
        assert store.rows(experiment="phenomenon") == before  # the same weights, the same probes: the same rows
        assert (tmp_path / "again" / "claims.json").read_bytes() == (tmp_path / "out" / "claims.json").read_bytes()

        threads = []

        def probed_again(ctx):  # a probe that changed after training
            threads.append((ctx.member.variant, torch.get_num_threads()))
            return [{**row, "new_probe": ctx.member.seed + 1} for row in exp.evaluate(ctx)]

        assert all(r["timings"]["eval_threads"] >= 1 for k, r in runs.items() if k in weights)
        with store._transaction():  # as if each member had been evaluated on 3 threads
            for key in weights:
                store._conn.execute("UPDATE runs SET timings_json = ? WHERE key = ?",
                                    (json.dumps({**runs[key]["timings"], "eval_threads": 3}), key))
        changed = dataclasses.replace(exp, evaluate=probed_again)
        run_study(changed, study, store=store, out=tmp_path / "changed", progress=False, reevaluate=True)
        rows = store.rows(experiment="phenomenon")
        assert len(rows) == len(before) and all(r["new_probe"] == 1 for r in rows)
        # trained members on the threads their evaluation had, so reductions add up in the same order
        assert [n for v, n in threads if v is None] == [3, 3]
        after = {r["key"]: r for r in store.runs(experiment="phenomenon")}
        assert set(after) == set(runs)  # no run added or lost
        for key, r in after.items():
            assert r["config"] == runs[key]["config"] and r["status"] == runs[key]["status"]
            if key in weights:  # trained members keep their weights and their training timings
                assert all(store.load_weights(key)[n].equal(w) for n, w in weights[key].items())
                assert r["timings"]["group_train_seconds"] == runs[key]["timings"]["group_train_seconds"]
                assert r["timings"]["reevaluated_at"]


@pytest.mark.parametrize("name, overrides, named", [
    ("phenomenon", [], "not in the store"),  # nothing trained yet
    ("lm", [], "loss curve"),
    ("controls", [], "snapshot_steps"),
])
def test_reevaluate_refuses_what_it_cannot_recompute_before_any_work(name, overrides, named, tmp_path):
    exp = get_experiment(name)
    study = apply_overrides(exp.study("quick"), overrides)
    with Store(tmp_path / "s.sqlite") as store:
        with pytest.raises(ConfigError, match=named) as err:
            run_study(exp, study, store=store, out=tmp_path / "out", progress=False, reevaluate=True)
        assert err.value.field == "--reevaluate"
        assert store.runs() == [] and not (tmp_path / "out").exists()
        with pytest.raises(ConfigError, match="without --force"):
            run_study(exp, study, store=store, out=tmp_path / "out", progress=False, reevaluate=True, force=True)


def test_model_fields_added_later_leave_the_run_key_alone_at_their_defaults():
    import dataclasses

    from poslab.experiments.experiment import LATER_MODEL_DEFAULTS, model_fields
    from poslab.models.transformer import TransformerConfig

    cfg = TransformerConfig(vocab_size=8)
    fields = model_fields(cfg)
    assert not set(LATER_MODEL_DEFAULTS) & set(fields)  # the key of a run stored before they existed
    assert model_fields(dataclasses.replace(cfg, random_positions=256))["random_positions"] == 256
    assert not {"layout", "qk_norm"} & set(fields)  # issue 57's fields: a plain model's key is as before
    laid = model_fields(dataclasses.replace(cfg, n_layers=2, layout="rope,nope", qk_norm=True))
    assert (laid["layout"], laid["qk_norm"]) == ("rope,nope", True)


def test_lines_share_a_colour_per_hue_and_dash_the_flagged_series(tmp_path, monkeypatch):
    """Lines(hue=, dash=, shared_legend=): one colour per hue value in every panel, dashed where the
    flag is true, and one figure legend naming each series once."""
    import matplotlib.pyplot as plt

    from poslab.experiments.outputs import Lines

    rows = [dict(task=t, cell=f"{e}{'+r' if r else ''}", encoding=e, randomized=r, length=L, score=0.5)
            for t in ("a", "b") for e in ("rope", "alibi") for r in (False, True) for L in (1, 2)]
    seen = {}
    monkeypatch.setattr(plt, "close", lambda fig: seen.setdefault("fig", fig))
    Lines("f.png", x="length", y="score", series=("cell",), panel="task", hue="encoding", dash="randomized",
          shared_legend=True).draw(rows, tmp_path)
    fig = seen["fig"]
    assert (tmp_path / "f.png").exists() and len(fig.legends) == 1
    assert sorted(t.get_text() for t in fig.legends[0].get_texts()) == ["alibi", "alibi+r", "rope", "rope+r"]
    for ax in fig.axes:
        lines = {ln.get_label(): ln for ln in ax.get_lines()}
        assert lines["rope"].get_color() == lines["rope+r"].get_color() != lines["alibi"].get_color()
        assert lines["rope+r"].get_linestyle() == "--" and lines["rope"].get_linestyle() == "-"
        assert ax.get_legend() is None
