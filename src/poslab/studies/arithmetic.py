"""The seed's arithmetic next step: length generalization of addition with positions from the task's
structure. Position coupling (Cho et al. 2024, arXiv 2405.20671), Abacus embeddings (McLeish et al. 2024,
arXiv 2405.17399) and index hints (Zhou et al. 2024, arXiv 2402.09371) beside NoPE, RoPE and learned APE,
trained on additions of 1 .. n digits and evaluated at multiples of n (:mod:`poslab.tasks.digit_addition`,
every format zero-padded as position coupling's, the sum's digits and the end token scored, teacher forced).

Settings (one model, one trainer; each setting fixes the encoding and the task's format and positions)::

    coupling     position_coupling on the coupled ids (reversed sum)          Cho et al.'s method
    abacus       abacus on the digit places (reversed sum)                    McLeish et al.'s, with NoPE
    hints rope   rope, index hints (reversed sum)                             Zhou et al.'s format
    hints nope   nope, index hints (reversed sum)
    nope, rope, learned   the plain encodings on the reversed sum (the papers' baselines' format)

Probes (the seed's), per scored sum digit (a query whose next token is a sum digit) and each layer and head::

    argmax key     k*(i) = argmax_j pattern[i, j]
    peak offset    k*(i) - i, its most common value (the seed's selected offset)
    source hit     k*(i) is an operand digit of the significance the query predicts
    off-source pin over queries at token positions i >= T (T = tokens of the widest trained addition): the
                   share whose argmax key lies inside [0, T) and is no source (an APE head pinned to trained
                   positions; a source-following head's keys are sources and do not count)

The member's copy head is its (layer, head) with most source hits at the trained lengths. Set-up, the
papers' numbers and the scale-down: docs/arithmetic.md.

Notation: b batch, h head, i query index, j key index, n trained operand digits, L evaluated digits.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from poslab.errors import ConfigError
from poslab.experiments import Trained
from poslab.experiments.config import QUICK, EvalConfig, StudyConfig
from poslab.experiments.experiment import resolve_task
from poslab.experiments.outputs import Column, Lines, Pivot, Table, joined, select, write_outputs
from poslab.experiments.spec import (
    ClaimSpec,
    InRange,
    cited,
    hypothesis,
    is_,
    judge_all,
    mean,
    minimum,
    probe,
    seed_states,
    share,
)
from poslab.models.loss import aligned_logits
from poslab.positional import encoding_class, small_encoding
from poslab.probes.common import over_chunks
from poslab.tasks import eval_batch
from poslab.tasks.scoring import sequence_scores
from poslab.train import TrainConfig

# the positions each encoding reads from the task (digit_addition's ``positions``); every other: "index"
TASK_POSITIONS = {"position_coupling": "coupled", "abacus": "abacus"}
SETTINGS = {  # name: (encoding, format)
    "coupling": ("position_coupling", "reversed"),
    "abacus": ("abacus", "reversed"),
    "hints rope": ("rope", "index_hints"),
    "hints nope": ("nope", "index_hints"),
    "nope": ("nope", "reversed"),
    "rope": ("rope", "reversed"),
    "learned": ("learned", "reversed"),
}
BASELINES = ("nope", "rope", "learned")
PINNED_SHARE = 0.9  # a pinned head keeps at least this share of its argmax keys off-source inside [0, T)


CPU_ABACUS_OFFSET = 20  # K of Abacus's random offset at the cpu preset (the paper: 100)


def lengths_of(n: int, multiples: tuple[int, ...]) -> tuple[int, ...]:
    """The evaluated digits per operand: n // 2 (at least 1) and each multiple of the trained n."""
    return tuple(sorted({max(1, n // 2), *(m * n for m in multiples)}))


def settings_of(lengths: tuple[int, ...], n: int, abacus_offset: int) -> dict[str, dict]:
    """Every setting of SETTINGS: its encoding, the task's format and the positions that encoding reads, and
    the tables of the task-position encodings sized to the widest evaluated addition (position coupling's
    ids 1 .. L + 2: the paper's 202 for 200 digits; Abacus's places past its random offset K)."""
    opts = {"position_coupling": {"max_pos": max(lengths) + 2},
            "abacus": {"max_offset": abacus_offset, "max_position": max(n + 1 + abacus_offset, max(lengths) + 1)}}
    return {name: {"encoding": enc, "task.format": fmt, "task.positions": TASK_POSITIONS.get(enc, "index"),
                   **({"encoding_options": {enc: opts[enc]}} if enc in opts else {})}
            for name, (enc, fmt) in SETTINGS.items()}


def scale(n: int, multiples: tuple[int, ...], abacus_offset: int) -> dict[str, object]:
    """A preset's digits (dotted-path changes): trained on 1 .. n, evaluated at ``lengths_of(n, multiples)``,
    the index hints and the task-position tables sized to the widest addition."""
    lengths = lengths_of(n, multiples)
    return {"train.max_length": n, "eval.lengths": lengths, "task.n_hints": max(lengths) + 4,
            "settings": settings_of(lengths, n, abacus_offset)}


# Paper preset: Cho et al.'s addition run (their scripts/addition/run_coupling.sh): 1 layer, 4 heads, d_model
# 512, MLP 2048, Adam lr 1e-4 without weight decay, batch 1000, 50k steps, trained on 1-30 digits, max_pos 202,
# tested to 200 digits; Abacus's K = 100 (McLeish et al.). Not run here
PAPER_LENGTHS = lengths_of(30, (1, 2, 4, 6))
BASE = StudyConfig(model_type="transformer", model=dict(n_layers=1, d_model=512, n_heads=4, d_mlp=2048),
                   task_type="digit_addition", task=dict(n_hints=max(PAPER_LENGTHS) + 4),
                   grid={"setting": tuple(SETTINGS)}, settings=settings_of(PAPER_LENGTHS, 30, 100), seeds=4,
                   train=TrainConfig(steps=50_000, batch_size=1000, lr=1e-4, min_length=1, max_length=30,
                                     length_sampling="sequence"),
                   eval=EvalConfig(lengths=PAPER_LENGTHS, n_sequences=1000, chunk=128))
PRESETS = {
    "paper": {},
    # a few steps of a tiny model on 1 .. 3 digits, tested at 1, 3 and 6: every code path in seconds
    "quick": {**QUICK, **scale(3, (1, 2), 4), "model": dict(n_layers=1, d_model=16, n_heads=2), "seeds": 1,
              "train.steps": 10, "train.batch_size": 8, "train.lr": 1e-3, "eval.n_sequences": 16},
    # sized here (docs/arithmetic.md): 1 .. 5 digits (position coupling's own small run trains 1-5 and tests 10),
    # tested at 2x, 3x and 4x; two layers: in the short check (docs/arithmetic.md) position coupling learned in
    # range by step 3000 at two layers and not by step 5500 at one (the headline's depth, at d_model 512 and 50k
    # steps of batch 1000 there); 5000 steps: 21 members at ~26 ms a member-step on 2 workers, ~23 min
    "cpu": {**scale(5, (1, 2, 3, 4), CPU_ABACUS_OFFSET), "model": dict(n_layers=2, d_model=64, n_heads=4),
            "seeds": 3, "train.steps": 5000, "train.batch_size": 64, "train.lr": 2e-3, "eval.n_sequences": 256},
}

LENGTH, HEAD, MEMBER = probe("length"), probe("head"), probe("member")
TRAINED, UNSEEN = LENGTH & is_("in_range", True), LENGTH & is_("in_range", False)
UP_TO_2_5 = UNSEEN & is_("ratio", 2.0)  # Zhou et al.'s 2.5x covers 2n
COUPLING, ABACUS = is_("setting", "coupling"), is_("setting", "abacus")

CHO = cited("Cho et al. 2024, arXiv 2405.20671 (abstract): 'our models trained on 1 to 30-digit additions can "
            "generalize up to 200-digit additions (6.67x of the trained length)'")
CHO_ONE_LAYER = cited("Cho et al. 2024, arXiv 2405.20671 (abstract): 'any 1-layer Transformer without positional "
                      "information cannot entirely solve it' (addition)")
CHO_BASELINE = cited("Cho et al. 2024, arXiv 2405.20671 (introduction): 'Transformers typically learn to solve "
                     "addition only up to the training sequence length (Lee et al., 2024)'")
MCLEISH = cited("McLeish et al. 2024, arXiv 2405.17399 (abstract): 'training on only 20 digit numbers ... we can "
                "reach state-of-the-art performance, achieving up to 99% accuracy on 100 digit addition problems'")
HINTS_OWN = hypothesis("index hints (Zhou et al. 2024, arXiv 2402.09371) with RoPE or NoPE reach 2x the trained "
                       "digits; Zhou et al. state 2.5x for their combination with FIRE, not for these encodings")
LEARNS = hypothesis("each setting learns n-digit addition in range at this scale (the learned-in-range gate)")
COUPLED_HEAD = hypothesis("coupled ids make the head that reads the operand digits of the predicted significance "
                          "find them at every length (an absolute table read at ids that repeat per significance)")
LEMMA1 = seed_states("Lemma 1 / Section 5.2: RoPE's selected offset is length-invariant; RoPE generalizes")
PROPOSITION2 = seed_states("Proposition 2: the trained APE head selects a fixed absolute position inside the "
                           "training range, so it misses the target outside that range")
SCALE_NOTE = ("scaled down: trained on 1..n digits (n = 5 at the cpu preset), tested to 4n (the paper: 1..30, to "
              "200 = 6.67x); {seeds} seeds; the worst evaluated length past n (mean over seeds)")

GATE = InRange(where=TRAINED, column="exact", threshold=0.9, match=("setting",),
               text="exact match at the trained lengths (mean over seeds and lengths)")

CLAIMS = [
    ClaimSpec(name="{setting}: exact match at the trained lengths", paper="(learned in range)", where=TRAINED,
              per=("setting",), measure=mean("exact"), op=">=", threshold=0.9, source=LEARNS, setting="other",
              note="mean over {seeds} seeds and the trained lengths evaluated; the learned-in-range gate"),
    ClaimSpec(name="coupling: exact match at every length past training, up to 4n",
              paper="1-30 digits generalize to 200 (6.67x)", where=UNSEEN & COUPLING, per=("setting",),
              measure=minimum("exact", by=("length",)), op=">=", threshold=0.9, source=CHO, setting="other",
              trained=True, note=SCALE_NOTE + "; line 0.9 (the paper's figure 1 sits above it to 200 digits)"),
    ClaimSpec(name="abacus: exact match at every length past training, up to 4n",
              paper="20 digits generalize to 100 at up to 99% (5x)", where=UNSEEN & ABACUS, per=("setting",),
              measure=minimum("exact", by=("length",)), op=">=", threshold=0.9, source=MCLEISH, setting="other",
              trained=True, note=SCALE_NOTE + f"; Abacus alone (with NoPE), K scaled from 100 to the cpu preset's "
                                               f"{CPU_ABACUS_OFFSET}"),
    ClaimSpec(name="{setting}: exact match at 2n", paper="(index hints reach 2.5x with FIRE; Zhou et al.)",
              where=UP_TO_2_5 & is_("setting", "hints rope", "hints nope"), per=("setting",), measure=mean("exact"),
              op=">=", threshold=0.9, source=HINTS_OWN, setting="other", trained=True,
              note="mean over {seeds} seeds at twice the trained digits"),
    ClaimSpec(name="{setting}: exact match past training (mean over lengths > n)",
              paper="addition is solved only up to the training length", where=UNSEEN & is_("setting", *BASELINES),
              per=("setting",), measure=mean("exact"), op="<", threshold=0.5, source=CHO_BASELINE, setting="other",
              trained=True, note="mean over {seeds} seeds and the lengths 2n .. 4n; the baselines' reversed format"),
    ClaimSpec(name="nope, 1 layer: exact match at the trained lengths", paper="cannot entirely solve addition",
              where=TRAINED & is_("setting", "nope") & is_("n_layers", 1), per=("setting",), measure=mean("exact"),
              op="<", threshold=1.0, source=CHO_ONE_LAYER, setting="other",
              note="mean over {seeds} seeds and the trained lengths; a statement about in-range skill, not gated"),
    # the seed's probes
    ClaimSpec(name="coupling: copy head's source hits past training", paper="(the coupled head finds its digits)",
              where=MEMBER & COUPLING, per=("setting",), measure=mean("hit_unseen"), op=">=", threshold=0.9,
              source=COUPLED_HEAD, setting="other", trained=True,
              note="mean over {seeds} seeds of the copy head's share of sum-digit queries whose argmax key is an "
                   "operand digit of the predicted significance, over the lengths past n"),
    ClaimSpec(name="rope: copy head's source hits past training", paper="the head keeps finding its target (RoPE)",
              where=MEMBER & is_("setting", "rope"), per=("setting",), measure=mean("hit_unseen"), op=">=",
              threshold=0.9, source=LEMMA1, setting="other", trained=True,
              note="the seed's statement is for a fixed offset; here the source's offset grows with the operands "
                   "(a control); mean over {seeds} seeds"),
    ClaimSpec(name="learned: copy heads pinned off-source inside the trained positions at every length past "
                   f"training (≥ {PINNED_SHARE:.0%} of argmax keys)",
              paper="selects a fixed absolute position inside the training range (Proposition 2)",
              where=MEMBER & is_("setting", "learned"), per=("setting",), measure=share("pinned", "==", True),
              op=">=", threshold=0.9, percent=True, source=PROPOSITION2, setting="other", trained=True,
              note="learned APE on addition (another setting: a control); one copy head per seed"),
]

TABLES = [
    Table("Exact match of the sum by length (digits per operand)", by=("setting",), where=LENGTH,
          pivot=Pivot("length", "exact", "L={}")),
    Table("Per-token accuracy on the sum by length", by=("setting",), where=LENGTH,
          pivot=Pivot("length", "accuracy", "L={}")),
    Table("The copy head of each seed", by=("setting", "seed"), where=MEMBER,
          intro="head = layer.head with most source hits at the trained lengths; source hits: share of sum-digit "
                "queries whose argmax key is an operand digit of the predicted significance (trained lengths / "
                "lengths past n); peak offsets: the most common argmax key minus query, per length past n (the "
                "seed's probe); off-source pin: over queries at positions ≥ T, the share of argmax keys inside "
                "[0, T) that are no source (mean over lengths past n); pinned: ≥ 90% at every such length.",
          columns=(Column("head", joined("head_name")), Column("hits trained", "hit_trained"),
                   Column("hits past n", "hit_unseen"), Column("peak offsets", joined("peak_offsets")),
                   Column("off-source pin", "pin_out"),
                   Column("pinned", lambda g: f"{sum(bool(r['pinned']) for r in g)} of {len(g)}"))),
    Table("Every head at the longest length (mean over seeds)", by=("setting", "layer", "head"),
          where=HEAD & is_("longest", True),
          columns=(Column("source hits", "hit"), Column("peak offset", "peak_offset", 1),
                   Column("off-source pin", "pin_out"))),
]
FIGURES = [
    Lines("exact.png", x="ratio", y="exact", series=("setting",), where=LENGTH, ylim=(-0.02, 1.02),
          xlabel="digits per operand / trained digits n", ylabel="exact match of the sum"),
]


def check(cfg: StudyConfig) -> None:
    """Each setting's encoding reads the positions its task hands (coupled ids for position coupling, digit
    places for Abacus, none for the others), and its table holds the longest evaluated addition's ids."""
    longest = max((*cfg.eval.lengths, cfg.train.max_length))
    for name in cfg.axis("setting"):
        bundle = cfg.settings[name]
        enc = bundle.get("encoding", cfg.encoding)
        want = TASK_POSITIONS.get(enc, "index")
        got = bundle.get("task.positions", cfg.task.get("positions", "index"))
        if got != want:
            raise ConfigError(f"settings.{name}.task.positions", got, f"{want!r} for encoding {enc!r}")
        if encoding_class(enc).task_positions:
            built = small_encoding(enc, **bundle.get("encoding_options", {}).get(enc, {}))
            built.check_positions(longest + 2 if want == "coupled" else longest + 1)


def table_length(cfg: StudyConfig) -> int:
    """Tokens of the widest addition used (a learned APE table holds every position it meets)."""
    return resolve_task(cfg).max_tokens(max((*cfg.eval.lengths, cfg.train.max_length)))  # type: ignore[attr-defined]


# ----------------------------------------------------------------------------- probes

def head_stats(pattern: np.ndarray, queries: np.ndarray, sources: np.ndarray, T: int) -> dict[str, np.ndarray]:
    """Per (layer, head), each ``[layers, h]``, from patterns ``[b, layers, h, i, j]``, the sum-digit queries
    ``[b, i]`` and their source keys ``[b, i, j]``: the source hit (over queries with a source), the most common
    peak offset, and over queries at positions >= T the share of argmax keys inside [0, T) that are no source
    (NaN where none)."""
    b, n_layers, h, s, _ = pattern.shape
    am = pattern.argmax(-1)  # [b, layers, h, i]
    i = np.broadcast_to(np.arange(s), (b, s))
    past = queries & (i >= T)
    sourced = queries & sources.any(-1)  # the sum's top digit (a carry) has no operand digit to read
    out = {k: np.full((n_layers, h), np.nan) for k in ("hit", "peak_offset", "pin_out")}
    for layer in range(n_layers):
        for head in range(h):
            k = am[:, layer, head]  # [b, i]
            on_src = np.take_along_axis(sources, k[..., None], -1)[..., 0]  # [b, i]
            if sourced.any():
                out["hit"][layer, head] = on_src[sourced].mean()
            if queries.any():
                vals, counts = np.unique((k - i)[queries], return_counts=True)
                out["peak_offset"][layer, head] = float(vals[counts.argmax()])
            if past.any():
                out["pin_out"][layer, head] = ((k < T) & ~on_src)[past].mean()
    return out


def _num(v) -> float | None:
    return None if v is None or np.isnan(v) else float(v)


def evaluate(ctx) -> list[dict]:
    """Per length: exact match and per-token accuracy over the sum; per layer and head the seed's probes
    (:func:`head_stats`); and the member's copy head (:func:`member_row`)."""
    study, model, task = ctx.study, ctx.model, ctx.task
    n = study.train.max_length
    T = task.max_tokens(n)
    ids = dict(encoding=study.encoding, format=task.format, n=n, T=T,  # the runner adds setting and seed
               n_layers=model.cfg.n_layers)
    rows, heads = [], []
    longest = max(study.eval.lengths)
    for L in study.eval.lengths:
        batch = eval_batch(task, L, study.eval.n_sequences, study.eval.seed, device=ctx.device)
        acc, exact, got = [], [], []
        with torch.no_grad():
            for part, inter in over_chunks(model, batch, study.eval.chunk):
                assert inter.logits is not None  # collect sets them
                a, e = sequence_scores(aligned_logits(inter.logits, part).argmax(-1), part)
                acc.append(a)
                exact.append(e)
                sig, piece = (x.cpu().numpy() for x in task.places(part.tokens))
                nxt_sig = np.pad(sig[:, 1:], ((0, 0), (0, 1)), constant_values=-1)
                nxt_sum = np.pad(piece[:, 1:] == 3, ((0, 0), (0, 1)))
                queries = part.loss_mask.cpu().numpy() & nxt_sum  # [b, i] the query before a sum digit
                operand = (piece == 1) | (piece == 2)  # [b, j]
                sources = operand[:, None, :] & (sig[:, None, :] == nxt_sig[:, :, None])  # [b, i, j]
                pattern = np.stack([lay.pattern.double().cpu().numpy() for lay in inter.layers], 1)
                got.append(head_stats(pattern, queries, sources, T) | {"_w": (queries & sources.any(-1)).sum(),
                                                                          "_p": (queries & (np.arange(
                                                                              queries.shape[1]) >= T)).sum()})
        rows.append(dict(ids, probe="length", length=L, ratio=L / n, in_range=L <= n,
                         tokens=int(batch.tokens.shape[1]), accuracy=float(torch.cat(acc).nanmean()),
                         exact=float(torch.cat(exact).nanmean())))
        stats = _pool(got)
        heads += [dict(ids, probe="head", length=L, in_range=L <= n, longest=L == longest, layer=layer, head=h,
                       **{k: _num(v[layer, h]) for k, v in stats.items()})
                  for layer in range(stats["hit"].shape[0]) for h in range(stats["hit"].shape[1])]
    return rows + heads + [member_row(heads, ids)]


def _pool(parts: list[dict]) -> dict[str, np.ndarray]:
    """Chunks' head statistics pooled, weighted by their queries (the peak offset: the largest chunk's)."""
    out = {}
    for key, weight in (("hit", "_w"), ("pin_out", "_p")):
        vals = np.stack([p[key] for p in parts])  # [chunks, layers, h]
        w = np.array([p[weight] for p in parts], dtype=float)[:, None, None] * ~np.isnan(vals)
        out[key] = np.where(w.sum(0) > 0, np.nansum(vals * w, 0) / np.maximum(w.sum(0), 1e-12), np.nan)
    out["peak_offset"] = max(parts, key=lambda p: p["_w"])["peak_offset"]
    return out


def member_row(heads: list[dict], ids: dict) -> dict:
    """The copy head (most source hits over the trained lengths) and its numbers past training; tags its rows."""
    names = sorted({(r["layer"], r["head"]) for r in heads})

    def avg(rs: list[dict], col: str) -> float | None:
        vals = [r[col] for r in rs if r[col] is not None]
        return float(np.mean(vals)) if vals else None

    best = max(names, key=lambda p: avg([r for r in heads if r["in_range"] and (r["layer"], r["head"]) == p], "hit")
               or -1.0)
    mine = sorted((r for r in heads if (r["layer"], r["head"]) == best), key=lambda r: r["length"])
    for r in heads:
        r["copy_head"] = (r["layer"], r["head"]) == best
    unseen = [r for r in mine if not r["in_range"]]
    measured = [r for r in unseen if r["pin_out"] is not None]
    pinned = bool(measured) and all(r["pin_out"] >= PINNED_SHARE for r in measured)
    return dict(ids, probe="member", head_name=f"{best[0]}.{best[1]}", layer=best[0], head=best[1],
                hit_trained=avg([r for r in mine if r["in_range"]], "hit"), hit_unseen=avg(unseen, "hit"),
                pin_out=avg(unseen, "pin_out"), pinned=pinned,
                peak_offsets=" ".join("-" if r["peak_offset"] is None else str(int(r["peak_offset"])) for r in unseen))


def report(rows: list[dict], study: StudyConfig, out: Path) -> list[Path]:
    m, t = study.model, study.train
    intro = (f"Mean ± std over seeds 0..{study.seeds - 1}. Causal decoder, {m.get('n_layers')} layers, d_model = "
             f"{m.get('d_model')}, {m.get('n_heads')} heads; {t.steps} steps of batch {t.batch_size} (Adam, lr "
             f"{t.lr:g}); trained on 1..{t.max_length} digits per operand, evaluated at "
             f"{', '.join(map(str, study.eval.lengths))} digits; {study.eval.n_sequences} additions per length "
             "(both operands of that many digits). Exact match: every sum digit and the end token right, teacher "
             "forced. Settings: see docs/arithmetic.md.")
    return write_outputs(out, title=EXPERIMENT.title, rows=rows, claims=judge_all(CLAIMS, rows, GATE), intro=intro,
                         tables=TABLES, figures=FIGURES, csv_rows=select(rows, "length"),
                         csvs={"heads.csv": "head", "members.csv": "member"})


EXPERIMENT = Trained(name="arithmetic", title="Next step: arithmetic, position coupling's headline at cpu scale "
                                           "(position coupling, Abacus, index hints, NoPE / RoPE / APE)",
                     base=BASE, presets=PRESETS, evaluate=evaluate, report=report, check=check,
                     table_length=table_length)
