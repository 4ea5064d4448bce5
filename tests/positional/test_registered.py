"""poslab.positional.registered: the registry's names by kind and by the caller's attention,
read from the classes, plugins included (a plugin's encoding joins by its class's kind)."""

from __future__ import annotations

from functools import partial

import pytest

from poslab import positional
from poslab.errors import ConfigError
from poslab.positional import ENCODINGS, PositionalEncoding, encoding_class, registered
from poslab.positional.base import KINDS


def test_every_entry_in_registry_order_and_each_kind_partitions_them():
    assert registered(task_positions=True) == tuple(ENCODINGS)
    by_kind = [name for k in KINDS for name in registered(k, task_positions=True)]
    assert sorted(by_kind) == sorted(ENCODINGS)  # each name under exactly one kind
    for k in KINDS:
        assert all(encoding_class(name).kind == k for name in registered(k))
    assert registered(("absolute", "none")) == tuple(n for n in ENCODINGS if n in registered("absolute")
                                                    or n in registered("none"))


def test_entries_reading_task_positions_join_only_on_request():
    task = {name for name in ENCODINGS if encoding_class(name).task_positions}
    assert task == {"position_coupling", "abacus"}
    assert registered() == tuple(n for n in ENCODINGS if n not in task)
    assert registered("absolute", task_positions=True)[-2:] == ("position_coupling", "abacus")


def test_bidirectional_callers_lose_the_causal_only_entries():
    causal_only = {name for name in ENCODINGS if encoding_class(name).causal_only}
    assert {"xpos", "fire", "cope", "fox"} <= causal_only
    assert set(registered(causal=False, task_positions=True)) == set(ENCODINGS) - causal_only
    assert registered(causal=True) == registered() == registered(causal=None)
    assert "xpos" in registered("rotary") and "xpos" not in registered("rotary", causal=False)


class Plain(PositionalEncoding):
    kind, extra_parameters, cost, reference = "relative", "none", "none", "a test"
    causal_only = True


def test_a_plugin_entry_joins_by_its_class(monkeypatch):
    monkeypatch.setitem(ENCODINGS, "plugin_bias", partial(Plain))
    assert registered("relative")[-1] == "plugin_bias"
    assert "plugin_bias" not in registered("relative", causal=False)
    assert "plugin_bias" not in registered("rotary")


def test_an_unknown_kind_names_the_kinds():
    with pytest.raises(ConfigError) as err:
        registered("rotational")
    assert err.value.field == "kind" and "rotary" in str(err.value)


def test_the_docstring_examples():
    import doctest
    finder = doctest.DocTestFinder()
    [test] = [t for t in finder.find(positional) if t.name.endswith(".registered")]
    assert doctest.DocTestRunner().run(test).failed == 0 and test.examples
