"""The pretrained studies' checkpoints: a name resolved to a source (the quick preset's tiny random
Llama, :data:`TINY`, built in code once per machine), a checkpoint loaded once per process, and the
standard passkey prompt in a checkpoint's tokens (:func:`passkey_prompt`)."""

from __future__ import annotations

import functools
import tempfile
from pathlib import Path

import torch

TINY = "tiny-llama"  # the quick presets' checkpoint: poslab.pretrained.tiny, seed 0


def checkpoint_source(name: str):
    """The :class:`~poslab.pretrained.loading.Source` of ``name``: :data:`TINY` built in the temporary
    folder where it is not there yet, any other name resolved as ``poslab inspect`` resolves it."""
    from poslab.pretrained.loading import Source, resolve

    if name == TINY:
        from poslab.pretrained.tiny import tiny_checkpoint

        path = Path(tempfile.gettempdir()) / "poslab-tiny-llama-seed0"
        if not (path / "config.json").is_file():
            tiny_checkpoint("llama", path)
        return Source("dir", str(path), TINY)
    return resolve(name)


def source_path(source) -> str:
    """What :func:`loaded` takes for ``source``: its path, or a hub id's name."""
    return str(source.path if source.kind != "hub" else source.name)


def preflight_checkpoint(name: str, needs=(), field: str = "--model") -> None:
    """The last check of a study on checkpoint ``name``, before any job runs: its weights loaded (float32,
    on the CPU) and one short forward (:func:`poslab.pretrained.checks.preflight`: it runs; with
    ``needs`` "record", poslab's recording attention ran at every layer; with "schedule", poslab's
    rotary gives its logits). The model is let go afterwards: the jobs load their own.

    The built-in checkpoints (``BUILTIN``: SmolLM2, Gemma 3) skip it: their recording and rotary are
    tested on the files themselves (tests/pretrained/test_smollm2.py, test_gemma3.py), and a load
    costs them seconds to minutes (Gemma 3 270M's GGUF: 38 s unloaded, docs/pretrained.md)."""
    from poslab.pretrained.checks import preflight
    from poslab.pretrained.loading import BUILTIN
    from poslab.pretrained.model import load

    if name in BUILTIN:
        return
    model = load(source_path(checkpoint_source(name)), quiet=True)  # a refusal is one line: no loading bar
    preflight(model, needs, field, name)


@functools.lru_cache(maxsize=1)
def loaded(path: str, dtype: str, device: str):
    """The checkpoint at ``path``, loaded once per process (the driver's search and inline jobs share it)."""
    from poslab.pretrained.model import load

    return load(path, dtype=dtype, device=device)


# The standard passkey prompt (Mohtashami & Jaggi 2023), as used by PI, YaRN and LongRoPE.
PASSKEY_TASK = ("There is an important info hidden inside a lot of irrelevant text. Find it and memorize it. "
                "I will quiz you about the important information there.")
PASSKEY_FILLER = " The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
PASSKEY_NEEDLE = " The pass key is {key}. Remember it. {key} is the pass key."
PASSKEY_QUESTION = " What is the pass key? The pass key is"


def passkey_prompt(model, L: int, depth: float, key: str) -> torch.Tensor | None:
    """Token ids of a prompt of at most L tokens (filler repeated to fill it), needle at ``depth``;
    None when the needle and the question alone are longer than L."""
    from poslab.pretrained.model import encode_text

    task, filler = encode_text(model, PASSKEY_TASK), encode_text(model, PASSKEY_FILLER)
    needle, question = encode_text(model, PASSKEY_NEEDLE.format(key=key)), encode_text(model, PASSKEY_QUESTION)
    if len(task) + len(needle) + len(question) > L:
        task = task[:0]  # a window too short for the preamble: needle and question only
    if len(needle) + len(question) > L:
        return None
    room = L - len(task) - len(needle) - len(question)
    n_fill = max(room // len(filler), 0)
    before = int(round(depth * n_fill))
    parts = [task, filler.repeat(before), needle, filler.repeat(n_fill - before), question]
    return torch.cat(parts)
