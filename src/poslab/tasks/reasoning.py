"""Reasoning and long-context code tasks over text (RULER style), for character and pretrained models.

The survey's long-context evaluation goes past the single passkey (``poslab.tasks.passkey``) to
tasks that need more than one lookup. Each task here is defined once over *text*: a generator
returns an :class:`Example` (a prompt and its expected answer), so the same example runs on a
character-level model (its characters) and on a pretrained model (through its tokenizer,
:func:`poslab.pretrained.zero_shot.zero_shot_rows`). Scoring is exact match of a greedy continuation (:func:`score`).

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
import string
from collections.abc import Callable
from dataclasses import dataclass, field

from poslab.errors import ConfigError, check_choice

FILLER = ("The grass is green.", "The sky is blue.", "The sun is yellow.", "Here we go.", "There and back again.",
          "The river runs to the sea.", "A bird sings in the morning.", "The road is long and quiet.")
LOWER, UPPER, DIGITS = string.ascii_lowercase, string.ascii_uppercase, string.digits  # names and values
OPENERS, CLOSERS = "([{<", ")]}>"
SEPARATORS = (" ", "\n", ", ")  # between filler pieces (code: lines), between answer items
ASKS = ("all", "outermost")
# Every template of a form; "compact" says the same in fewer characters, so that the tasks fit the
# 64-character windows a character LM trains on (poslab.tasks.passkey's reasoning mixture).
FORMS = {
    "prose": dict(
        needle="The special magic number for {key} is: {value}.",
        ask_key="What is the special magic number for {key}? The special magic number for {key} is:",
        ask_values="What are all the special magic numbers for {key}? In order, they are:",
        assign="VAR {name} = {value}.",
        ask_vars="Question: which variables are assigned the value {value}? Answer:",
        ask_all="Question: write the brackets that close every bracket still open, innermost first. Answer:",
        ask_outermost="Question: which bracket closes the first bracket still open? Answer:",
        define="def f_{name}(x):\n    return x * {a} + {b}",
        call="print(f_{name}({x}))  # prints"),
    "compact": dict(
        needle="{key}: {value}.", ask_key="{key}:", ask_values="{key} all:",
        assign="{name} = {value}.", ask_vars="vars = {value}:",
        ask_all="close:", ask_outermost="close first:",
        define="f_{name}(x) = x*{a}+{b}", call="f_{name}({x}) ="),
}
KEY_NEEDLE = FORMS["prose"]["needle"]


def characters() -> str:
    """Every character a generator can emit, sorted: the literal text of every template of every
    form, the filler, the separators, and the alphabets names, values and brackets are drawn from."""
    literal = "".join(text for form in FORMS.values() for template in form.values()
                      for text, *_ in string.Formatter().parse(template))
    return "".join(sorted(set(literal + "".join(FILLER) + "".join(SEPARATORS) + LOWER + UPPER + DIGITS
                              + OPENERS + CLOSERS)))


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

def _form(form: str) -> dict:
    check_choice("form", form, FORMS)
    return FORMS[form]


def _multikey(rng, length, depth, keys: int = 4, form: str = "prose"):
    _count("keys", keys, 1, 64)
    t = _form(form)
    names = _names(rng, keys, 6, LOWER)
    values = [str(rng.randrange(10 ** 6, 10 ** 7)) for _ in names]
    inserts = [(depth, t["needle"].format(key=names[0], value=values[0]))]
    inserts += [(rng.random(), t["needle"].format(key=k, value=v)) for k, v in zip(names[1:], values[1:], strict=True)]
    question = t["ask_key"].format(key=names[0])
    return _layout(rng, length, sorted(inserts, key=lambda x: x[0]), question), " " + values[0]


def _multivalue(rng, length, depth, values: int = 3, form: str = "prose"):
    _count("values", values, 1, 64)
    t = _form(form)
    key = _names(rng, 1, 6, LOWER)[0]
    vals = [str(rng.randrange(10 ** 6, 10 ** 7)) for _ in range(values)]
    inserts = [(d, t["needle"].format(key=key, value=v)) for d, v in zip(_after(rng, depth, values), vals, strict=True)]
    return _layout(rng, length, inserts, t["ask_values"].format(key=key)), " " + ", ".join(vals)


def _vartrack(rng, length, depth, hops: int = 3, chains: int = 2, form: str = "prose"):
    _count("hops", hops, 1, 32)
    _count("chains", chains, 1, 8)
    t = _form(form)
    names = _names(rng, hops * chains, 5, UPPER)
    values = [str(v) for v in rng.sample(range(10 ** 4, 10 ** 5), chains)]
    inserts = []
    for c in range(chains):
        chain = names[c * hops:(c + 1) * hops]
        depths = _after(rng, depth, hops) if c == 0 else sorted(rng.random() for _ in range(hops))
        texts = [t["assign"].format(name=chain[0], value=values[c])]
        texts += [t["assign"].format(name=b, value=a) for a, b in zip(chain, chain[1:], strict=False)]
        inserts += list(zip(depths, texts, strict=True))
    inserts.sort(key=lambda x: x[0])  # stable: a chain's own statements keep their order
    return _layout(rng, length, inserts, t["ask_vars"].format(value=values[0])), " " + " ".join(names[:hops])


def _brackets(rng, length, depth, nesting: int = 3, groups: int = 2, ask: str = "all", form: str = "prose"):
    _count("nesting", nesting, 1, 32)
    _count("groups", groups, 0, 32)
    check_choice("ask", ask, ASKS)
    t = _form(form)
    opened = [rng.randrange(4) for _ in range(nesting)]
    inserts = [(d, OPENERS[o]) for d, o in zip(_after(rng, depth, nesting), opened, strict=True)]
    for _ in range(groups):  # balanced groups: they never change which brackets stay open
        inner = [rng.randrange(4) for _ in range(rng.randint(1, 3))]
        text = " ".join([OPENERS[i] for i in inner] + [CLOSERS[i] for i in reversed(inner)])
        inserts.append((rng.uniform(depth, 1), text))
    inserts.sort(key=lambda x: x[0])
    if ask == "all":
        question, answer = t["ask_all"], " " + " ".join(CLOSERS[o] for o in reversed(opened))
    else:
        question, answer = t["ask_outermost"], " " + CLOSERS[opened[0]]
    return _layout(rng, length, inserts, question), answer


def _code(rng, length, depth, functions: int = 8, arg: int | None = None, form: str = "prose"):
    _count("functions", functions, 1, 4096)
    t = _form(form)
    names = _names(rng, functions, 4, LOWER)
    taken = set(names)

    def define(name):
        a, b = rng.randint(2, 9), rng.randint(1, 99)
        return t["define"].format(name=name, a=a, b=b), a, b

    target, a, b = define(names[0])
    others = [define(n)[0] for n in names[1:]]
    extra = iter(_names(rng, 4096, 4, LOWER, taken))  # filler: more distractors
    inserts = [(depth, target)] + [(rng.random(), o) for o in others]
    inserts.sort(key=lambda x: x[0])
    x = rng.randint(1, 9) if arg is None else _count("arg", arg, 0, 999)
    question = t["call"].format(name=names[0], x=x)
    return _layout(rng, length, inserts, question, filler=lambda r: define(next(extra))[0], sep="\n"), f" {x * a + b}"


TASKS: dict[str, Callable[..., tuple[str, str]]] = {
    "multikey": _multikey, "multivalue": _multivalue, "vartrack": _vartrack, "brackets": _brackets, "code": _code}


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


# The character LM's settings: the compact form, counts small enough that prompt and answer fit a
# 64-character window (a char-LM study's L0) with room for filler; see ``fitted``.
CHAR_PARAMS = {"multikey": dict(keys=2, form="compact"), "multivalue": dict(values=2, form="compact"),
               "vartrack": dict(hops=2, chains=1, form="compact"),
               "brackets": dict(nesting=3, groups=1, form="compact"), "code": dict(functions=2, form="compact")}


def fitted(task: str, total: int, depth: float, seed: int = 0, **params) -> Example | None:
    """An example whose prompt and answer together hold at most ``total`` characters (a window
    that ends with the answer), or None when the task's inserts and question cannot fit. The
    requested length is lowered by the overshoot until it fits, so ``Example.length`` may be below
    ``total``; the same arguments always give the same example."""
    room = total
    while room >= 1:
        try:
            ex = generate(task, room, depth, seed, **params)
        except ConfigError as e:
            if e.field == "length":
                return None
            raise
        over = len(ex.prompt) + len(ex.answer) - total
        if over <= 0:
            return ex
        room -= over
    return None


def score(answer: str | Example, generated: str) -> float:
    """Exact match: 1.0 if the continuation, leading whitespace dropped, starts with the answer and
    does not run on into a letter or digit ("48213" matches "48213." but not "482130"); else 0.0."""
    want = (answer.answer if isinstance(answer, Example) else answer).strip()
    got = generated.lstrip()
    if not got.startswith(want):
        return 0.0
    rest = got[len(want):]
    return float(not (rest and rest[0].isalnum()))
