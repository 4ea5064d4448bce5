"""scripts/gpu_check.sh, the prepared GPU run of issue 19, as a dry run on CPU (QUICK=1 DEVICE=cpu):
every step runs and exits 0, so a session lent a GPU can run it as it is."""

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_prepared_gpu_script_runs_every_step_on_cpu(tmp_path):
    env = {**os.environ, "QUICK": "1", "DEVICE": "cpu", "PYTHON": sys.executable}
    done = subprocess.run(["bash", "scripts/gpu_check.sh", str(tmp_path / "out")], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    summary = (tmp_path / "out" / "summary.txt").read_text().splitlines()
    steps = ["environment", "parity", "lm", "lm_eval", "lengthgen", "lm_init", "pretrained"]
    assert [line.split(":")[0] for line in summary] == steps
    assert all(": exit 0," in line for line in summary[:6]), summary
    assert "bit for bit" in (tmp_path / "out" / "parity.log").read_text()
    assert (tmp_path / "out" / "lm" / "claims.json").exists() and (tmp_path / "out" / "lm_eval.png").exists()
    # issue 56's two: the lengthgen gpu preset (shrunk to one member) and the LM with model.init=normal
    assert (tmp_path / "out" / "lengthgen" / "claims.json").exists()
    with sqlite3.connect(tmp_path / "out" / "store.sqlite") as db:
        configs = [json.loads(c) for (c,) in db.execute("SELECT config_json FROM runs WHERE experiment = 'lm'")]
    assert sorted(c["model"].get("init", "torch") for c in configs).count("normal") == 1, configs
