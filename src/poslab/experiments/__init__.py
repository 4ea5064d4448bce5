"""The engine: it runs whatever :class:`Experiment` it is handed and never imports a study.

    config      typed study configs, presets' grids, ``--set`` overrides
    experiment  Experiment, Member, MemberContext: grid points x seeds, resolved to a task and a model
    preflight   validate(): every check on user input, before any work
    training    a group trained as one ensemble and its members evaluated; variants; re-evaluation
    schedule    the CPU cost model that shares groups out among workers
    executors   where groups train (inline, worker processes, Ray), behind one protocol
    runner      run_study (one study, resumable) and run (what ``poslab run`` does)
    spec        claims as data (ClaimSpec, measures, where-clauses); claims: verdicts and their text
    outputs     tables and figures as declarations, one writer for every study's outputs
    stages      stored work beyond evaluation (a search, a fine-tune), keyed and resumable

The studies, one module per published artefact, and the kit they share live in
:mod:`poslab.studies`, which is where names are resolved.
"""

from poslab.experiments.experiment import (
    Experiment,
    Member,
    MemberContext,
    inapplicable,
    members,
    no_member_rows,
    variant_members,
)
from poslab.experiments.preflight import validate
from poslab.experiments.runner import run, run_study
from poslab.experiments.training import evaluate_members

__all__ = ["Experiment", "Member", "MemberContext", "evaluate_members", "inapplicable", "members", "no_member_rows",
           "run", "run_study", "validate", "variant_members"]
