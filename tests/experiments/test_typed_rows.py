"""Typed rows (poslab.experiments.rows): a RowKind checks the rows it makes; a frame keeps each cell's
object; groups and the claim specs' selection read frames as the lists of dicts were read."""

import math

import pytest

from poslab.experiments.rows import RowError, RowKind, frame, groups, has, of_kind, values
from poslab.experiments.spec import ClaimSpec, at_least, derivation, is_, kind, mean, neg, probe, share

DEPTH = RowKind("depth", {"bos": str, "seed": int, "slope": float | None})


def test_a_kind_makes_its_row_tag_first_in_the_given_order():
    row = DEPTH(seed=1, bos="with BOS", slope=None)
    assert list(row) == ["probe", "seed", "bos", "slope"] and row["probe"] == "depth"


@pytest.mark.parametrize(("values", "column", "said"), [
    (dict(bos="x", seed=0), "slope", "missing"),
    (dict(bos="x", seed="0", slope=1.0), "seed", "got str '0'; declared int"),
    (dict(bos="x", seed=0, slope=1), "slope", "got int 1; declared float"),
    (dict(bos="x", seed=0, slope=1.0, extra=2), "extra", "not declared"),
])
def test_a_bad_row_fails_naming_the_kind_and_the_column(values, column, said):
    with pytest.raises(RowError, match=f"row kind 'depth', column '{column}': {said}"):
        DEPTH(**values)


def test_a_frame_keeps_each_cells_object_and_none_where_missing():
    df = frame([{"probe": "a", "K": 2}, {"probe": "b", "x": 0.1}])
    assert list(df.columns) == ["probe", "K", "x"]
    assert df["K"].iloc[0] == 2 and type(df["K"].iloc[0]) is int and df["K"].iloc[1] is None
    assert list(has(df, "x")) == [False, True] and list(has(df, "nope")) == [False, False]
    assert list(of_kind(df, "b")["x"]) == [0.1] and len(values(df, "nope")) == 0


def test_groups_keep_first_appearance_and_row_order():
    df = frame([{"e": "b", "v": 1}, {"e": "a", "v": 2}, {"e": "b", "v": 3}, {"v": 4}])
    got = [(key, list(g["v"])) for key, g in groups(df, ["e"])]
    assert got == [(("b",), [1, 3]), (("a",), [2]), ((None,), [4])]
    assert groups(df.iloc[:0], ["e"]) == [] and groups(df, [])[0][0] == ()


def test_selection_on_a_frame_equals_the_row_predicate():
    rows = [{"probe": "length", "kind": "rotary", "K": k, "peak": -k if k % 2 else 0} for k in range(5)]
    rows += [{"probe": "other", "K": "not a number"}, {"probe": "length", "kind": "none"}]
    where = probe("length") & kind("rotary") & at_least("K", 2)
    picked = where.select(frame(rows))  # term by term: "not a number" is never compared with 2
    assert picked.to_dict("records") == [r for r in rows if where(r)]
    spec = ClaimSpec(name="K={K}", paper="p", where=where, per=("K",), measure=share("peak", "==", neg("K")), op=">=",
                     threshold=1.0, source=derivation("by definition"), setting="seed")
    assert [(c.name, c.holds) for c in spec.evaluate(rows)] == [("K=2", False), ("K=3", True), ("K=4", False)]
    by_seed = ClaimSpec(name="m", paper="p", where=is_("probe", "length"), measure=mean("K"), op=">", threshold=1.9,
                        source=derivation("by definition"), setting="seed")
    (claim,) = by_seed.evaluate(rows)
    assert math.isclose(claim.measured, 2.0) and claim.holds is True and claim.note == "1 seeds, 6 rows"


def test_numpy_scalars_count_as_their_python_types():
    import numpy as np

    row = DEPTH(bos="x", seed=np.int64(2), slope=np.float32(0.5))
    assert row["seed"] == 2
    with pytest.raises(RowError, match="column 'bos'"):
        DEPTH(bos=np.int64(1), seed=0, slope=None)
