"""Synthetic tasks: pure samplers with worked examples, a plain-dict registry.

``TASKS`` maps the names used on the command line to task classes (frozen dataclasses whose
fields are the task's options). Build one with :func:`build_task`; draw a fixed evaluation set
with :func:`eval_batch`. Installed packages add tasks through the ``poslab.tasks`` entry points
(:mod:`poslab.plugins`), loaded when this module is imported.
"""

from __future__ import annotations

import dataclasses

from poslab import plugins
from poslab.errors import ConfigError
from poslab.tasks import kazemnejad as kz
from poslab.tasks import kazemnejad_math as kzm
from poslab.tasks.base import Batch, Length, Task, eval_batch, eval_seed, length_range
from poslab.tasks.chomsky import context_free as cf
from poslab.tasks.chomsky import context_sensitive as cs
from poslab.tasks.chomsky import regular as rg
from poslab.tasks.digit_addition import DigitAddition
from poslab.tasks.induction import Induction
from poslab.tasks.passkey import PasskeyText
from poslab.tasks.retrieval import ContentConditioned, FixedOffset
from poslab.tasks.scan import Scan
from poslab.tasks.shift import Shift
from poslab.tasks.text import CharText

TASKS: dict[str, type] = {
    "fixed_offset": FixedOffset,
    "content_conditioned": ContentConditioned,
    "shift": Shift,
    "induction": Induction,
    "text": CharText,
    "passkey": PasskeyText,
    "scan": Scan,
    "copy": kz.Copy,
    "reverse": kz.Reverse,
    "addition": kzm.Addition,
    "sort": kz.Sort,
    "summation": kzm.Summation,
    "parity": kzm.Parity,
    "polynomial_evaluation": kzm.PolynomialEvaluation,
    "even_pairs": rg.EvenPairs,
    "modular_arithmetic": rg.ModularArithmetic,
    "parity_check": rg.ParityCheck,
    "cycle_navigation": rg.CycleNavigation,
    "stack_manipulation": cf.StackManipulation,
    "reverse_string": cf.ReverseString,
    "modular_arithmetic_brackets": cf.ModularArithmeticBrackets,
    "solve_equation": cf.SolveEquation,
    "duplicate_string": cs.DuplicateString,
    "missing_duplicate_string": cs.MissingDuplicateString,
    "odds_first": cs.OddsFirst,
    "binary_addition": cs.BinaryAddition,
    "binary_multiplication": cs.BinaryMultiplication,
    "compute_sqrt": cs.ComputeSqrt,
    "bucket_sort": cs.BucketSort,
    "digit_addition": DigitAddition,  # position coupling / Abacus / index hints formats (Batch.positions)
}


def _is_task(obj: object) -> bool:
    return isinstance(obj, type) and dataclasses.is_dataclass(obj) and callable(getattr(obj, "sample", None))


# plugins (poslab.plugins): installed packages' tasks join the registry on import
TASKS.update(plugins.load("tasks", TASKS, _is_task, "a task class (a dataclass with a sample method)"))


def task_options(name: str) -> dict[str, object]:
    """The options a task takes, with their defaults."""
    if name not in TASKS:
        raise ConfigError("task", name, sorted(TASKS))
    return {f.name: f.default for f in dataclasses.fields(TASKS[name])}


def build_task(name: str, **options) -> Task:
    """Validate the name and option names, then build; option values are checked by the task."""
    allowed = task_options(name)
    for key in options:
        if key not in allowed:
            raise ConfigError(f"task.{key}", key, sorted(allowed) or "no options")
    return TASKS[name](**options)


__all__ = ["TASKS", "Batch", "CharText", "ContentConditioned", "FixedOffset", "Length", "PasskeyText", "Shift", "Task",
           "build_task", "eval_batch", "eval_seed", "length_range", "task_options"]
