"""Benchmarks (not tests), one module per ``poslab bench`` command, and the plain reference models
they time poslab against.

    train           Table 1 training as ``poslab run`` does it, against a plain loop; the ensemble step's cost fit
    parity          ensemble = solo on a device (weights bit for bit on CPU)
    lm              one character-LM step, poslab against PlainGPT; matmul FLOPs and rate
    floor           a study's training FLOPs over this CPU's matmul rate
    eval_head       the retrieval head's streamed evaluation to 10^6 positions
    eval_lm         the character LM's position-wise loss, streamed, at long lengths
    profile         where one study's wall time goes
    pretrained      a checkpoint's position-wise loss against its own forward
    job_memory      the peak memory of one job of an evaluate-only study, beside its declared peak
    ensemble        a study preset's training as ensembles against the plain loop (the benchmark's cpu preset)
    plain           PlainGPT, the LM written plainly (nanoGPT style)
    measure         a measured child process (peak memory = its working set)
"""

from poslab.bench.ensemble import bench_ensemble
from poslab.bench.eval_head import bench_eval
from poslab.bench.eval_lm import bench_eval_lm
from poslab.bench.floor import bench_floor, step_flops
from poslab.bench.job_memory import bench_job_memory
from poslab.bench.lm import bench_lm, lm_step_flops, matmul_gflops
from poslab.bench.measure import start_measured
from poslab.bench.parity import bench_parity
from poslab.bench.plain import PlainGPT
from poslab.bench.pretrained import bench_pretrained
from poslab.bench.profile import PHASES, bench_profile
from poslab.bench.train import bench_train, ensemble_scaling

__all__ = ["PHASES", "PlainGPT", "bench_eval", "bench_eval_lm", "bench_floor", "bench_job_memory",
           "bench_ensemble", "bench_lm", "bench_parity", "bench_pretrained", "bench_profile", "bench_train",
           "ensemble_scaling", "lm_step_flops", "matmul_gflops", "start_measured", "step_flops"]
