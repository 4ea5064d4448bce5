"""What a study may ask of a checkpoint, checked before any work, and parity as a verdict.

    require_capable(config, needs, field, value)  by model type, from the config alone (no weights read)
    preflight(model, needs, field, value)         one short forward of the loaded checkpoint: it runs, with
                                                  finite logits; "record": poslab's recording attention ran
                                                  at every layer, each pattern row sums to 1 over the keys
                                                  it may see; "schedule": poslab's rotary runs in the
                                                  checkpoint's place and gives its logits (within tolerance)
    parity_tolerance(L), parity_verdict(row)      ``inspect --parity``'s threshold and verdict

A study needs one or both of (``NEEDS``):

    record     record attention: collect / stream through poslab's attention function, registered under
               transformers' attention interface (the records that can "record", architectures.py)
    schedule   replace the checkpoint's rotary with poslab's, to apply a schedule (those that can "replace")

A model type whose record does not allow it is refused by name before any weights are read. The forward is the
backstop for a checkpoint that passes the list but not the code: one whose attention does not call
transformers' attention interface would otherwise leave every recorded pattern empty, and a study
would store zeros as a finished member.

Parity tolerance. poslab's frequencies are within 2 ulp of transformers' (tests/pretrained/
test_rotary_parity.py) and its cos/sin equal to the bit given the same frequencies, so what is left
is float32 rounding, which scales with the logits: the measure is max |Δ logit| / max |logit|. The
threshold is max(1e-5, L × 2^-23) at L tokens. 1e-5 is 84 float32 epsilons (2^-23); measured
ratios sit well below it (docs/pretrained.md: at most 8.0e-7 on the tiny ``PARITY_KINDS``
checkpoints, 1.3e-6 to 2.2e-6 on SmolLM2-135M at 16 and 48 tokens). The L × 2^-23 term is the
float32 rounding of the angle p θ itself (θ <= 1, p < L: up to L × 2^-24 radians, doubled), which
both implementations carry and which grows with the position; it passes 1e-5 from L = 84 on. A
schedule that is not the checkpoint's own is off by orders of magnitude more.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from poslab.errors import ConfigError
from poslab.pretrained.architectures import find, model_types
from poslab.pretrained.model import PretrainedLM
from poslab.tasks.base import Batch

NEEDS = {  # what a study asks -> (the record's capability, what it is, what poslab cannot do otherwise)
    "record": ("record", "a model type whose attention poslab records", "record the attention of"),
    "schedule": ("replace", "a model type whose rotary poslab replaces faithfully",
                 "replace the rotary (to apply a schedule) of"),
}
PARITY_RELATIVE = 1e-5  # max |Δ logit| / max |logit| at short lengths (see the module docstring)
ANGLE_ULP = 2.0 ** -23  # float32's unit roundoff, doubled: the angle's rounding per position
ROW_SUM_TOL = 1e-4  # a pattern row's sum over the keys it may see, float32, against 1
PREFLIGHT_TOKENS = 8  # tokens of the preflight forward (two sequences)


def require_capable(config: dict, needs: Iterable[str], field: str = "--model", value=None) -> None:
    """ConfigError naming the model type and what poslab cannot do with it, for the first of ``needs``
    its type is not tested for (read off the config: no weights)."""
    model_type = str(config.get("model_type", ""))
    for need in needs:
        capability, allowed, cannot = NEEDS[need]
        types = model_types(capability)
        if model_type not in types:
            arch = find(model_type)
            why = f": {arch.why_not}" if arch is not None and arch.why_not else ""
            raise ConfigError(field, value if value is not None else model_type,
                              f"{allowed} ({', '.join(types)}); poslab cannot {cannot} this {model_type!r} model"
                              f"{why}")


@torch.no_grad()
def preflight(model: PretrainedLM, needs: Iterable[str] = (), field: str = "--model", value=None, *,
              compare: bool = True) -> None:
    """One short forward of two random sequences: ConfigError unless it runs with finite logits,
    and for ``needs`` "record" unless the recording ran as it must, for "schedule" unless poslab's
    rotary runs in the checkpoint's place and (``compare``; ``inspect --parity`` measures it instead)
    gives its logits (:func:`parity_tolerance`)."""
    needs = set(needs)
    value = value if value is not None else model.source.name if model.source is not None else "model"
    kind = f"this {getattr(model.config, 'model_type', '?')!r} model"
    n = max(2, min(PREFLIGHT_TOKENS, model.context or PREFLIGHT_TOKENS))
    rows = model.hf.get_input_embeddings().weight.shape[0]
    device = next(model.hf.parameters()).device
    x = torch.randint(0, rows, (2, n), generator=torch.Generator().manual_seed(0)).to(device)
    own = run_checked(lambda: model(x), field, value,
                      f"a checkpoint whose forward transformers can run ({kind}'s fails")
    if not torch.isfinite(own).all():
        raise ConfigError(field, value, f"a checkpoint with finite logits ({kind} gives NaN or inf on {n} tokens)")
    if "record" in needs:
        check_recording(model, x, field, value)
    if "schedule" in needs:
        model.set_schedule(None)
        try:
            ours = run_checked(lambda: model(x), field, value,
                        f"a checkpoint whose rotary poslab can replace (with poslab's in its place {kind} fails")
        finally:
            model.restore()
        ratio = float((ours - own).abs().max() / own.abs().max().clamp_min(1e-30))
        if compare and not ratio <= parity_tolerance(n):
            raise ConfigError(field, value, f"a checkpoint whose rotary poslab reproduces (under its own schedule "
                                            f"poslab's rotary gives max |d logit| / max |logit| = {ratio:.1e} > "
                                            f"{parity_tolerance(n):.0e} on {kind}; see poslab inspect --parity)")


def check_recording(model: PretrainedLM, x: torch.Tensor, field: str = "--model", value=None) -> None:
    """ConfigError unless poslab's recording attention handed over a pattern at every layer, each row
    >= 0, 0 on keys later than its query, and summing to 1 over the keys it may see."""
    seen: dict[int, torch.Tensor] = {}
    kind = f"this {getattr(model.config, 'model_type', '?')!r} model"
    batch = Batch(tokens=x, targets=x, loss_mask=torch.ones_like(x, dtype=torch.bool),
                  lengths=torch.full((x.shape[0],), x.shape[1], device=x.device))
    run_checked(lambda: model.stream(batch, lambda i, scores, pattern: seen.__setitem__(i, pattern.float())),
         field, value, f"a checkpoint whose attention poslab can record ({kind} fails under the recording")
    missing = [i for i in range(model.n_layers) if i not in seen]
    if missing:
        layers = ", ".join(map(str, missing[:6])) + (" ..." if len(missing) > 6 else "")
        raise ConfigError(field, value, f"a checkpoint whose attention poslab can record ({kind}'s attention did not "
                                        f"pass through poslab's recording attention at layers {layers} of "
                                        f"{model.n_layers}: it does not call transformers' attention interface)")
    s = x.shape[1]
    later = torch.ones(s, s, dtype=torch.bool, device=x.device).triu(1)  # keys j > i: never seen
    for i, pattern in sorted(seen.items()):
        sums = pattern.sum(-1)
        bad = (not torch.isfinite(pattern).all() or bool((pattern < 0).any())
               or bool(pattern[..., later].abs().max() > 0) or float((sums - 1).abs().max()) > ROW_SUM_TOL)
        if bad:
            raise ConfigError(field, value, f"a checkpoint whose attention poslab records as a softmax over the keys "
                                            f"each query may see ({kind}'s recorded pattern at layer {i} is not: row "
                                            f"sums {float(sums.min()):.3g} .. {float(sums.max()):.3g})")


def run_checked(fn, field: str, value, allowed: str):
    """``fn()``, an exception from the checkpoint's code turned into one ConfigError line."""
    try:
        return fn()
    except ConfigError:
        raise
    except Exception as e:  # noqa: BLE001 — whatever the checkpoint's modules raise, said in one line
        first = (str(e).splitlines() or [""])[0][:160]
        raise ConfigError(field, value, f"{allowed}: {type(e).__name__}: {first})") from None


def parity_tolerance(length: int) -> float:
    """The largest max |Δ logit| / max |logit| that passes at ``length`` tokens (module docstring)."""
    return max(PARITY_RELATIVE, length * ANGLE_ULP)


def parity_verdict(row: dict) -> dict:
    """A :func:`~poslab.pretrained.model.parity` row with its relative measures (forward and collect),
    the tolerance at its length and ``pass`` (both within it)."""
    scale = max(row["logit_scale"], 1e-30)
    out = dict(row, forward_relative=row["forward"] / scale, collect_relative=row["collect"] / scale,
               tolerance=parity_tolerance(row["length"]))
    out["pass"] = bool(out["forward_relative"] <= out["tolerance"] and out["collect_relative"] <= out["tolerance"])
    return out
