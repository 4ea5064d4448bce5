"""SCAN (Lake & Baroni 2018): a command in a small English fragment -> the action sequence it means.

The commands are exactly the sentences of the paper's phrase-structure grammar (its supplementary
Figure 6), with C the start symbol::

    C -> S and S | S after S | S
    S -> V twice | V thrice | V
    V -> D[1] opposite D[2] | D[1] around D[2] | D | U
    D -> U left | U right | turn left | turn right
    U -> walk | look | run | jump

(D[1] and D[2] are D's first and second word: "walk opposite left" is D = "walk left" with
"opposite" between its two words), and each command's meaning is the interpretation function::

    [[walk]] = WALK   [[look]] = LOOK   [[run]] = RUN   [[jump]] = JUMP
    [[turn left]] = LTURN                   [[turn right]] = RTURN
    [[u left]] = LTURN [[u]]                [[u right]] = RTURN [[u]]
    [[turn opposite left]] = LTURN LTURN    [[u opposite left]] = [[turn opposite left]] [[u]]
    [[turn around left]] = LTURN LTURN LTURN LTURN
    [[u around left]] = LTURN [[u]] LTURN [[u]] LTURN [[u]] LTURN [[u]]     (right: RTURN alike)
    [[x twice]] = [[x]] [[x]]               [[x thrice]] = [[x]] [[x]] [[x]]
    [[x1 and x2]] = [[x1]] [[x2]]           [[x1 after x2]] = [[x2]] [[x1]]

Counting: U has 4 sentences, D 4 * 2 + 2 = 10, V 10 + 10 + 10 + 4 = 34, S 3 * 34 = 102, and C
102 + 2 * 102**2 = 20,910 -- the published size of SCAN (20,910 commands). The grammar is
unambiguous (no two derivations give the same words), so :func:`commands` returns 20,910
distinct commands. Checked once by hand on 2026-12-04, not in the tests (they read no data):
the set of (command, actions) pairs equals brendenlake/SCAN's ``tasks.txt`` at commit c4b756c
(its I_WALK, I_TURN_LEFT, ... written WALK, LTURN, ... here), and the action lengths split it
into that repository's length split, 16,990 training commands (1 to 22 actions) and 3,920 test
commands (24 to 48 actions).

Actions per command run from 1 to 48; no command has 23, 29, 31, 34, 35, 37 to 39 or 41 to 47
actions (:func:`action_lengths` lists the lengths that occur). Commands have 1 to 9 words.

Length splits (:data:`SPLITS`), both by the number of output actions: Lake & Baroni train on
at most 22 actions and test on 24 to 48; Kazemnejad et al. 2023, whose benchmark poslab
follows, pool all 20,910 commands and cut them at 25 (train 1..25, test 26..48; McGill-NLP/
length-generalization ``scripts/dataset_builders/make_scan_dataset.py``, split
``len_tr25_ts48``). Both are thresholds on action count, so each is exactly a pair of length
ranges of the task below. Here each command word and each action is one token.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from poslab.errors import ConfigError, check_choice
from poslab.tasks.base import Batch, Length, length_range
from poslab.tasks.decoder_format import PAD, decoder_batch, decoder_label

PRIMITIVES = {"walk": "WALK", "look": "LOOK", "run": "RUN", "jump": "JUMP"}  # U and [[u]]
TURNS = {"left": "LTURN", "right": "RTURN"}  # [[turn left]], [[turn right]]
MAX_ACTIONS = 48  # "x around d thrice and y around d thrice": 2 * 3 * 4 * 2


@dataclass(frozen=True)
class Command:
    """One sentence of the grammar and its meaning."""

    words: tuple[str, ...]  # e.g. ("jump", "twice", "after", "walk", "left")
    actions: tuple[str, ...]  # e.g. ("LTURN", "WALK", "JUMP", "JUMP")


Phrase = tuple[tuple[str, ...], tuple[str, ...]]  # (words, actions) of a non-terminal's sentence


def _u() -> list[Phrase]:
    """U -> walk | look | run | jump."""
    return [((u,), (action,)) for u, action in PRIMITIVES.items()]


def _d() -> list[tuple[str, str]]:
    """D -> U left | U right | turn left | turn right, as (D[1], D[2]) word pairs."""
    return [(first, direction) for first in (*PRIMITIVES, "turn") for direction in TURNS]


def _meaning(first: str) -> tuple[str, ...]:
    """[[u]] for a primitive; "turn" contributes no action of its own beyond its turns."""
    return () if first == "turn" else (PRIMITIVES[first],)


def _v() -> list[Phrase]:
    """V -> D[1] opposite D[2] | D[1] around D[2] | D | U."""
    turn = TURNS
    opposite = [((x, "opposite", d), (turn[d], turn[d], *_meaning(x))) for x, d in _d()]
    around = [((x, "around", d), (turn[d], *_meaning(x)) * 4) for x, d in _d()]
    plain = [((x, d), (turn[d], *_meaning(x))) for x, d in _d()]
    return opposite + around + plain + _u()


def _s() -> list[Phrase]:
    """S -> V twice | V thrice | V."""
    out: list[Phrase] = []
    for words, actions in _v():
        out += [((*words, "twice"), actions * 2), ((*words, "thrice"), actions * 3), (words, actions)]
    return out


@functools.cache
def commands() -> tuple[Command, ...]:
    """Every sentence of C -> S and S | S after S | S with its meaning, in the grammar's rule order
    (all "S and S", then all "S after S", then the single S), 20,910 in all."""
    s = _s()
    conj = [Command((*w1, "and", *w2), a1 + a2) for w1, a1 in s for w2, a2 in s]
    after = [Command((*w1, "after", *w2), a2 + a1) for w1, a1 in s for w2, a2 in s]  # x2 runs first
    return tuple(conj + after + [Command(w, a) for w, a in s])


def interpret(words: tuple[str, ...] | str) -> tuple[str, ...]:
    """The actions of one command (words, or one space-separated string); KeyError if the grammar
    does not generate it."""
    if isinstance(words, str):
        words = tuple(words.split())
    return _meanings()[words]


@functools.cache
def _meanings() -> dict[tuple[str, ...], tuple[str, ...]]:
    return {c.words: c.actions for c in commands()}


COMMAND_WORDS = ("walk", "look", "run", "jump", "turn", "left", "right", "opposite", "around", "twice", "thrice",
                 "and", "after")
ACTIONS = ("WALK", "LOOK", "RUN", "JUMP", "LTURN", "RTURN")


@functools.cache
def action_lengths() -> tuple[int, ...]:
    """The action counts that occur, ascending: 1 .. 22, 24 .. 28, 30, 32, 33, 36, 40, 48."""
    return tuple(sorted({len(c.actions) for c in commands()}))


# ----------------------------------------------------------------------------- the task

SEP, EOS = 1, 2  # after PAD = 0, as in poslab.tasks.decoder_format
SYMBOLS = ("PAD", "SEP", "EOS", *COMMAND_WORDS, *ACTIONS)  # token id -> symbol
WORD_ID = {w: SYMBOLS.index(w) for w in COMMAND_WORDS}
ACTION_ID = {a: SYMBOLS.index(a) for a in ACTIONS}

# (train_range, test_range) in output actions, both inclusive
SPLITS = {
    # Kazemnejad et al. 2023 (McGill-NLP/length-generalization, scripts/dataset_builders/
    # make_scan_dataset.py, split "len_tr25_ts48"): all 20,910 commands (Hugging Face scan/length,
    # train + test) re-split by action count, at most 25 -> training (17,774, of which they hold
    # out a tenth for validation), more -> test (3,136: 26 to 48 actions)
    "kazemnejad": ((1, 25), (26, 48)),
    # Lake & Baroni 2018's length split (brendenlake/SCAN length_split/): 16,990 commands with at
    # most 22 actions train, 3,920 with 24 to 48 test (no command has 23)
    "lake_baroni": ((1, 22), (24, 48)),
}


@dataclass(frozen=True, kw_only=True)
class Scan:
    """SCAN in the decoder form: the command's words, SEP, the actions, EOS; the loss on the actions.

    Length is the number of output actions (the unit both length splits use). ``sample`` draws
    commands uniformly among the enumerated commands whose action count lies in the requested
    length or range (:func:`commands`): a fixed dataset split presented as a length-sampled task.
    Sampling the training range as a pair (L_min, L_max) per sequence gives every training command
    the same chance, as a pass over the split's training file would; one length per batch
    (``sample_steps`` with ``per="batch"``) draws the length uniformly among the lengths that occur
    in the range, then a command of that length. A length (or range) with no command, e.g. 23, is a
    ConfigError naming the lengths that occur.

    ``split`` picks the source's train and test ranges: "kazemnejad" (default, the issue's source:
    train 1..25, test 26..48 actions) or "lake_baroni" (train 1..22, test 24..48). The class
    variables hold Kazemnejad et al.'s; an instance holds its own split's.

    Vocabulary (22): PAD 0, SEP 1, EOS 2, the 13 command words 3..15, the 6 actions 16..21.
    Chance accuracy is 1/7 (a uniform guess over the 6 actions and EOS).

    Worked examples (decoded samples; positions p from 0, each scored position predicts the next token)::

        tokens   jump twice after walk left SEP LTURN WALK JUMP JUMP EOS     4 actions, 11 tokens
        scored   p = 5..9 (SEP .. last JUMP)   targets LTURN WALK JUMP JUMP EOS
        tokens   turn around right SEP RTURN RTURN RTURN RTURN EOS           4 actions, 9 tokens
        scored   p = 3..7                      targets RTURN RTURN RTURN RTURN EOS
        tokens   look SEP LOOK EOS PAD PAD ...                               1 action, 4 tokens
        scored   p = 1..2                      targets LOOK EOS
    """

    name: ClassVar[str] = "scan"
    target_kind: ClassVar[str] = "sequence"
    model_form: ClassVar[str] = "decoder"
    benchmark: ClassVar[str] = "kazemnejad"
    length_unit: ClassVar[str] = "output actions"
    train_range: ClassVar[tuple[int, int]] = SPLITS["kazemnejad"][0]
    test_range: ClassVar[tuple[int, int]] = SPLITS["kazemnejad"][1]

    split: str = "kazemnejad"  # whose length split: "kazemnejad" or "lake_baroni"

    # the lengths a study can train or evaluate at (on the class too): 1..22, 24..28, 30, 32, 33, 36, 40, 48
    occurring_lengths = staticmethod(action_lengths)

    def __post_init__(self):
        check_choice("split", self.split, SPLITS)
        # the chosen split's ranges shadow the class's (Kazemnejad et al.'s) on this instance
        object.__setattr__(self, "train_range", SPLITS[self.split][0])
        object.__setattr__(self, "test_range", SPLITS[self.split][1])

    @property
    def vocab_size(self) -> int:
        return len(SYMBOLS)

    @property
    def chance(self) -> float:
        return 1.0 / (len(ACTIONS) + 1)

    def max_tokens(self, length: int) -> int:
        """The most tokens of a sequence with at most ``length`` actions (words + SEP + actions + EOS)."""
        L = length_range(length)[0]
        return int(_tables("cpu").max_tokens[min(L, MAX_ACTIONS)])

    def validate(self, min_length: int) -> None:
        """Some command must have exactly ``min_length`` actions."""
        L = length_range(min_length)[0]
        if L not in action_lengths():
            raise ConfigError("length", L, _occurring())

    def label(self, tokens: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor]:
        """tokens [b, s], lengths [b] -> targets [b, s] and loss mask [b, s]: next tokens, with the
        output positions' targets recomputed as the meaning of the command before SEP."""
        targets, loss_mask = decoder_label(tokens, lengths, SEP)
        for r, (row, L) in enumerate(zip(tokens.tolist(), lengths.tolist(), strict=True)):
            n = row.index(SEP)
            answer = [ACTION_ID[a] for a in interpret(tuple(SYMBOLS[t] for t in row[:n]))] + [EOS]
            if n + 1 + len(answer) != L:
                raise ValueError(f"sequence {r} has {L - n - 1} tokens after SEP; its command means "
                                 f"{len(answer) - 1} actions and EOS")
            targets[r, n: n + len(answer)] = torch.tensor(answer, device=tokens.device)
        return targets, loss_mask

    def sample(self, generator: torch.Generator, batch_size: int, length: Length) -> Batch:
        lo, hi = length_range(length)
        tables = _tables(str(generator.device))
        first, stop = _span(tables, lo, hi, length)
        i = first + torch.randint(0, stop - first, (batch_size,), generator=generator, device=generator.device)
        return decoder_batch(tables.inputs[i], tables.input_lengths[i], tables.outputs[i], tables.output_lengths[i],
                             sep=SEP, eos=EOS)

    def sample_steps(self, generator: torch.Generator, steps: int, batch_size: int, length: tuple[int, int],
                     per: str = "batch") -> Batch:
        """``steps`` batches stacked, [n, b, s], every one padded to ``max_tokens(hi)``.

        ``per="batch"``: one action count per step, uniform among those that occur in [lo, hi];
        ``per="sequence"``: each sequence uniform among all commands in [lo, hi]."""
        lo, hi = length
        _span(_tables(str(generator.device)), lo, hi, length)
        occurring = torch.tensor([L for L in action_lengths() if lo <= L <= hi])
        width = self.max_tokens(hi)
        parts = []
        for _ in range(steps):
            if per == "batch":
                k = int(torch.randint(0, len(occurring), (1,), generator=generator, device=generator.device))
                batch = self.sample(generator, batch_size, int(occurring[k]))
            else:
                batch = self.sample(generator, batch_size, (lo, hi))
            parts.append(_pad_to(batch, width))
        return Batch(tokens=torch.stack([p.tokens for p in parts]), targets=torch.stack([p.targets for p in parts]),
                     loss_mask=torch.stack([p.loss_mask for p in parts]),
                     lengths=torch.stack([p.lengths for p in parts]))


@dataclass(frozen=True)
class _Tables:
    """Every command as token ids, sorted by action count (ties in :func:`commands` order)."""

    inputs: Tensor  # [N, 9] command word ids, PAD past each command
    input_lengths: Tensor  # [N]
    outputs: Tensor  # [N, 48] action ids, PAD past each sequence
    output_lengths: Tensor  # [N]
    first: Tensor  # [50]: first[L] = index of the first command with >= L actions (first[49] = N)
    max_tokens: Tensor  # [49]: max_tokens[L] = most tokens of a sequence with <= L actions


@functools.cache
def _tables(device: str) -> _Tables:
    ordered = sorted(commands(), key=lambda c: len(c.actions))  # stable: ties keep the grammar's order
    n_words = max(len(c.words) for c in ordered)
    inputs = torch.full((len(ordered), n_words), PAD, dtype=torch.long)
    outputs = torch.full((len(ordered), MAX_ACTIONS), PAD, dtype=torch.long)
    for k, c in enumerate(ordered):
        inputs[k, : len(c.words)] = torch.tensor([WORD_ID[w] for w in c.words])
        outputs[k, : len(c.actions)] = torch.tensor([ACTION_ID[a] for a in c.actions])
    input_lengths = torch.tensor([len(c.words) for c in ordered])
    output_lengths = torch.tensor([len(c.actions) for c in ordered])
    first = torch.searchsorted(output_lengths, torch.arange(MAX_ACTIONS + 2))
    tokens = input_lengths + output_lengths + 2  # [N]
    most = torch.zeros(MAX_ACTIONS + 1, dtype=torch.long).scatter_reduce(0, output_lengths, tokens, "amax")
    to = lambda x: x.to(device)  # noqa: E731
    return _Tables(to(inputs), to(input_lengths), to(outputs), to(output_lengths), first,
                   torch.cummax(most, 0).values)


def _span(tables: _Tables, lo: int, hi: int, length: object) -> tuple[int, int]:
    """[first, stop) of the commands with lo..hi actions; ConfigError when there are none."""
    first, stop = int(tables.first[min(lo, MAX_ACTIONS + 1)]), int(tables.first[min(hi, MAX_ACTIONS) + 1])
    if stop <= first:
        raise ConfigError("length", length, _occurring())
    return first, stop


def _occurring() -> str:
    return "a length or range holding some command's action count: " + ", ".join(map(str, action_lengths()))


def _pad_to(batch: Batch, width: int) -> Batch:
    """Right-pad a decoder batch's tokens, targets and mask to ``width`` positions."""
    extra = width - batch.tokens.shape[1]
    pad = lambda x, v: torch.nn.functional.pad(x, (0, extra), value=v)  # noqa: E731
    return Batch(tokens=pad(batch.tokens, PAD), targets=pad(batch.targets, PAD),
                 loss_mask=pad(batch.loss_mask, False), lengths=batch.lengths)
