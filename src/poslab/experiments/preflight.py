"""Every check on user input, before anything is trained or written (``validate``), and the
preconditions of an output folder and of ``--reevaluate``."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from poslab.errors import ConfigError
from poslab.experiments.config import StudyConfig
from poslab.experiments.experiment import EvaluateOnly, Experiment, Member, Trained, members, variant_members
from poslab.store import Store

DEVICES = ("cpu", "cuda")

# ----------------------------------------------------------------------------- validation

def validate(study: StudyConfig, device: str, experiment: Experiment | None = None) -> list[Member]:
    """Every check on user input, before anything is trained or written; returns the members.

    Builds one small real model per distinct model config (every table the run will use) and
    asks it about every length; variants must keep the trained parameter shapes.
    """
    check_seeds(study)  # every study, an evaluate-only one too (its jobs never read the seeds)
    if device not in DEVICES:
        raise ConfigError("device", device, DEVICES)
    if device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device", device, "cpu (no CUDA device is available here)")
    if isinstance(experiment, EvaluateOnly):  # the study checks itself
        if experiment.check is not None:
            experiment.check(study)
        return []
    assert experiment is None or isinstance(experiment, Trained), experiment
    check_settings(study)
    trained = members(experiment if experiment is not None else "study", study)
    check_members(study, trained, lengths=experiment is None or not experiment.checks_eval_lengths)
    if experiment is not None and experiment.check is not None:
        experiment.check(study)
    return trained


# members are enumerated (and keyed) one by one before any work: a typo of 10^12 would enumerate for hours
MAX_SEEDS = 10_000


def check_seeds(study: StudyConfig) -> None:
    """``--seeds`` / ``seeds``: a positive integer up to MAX_SEEDS, in every study (an evaluate-only study
    has one member per job whatever it says, but 0 or -1 is a typo to refuse, not to ignore)."""
    if not isinstance(study.seeds, int) or isinstance(study.seeds, bool) or not 1 <= study.seeds <= MAX_SEEDS:
        raise ConfigError("seeds", study.seeds, f"a positive integer up to {MAX_SEEDS}")


def check_settings(study: StudyConfig) -> None:
    """The study's own settings: training, evaluation, grid axes and encoding options (seeds:
    :func:`check_seeds`, which :func:`validate` calls first)."""
    study.train.validate()
    if not study.eval.lengths or min(study.eval.lengths) < 1:
        raise ConfigError("eval.lengths", study.eval.lengths, "positive integers")
    for name in ("n_sequences", "chunk"):
        if getattr(study.eval, name) < 1:
            raise ConfigError(f"eval.{name}", getattr(study.eval, name), "a positive integer")
    for path, values in study.grid.items():
        if not values:
            raise ConfigError(f"grid.{path}", values, "a non-empty list of values")
    encodings = set(study.axis("encoding"))
    for name in study.encoding_options:
        if name not in encodings:
            raise ConfigError("encoding_options", name, f"options for one of the study's encodings: "
                                                        f"{', '.join(sorted(encodings))}")


def check_members(study: StudyConfig, trained: list[Member], *, lengths: bool = True) -> None:
    """Every member's task at its lengths (``lengths``: the eval lengths too) and one small real model
    per group; each variant's model keeps its trained member's parameter names and shapes."""
    shapes: dict[str, dict] = {}
    for member in trained:
        member.task.validate(member.study.train.min_length)
        for L in member.study.eval.lengths:
            if lengths:  # else the experiment's check() does (lm: the whole corpus)
                member.task.validate(L)
        if member.group_key() not in shapes:
            shapes[member.group_key()] = _check_model(member)
    for variant, base in variant_members(study, trained):
        variant.task.validate(variant.study.train.min_length)
        got = _check_model(variant)
        if got != shapes[base.group_key()]:
            raise ConfigError(f"variants.{variant.variant}", dict(study.variants[variant.variant]),
                              "changes that keep the trained parameters' names and shapes (evaluate-only)")


def _check_model(member: Member) -> dict:
    model = member.make_model()()
    for L in (*member.study.eval.lengths, member.study.train.max_length):
        model.check_length(L)
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}


def check_output_folder(out: Path) -> None:
    """``out`` must be a folder or a path where one can be made (checked before any work)."""
    out = Path(out)
    allowed = "a folder, or a new path whose nearest existing parent is a writable folder"
    if out.exists():
        if not out.is_dir():
            raise ConfigError("--out", str(out), f"{allowed} (this is an existing file)")
        if not os.access(out, os.W_OK):
            raise ConfigError("--out", str(out), f"{allowed} (this folder is not writable)")
        return
    parent = out.parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK):
        raise ConfigError("--out", str(out), f"{allowed} ({parent} is not a writable folder)")


def check_reevaluate(experiment: Experiment, study: StudyConfig, trained: list[Member], store: Store) -> dict:
    """``--reevaluate``'s preconditions, checked before any work: a study whose rows follow from its
    weights, every trained member stored with them. Returns the stored runs by key."""
    use_force = "use --force to train it again"
    if not isinstance(experiment, Trained):
        raise ConfigError("--reevaluate", experiment.name, "a study that trains its members (this one evaluates "
                                                           "a pretrained checkpoint on every run: use --force)")
    if experiment.training_rows:
        raise ConfigError("--reevaluate", experiment.name, "a study whose rows follow from its weights (this one's "
                                                           f"rows hold the training loss curve, not stored: "
                                                           f"{use_force})")
    if study.train.snapshot_steps:
        raise ConfigError("--reevaluate", experiment.name, "a study without train.snapshot_steps (weights during "
                                                           f"training are not stored: {use_force})")
    stored = {r["key"]: r for r in store.runs(experiment=experiment.name)}
    missing = [m for m in trained if m.key not in stored or stored[m.key]["weights"] is None]
    if missing:
        raise ConfigError("--reevaluate", f"{experiment.name}: {len(missing)} of {len(trained)} members not in the "
                                          f"store with weights", "a study already trained into this store with the "
                                                                 "same preset, --seeds and --set, eval settings "
                                                                 "included (or run it without --reevaluate first)")
    return stored
