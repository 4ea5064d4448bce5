"""Text from a stored language model: find a trained member in the store and sample from it
(``poslab sample``), to read what a character LM learned."""

from __future__ import annotations

import dataclasses

import torch

from poslab.errors import ConfigError


def load_member(store, key: str | None = None, *, experiment: str | None = None, encoding: str | None = None,
                seed: int = 0):
    """(model in eval mode, its task, run key) of a stored member: by run key, or the latest
    finished trained member of ``experiment`` (default: the study ``poslab.studies.DEFAULTS`` names
    for ``sample``, the character LM's) with that encoding and seed."""
    from poslab.models import model_classes
    from poslab.tasks import build_task

    if experiment is None:
        from poslab.studies import DEFAULTS

        experiment = DEFAULTS["sample"]

    runs = store.runs()
    run = _run_by_key(runs, key) if key is not None else _latest_member(runs, experiment, encoding, seed)
    config = run["config"]
    model_cls, cfg_cls = model_classes(config["model_type"])
    fields = {f.name for f in dataclasses.fields(cfg_cls)}
    model = model_cls(cfg_cls(**{k: v for k, v in config["model"].items() if k in fields}))
    model.load_state_dict(store.load_weights(run["key"]))
    task = build_task(config["task_type"], **config["task"])
    if not hasattr(task, "decode"):
        raise ConfigError("--run", run["key"], "a run trained on text (its task decodes tokens to characters)")
    return model.eval(), task, run


def _run_by_key(runs: list[dict], key: str) -> dict:
    """The (last) run of the store with run key ``key``."""
    found = [r for r in runs if r["key"] == key]
    if not found:
        raise ConfigError("--run", key, "the key of a run in the store (poslab report lists them)")
    return found[-1]


def _latest_member(runs: list[dict], experiment: str, encoding: str | None, seed: int) -> dict:
    """The latest finished trained member (no stage, no variant) of ``experiment`` with that encoding
    (None: any) and seed."""
    from poslab.experiments.stages import is_stage

    found = [r for r in runs if r["experiment"] == experiment and r["status"] == "finished"
             and not is_stage(r["config"]) and r["config"].get("variant") is None
             and r["config"].get("seed") == seed
             and (encoding is None or r["config"]["model"].get("encoding") == encoding)]
    if not found:
        have = sorted({(r["config"]["model"].get("encoding"), r["config"].get("seed")) for r in runs
                       if r["experiment"] == experiment and "model" in r["config"]})
        raise ConfigError("--encoding/--seed", (encoding, seed),
                          f"a trained member of {experiment!r} in the store: {have or 'none'}")
    return found[-1]


def generate(model, task, prompt: str, length: int, *, temperature: float = 0.8, context: int | None = None,
             generator: torch.Generator | None = None) -> str:
    """``length`` characters sampled after ``prompt`` from softmax(logits / temperature), each
    conditioned on the last ``context`` characters (default: the model's table length)."""
    if not (isinstance(length, int) and length >= 1):
        raise ConfigError("--length", length, "a positive integer")
    if not temperature > 0:
        raise ConfigError("--temperature", temperature, "a positive number")
    if not prompt:
        raise ConfigError("--prompt", prompt, "at least one character of the corpus")
    ids = task.encode(prompt)  # ConfigError for characters outside the vocabulary
    context = context or model.cfg.max_len - int(model.cfg.bos)
    out = ids.tolist()
    with torch.no_grad():
        for _ in range(length):
            window = torch.tensor(out[-context:])[None]  # [1, s]
            logits = model(window)[0, -1] / temperature  # [m]
            out.append(int(torch.multinomial(logits.softmax(-1), 1, generator=generator)))
    return task.decode(torch.tensor(out[len(ids):]))
