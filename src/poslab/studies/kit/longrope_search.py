"""LongRoPE's evolutionary search over per-pair rescale factors (Ding et al. 2024) and LongRoPE2's
critical-dimension variant (Shang et al. 2025), as a function of (model, objective, search space,
budget): nothing here knows which model or which text it is given.

A candidate is (factors lambda_i, n-hat, critical pair c); it is scored as
``objective(rescale(model, longrope dict))`` where the dict is Hugging Face's ``longrope``
``rope_scaling`` (poslab's ``n_hat`` added, :mod:`poslab.positional.rope_scaling`) and ``rescale``
defaults to :func:`with_scaling` (a copy of a poslab model whose RoPE is rebuilt under the dict;
another model type passes its own). Lower is better.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from poslab.errors import ConfigError
from poslab.positional import build_encoding
from poslab.positional.rope_scaling import rope_frequencies


@dataclass(frozen=True, kw_only=True)
class SearchConfig:
    """The evolutionary search's budget: ``evaluations`` objective calls per search."""

    population: int = 16
    generations: int = 8
    survivors: int = 4
    sigma: float = 0.25  # log-normal mutation step

    @property
    def evaluations(self) -> int:
        return self.population + self.generations * (self.population - self.survivors)


def rope_encoding(model, scaling: dict | None):
    """The model's RoPE rebuilt with another schedule (its other options kept), on its device.
    (Its table covers lengths up to max_len; longrope clamps longer ones to the long factors, the
    same table, so a search at 8 L0 works past a quick preset's max_len.)"""
    cfg = model.cfg
    options = {k: v for k, v in cfg.encoding_options.items() if k != "scaling"}
    if scaling:
        options["scaling"] = scaling
    enc = build_encoding(cfg.encoding, d_model=cfg.d_model, n_heads=cfg.n_heads, d_head=cfg.d_head,
                         max_len=cfg.max_len, **options)
    return enc.to(next(model.parameters()).device)


def with_scaling(model, scaling: dict | None):
    """The same weights under another RoPE schedule (RoPE has no parameters; one module serves every layer)."""
    _one_rotary(model)
    out = copy.deepcopy(model)
    out.encoding = rope_encoding(model, scaling)
    return out.eval()


def swap(model, encoding):
    """``model`` reading positions through ``encoding`` from now on (weights untouched)."""
    _one_rotary(model)
    model.encoding = encoding
    return model


def _one_rotary(model) -> None:
    """ConfigError if a layout gives some layers a rotary module of their own: replacing the
    model's ``encoding`` would leave those layers on their old schedule."""
    layout = getattr(model.cfg, "layout", None)
    if layout is not None and any(enc.is_rotary for enc in getattr(model, "layer_encodings", ())):
        raise ConfigError("layout", layout, "a layout whose rotary layers all use the model's encoding (entries "
                                            "naming it, without options of their own): a schedule replaces that one "
                                            "module")


def longrope(L0: int, short, long, s: float, n_hat: int = 0) -> dict:
    """The HF longrope dict (plus poslab's ``n_hat`` when > 0: positions below it keep the original angles)."""
    out = {"rope_type": "longrope", "factor": s, "original_max_position_embeddings": L0,
           "short_factor": [float(x) for x in short], "long_factor": [float(x) for x in long]}
    return {**out, "n_hat": int(n_hat)} if n_hat else out


@dataclass(frozen=True, kw_only=True)
class SearchSpace:
    """What a LongRoPE search may choose, for a RoPE of ``head_dim`` and ``base`` trained on L0.

    ``kind`` "long" searches the long factors (short ones fixed to ``other``, default 1), "short"
    the short ones (long fixed to ``other``). Factors lie in [1, 2 s] and are non-decreasing in the
    pair index (LongRoPE). ``critical`` = (lo, hi) makes it LongRoPE2's: a critical pair c in
    [lo, hi] is searched too; pairs below c take the NTK-aware factors s^(2i/(r-2)), pairs from c
    on searched factors in [s, 2 s]. ``starts``: named extra initial factor vectors."""

    L0: int
    head_dim: int
    base: float
    s: float
    kind: str = "long"
    other: tuple[float, ...] | None = None
    n_hats: tuple[int, ...] = (0,)
    critical: tuple[int, int] | None = None
    starts: dict = field(default_factory=dict)

    def seeds(self) -> dict[str, np.ndarray]:
        pairs, s = self.head_dim // 2, self.s
        if self.kind == "short":
            return {"rope": np.ones(pairs), **self._starts()}
        if self.critical is not None:
            return {"pi": np.full(pairs, s), "ramp": np.linspace(s, 2 * s, pairs), "2s": np.full(pairs, 2 * s),
                    **self._starts()}
        yarn = {"rope_type": "yarn", "factor": s, "original_max_position_embeddings": self.L0}
        return {"pi": np.full(pairs, s), "ntk": self.ntk(), "yarn": self._factors(yarn), **self._starts()}

    def ntk(self) -> np.ndarray:
        return self._factors({"rope_type": "ntk", "factor": self.s})

    def _factors(self, scaling: dict) -> np.ndarray:
        """A schedule's frequencies as per-pair factors theta_i / theta'_i."""
        plain, _ = rope_frequencies(self.head_dim, self.base)
        scaled, _ = rope_frequencies(self.head_dim, self.base, scaling)
        return (plain.double() / scaled.double()).numpy()

    def _starts(self) -> dict[str, np.ndarray]:
        return {k: np.asarray(v, dtype=np.float64) for k, v in self.starts.items()}

    def legal(self, f: np.ndarray, crit: int | None) -> np.ndarray:
        f = np.clip(f, 1.0, 2 * self.s)
        if crit is not None:
            f = np.concatenate([self.ntk()[:crit], np.clip(f[crit:], self.s, 2 * self.s)])
        return np.maximum.accumulate(f)


@dataclass
class SearchResult:
    factors: list[float]
    n_hat: int
    critical: int | None
    origin: str  # the initial seeds the winner descends from ("+"-joined)
    trace: list[float]  # best objective per generation
    evaluations: int
    seconds: float
    space: SearchSpace

    def rows(self, which: str) -> list[dict]:
        sp = self.space
        crit = None if sp.critical is None else f"{self.critical} ({sp.critical[0]}-{sp.critical[1]})"
        out = [dict(probe="search_result", set=which, s=sp.s, n_hat=self.n_hat, critical=self.critical, crit=crit,
                    origin=self.origin, trace=f"{self.trace[0]:.3f} -> {self.trace[-1]:.3f}", objective=self.trace[-1],
                    evaluations=self.evaluations, seconds=self.seconds)]
        out += [dict(probe="search", set=which, generation=i, objective=v) for i, v in enumerate(self.trace)]
        return out + [dict(probe="factors", set=which, pair=i, factor=float(f), n_hat=self.n_hat, s=sp.s,
                           critical=self.critical) for i, f in enumerate(self.factors)]


def search(model, objective: Callable[[torch.nn.Module], float], space: SearchSpace, config: SearchConfig | None = None,
           *, seed: int, rescale: Callable | None = None) -> SearchResult:
    """LongRoPE's evolutionary search: the candidate (factors, n-hat, critical pair) whose
    ``objective(rescale(model, longrope dict))`` is lowest.

    The initial population is ``space.seeds()`` (n-hat = n_hats[0], critical pair = its upper end),
    then log-normal mutations of them with a random n-hat and critical pair. Each generation keeps
    the ``survivors`` best and fills the population with children: uniform crossover per pair, a
    log-normal mutation on about half the pairs, n-hat and critical pair from either parent and each
    moved to a neighbouring value with probability 1/2. A child descends from both parents' seeds.
    """
    rescale, config = rescale or with_scaling, config or SearchConfig()
    rng = np.random.default_rng(seed)
    pairs, sp, clock = space.head_dim // 2, space, time.perf_counter()
    other = np.ones(pairs) if sp.other is None else np.asarray(sp.other, dtype=np.float64)
    crits = tuple(range(sp.critical[0], sp.critical[1] + 1)) if sp.critical else (None,)

    def draw(values):  # no draw for a single value, so a fixed n-hat search repeats
        return values[rng.integers(len(values))] if len(values) > 1 else values[0]

    def nudge(values, v):
        if len(values) > 1 and rng.random() < 0.5:
            return values[min(max(values.index(v) + rng.choice((-1, 1)), 0), len(values) - 1)]
        return v

    seeds = sp.seeds()
    population = [(sp.legal(f, crits[-1]), sp.n_hats[0], crits[-1], frozenset([k])) for k, f in seeds.items()]
    while len(population) < config.population:
        f, _, _, origin = population[rng.integers(len(seeds))]
        crit = draw(crits)
        population.append((sp.legal(f * np.exp(rng.normal(0, config.sigma, pairs)), crit), draw(sp.n_hats), crit,
                           origin))

    def score(f, n_hat):
        short, long = (other, f) if sp.kind == "long" else (f, other)
        return objective(rescale(model, longrope(sp.L0, short, long, sp.s, n_hat)))

    scored = sorted(((score(f, n), i, f, n, c, o) for i, (f, n, c, o) in enumerate(population)), key=lambda t: t[:2])
    evaluations, trace = len(population), [scored[0][0]]
    for gen in range(config.generations):
        parents = scored[:config.survivors]
        children: list[tuple] = []
        while len(children) < config.population - len(parents):
            a, b = (parents[i] for i in rng.choice(len(parents), 2))
            child = np.where(rng.random(pairs) < 0.5, a[2], b[2])
            child = child * np.exp(rng.normal(0, config.sigma, pairs) * (rng.random(pairs) < 0.5))
            n_hat = nudge(sp.n_hats, b[3] if rng.random() < 0.5 else a[3]) if len(sp.n_hats) > 1 else a[3]
            crit = nudge(crits, b[4] if rng.random() < 0.5 else a[4]) if len(crits) > 1 else a[4]
            children.append((sp.legal(child, crit), n_hat, crit, a[5] | b[5]))
        evaluations += len(children)
        scored = sorted(parents + [(score(f, n), 1000 * (gen + 1) + i, f, n, c, o)
                                   for i, (f, n, c, o) in enumerate(children)], key=lambda t: t[:2])
        trace.append(scored[0][0])
    best = scored[0]
    return SearchResult(factors=[float(x) for x in best[2]], n_hat=int(best[3]), critical=best[4],
                        origin="+".join(sorted(best[5])), trace=[float(t) for t in trace], evaluations=evaluations,
                        seconds=time.perf_counter() - clock, space=sp)
