"""The Chomsky-hierarchy length-generalization tasks (Delétang et al. 2023; Ruoss et al. 2023).

Fifteen tasks in the sources' encoder form (:mod:`poslab.tasks.chomsky.format`): regular
(:mod:`.regular`), context-free (:mod:`.context_free`) and context-sensitive
(:mod:`.context_sensitive`), each registered in :data:`poslab.tasks.TASKS` under the sources'
task name.
"""

from poslab.tasks.chomsky.context_free import ModularArithmeticBrackets, ReverseString, SolveEquation, StackManipulation
from poslab.tasks.chomsky.context_sensitive import (
    BinaryAddition,
    BinaryMultiplication,
    BucketSort,
    ComputeSqrt,
    DuplicateString,
    MissingDuplicateString,
    OddsFirst,
)
from poslab.tasks.chomsky.regular import CycleNavigation, EvenPairs, ModularArithmetic, ParityCheck

REGULAR = (EvenPairs, ModularArithmetic, ParityCheck, CycleNavigation)
CONTEXT_FREE = (StackManipulation, ReverseString, ModularArithmeticBrackets, SolveEquation)
CONTEXT_SENSITIVE = (DuplicateString, MissingDuplicateString, OddsFirst, BinaryAddition, BinaryMultiplication,
                     ComputeSqrt, BucketSort)

__all__ = ["CONTEXT_FREE", "CONTEXT_SENSITIVE", "REGULAR", "BinaryAddition", "BinaryMultiplication", "BucketSort",
           "ComputeSqrt", "CycleNavigation", "DuplicateString", "EvenPairs", "MissingDuplicateString",
           "ModularArithmetic", "ModularArithmeticBrackets", "OddsFirst", "ParityCheck", "ReverseString",
           "SolveEquation", "StackManipulation"]
