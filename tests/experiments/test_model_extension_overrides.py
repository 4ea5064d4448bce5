"""The Transformer's extensions (energy gate, randomized positions) through a study's config: their
options by dotted path under an on/off grid axis, the earlier flat spellings refused naming the new
path, and a run's recorded config (its key) as before the extensions existed."""

import dataclasses

import pytest

from poslab.errors import ConfigError
from poslab.experiments import members
from poslab.experiments.config import apply_overrides
from poslab.experiments.experiment import model_fields
from poslab.models.energy_gate import EnergyGate
from poslab.models.random_positions import RandomPositions
from poslab.models.transformer import RENAMED, TransformerConfig
from poslab.studies import mope

# the flat fields a TransformerConfig had before the extensions, as every stored run's config holds them
EARLIER = {"energy_gate": False, "gate_projection": "per_head", "gate_energy": "power", "gate_temperature": 0.1,
           "gate_tau_init": 0.5, "gate_renormalize": False}


def test_gate_options_under_the_on_off_axis_reach_the_gated_members_only():
    study = mope.EXPERIMENT.study("quick")
    base = {m.key: m for m in members("mope", study)}
    options = ["model.energy_gate.temperature=0.2", "model.energy_gate.renormalize=true"]
    tuned = members("mope", apply_overrides(study, options, mope.EXPERIMENT.fixed))  # as the command line does
    gates = {m.model_config.energy_gate for m in tuned}
    assert gates == {None, EnergyGate(temperature=0.2, renormalize=True)}
    for m in tuned:  # the ungated members are the same runs as before; the gated ones are new runs
        assert (m.key in base) == (m.model_config.energy_gate is None)


@pytest.mark.parametrize("old", sorted(RENAMED))
def test_an_earlier_flat_spelling_is_refused_naming_the_new_path(old):
    for path in (f"model.{old}=1", f"grid.model.{old}=[1]"):
        with pytest.raises(ConfigError) as err:
            apply_overrides(mope.EXPERIMENT.study("quick"), [path], mope.EXPERIMENT.fixed)
        assert f"model.{RENAMED[old]}" in str(err.value)


def test_the_axis_itself_stays_fixed():
    with pytest.raises(ConfigError):
        apply_overrides(mope.EXPERIMENT.study("quick"), ["model.energy_gate=true"], mope.EXPERIMENT.fixed)


def test_shorthands_and_options_by_path_on_a_study_without_the_axis():
    study = dataclasses.replace(mope.EXPERIMENT.study("quick"), grid={"encoding": ("rope",)})
    got = members("mope", apply_overrides(study, ["model.energy_gate=true", "model.energy_gate.tau_init=1",
                                                  'model.random_positions={"N": 300, "at_eval": false}']))
    cfg = got[0].model_config
    assert cfg.energy_gate == EnergyGate(tau_init=1.0)
    assert cfg.random_positions == RandomPositions(N=300, at_eval=False)
    with pytest.raises(ConfigError) as err:
        members("mope", apply_overrides(study, ["model.energy_gate.tau=1"]))
    assert "tau_init" in str(err.value)
    with pytest.raises(ConfigError):  # a path under a scalar shorthand: set the object whole
        apply_overrides(study, ["model.random_positions=300", "model.random_positions.at_eval=false"])


def test_a_runs_recorded_config_is_as_before_the_extensions():
    plain = model_fields(TransformerConfig(vocab_size=8))
    assert {k: plain[k] for k in EARLIER} == EARLIER and "random_positions" not in plain
    gated = TransformerConfig(vocab_size=8, energy_gate=EnergyGate(temperature=0.3, projection="shared"),
                              random_positions=RandomPositions(N=64, at_eval=False))
    fields = model_fields(gated)
    assert (fields["energy_gate"], fields["gate_temperature"], fields["gate_projection"]) == (True, 0.3, "shared")
    assert (fields["random_positions"], fields["random_positions_eval"]) == (64, False)
    assert TransformerConfig.from_record(fields) == gated
    assert TransformerConfig.from_record(plain) == TransformerConfig(vocab_size=8)
