"""MuJoCo continuous control on every engine: SAC on HalfCheetah-v5 through `crossrl run` (the real runner, a
results store, the report), a few hundred env steps each; and `crossrl evaluate` acting with each engine's mean
action on the checkpoints the run wrote."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

CROSSRL = [sys.executable, "-c", "import sys; from crossrl.cli import main; sys.argv[0] = 'crossrl'; main()"]

SPEC = {
    "name": "mujoco-smoke",
    "env": {"id": "HalfCheetah-v5"},
    "algorithm": {
        "name": "sac",
        "hyperparams": {"learning_starts": 200, "train_batch": 32, "buffer_size": 5000, "updates_per_step": 0.25},
        "model": {"hidden": [32, 32]},
    },
    "engines": ["crossrl", "rllib", "torchrl"],
    "execution": {"workers": [1], "envs_per_worker": 1},
    "budget": {"env_steps": 1000, "wall_seconds": 600},
    "seeds": [0],
}


def crossrl(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CROSSRL, *args], cwd=cwd, env=dict(os.environ), capture_output=True, text=True, timeout=900)


@pytest.mark.system
@pytest.mark.long
def test_sac_on_halfcheetah_runs_and_evaluates_on_every_engine(tmp_path: Path) -> None:
    spec = tmp_path / "mujoco-smoke.yaml"
    spec.write_text(yaml.safe_dump(SPEC))
    results = tmp_path / "results"
    out = crossrl("run", str(spec), "--results-dir", str(results), cwd=tmp_path)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert out.stdout.count("FINISHED, 1,000 env steps") == 3 and "FAILED" not in out.stdout, out.stdout[-3000:]
    evaluated = crossrl("evaluate", "mujoco-smoke", "--results-dir", str(results), "--episodes", "1", cwd=tmp_path)
    assert evaluated.returncode == 0, evaluated.stdout[-3000:] + evaluated.stderr[-3000:]
    for engine in ("crossrl", "rllib", "torchrl"):
        assert f"{engine}-sac-w1-s0" in evaluated.stdout, evaluated.stdout
