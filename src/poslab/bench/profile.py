"""``poslab bench profile``: where one study's wall time goes, phase by phase."""

from __future__ import annotations

import time
from pathlib import Path

import torch

from poslab.experiments.config import apply_overrides

# ----------------------------------------------------------------------------- where a study's time goes

# The phases of one study, in the order they first happen. The trainer and the runner time them
# with perf_counter spans at their boundaries (train.PhaseTimer); spans never nest, so the phases
# never count a second twice; "other" is the wall time no span covers (the loss curve, progress
# bars, Python between the spans).
PHASES = ("setup", "sampling", "forward", "backward", "optimizer", "evaluation", "variants", "store",
          "tables and figures")
TRAINING = ("sampling", "forward", "backward", "optimizer")


def bench_profile(experiment: str, *, preset: str = "paper", overrides: tuple[str, ...] = (),
                  device: str = "cpu", echo=print) -> dict:
    """Run one study inline (one process, its groups one after another) in a fresh temporary
    store, and split its wall time into PHASES: seconds, share of the wall time, and ms per
    member-step (trained members x steps; for the evaluation phases, their cost spread over
    the same member-steps). The spans read the clock only: the run computes what it computes
    untimed (tests/test_train.py)."""
    import tempfile

    from poslab.errors import ConfigError
    from poslab.experiments import Trained, run_study, validate
    from poslab.experiments.executors import Inline
    from poslab.store import Store
    from poslab.studies import get_experiment
    from poslab.train import PhaseTimer

    exp = get_experiment(experiment)
    if not isinstance(exp, Trained):
        raise ConfigError("experiment", experiment, "a study that trains members (this one only evaluates "
                                                    "a pretrained checkpoint)")
    study = apply_overrides(exp.study(preset), list(overrides), fixed=exp.fixed)
    trained = validate(study, device, exp)
    timer = PhaseTimer(sync=torch.cuda.synchronize if device == "cuda" else None)
    with tempfile.TemporaryDirectory(prefix="poslab-profile-") as tmp, Store(Path(tmp) / "s.sqlite") as store:
        start = time.perf_counter()
        summary = run_study(exp, study, store=store, out=Path(tmp) / "out", device=device, progress=False,
                            executor=Inline(), timer=timer)
        wall = time.perf_counter() - start
    seconds = {phase: timer.seconds.get(phase, 0.0) for phase in PHASES}
    seconds["other"] = wall - sum(seconds.values())
    member_steps = len(trained) * study.train.steps
    rows = [dict(phase=p, seconds=s, share=s / wall, ms_per_member_step=1e3 * s / member_steps)
            for p, s in seconds.items()]
    rows.append(dict(phase="wall", seconds=wall, share=1.0, ms_per_member_step=1e3 * wall / member_steps))
    echo(f"{experiment} --preset {preset}{''.join(f' --set {o}' for o in overrides)}: {len(trained)} trained "
         f"members x {study.train.steps} steps = {member_steps:,} member-steps, {summary['variants']} "
         f"evaluate-only variants; inline on {device}, {torch.get_num_threads()} thread(s)")
    echo(f"  {'phase':<20} {'seconds':>9} {'share':>7} {'ms/member-step':>15}")
    for r in rows:
        echo(f"  {r['phase']:<20} {r['seconds']:9.2f} {100 * r['share']:6.1f}% {r['ms_per_member_step']:15.4f}")
    return dict(experiment=experiment, preset=preset, wall=wall, members=len(trained), steps=study.train.steps,
                member_steps=member_steps, rows=rows)
