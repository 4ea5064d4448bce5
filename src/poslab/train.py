"""The ensemble trainer: many members (seeds, and configs of one parameter shape) in one pass.

Members' parameters are stacked along a leading member axis (``torch.func.stack_module_state``)
and one ``vmap``-ed loss is summed over members, so one backward and one optimizer step train
all of them. Adam and AdamW act element-wise, so this is exactly independent training of each
member; everything global — gradient clipping, divergence checks — is done per member. A member
whose loss turns NaN/inf is frozen where it stands and recorded as diverged; the others go on.

Seed ``s`` initialises its model after ``torch.manual_seed(s)`` and draws its batches from its
own generator seeded with ``s``, so it sees the same weights and data alone or in an ensemble.

Training lengths (``length_sampling``):
- ``"batch"`` (default): one length per step, uniform in [min_length, max_length], as in the
  randomized-positions protocol of Ruoss et al. (2023). A RetrievalHead then needs only the m
  queries at that length's last position, which makes the grid fast path cheap;
- ``"sequence"``: one length per sequence, right-padded.

Notation: e member, b batch, s position, T longest training length.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor, nn
from torch.func import functional_call, stack_module_state, vmap
from tqdm.auto import tqdm

from poslab.errors import ConfigError, check_choice
from poslab.tasks import Task

OPTIMIZERS = ("adam", "adamw")
LENGTH_SAMPLING = ("batch", "sequence")


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    steps: int = 4000
    batch_size: int = 256
    lr: float = 1e-3
    optimizer: str = "adam"  # "adam" | "adamw"
    weight_decay: float = 0.0  # AdamW's decoupled decay (Fig. 4 control: 0, 1e-4, 1e-2)
    min_length: int = 8  # L_min
    max_length: int = 16  # L_max
    length_sampling: str = "batch"  # "batch" | "sequence", see the module docstring
    grad_clip: float | None = None  # per-member global norm; None = off
    snapshot_steps: tuple[int, ...] = ()  # steps after which every member's weights are kept
    chunk: int = 50  # steps of data drawn per generator call

    def validate(self) -> None:
        check_choice("optimizer", self.optimizer, OPTIMIZERS)
        check_choice("length_sampling", self.length_sampling, LENGTH_SAMPLING)
        if not 1 <= self.min_length <= self.max_length:
            raise ConfigError("min_length", self.min_length, f"an integer in [1, max_length={self.max_length}]")
        for name in ("steps", "batch_size", "chunk"):
            if getattr(self, name) < 1:
                raise ConfigError(name, getattr(self, name), "a positive integer")
        if not self.lr > 0:
            raise ConfigError("lr", self.lr, "a positive number")


@dataclass
class TrainResult:
    models: list[nn.Module]  # one trained model per member, in member order
    loss_curve: np.ndarray  # [steps, e] training loss per step
    diverged_at: list[int | None]  # step at which a member diverged, None if it did not
    snapshots: dict[int, list[dict[str, Tensor]]] = field(default_factory=dict)  # step -> state dicts
    seconds: float = 0.0


class DataStream:
    """Seed ``s``'s batches for one task, drawn ``chunk`` steps at a time from its generator.

    ``draw()`` returns the next chunk: tokens [n, b, T], targets [n, b], lengths [n, b] and the
    first query position of each step [n] (L - 1 under batch sampling, min_length - 1 under
    sequence sampling). ``next()`` hands out one step of it at a time.
    """

    def __init__(self, task: Task, seed: int, cfg: TrainConfig):
        self.task, self.cfg = task, cfg
        self.generator = torch.Generator().manual_seed(seed)
        self._chunk: tuple[Tensor, ...] | None = None
        self._i = 0

    def draw(self) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        cfg, g, n = self.cfg, self.generator, self.cfg.chunk
        b, lo, hi = cfg.batch_size, cfg.min_length, cfg.max_length
        tokens = torch.randint(0, self.task.vocab_size, (n * b, hi), generator=g)
        if cfg.length_sampling == "batch":
            q_start = torch.randint(lo, hi + 1, (n,), generator=g) - 1
            lengths = (q_start + 1).repeat_interleave(b)
        else:
            lengths = torch.randint(lo, hi + 1, (n * b,), generator=g)
            q_start = torch.full((n,), lo - 1)
        tokens = tokens.masked_fill(torch.arange(hi) >= lengths[:, None], 0)
        targets, _ = self.task.label(tokens, lengths)
        return tokens.view(n, b, hi), targets.view(n, b), lengths.view(n, b), q_start

    def next(self) -> tuple[Tensor, Tensor, Tensor, int]:
        if self._chunk is None or self._i == self.cfg.chunk:
            self._chunk, self._i = self.draw(), 0
        tokens, targets, lengths, q_start = (x[self._i] for x in self._chunk)
        self._i += 1
        return tokens, targets, lengths, int(q_start)


def ensemble_batches(streams: list[DataStream], device) -> Iterator[tuple[Tensor, Tensor, Tensor, Tensor]]:
    """Every member's next batch, stacked along the member axis: [e, b, T], [e, b], [e, b], [e].

    Stacks and moves once per chunk, then hands out views."""
    while True:
        chunk = [torch.stack(parts, dim=1).to(device) for parts in zip(*(st.draw() for st in streams))]
        for i in range(streams[0].cfg.chunk):
            yield tuple(x[i] for x in chunk)


def build_member(make_model, seed: int) -> nn.Module:
    """A member's initial model: the same weights whether it trains alone or in an ensemble."""
    torch.manual_seed(seed)
    return make_model()


def _optimizer(params: list[Tensor], cfg: TrainConfig, fused: bool = False) -> torch.optim.Optimizer:
    # fused: one kernel per step for all stacked tensors; element-wise, so still per member
    if cfg.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay, fused=fused)
    return torch.optim.Adam(params, lr=cfg.lr, fused=fused)


def train_ensemble(make_model, tasks: list[Task], seeds: list[int], cfg: TrainConfig, *,
                   device: str | torch.device = "cpu", progress: bool = True, desc: str = "train",
                   position: int = 0) -> TrainResult:
    """Train one member per (task, seed) pair; every member's model comes from ``make_model()``.

    ``make_model`` must build models of one parameter shape (it is called after seeding). The
    model provides ``loss(tokens, targets, lengths, q_start, n_query)`` for one member.
    """
    cfg.validate()
    if len(tasks) != len(seeds):
        raise ValueError("one task per seed")
    n_query = 1 if cfg.length_sampling == "batch" else cfg.max_length - cfg.min_length + 1
    models = [build_member(make_model, s).to(device) for s in seeds]
    params, buffers = stack_module_state(models)  # name -> [e, ...]
    params = {k: v.detach().clone().requires_grad_(True) for k, v in params.items()}
    buffers = {k: v[0] for k, v in buffers.items()}  # identical across members: shared, not mapped
    template = _LossOf(copy.deepcopy(models[0]).to("meta"))

    def member_loss(p, tokens, targets, lengths, q_start):
        state = {f"model.{k}": v for k, v in (p | buffers).items()}
        return functional_call(template, state, (tokens, targets, lengths, q_start, n_query))

    losses_fn = vmap(member_loss)
    opt = _optimizer(list(params.values()), cfg, fused=True)
    streams = [DataStream(t, s, cfg) for t, s in zip(tasks, seeds)]
    E = len(seeds)
    alive = torch.ones(E, dtype=torch.bool, device=device)
    frozen: dict[str, Tensor] = {}
    diverged_at: list[int | None] = [None] * E
    curve = np.zeros((cfg.steps, E), dtype=np.float32)
    snapshots: dict[int, list[dict[str, Tensor]]] = {}
    start = time.perf_counter()
    bar = tqdm(range(1, cfg.steps + 1), desc=desc, disable=not progress, unit="step", leave=False, position=position)
    batches = ensemble_batches(streams, device)
    for step in bar:
        tokens, targets, lengths, q_start = next(batches)  # [e, b, T], [e, b], [e, b], [e]
        losses = losses_fn(params, tokens, targets, lengths, q_start)  # [e]
        finite = torch.isfinite(losses)
        if not bool(finite[alive].all()):
            for e in (~finite & alive).nonzero().flatten().tolist():
                diverged_at[e] = step
            alive = alive & finite
            frozen = {k: v.detach().clone() for k, v in params.items()}
        opt.zero_grad(set_to_none=True)
        torch.where(alive, losses, torch.zeros_like(losses)).sum().backward()
        if cfg.grad_clip is not None:
            _clip_per_member(params, cfg.grad_clip)
        opt.step()
        if not bool(alive.all()):
            with torch.no_grad():  # frozen members keep the weights they diverged with
                for k, v in params.items():
                    v[~alive] = frozen[k][~alive]
        curve[step - 1] = losses.detach().cpu().numpy()
        if step in cfg.snapshot_steps:
            snapshots[step] = [{k: v[e].detach().cpu().clone() for k, v in params.items()} for e in range(E)]
        if progress and (step % 25 == 0 or step == cfg.steps):
            live = curve[step - 1][alive.cpu().numpy()]
            if live.size:
                bar.set_postfix_str(f"loss {live.min():.3f}-{live.max():.3f}")
    bar.close()
    seconds = time.perf_counter() - start
    trained = []
    for e, model in enumerate(models):
        model.load_state_dict({k: v[e].detach() for k, v in params.items()}, strict=False)
        trained.append(model)
    return TrainResult(models=trained, loss_curve=curve, diverged_at=diverged_at, snapshots=snapshots,
                       seconds=seconds)


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
    sq = sum(g.pow(2).flatten(1).sum(1) for g in grads)  # [e]
    scale = (max_norm / (sq.sqrt() + 1e-6)).clamp(max=1.0)
    for g in grads:
        g.mul_(scale.view(-1, *([1] * (g.dim() - 1))))


def train_plain(make_model, task: Task, seed: int, cfg: TrainConfig, *, steps: int | None = None,
                device: str | torch.device = "cpu") -> tuple[nn.Module, list[float]]:
    """The baseline: one model, a plain PyTorch loop over its direct forward, the same data."""
    cfg.validate()
    model = build_member(make_model, seed).to(device)
    opt = _optimizer(list(model.parameters()), cfg)
    stream = DataStream(task, seed, cfg)
    losses = []
    for _ in range(steps or cfg.steps):
        tokens, targets, lengths, _ = stream.next()
        logits = model(tokens.to(device), lengths=lengths.to(device))
        loss = torch.nn.functional.cross_entropy(logits, targets.to(device))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return model, losses
