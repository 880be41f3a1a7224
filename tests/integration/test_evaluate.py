"""`crossrl evaluate` on a trial without a checkpoint, or on nothing: one line and exit 2. (Reloading each engine's
final policy: tests/faults/test_checkpoint_resume.py.)"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.integration
CLI = [sys.executable, "-m", "crossrl.cli"]


def _run(tmp_path: Path, results: Path, engine: str, **checkpoint: object) -> None:
    spec = {
        "name": f"ev-{engine}",
        "env": {"id": "CartPole-v1"},
        "algorithm": {"name": "ppo", "hyperparams": {"train_batch": 500, "minibatch": 250, "epochs": 2}},
        "engines": [engine],
        "budget": {"env_steps": 2000, "wall_seconds": 240},
        "checkpoint": checkpoint,
    }
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    out = subprocess.run(
        [*CLI, "run", str(path), "--results-dir", str(results), "--no-report"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]


def _evaluate(results: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, "evaluate", *args, "--results-dir", str(results)], capture_output=True, text=True, timeout=300
    )


@pytest.mark.system  # a whole run first, then `crossrl evaluate` on it
def test_a_trial_without_a_checkpoint_is_one_line(tmp_path: Path, results_dir: Path) -> None:
    _run(tmp_path, results_dir, "crossrl", every_seconds=None, final=False)
    out = _evaluate(results_dir, "ev-crossrl")
    assert out.returncode == 2 and "Traceback" not in out.stderr
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "crossrl-ppo-w1-s0" in lines[0] and "has no checkpoint" in lines[0], lines
    assert _evaluate(results_dir, "no-such-scenario").returncode == 2
