"""Reasoning and long-context code tasks over text (RULER style), for character and pretrained models.

The survey's long-context evaluation goes past the single passkey (``poslab.tasks.passkey``) to
tasks that need more than one lookup. Each task here is defined once over *text*: a generator
returns an :class:`Example` (a prompt and its expected answer), so the same example runs on a
character-level model (its characters) and on a pretrained model (through its tokenizer,
:func:`evaluate_pretrained`). Scoring is exact match of a greedy continuation (:func:`score`).

Tasks (``TASKS``), each ``generate(task, length, depth, seed, **params)``:

- ``multikey``: ``keys`` key-value needles ("The special magic number for qzfkwa is: 4821307.")
  planted through filler; one key is asked. ``depth`` places the asked needle, the others are
  uniform. Answer: its 7-digit value.
- ``multivalue``: ``values`` needles with the same key; all its values are asked, in text order.
  ``depth`` places the first one, the others are uniform after it. Answer "v1, v2, v3".
- ``vartrack``: variable tracking: ``VAR QWERT = 48213.`` then ``VAR ASDFG = QWERT.`` ... a chain
  of ``hops`` assignments through filler, with ``chains - 1`` distractor chains of other values;
  asked which variables hold the value. ``depth`` places the chain's first assignment. Answer:
  the chain's names in order, space-separated.
- ``brackets``: ``nesting`` openers left open (each of ( [ { <) spread through filler, the
  outermost at ``depth`` (its distance to the question is about (1 - depth) L), with ``groups``
  balanced distractor groups such as "[ ( ) ]" between them. ``ask="all"``: the closers of all
  open brackets, innermost first ("> ] )"); ``ask="outermost"``: the closer of the first opener.
- ``code``: ``functions`` small definitions ``def f_abcd(x):`` / ``    return x * 3 + 7`` (the
  window's filler is more such definitions, nothing else), then ``print(f_abcd(5))  # prints`` asking the
  value of a call whose definition sits at ``depth`` (definition-to-use distance (1 - depth) L).

The filler is whole neutral sentences (code: distractor definitions), so no filler character is
a digit or a bracket. ``length`` is in characters: the prompt has at most ``length`` characters
and at least ``length`` minus one filler sentence (a pretrained tokenizer makes roughly a quarter
as many tokens of English). A length too short for the inserts and the question is refused with
a ConfigError. The same (task, length, depth, seed, params) always gives the same text
(``random.Random`` seeded by their string).

Worked examples (seed 0; answers start with a space, as a continuation would)::

    generate("multikey", 240, 0.0, 0, keys=2)
        prompt  "The special magic number for fdatyq is: 7791861. There and back again. The special
                 magic number for grydci is: 9683992. A bird sings in the morning. What is the special
                 magic number for fdatyq? The special magic number for fdatyq is:"
        answer  " 7791861"
    generate("brackets", 200, 0.0, 0, nesting=3, groups=1)
        prompt  "{ [ The road is long and quiet. { } There and back again. The grass is green. ( The
                 sky is blue. Here we go. Question: write the brackets that close every bracket still
                 open, innermost first. Answer:"
        answer  " ) ] }"
    generate("code", 130, 0.0, 0, functions=2)
        prompt  "def f_rhyq(x):\n    return x * 2 + 42\ndef f_tbbs(x):\n    return x * 3 + 12\n"
                "print(f_rhyq(6))  # prints"
        answer  " 54"

Notation: L the requested length in characters, d the depth in [0, 1].
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field

import torch

from poslab.errors import ConfigError, check_choice

FILLER = ("The grass is green.", "The sky is blue.", "The sun is yellow.", "Here we go.", "There and back again.",
          "The river runs to the sea.", "A bird sings in the morning.", "The road is long and quiet.")
KEY_NEEDLE = "The special magic number for {key} is: {value}."
OPENERS, CLOSERS = "([{<", ")]}>"
ASKS = ("all", "outermost")


@dataclass(frozen=True)
class Example:
    """One prompt and the exact answer a greedy continuation must start with."""

    task: str
    prompt: str
    answer: str  # starts with a space: the continuation right after the prompt
    length: int  # the requested length L (characters); len(prompt) <= L
    depth: float
    seed: int
    params: dict = field(default_factory=dict)


# ----------------------------------------------------------------------------- layout helpers

def _check(task: str, length, depth, seed) -> None:
    check_choice("task", task, TASKS)
    if not isinstance(length, int) or isinstance(length, bool) or length < 1:
        raise ConfigError("length", length, "an integer >= 1 (characters)")
    if not isinstance(depth, (int, float)) or isinstance(depth, bool) or not 0 <= depth <= 1:
        raise ConfigError("depth", depth, "a number in [0, 1]")
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise ConfigError("seed", seed, "an integer")


def _count(name: str, value, lo: int, hi: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
        raise ConfigError(name, value, f"an integer in [{lo}, {hi}]")
    return value


def _layout(rng: random.Random, length: int, inserts: list[tuple[float, str]], question: str,
            filler=None, sep: str = " ") -> str:
    """Whole filler pieces up to ``length`` characters with each insert (depth, text) placed at the
    piece boundary nearest depth x (filler characters); inserts at equal depth keep list order."""
    filler = filler or (lambda r: r.choice(FILLER))
    fixed = sum(len(t) + 1 for _, t in inserts) + len(question)
    room = length - fixed
    if room < 0:
        raise ConfigError("length", length, f"at least {fixed} characters for these inserts and the question")
    pieces, used = [], 0
    while True:
        piece = filler(rng)
        if used + len(piece) + 1 > room:
            break
        pieces.append(piece)
        used += len(piece) + 1
    bounds = [0]  # characters of filler before boundary i
    for p in pieces:
        bounds.append(bounds[-1] + len(p) + 1)
    at: dict[int, list[str]] = {}
    for d, text in inserts:
        i = min(range(len(bounds)), key=lambda j: (abs(bounds[j] - d * used), j))
        at.setdefault(i, []).append(text)
    parts = []
    for i in range(len(pieces) + 1):
        parts.extend(at.get(i, []))
        if i < len(pieces):
            parts.append(pieces[i])
    return sep.join(parts) + (sep if parts else "") + question


def _names(rng: random.Random, n: int, k: int, alphabet: str, taken=()) -> list[str]:
    out: list[str] = []
    seen = set(taken)
    while len(out) < n:
        name = "".join(rng.choice(alphabet) for _ in range(k))
        if name not in seen:
            seen.add(name)
            out.append(name)
    return out


def _after(rng: random.Random, depth: float, n: int) -> list[float]:
    """depth, then n - 1 sorted uniform depths in [depth, 1]."""
    return [depth] + sorted(rng.uniform(depth, 1) for _ in range(n - 1))


# ----------------------------------------------------------------------------- the tasks

def _multikey(rng, length, depth, keys: int = 4):
    _count("keys", keys, 1, 64)
    names = _names(rng, keys, 6, "abcdefghijklmnopqrstuvwxyz")
    values = [str(rng.randrange(10 ** 6, 10 ** 7)) for _ in names]
    inserts = [(depth, KEY_NEEDLE.format(key=names[0], value=values[0]))]
    inserts += [(rng.random(), KEY_NEEDLE.format(key=k, value=v)) for k, v in zip(names[1:], values[1:], strict=True)]
    question = (f"What is the special magic number for {names[0]}? "
                f"The special magic number for {names[0]} is:")
    return _layout(rng, length, sorted(inserts, key=lambda x: x[0]), question), " " + values[0]


def _multivalue(rng, length, depth, values: int = 3):
    _count("values", values, 1, 64)
    key = _names(rng, 1, 6, "abcdefghijklmnopqrstuvwxyz")[0]
    vals = [str(rng.randrange(10 ** 6, 10 ** 7)) for _ in range(values)]
    inserts = [(d, KEY_NEEDLE.format(key=key, value=v)) for d, v in zip(_after(rng, depth, values), vals, strict=True)]
    question = f"What are all the special magic numbers for {key}? In order, they are:"
    return _layout(rng, length, inserts, question), " " + ", ".join(vals)


def _vartrack(rng, length, depth, hops: int = 3, chains: int = 2):
    _count("hops", hops, 1, 32)
    _count("chains", chains, 1, 8)
    names = _names(rng, hops * chains, 5, "ABCDEFGHIJKLMNOPQRSTUVWXYZ")
    values = [str(v) for v in rng.sample(range(10 ** 4, 10 ** 5), chains)]
    inserts = []
    for c in range(chains):
        chain = names[c * hops:(c + 1) * hops]
        depths = _after(rng, depth, hops) if c == 0 else sorted(rng.random() for _ in range(hops))
        texts = [f"VAR {chain[0]} = {values[c]}."] + [f"VAR {b} = {a}." for a, b in zip(chain, chain[1:], strict=False)]
        inserts += list(zip(depths, texts, strict=True))
    inserts.sort(key=lambda x: x[0])  # stable: a chain's own statements keep their order
    question = f"Question: which variables are assigned the value {values[0]}? Answer:"
    return _layout(rng, length, inserts, question), " " + " ".join(names[:hops])


def _brackets(rng, length, depth, nesting: int = 3, groups: int = 2, ask: str = "all"):
    _count("nesting", nesting, 1, 32)
    _count("groups", groups, 0, 32)
    check_choice("ask", ask, ASKS)
    opened = [rng.randrange(4) for _ in range(nesting)]
    inserts = [(d, OPENERS[o]) for d, o in zip(_after(rng, depth, nesting), opened, strict=True)]
    for _ in range(groups):  # balanced groups: they never change which brackets stay open
        inner = [rng.randrange(4) for _ in range(rng.randint(1, 3))]
        text = " ".join([OPENERS[i] for i in inner] + [CLOSERS[i] for i in reversed(inner)])
        inserts.append((rng.uniform(depth, 1), text))
    inserts.sort(key=lambda x: x[0])
    if ask == "all":
        question = "Question: write the brackets that close every bracket still open, innermost first. Answer:"
        answer = " " + " ".join(CLOSERS[o] for o in reversed(opened))
    else:
        question = "Question: which bracket closes the first bracket still open? Answer:"
        answer = " " + CLOSERS[opened[0]]
    return _layout(rng, length, inserts, question), answer


def _code(rng, length, depth, functions: int = 8, arg: int | None = None):
    _count("functions", functions, 1, 4096)
    names = _names(rng, functions, 4, "abcdefghijklmnopqrstuvwxyz")
    taken = set(names)

    def define(name):
        return f"def f_{name}(x):\n    return x * {rng.randint(2, 9)} + {rng.randint(1, 99)}"

    target = define(names[0])
    others = [define(n) for n in names[1:]]
    extra = iter(_names(rng, 4096, 4, "abcdefghijklmnopqrstuvwxyz", taken))  # filler: more distractors
    inserts = [(depth, target)] + [(rng.random(), o) for o in others]
    inserts.sort(key=lambda x: x[0])
    x = rng.randint(1, 9) if arg is None else _count("arg", arg, 0, 999)
    a, b = map(int, re.findall(r"\d+", target.split(":", 1)[1]))
    question = f"print(f_{names[0]}({x}))  # prints"
    return _layout(rng, length, inserts, question, filler=lambda r: define(next(extra)), sep="\n"), f" {x * a + b}"


TASKS = {"multikey": _multikey, "multivalue": _multivalue, "vartrack": _vartrack, "brackets": _brackets,
         "code": _code}


def generate(task: str, length: int, depth: float, seed: int = 0, **params) -> Example:
    """One example of ``task``: at most ``length`` characters, its key insert at ``depth``."""
    _check(task, length, depth, seed)
    rng = random.Random(f"{task}|{length}|{float(depth)!r}|{seed}|{sorted(params.items())!r}")
    try:
        prompt, answer = TASKS[task](rng, length, float(depth), **params)
    except TypeError as e:  # an unknown parameter name
        import inspect

        allowed = [p for p in inspect.signature(TASKS[task]).parameters if p not in ("rng", "length", "depth")]
        raise ConfigError("params", sorted(params), f"parameters of {task}: {', '.join(allowed)}") from e
    return Example(task=task, prompt=prompt, answer=answer, length=length, depth=float(depth), seed=seed,
                   params=dict(params))


def grid(task: str, lengths, depths, trials: int = 1, seed: int = 0, **params) -> list[Example]:
    """The depth x length grid (as the passkey's): ``trials`` examples per (length, depth), the
    trial's seed ``seed * 1000 + trial``; every argument is checked before any text is made."""
    lengths, depths = list(lengths), list(depths)
    _count("trials", trials, 1, 1000)
    for L in lengths:
        for d in depths:
            _check(task, L, d, seed)
    return [generate(task, L, d, seed * 1000 + t, **params) for L in lengths for d in depths for t in range(trials)]


def score(answer: str | Example, generated: str) -> float:
    """Exact match: 1.0 if the continuation, leading whitespace dropped, starts with the answer and
    does not run on into a letter or digit ("48213" matches "48213." but not "482130"); else 0.0."""
    want = (answer.answer if isinstance(answer, Example) else answer).strip()
    got = generated.lstrip()
    if not got.startswith(want):
        return 0.0
    rest = got[len(want):]
    return float(not (rest and rest[0].isalnum()))


# ----------------------------------------------------------------------------- pretrained evaluation

@torch.no_grad()
def greedy_text(model, prompt_ids: torch.Tensor, n_new: int) -> list[int]:
    """Greedy decoding through ``model(tokens) -> logits`` (no cache: each step reruns the window)."""
    tokens = prompt_ids[None]
    out = []
    for _ in range(n_new):
        nxt = model(tokens)[0, -1].argmax()
        out.append(int(nxt))
        tokens = torch.cat([tokens, nxt.view(1, 1)], dim=1)
    return out


def evaluate_pretrained(model, examples: list[Example], *, extra_tokens: int = 2) -> list[dict]:
    """Zero-shot exact match of each example on a pretrained model (greedy, its tokenizer, no BOS):
    one row per example with the prompt's token count, the continuation and ``exact``."""
    from poslab.pretrained.model import decode_tokens, encode_text

    rows = []
    for ex in examples:
        ids = encode_text(model, ex.prompt)
        n_new = len(encode_text(model, ex.answer)) + extra_tokens
        text = decode_tokens(model, greedy_text(model, ids, n_new))
        rows.append(dict(task=ex.task, length=ex.length, depth=ex.depth, seed=ex.seed, prompt_tokens=len(ids),
                         answer=ex.answer.strip(), output=text, exact=score(ex, text)))
    return rows
