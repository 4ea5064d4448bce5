"""``poslab bench floor``: a study's training matmul FLOPs over this CPU's rate, the floor no
engine on this machine goes below."""

from __future__ import annotations

import torch

from poslab.bench.lm import matmul_gflops
from poslab.experiments import members as study_members


def step_flops(model, batches) -> float:
    """Mean matmul FLOPs of one training step of ``model`` (forward and backward of ``model.loss``)
    over ``batches``, by torch's FlopCounterMode: matmuls and attention kernels it knows;
    element-wise work, gathers and the optimizer are not counted, so this is a lower bound."""
    from torch.utils.flop_counter import FlopCounterMode

    total, n = 0.0, 0
    for batch in batches:
        with FlopCounterMode(display=False) as counter:
            model.loss(batch).backward()
        total, n = total + counter.get_total_flops(), n + 1
    return total / max(n, 1)


def bench_floor(experiments: tuple[str, ...] = ("all",), *, preset: str = "paper", batches: int = 10,
                echo=print) -> dict:
    """The arithmetic floor of training ``experiments`` at ``preset`` on this machine: each trained
    group's matmul FLOPs per member-step (mean over ``batches`` of its first member's own batches)
    x members x steps, over this process's float32 matmul rate on all its threads. No schedule
    trains them faster; evaluation, element-wise work and per-op overheads come on top."""
    from poslab.experiments import Trained
    from poslab.studies import PAPER_STUDIES, get_experiment
    from poslab.train import DataStream, build_member

    names = [n for e in experiments for n in (PAPER_STUDIES if e == "all" else (e,))]
    exps = {n: get_experiment(n) for n in names}  # an unknown name stops here, before any work
    rate = matmul_gflops() * 1e9
    rows, total = [], 0.0
    for name, exp in exps.items():
        if not isinstance(exp, Trained):
            echo(f"{name}: trains nothing (a pretrained checkpoint), skipped")
            continue
        groups: dict[str, list] = {}
        for m in study_members(name, exp.study(preset)):
            if m.variant is None:  # evaluate-only variants train nothing
                groups.setdefault(m.group_key(), []).append(m)
        flops = 0.0
        for group in groups.values():
            first, cfg = group[0], group[0].study.train
            stream = DataStream(first.task, first.seed, cfg)
            per_step = step_flops(build_member(first.make_model(), first.seed), (stream.next() for _ in range(batches)))
            flops += per_step * cfg.steps * len(group)
        rows.append(dict(experiment=name, groups=len(groups), members=sum(map(len, groups.values())), flops=flops,
                         floor_s=flops / rate))
        total += flops
        echo(f"{name}: {rows[-1]['members']} trained members in {len(groups)} group(s), {flops / 1e12:.3f} TFLOP of "
             f"matmuls: at least {flops / rate:.0f} s")
    echo(f"all of them: {total / 1e12:.2f} TFLOP at {rate / 1e9:.1f} GFLOP/s (float32 1024^3 matmul, "
         f"{torch.get_num_threads()} thread(s)): at least {total / rate:.0f} s of training")
    return dict(rows=rows, flops=total, gflops=rate / 1e9, floor_s=total / rate)
