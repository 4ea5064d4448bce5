"""Context-extension methods applied to a trained RoPE member, each one a stage of its own.

A study registers its methods in an :class:`Extensions`: ``{name: Method(build, trains, scaling,
stored)}``. ``Extensions.stage(ctx, name)`` builds a method on ``ctx``'s trained member (``ctx``:
a member's evaluation context, :mod:`poslab.experiments.runner`) once per process; a method built
on another calls ``stage`` for it. A stored method (a search or a fine-tune) is a stage of the
store (:mod:`poslab.experiments.stages`), keyed by the study's ``config(member, method)``: read
back when the store holds it (its rows, its ``info``, JSON: the searched schedule or the
fine-tuning schedules, and its fine-tuned weights), else computed and recorded there.

Also the pieces methods are built from: :func:`finetune` (a copy trained under RoPE schedules),
the search objectives on character text (:func:`lm_objective`, :func:`needle_objective`) and the
RoPE scaling law's row (:func:`scaling_law_row`). Used by the ``context-extension`` study.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from poslab.positional.scaling_laws import critical_dimension, extrapolation_bound, full_period_pairs
from poslab.probes.passkey_eval import cell_seed
from poslab.studies.kit.longrope_search import rope_encoding, swap, with_scaling
from poslab.tasks.passkey import PasskeyText
from poslab.tasks.text import CharText

FINE_TUNING_METHODS = ("pi",)  # published with fine-tuning: their training-free use is a control


@dataclass
class Built:
    """A method applied to one trained member: its model at each length, its stage rows, what a
    stored stage rebuilds it from (``info``, JSON: the searched schedule, the fine-tuning
    schedules) and the fine-tuned copy (``tuned``), which later stages reuse."""

    model_at: Callable[[int], torch.nn.Module]
    rows: list[dict] = field(default_factory=list)
    info: dict = field(default_factory=dict)
    tuned: torch.nn.Module | None = None


@dataclass(frozen=True)
class Method:
    build: Callable[..., Built]  # (ctx) -> Built
    trains: bool  # changes the weights (fine-tuning)
    scaling: Callable[[int], dict] | None = None  # training-free: its rope_scaling dict for L0 (the variant's)
    stored: bool = False  # a search or a fine-tune: a stage of its own in the store (experiments.stages)


def fixed(model) -> Callable[[int], torch.nn.Module]:
    """The same model at every length."""
    return lambda L: model


def as_loaded(ctx) -> Built:
    """The member as evaluated (a training-free schedule is its variant's encoding)."""
    return Built(fixed(ctx.model))


def rope_base(model) -> float:
    return float(getattr(model.encoding, "base", 10000.0))


@dataclass
class Extensions:
    """A study's methods by name; ``config(member, method)``: what a stored method's stage is
    keyed by (the trained member, the method and every constant its search or fine-tuning reads)."""

    methods: dict[str, Method]
    config: Callable[[str, str], dict]
    memo: dict[tuple[str, str], Built] = field(default_factory=dict)

    def stage(self, ctx, method: str) -> Built:
        """``methods[method]`` built on ctx's trained member, once per process (keyed by the trained
        member's run key: a stage method's variant changes nothing else in the config). A stored
        method is read back from the store's stage when ``ctx.stages`` holds it, else computed and
        recorded there (its rows with ``info``, and the fine-tuned weights)."""
        member = dataclasses.replace(ctx.member, variant=None).key
        if (member, method) in self.memo:
            return self.memo[(member, method)]
        spec, stages = self.methods[method], ctx.stages
        stored = stages.get(self.config(member, method)) if spec.stored and stages is not None else None
        if stored is None:
            clock = time.perf_counter()
            built = spec.build(ctx)
            if spec.stored and stages is not None:
                tuned = built.tuned
                weights = None if tuned is None else {k: v.detach().cpu() for k, v in tuned.state_dict().items()}
                stages.put(self.config(member, method), [dict(probe="stage", info=json.dumps(built.info))]
                           + built.rows, weights, seconds=time.perf_counter() - clock)
        else:
            rows, weights = stored
            info = json.loads(rows[0]["info"])
            tuned = _reload(ctx, info, weights) if weights else None
            built = Built(self.view(ctx, info, tuned), rows[1:], info, tuned)
        self.memo[(member, method)] = built
        return built

    def searched(self, ctx, scaling: dict, rows: list[dict], on: str | None = None, **info) -> Built:
        """A searched stage: ``scaling`` on the member (or on stage ``on``'s fine-tuned copy)."""
        info = dict(scaling=scaling, **({"on": on} if on else {}), **info)
        return Built(self.view(ctx, info), rows, info)

    def finetuned(self, ctx, scalings: dict, steps: int, lr: float, per_length: bool = False) -> Built:
        """A fine-tuned stage: ``scalings`` {length: rope_scaling dict or None}, trained on in turn
        (:func:`finetune`, ``steps`` AdamW steps at ``lr``); with ``per_length`` each length is
        evaluated through its own schedule."""
        clock = time.perf_counter()
        encodings = {L: rope_encoding(ctx.model, scaling) for L, scaling in scalings.items()}
        tuned = finetune(ctx.model, encodings, ctx.task, ctx.study, steps, ctx.member.seed, ctx.device, lr)
        rows = [dict(probe="timing", stage="finetune", seconds=time.perf_counter() - clock, steps=steps, lr=lr,
                     lengths=",".join(map(str, encodings)))]
        info = dict(encodings=scalings, per_length=per_length)
        return Built(self.view(ctx, info, tuned), rows, info, tuned)

    def view(self, ctx, info: dict, tuned: torch.nn.Module | None = None) -> Callable[[int], torch.nn.Module]:
        """A stage's model at each length, from its info (and fine-tuned copy)."""
        if "encodings" in info:  # fine-tuned: each length reads through its training schedule (or the first's)
            assert tuned is not None
            if not info.get("per_length"):
                return fixed(tuned)
            encs = _encodings(ctx, info)
            L0, target = min(encs), max(encs)
            return lambda L: swap(tuned, encs[L0] if L <= L0 else encs[target])
        if "scaling" in info:
            base = self.stage(ctx, info["on"]).tuned if "on" in info else ctx.model
            return fixed(with_scaling(base, info["scaling"]))
        return fixed(ctx.model)


def _encodings(ctx, info: dict) -> dict:
    """{length: RoPE encoding} of a fine-tuned stage's info (JSON keys are strings)."""
    return {int(L): rope_encoding(ctx.model, scaling) for L, scaling in info["encodings"].items()}


def _reload(ctx, info: dict, weights: dict) -> torch.nn.Module:
    """A stored fine-tuned copy: the member's structure, reading through its first schedule."""
    tuned = copy.deepcopy(ctx.model)
    encs = _encodings(ctx, info)
    swap(tuned, encs[next(iter(encs))])
    tuned.load_state_dict(weights)
    return tuned.to(next(ctx.model.parameters()).device).eval()


def finetune(model, encodings: dict, task, study, steps: int, seed: int, device, lr: float):
    """A fine-tuned copy of ``model``: step k trains on windows of the k-th length of ``encodings``
    (cycling) read through that length's RoPE schedule; AdamW at ``lr`` (the study's betas and
    weight decay), gradient clip 1.0, the training mix of the task. Returns the copy, reading
    through the first schedule."""
    tuned = copy.deepcopy(model).train()
    lengths = list(encodings)
    opt = torch.optim.AdamW(tuned.parameters(), lr=lr, betas=study.train.betas, weight_decay=study.train.weight_decay)
    g = torch.Generator().manual_seed(10_000 + seed)
    with torch.enable_grad():
        for k in range(steps):
            L = lengths[k % len(lengths)]
            swap(tuned, encodings[L])
            loss = tuned.loss(task.sample(g, study.train.batch_size, L).to(device))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(tuned.parameters(), 1.0)
            opt.step()
    return swap(tuned.eval(), encodings[lengths[0]])


def lm_objective(task, L: int, study):
    """Mean next-character loss on fixed training-split text windows of length L."""
    n = max(2, study.eval.n_sequences // 8)
    batch = CharText(corpus=task.corpus, split="train").sample(
        torch.Generator().manual_seed(cell_seed(study.eval.seed + 7, L, 0.0)), n, L)

    def loss(model) -> float:
        b = batch.to(next(model.parameters()).device)
        return float(F.cross_entropy(model(b.tokens).flatten(0, 1), b.targets.flatten()))
    return loss


def needle_objective(task, L: int, study):
    """LongRoPE2's needle-driven loss: cross-entropy on the answer digits of passkeys planted at the
    start of the window (depth 0), so every answer digit depends on the farthest positions."""
    n = max(4, study.eval.n_sequences // 4)
    pk = PasskeyText(corpus=task.corpus, split="train", share=1.0, digits=task.digits, depth=0.0, score="answer")
    batch, answer = pk.sample_with_answers(torch.Generator().manual_seed(cell_seed(study.eval.seed + 11, L, 0.0)),
                                           n, L)

    def loss(model) -> float:
        dev = next(model.parameters()).device
        ce = F.cross_entropy(model(batch.tokens.to(dev)).transpose(1, 2), batch.targets.to(dev), reduction="none")
        return float(ce[answer.to(dev)].mean())
    return loss


def scaling_law_row(base: float, L0: int, d: int, pretrain_base: float | None = None) -> dict:
    """probe="scaling_law": the RoPE scaling law (Liu et al. 2023) of a RoPE with ``base`` and head
    dimension d trained on L0 (a tuned base: ``pretrain_base`` the one pre-trained with)."""
    d_extra = critical_dimension(pretrain_base or base, L0, d)
    return dict(probe="scaling_law", head_dim=d, base=base, train_length=L0, critical_dimension=d_extra,
                full_period_pairs=full_period_pairs(base, L0, d),
                extrapolation_bound=extrapolation_bound(base, L0, d, pretrain_base=pretrain_base))
