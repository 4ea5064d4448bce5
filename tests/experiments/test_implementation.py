"""The implementation study: its quick preset end to end (a tiny char LM and a tiny random Llama),
and its claims read the rows it writes."""

import json
import time

import pytest

from poslab.experiments import run_study
from poslab.experiments.executors import Inline
from poslab.store import Store
from poslab.studies import implementation as im


def test_quick_preset_end_to_end(tmp_path):
    pytest.importorskip("transformers")
    start = time.perf_counter()
    with Store(tmp_path / "s.sqlite") as store:
        summary = run_study(im.EXPERIMENT, im.EXPERIMENT.study("quick"), store=store, out=tmp_path / "out",
                            progress=False, executor=Inline())
        assert len(store.runs(experiment="implementation")) == 2  # a second run reuses both members
    assert summary["members"] == 2 and summary["trained"] == 2
    # about 12 s on an idle 2-core machine (imports of transformers, matplotlib and the optimizer included)
    assert time.perf_counter() - start < 60
    claims = {c["name"]: c for c in json.loads((tmp_path / "out" / "claims.json").read_text())}
    for model in ("char", "tiny-llama"):
        differ = claims[f"{model}: Dynamic NTK with a KV cache differs from a full recompute past L0"]
        assert differ["role"] == "check" and differ["holds"] is True  # issue 53: by the schedule's construction
        assert claims[f"{model}: within L0 the cached decode equals the recompute"]["holds"] is True
    collapse = claims["bf16 positions: neighbours p, p + 1 collapse to one value in [256, 512)"]
    assert collapse["role"] == "check" and collapse["holds"] is True and float(collapse["measured"]) == 0.5
    table = (tmp_path / "out" / "table.md").read_text()
    assert "KV cache under Dynamic NTK" in table and "Attention-pattern error" in table
    assert (tmp_path / "out" / "pattern_error.png").is_file() and (tmp_path / "out" / "kv_gap.png").is_file()


def test_bad_settings_are_refused_before_any_work():
    from poslab.errors import ConfigError
    from poslab.experiments.config import apply_overrides

    study = im.EXPERIMENT.study("quick")
    with pytest.raises(ConfigError, match="model.decode"):
        im.settings(apply_overrides(study, ["model.decode=8"]))
    with pytest.raises(ConfigError, match="model.factor"):
        im.settings(apply_overrides(study, ["model.factor=1"]))


@pytest.mark.slow
def test_smollm2_cache_differs_past_L0():
    """SmolLM2-135M with Dynamic NTK at L0 = 32: its own KV cache against recompute."""
    from poslab.pretrained.model import load
    from poslab.studies.kit.checkpoints import checkpoint_source, source_path

    model = load(source_path(checkpoint_source("smollm2-135m")))
    import torch

    tokens = torch.randint(100, 5000, (1, 96), generator=torch.Generator().manual_seed(0))
    rows = im.kv_rows(model, tokens, dict(L0=32, decode=96, factor=2.0, stride=16, depths=[]))
    summary = im.derived_rows([dict(r, model="smollm2") for r in rows])[0]
    assert summary["gap_within"] < 1e-3 and summary["gap_ratio"] >= im.GAP_RATIO
    assert model.schedule is None  # restored
