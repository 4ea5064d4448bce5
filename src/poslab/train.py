"""The ensemble trainer: many members (seeds, and configs of one parameter shape) in one pass.

Members' parameters are stacked along a leading member axis (``torch.func.stack_module_state``)
and one ``vmap``-ed loss is summed over members, so one backward and one optimizer step train
all of them. Adam and AdamW act element-wise, so this is exactly independent training of each
member; everything global — gradient clipping, divergence checks — is done per member. A member
whose loss turns NaN/inf is frozen where it stands and recorded as diverged; the others go on.

The trainer knows nothing of models or tasks beyond two contracts: batches come from the task
(``sample_steps``, a chunk of steps per call, falling back to ``task.sample`` once per step),
and every model has ``model.loss(batch)``, the mean cross-entropy over the batch's loss mask
(one target per sequence for retrieval, one per position for shift and language modelling).

Seed ``s`` initialises its model after ``torch.manual_seed(s)`` and draws its batches from its
own generator seeded with ``s``, so it sees the same weights and data alone or in an ensemble.

Learning rate (``lr_schedule``): ``"constant"``, or ``"cosine"``: linear warm-up over
``warmup_steps`` (lr (t + 1) / (warmup + 1) at step t), then cosine decay to ``min_lr`` at the
last step, as nanoGPT schedules it. ``weight_decay`` is decoupled under ``optimizer="adamw"``
(w -= lr wd w beside the Adam step) and a coupled L2 penalty under ``optimizer="adam"`` (wd w
added to the gradient before Adam's moments, torch's ``Adam(weight_decay=)``: Adam's
normalisation then moves a parameter with no loss gradient by about lr per step, whatever wd);
with ``decay_1d=False`` biases and LayerNorm parameters are exempt from it (nanoGPT's choice).

Training lengths (``length_sampling``):
- ``"batch"`` (default): one length per step, uniform in [min_length, max_length], as in the
  randomized-positions protocol of Ruoss et al. (2023). A RetrievalHead then needs only the m
  queries at that length's last position, which makes the grid fast path cheap;
- ``"sequence"``: one length per sequence, right-padded.

Padding (``crop_padding``): batches of one task stack into chunks of one width, the longest a
training length can take (41 tokens for Ruoss et al.'s tasks at L <= 40), even when a step's
sequences are all shorter (one length per batch). With ``crop_padding`` each step is cut to its
own longest sequence (across members, in an ensemble) when the model says its loss does not read
the positions past every sequence's length (``model.padding_inert``: the Transformer without
randomized positions, dropout or a length-dependent encoding).

Evaluation (:func:`evaluate_loss`) runs in chunks of sequences, so memory is bounded by the
chunk, not by the evaluation set.

Notation: e member, b batch, s position, T longest training length.
"""

from __future__ import annotations

import copy
import math
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np
import torch
from torch import Tensor, nn
from torch.func import functional_call, stack_module_state, vmap
from tqdm.auto import tqdm

from poslab.errors import ConfigError, check_choice
from poslab.models.loss import aligned_logits, masked_cross_entropy
from poslab.tasks.base import PER, Batch, Task, sample_steps

OPTIMIZERS = ("adam", "adamw")
LR_SCHEDULES = ("constant", "cosine")


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    steps: int = 4000
    batch_size: int = 256
    lr: float = 1e-3
    optimizer: str = "adam"  # "adam" | "adamw"
    betas: tuple[float, ...] = (0.9, 0.999)  # Adam's (beta1, beta2)
    weight_decay: float = 0.0  # adamw: decoupled decay; adam: coupled L2 in the gradient (Fig. 4: 0, 1e-4, 1e-2)
    decay_1d: bool = True  # False: biases and LayerNorm parameters get no weight decay (nanoGPT)
    lr_schedule: str = "constant"  # "constant" | "cosine" (warm-up, then cosine to min_lr)
    warmup_steps: int = 0  # linear warm-up steps of the cosine schedule
    min_lr: float = 0.0  # the cosine schedule's floor
    min_length: int = 8  # L_min
    max_length: int = 16  # L_max
    length_sampling: str = "batch"  # "batch" | "sequence", see the module docstring
    grad_clip: float | None = None  # per-member global norm; None = off
    snapshot_steps: tuple[int, ...] = ()  # steps after which every member's weights are kept
    # parameter groups of their own: ({"match": [name substrings], "lr": peak lr, "weight_decay": wd}, ...);
    # a parameter joins the first group one of whose substrings its name contains (see _optimizer)
    param_groups: tuple[dict, ...] = ()
    chunk: int = 50  # steps of data drawn per generator call
    # torch.compile the loss (forward and backward); eager where compiling fails. Float rounding
    # differs from eager (tests/test_train.py), so it is part of a run's key when on
    compile: bool = False
    # cut each step's batch to its longest sequence (positions past every sequence's length are padding),
    # where the model's loss does not read them (its ``padding_inert``). Equal to the padded batch's loss
    # and gradients up to float rounding (tests/test_train.py), so part of a run's key when on
    crop_padding: bool = False

    def validate(self) -> None:
        check_choice("optimizer", self.optimizer, OPTIMIZERS)
        check_choice("length_sampling", self.length_sampling, PER)
        check_choice("lr_schedule", self.lr_schedule, LR_SCHEDULES)
        if not 1 <= self.min_length <= self.max_length:
            raise ConfigError("min_length", self.min_length, f"an integer in [1, max_length={self.max_length}]")
        for name in ("steps", "batch_size", "chunk"):
            if getattr(self, name) < 1:
                raise ConfigError(name, getattr(self, name), "a positive integer")
        self._validate_schedule()
        if len(self.betas) != 2 or not all(0 <= b < 1 for b in self.betas):
            raise ConfigError("betas", self.betas, "two numbers in [0, 1)")
        if self.grad_clip is not None and not self.grad_clip > 0:
            raise ConfigError("grad_clip", self.grad_clip, "a positive number or null")
        for group in self.param_groups:
            _check_group(group)

    def _validate_schedule(self) -> None:
        """lr > 0, min_lr in [0, lr], weight_decay >= 0, warmup_steps in [0, steps)."""
        if not self.lr > 0:
            raise ConfigError("lr", self.lr, "a positive number")
        if not (0 <= self.min_lr <= self.lr):
            raise ConfigError("min_lr", self.min_lr, f"a number in [0, lr={self.lr}]")
        if not (self.weight_decay >= 0):
            raise ConfigError("weight_decay", self.weight_decay, "a number >= 0")
        if not (0 <= self.warmup_steps < self.steps):
            raise ConfigError("warmup_steps", self.warmup_steps, f"an integer in [0, steps={self.steps})")

    def lr_at(self, step: int) -> float:
        """The learning rate of step ``step`` (0-based)."""
        if self.lr_schedule == "constant":
            return self.lr
        if step < self.warmup_steps:
            return self.lr * (step + 1) / (self.warmup_steps + 1)
        ratio = (step - self.warmup_steps) / max(1, self.steps - 1 - self.warmup_steps)
        return self.min_lr + 0.5 * (1 + math.cos(math.pi * min(ratio, 1.0))) * (self.lr - self.min_lr)


@dataclass
class TrainResult:
    models: list[nn.Module]  # one trained model per member, in member order
    loss_curve: np.ndarray  # [steps, e] training loss per step
    diverged_at: list[int | None]  # step at which a member diverged, None if it did not
    snapshots: dict[int, list[dict[str, Tensor]]] = field(default_factory=dict)  # step -> state dicts
    seconds: float = 0.0
    step_ends: np.ndarray | None = None  # [steps] seconds from the first step's start to each step's end


class PhaseTimer:
    """Wall seconds per named phase, summed over ``perf_counter`` spans: ``with timer("forward"): ...``.

    Spans may not nest (a span opened inside another raises), so no second is counted twice and
    the phases of one process sum to at most its wall time. ``sync`` runs before each clock read:
    on a GPU pass ``torch.cuda.synchronize``, or a span ends before the kernels it launched do.
    The timer reads the clock only; it touches no tensor, generator or order of operations, so a
    timed run computes bit for bit what an untimed one does (tests/test_train.py)."""

    def __init__(self, sync: Callable[[], None] | None = None):
        self.seconds: dict[str, float] = {}
        self.sync = sync
        self._open: str | None = None

    @contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        if self._open is not None:
            raise RuntimeError(f"phase {phase!r} opened inside {self._open!r}: spans may not nest")
        self._open = phase
        if self.sync is not None:
            self.sync()
        start = time.perf_counter()
        try:
            yield
        finally:
            if self.sync is not None:
                self.sync()
            self.seconds[phase] = self.seconds.get(phase, 0.0) + time.perf_counter() - start
            self._open = None


_UNTIMED = nullcontext()


def spans(timer: PhaseTimer | None) -> Callable[[str], AbstractContextManager]:
    """``timer`` itself, or a stand-in whose spans time nothing."""
    return timer if timer is not None else (lambda phase: _UNTIMED)


class DataStream:
    """Seed ``s``'s batches for one task, drawn ``chunk`` steps at a time from its generator.

    ``draw()`` returns the next chunk as one :class:`Batch` whose tensors have a leading
    [n] step axis; ``next()`` hands out one step of it at a time.
    """

    def __init__(self, task: Task, seed: int, cfg: TrainConfig):
        self.task, self.cfg = task, cfg
        self.generator = torch.Generator().manual_seed(seed)
        self._chunk: Batch | None = None
        self._i = 0

    def draw(self) -> Batch:
        cfg = self.cfg
        return sample_steps(self.task, self.generator, cfg.chunk, cfg.batch_size, (cfg.min_length, cfg.max_length),
                            cfg.length_sampling)

    def next(self) -> Batch:
        if self._chunk is None or self._i == self.cfg.chunk:
            self._chunk, self._i = self.draw(), 0
        i = self._i
        self._i += 1
        return self._chunk.map(lambda x: x[i])


def ensemble_batches(streams: list[DataStream], device, crop: bool = False) -> Iterator[Batch]:
    """Every member's next batch, stacked along the member axis: tensors [e, b, ...].

    Stacks and moves once per chunk, then hands out views; with ``crop`` each cut to its step's
    longest sequence over every member (:func:`cropped`)."""
    while True:
        parts = [st.draw() for st in streams]
        width = max(p.tokens.shape[-1] for p in parts)  # members' tasks may pad to different widths
        parts = [_pad_steps(p, width) for p in parts]
        if any(p.loss_weight is not None for p in parts):  # members without weights weigh every target 1
            for p in parts:
                if p.loss_weight is None:
                    p.loss_weight = torch.ones(p.targets.shape)
        fields: dict[str, Any] = {k: None if getattr(parts[0], k) is None else
                                  torch.stack([getattr(p, k) for p in parts], dim=1).to(device)
                                  for k in Batch.TENSORS}
        chunk = Batch(**fields,
                      n_queries=max((p.n_queries or 0) for p in parts) or None)
        widths = chunk.lengths.flatten(1).amax(1).tolist() if crop else None  # [n] each step's longest
        for i in range(streams[0].cfg.chunk):
            step = chunk.map(lambda x, i=i: x[i])
            yield step if widths is None else cropped(step, widths[i])


def cropped(batch: Batch, width: int) -> Batch:
    """``batch`` (tokens [..., s]) cut to its first ``width`` positions, which must hold every
    sequence (``width`` >= every length): positions past a sequence's length are padding, with no
    target in the loss mask. Views, no copy."""
    s = batch.tokens.shape[-1]
    if width >= s:
        return batch
    per_position = batch.targets.dim() == batch.tokens.dim()

    def cut(x: Tensor | None) -> Tensor | None:
        return x[..., :width] if x is not None and per_position else x
    return Batch(tokens=batch.tokens[..., :width], targets=cast(Tensor, cut(batch.targets)),
                 loss_mask=cast(Tensor, cut(batch.loss_mask)), lengths=batch.lengths, first_query=batch.first_query,
                 n_queries=batch.n_queries, loss_weight=cut(batch.loss_weight),
                 positions=None if batch.positions is None else batch.positions[..., :width])


def crops(model: nn.Module, cfg: TrainConfig) -> bool:
    """Whether training ``model`` under ``cfg`` cuts each batch to its longest sequence."""
    return cfg.crop_padding and bool(getattr(model, "padding_inert", False))


def _pad_steps(chunk: Batch, width: int) -> Batch:
    """A chunk of steps [n, b, s] right-padded to ``width`` positions (tokens 0, per-position targets
    0 and mask False), so that members whose tasks pad to different widths stack into one ensemble."""
    extra = width - chunk.tokens.shape[-1]
    if extra == 0:
        return chunk
    per_position = chunk.targets.dim() == chunk.tokens.dim()

    def pad(x: Tensor, value) -> Tensor:
        return torch.nn.functional.pad(x, (0, extra), value=value) if per_position or x is chunk.tokens else x
    weight = chunk.loss_weight
    return Batch(tokens=pad(chunk.tokens, 0), lengths=chunk.lengths, first_query=chunk.first_query,
                 n_queries=chunk.n_queries, targets=pad(chunk.targets, 0), loss_mask=pad(chunk.loss_mask, False),
                 loss_weight=None if weight is None else pad(weight, 0.0),
                 positions=None if chunk.positions is None else torch.nn.functional.pad(chunk.positions, (0, extra)))


def build_member(make_model, seed: int) -> nn.Module:
    """A member's initial model: the same weights whether it trains alone or in an ensemble."""
    torch.manual_seed(seed)
    return make_model()


def _optimizer(params: dict[str, Tensor], cfg: TrainConfig, fused: bool = False,
               member_axis: bool = False) -> torch.optim.Optimizer:
    """Adam or AdamW over ``params`` (name -> tensor); fused: one kernel per step for all
    stacked tensors, element-wise, so still per member. With ``decay_1d=False`` the tensors of
    one dimension per member (biases, LayerNorm) form a group without weight decay. The
    ``param_groups`` of ``cfg`` come first, each with its own peak lr (scaled by the schedule
    like the rest) and weight decay; a group that matches no parameter is an error."""
    own, params = _own_groups(params, cfg)
    skip = 1 + int(member_axis)  # stacked members carry a leading axis
    decay = [p for p in params.values() if cfg.decay_1d or p.dim() > skip]
    plain = [p for p in params.values() if not (cfg.decay_1d or p.dim() > skip)]
    groups = own + [dict(params=decay, weight_decay=cfg.weight_decay, lr_scale=1.0)]
    if plain:
        groups.append(dict(params=plain, weight_decay=0.0, lr_scale=1.0))
    adam = torch.optim.Adam if cfg.optimizer == "adam" else torch.optim.AdamW  # Adam: weight_decay is coupled L2
    return adam(groups, lr=cfg.lr, betas=(cfg.betas[0], cfg.betas[1]), fused=fused)  # two: validated


GROUP_KEYS = ("match", "lr", "weight_decay")  # the keys of one train.param_groups entry


def _check_group(group) -> None:
    if not isinstance(group, dict) or set(group) - set(GROUP_KEYS) or "match" not in group:
        raise ConfigError("train.param_groups", group, f"objects with keys {list(GROUP_KEYS)} ('match' required)")
    match = group["match"]
    if isinstance(match, str):
        match = [match]
    if not (isinstance(match, (list, tuple)) and match and all(isinstance(m, str) and m for m in match)):
        raise ConfigError("train.param_groups.match", group["match"], "a parameter-name substring or a list of them")
    for key in ("lr", "weight_decay"):
        v = group.get(key, 1.0)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not (v > 0 if key == "lr" else v >= 0):
            raise ConfigError(f"train.param_groups.{key}", v, "a number > 0" if key == "lr" else "a number >= 0")


def group_names(names, cfg: TrainConfig, strict: bool = False) -> list[list[str]]:
    """The parameter names each of ``cfg.param_groups`` takes (first matching group wins). A group
    may take none (a RoPE member of a study whose groups name MoPE's parameters); ``strict``
    refuses that (a study's check calls it on the model the groups are for, before any work)."""
    taken: set[str] = set()
    out = []
    for group in cfg.param_groups:
        match = [group["match"]] if isinstance(group["match"], str) else list(group["match"])
        mine = [n for n in names if n not in taken and any(m in n for m in match)]
        if strict and not mine:
            raise ConfigError("train.param_groups.match", group["match"],
                              f"substrings of parameter names: {list(names)}")
        taken.update(mine)
        out.append(mine)
    return out


def _own_groups(params: dict[str, Tensor], cfg: TrainConfig) -> tuple[list[dict], dict[str, Tensor]]:
    """(the optimizer groups of ``cfg.param_groups``, the parameters left for the default groups)."""
    own, rest = [], dict(params)
    for group, names in zip(cfg.param_groups, group_names(list(params), cfg), strict=True):
        if not names:
            continue
        lr = float(group.get("lr", cfg.lr))
        own.append(dict(params=[rest.pop(n) for n in names], lr=lr, lr_scale=lr / cfg.lr,
                        weight_decay=float(group.get("weight_decay", 0.0))))
    return own, rest


def _set_lr(opt: torch.optim.Optimizer, cfg: TrainConfig, step: int) -> None:
    if cfg.lr_schedule != "constant":
        for group in opt.param_groups:
            group["lr"] = cfg.lr_at(step) * group.get("lr_scale", 1.0)


def train_ensemble(make_model, tasks: list[Task], seeds: list[int], cfg: TrainConfig, *,
                   device: str | torch.device = "cpu", progress: bool = True, desc: str = "train",
                   position: int = 0, timer: PhaseTimer | None = None) -> TrainResult:
    """Train one member per (task, seed) pair; every member's model comes from ``make_model()``.

    ``make_model`` must build models of one parameter shape and one forward (it is called after
    seeding); the model provides ``loss(batch)`` for one member. Tasks may differ per member
    (another offset K, say) as long as their batches have one shape. ``timer`` (``poslab bench
    profile``) adds the time of each step's phases to its own: ``setup`` (models, optimizer),
    ``sampling``, ``forward`` (with the divergence check), ``backward``, ``optimizer`` (clipping,
    frozen members); the loss curve, snapshots and progress bar are left to the caller's "other".
    """
    cfg.validate()
    if len(tasks) != len(seeds):
        raise ValueError("one task per seed")
    span = spans(timer)
    with span("setup"):
        models, params, buffers = _stack_members(make_model, seeds, device)
        template = _LossOf(copy.deepcopy(models[0]).to("meta"))
        opt = _optimizer(params, cfg, fused=device_fused(device), member_axis=True)
    hint: dict[str, int | None] = {"n_queries": None}  # the batches' query hint: a Python int, one for every member
    losses_fn = _member_losses(template, buffers, hint, len(seeds), cfg.compile)
    streams = [DataStream(t, s, cfg) for t, s in zip(tasks, seeds, strict=True)]
    E = len(seeds)
    members = _Survivors(torch.ones(E, dtype=torch.bool, device=device), [None] * E)
    curve = np.zeros((cfg.steps, E), dtype=np.float32)
    step_ends = np.zeros(cfg.steps)
    snapshots: dict[int, list[dict[str, Tensor]]] = {}
    start = time.perf_counter()
    bar = tqdm(range(1, cfg.steps + 1), desc=desc, disable=not progress, unit="step", leave=False, position=position)
    batches = ensemble_batches(streams, device, crop=crops(models[0], cfg))
    for step in bar:
        with span("sampling"):
            batch = next(batches)  # tensors [e, b, ...]
        hint["n_queries"] = batch.n_queries
        tensors = {k: getattr(batch, k) for k in Batch.TENSORS if getattr(batch, k) is not None}
        with span("forward"):
            losses = losses_fn(params, tensors)  # [e]
            members.check(losses, params, step)
        with span("backward"):
            opt.zero_grad(set_to_none=True)
            torch.where(members.alive, losses, torch.zeros_like(losses)).sum().backward()
        with span("optimizer"):
            _optimizer_step(opt, cfg, step, params)
            members.restore(params)
        curve[step - 1] = losses.detach().cpu().numpy()
        step_ends[step - 1] = time.perf_counter() - start
        if step in cfg.snapshot_steps:
            snapshots[step] = [{k: v[e].detach().cpu().clone() for k, v in params.items()} for e in range(E)]
        if progress and (step % 25 == 0 or step == cfg.steps):
            _show_progress(bar, curve[step - 1][members.alive.cpu().numpy()],
                           step * cfg.batch_size * batch.tokens.shape[-1] * E, start)
    bar.close()
    seconds = time.perf_counter() - start
    return TrainResult(models=_unstack(models, params), loss_curve=curve, diverged_at=members.diverged_at,
                       snapshots=snapshots, seconds=seconds, step_ends=step_ends)


def _stack_members(make_model, seeds: list[int], device) -> tuple[list[nn.Module], dict[str, Tensor],
                                                                  dict[str, Tensor]]:
    """One model per seed, and their parameters stacked ([e, ...], trainable) and buffers (shared)."""
    models = [build_member(make_model, s).to(device) for s in seeds]
    params, buffers = stack_module_state(models)  # name -> [e, ...]
    params = {k: v.detach().clone().requires_grad_(True) for k, v in params.items()}
    buffers = {k: v[0] for k, v in buffers.items()}  # identical across members: shared, not mapped
    return models, params, buffers


def _member_losses(template: nn.Module, buffers: dict[str, Tensor], hint: dict[str, int | None], members: int,
                   compile: bool) -> Callable:
    """Every member's loss, [e], from stacked parameters and batch tensors ([e, ...]); ``hint`` holds
    the current batch's ``n_queries``."""
    def member_loss(p, tensors):
        state = {f"model.{k}": v for k, v in (p | buffers).items()}
        return functional_call(template, state, (Batch(**tensors, n_queries=hint["n_queries"]),))

    losses_fn = vmap(member_loss, randomness="different")  # dropout, if a model has it, differs per member
    if members == 1:  # one member: the same call without vmap, whose batching costs ~15-25% (poslab bench lm)
        def losses_fn(p, tensors):
            return member_loss({k: v[0] for k, v in p.items()}, {k: v[0] for k, v in tensors.items()})[None]
    if compile:
        losses_fn = compiled(losses_fn)
    return losses_fn


@dataclass
class _Survivors:
    """Which members still train (``alive``, [e] bool), the step each diverged at, and the weights
    they diverged with (``frozen``: every member's, copied at the last divergence)."""

    alive: Tensor
    diverged_at: list[int | None]
    frozen: dict[str, Tensor] = field(default_factory=dict)

    def check(self, losses: Tensor, params: dict[str, Tensor], step: int) -> None:
        """Mark the members whose loss is no longer finite as diverged at ``step``."""
        finite = torch.isfinite(losses)
        if not bool(finite[self.alive].all()):
            for e in (~finite & self.alive).nonzero().flatten().tolist():
                self.diverged_at[e] = step
            self.alive = self.alive & finite
            self.frozen = {k: v.detach().clone() for k, v in params.items()}

    def restore(self, params: dict[str, Tensor]) -> None:
        """Frozen members keep the weights they diverged with."""
        if not bool(self.alive.all()):
            with torch.no_grad():
                for k, v in params.items():
                    v[~self.alive] = self.frozen[k][~self.alive]


def _optimizer_step(opt: torch.optim.Optimizer, cfg: TrainConfig, step: int, params: dict[str, Tensor]) -> None:
    """Step ``step``'s learning rate, per-member clipping, and the optimizer's step."""
    _set_lr(opt, cfg, step - 1)
    if cfg.grad_clip is not None:
        _clip_per_member(params, cfg.grad_clip)
    opt.step()


def _show_progress(bar, live: np.ndarray, tokens: int, start: float) -> None:
    """The live members' loss range and the tokens a second so far (``tokens`` since ``start``)."""
    if live.size:
        tokens_per_s = tokens / (time.perf_counter() - start)
        bar.set_postfix_str(f"loss {live.min():.3f}-{live.max():.3f}, {tokens_per_s:,.0f} tok/s")


def _unstack(models: list[nn.Module], params: dict[str, Tensor]) -> list[nn.Module]:
    """Each member's model with its trained weights."""
    trained = []
    for e, model in enumerate(models):
        model.load_state_dict({k: v[e].detach() for k, v in params.items()}, strict=False)
        trained.append(model)
    return trained


def compiled(fn: Callable) -> Callable:
    """``fn`` under ``torch.compile``, or ``fn`` itself once compiling fails (no C++ compiler, an
    op the compiler does not take): a warning says so and training goes on eagerly. ``fn`` must
    be pure (a loss), so a failed compiled call leaves nothing behind and is simply rerun."""
    try:
        fast = torch.compile(fn)
    except Exception as e:  # torch.compile itself refuses (an unsupported Python, say)
        warnings.warn(f"train.compile: torch.compile is unavailable ({type(e).__name__}: {e}); training eagerly",
                      stacklevel=2)
        return fn
    use = [fast]

    def call(*args):
        if use[0] is fast:
            try:
                return fast(*args)
            except Exception as e:
                warnings.warn(f"train.compile: compiling the loss failed ({type(e).__name__}: "
                              f"{str(e).splitlines()[0] if str(e) else ''}); training eagerly", stacklevel=2)
                use[0] = fn
        return use[0](*args)

    return call


class _LossOf(nn.Module):
    """Makes a model's ``loss`` its forward, so ``functional_call`` can map it over members."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, *args):
        return self.model.loss(*args)


def _clip_per_member(params: dict[str, Tensor], max_norm: float) -> None:
    """Scale each member's gradients to a global norm of at most ``max_norm``."""
    grads = [p.grad for p in params.values() if p.grad is not None]
    sq = cast(Tensor, sum(g.pow(2).flatten(1).sum(1) for g in grads))  # [e]
    scale = (max_norm / (sq.sqrt() + 1e-6)).clamp(max=1.0)
    for g in grads:
        g.mul_(scale.view(-1, *([1] * (g.dim() - 1))))


def device_fused(device) -> bool:
    """Fused Adam kernels exist for CPU and CUDA tensors."""
    return torch.device(device).type in ("cpu", "cuda")


def train_plain(make_model, task: Task, seed: int, cfg: TrainConfig, *, steps: int | None = None,
                device: str | torch.device = "cpu") -> tuple[nn.Module, list[float]]:
    """The baseline: one model, a plain PyTorch loop over its direct forward, the same data."""
    cfg.validate()
    model = build_member(make_model, seed).to(device)
    opt = _optimizer(dict(model.named_parameters()), cfg)
    stream = DataStream(task, seed, cfg)
    crop = crops(model, cfg)
    losses = []
    for step in range(steps or cfg.steps):
        batch = stream.next().to(device)
        if crop:
            batch = cropped(batch, int(batch.lengths.max()))
        loss = masked_cross_entropy(model(batch.tokens, lengths=batch.lengths), batch)
        opt.zero_grad(set_to_none=True)
        _set_lr(opt, cfg, step)
        loss.backward()
        if cfg.grad_clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        losses.append(loss.item())
    return model, losses


def lm_recipe(*, steps: int, batch_size: int, context: int, warmup_steps: int = 100, **changes) -> TrainConfig:
    """nanoGPT's shakespeare_char recipe: AdamW at lr 1e-3 (betas 0.9 / 0.99, weight decay 0.1 on
    matrices only), ``warmup_steps`` of linear warm-up then cosine to 1e-4, gradient clip 1.0, every
    window ``context`` tokens long; ``changes`` replace any other TrainConfig field."""
    fields = dict(steps=steps, batch_size=batch_size, lr=1e-3, optimizer="adamw", betas=(0.9, 0.99),
                  weight_decay=0.1, decay_1d=False, lr_schedule="cosine", warmup_steps=warmup_steps, min_lr=1e-4,
                  min_length=context, max_length=context, grad_clip=1.0)
    return TrainConfig(**{**fields, **changes})

def evaluate_loss(model: nn.Module, batches, *, chunk: int = 256) -> dict:
    """Mean loss and accuracy over every masked target of ``batches`` (one Batch or an iterable),
    ``chunk`` sequences per forward, so memory is bounded by the chunk.

    Returns ``loss`` (mean cross-entropy per target), ``accuracy`` and ``targets`` (how many).
    """
    from poslab.probes.common import correct, split_batch

    if isinstance(batches, Batch):
        batches = [batches]
    device = next(model.parameters()).device
    total = hits = count = 0.0
    was_training = model.training
    model.eval()
    with torch.no_grad():
        for batch in batches:
            for part in split_batch(batch, chunk, device):
                logits = model(part.tokens, lengths=part.lengths)
                h, n = correct(aligned_logits(logits, part), part.targets, part.loss_mask)
                total += float(masked_cross_entropy(logits, part)) * n
                hits += h
                count += n
    model.train(was_training)
    return dict(loss=total / count if count else math.nan, accuracy=hits / count if count else math.nan,
                targets=int(count))
