"""The engine: it runs whatever :class:`Experiment` it is handed and never imports a study.

    config      typed study configs, presets' grids, ``--set`` overrides
    experiment  Trained and EvaluateOnly studies (an Experiment each); Member, MemberContext: grid points x
                seeds, resolved to a task and a model; Job: a member of an evaluate-only study (a pretrained
                checkpoint: nothing trained)
    preflight   validate(): every check on user input, before any work
    training    a group trained as one ensemble and its members evaluated; variants; re-evaluation; jobs
    schedule    the CPU cost model that shares groups out among workers
    executors   where groups train (inline, worker processes, Ray), behind one protocol
    runner      run_study (one study, resumable; run_jobs: an evaluate-only one) and run (what ``poslab run`` does)
    spec        claims as data (ClaimSpec, measures, where-clauses); claims: verdicts and their text
    outputs     tables and figures as declarations, one writer for every study's outputs
    stages      stored work beyond evaluation (a search, a fine-tune), keyed and resumable

The studies, one module per published artefact, and the kit they share live in
:mod:`poslab.studies`, which is where names are resolved.
"""

from poslab.experiments.experiment import (
    EvaluateOnly,
    Experiment,
    Job,
    Member,
    MemberContext,
    Trained,
    describe,
    inapplicable,
    members,
    variant_members,
)
from poslab.experiments.preflight import validate
from poslab.experiments.runner import run, run_jobs, run_study

__all__ = ["EvaluateOnly", "Experiment", "Job", "Member", "MemberContext", "Trained", "describe", "inapplicable",
           "members", "run", "run_jobs", "run_study", "validate", "variant_members"]
