"""`crossrl evaluate` reloads each engine's trained policy from its trial's final checkpoint and plays it without
training: a table of returns with CIs, the figures stored as the trial run's evaluate.* tags; a trial without a
checkpoint is one line and exit 2."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from crossrl.reports.store import ResultsStore

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


@pytest.mark.parametrize("engine", ["crossrl", "rllib", "torchrl"])
def test_evaluate_reloads_the_final_policy_of_each_engine(engine: str, tmp_path: Path, results_dir: Path) -> None:
    _run(tmp_path, results_dir, engine)
    store = ResultsStore(None, results_dir=results_dir)
    (trial_run,) = store.children(store.parent_runs(f"ev-{engine}")[0])
    last_step = store.points_of(trial_run.info.run_id)[-1][0]
    assert last_step >= 2000
    for args in ([f"ev-{engine}", "--episodes", "3"], [trial_run.info.run_id, "--episodes", "2", "--sample"]):
        out = _evaluate(results_dir, *args)
        assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
        assert f"{engine}-ppo-w1-s0" in out.stdout and f"{last_step:,}" in out.stdout  # the final checkpoint's
    tags = store.client.get_run(trial_run.info.run_id).data.tags
    assert tags["evaluate.episodes"] == "2" and tags["evaluate.mode"] == "sample"
    assert 1 <= float(tags["evaluate.return_mean"]) <= 500
    assert float(tags["evaluate.ci_low"]) <= float(tags["evaluate.return_mean"]) <= float(tags["evaluate.ci_high"])


def test_a_trial_without_a_checkpoint_is_one_line(tmp_path: Path, results_dir: Path) -> None:
    _run(tmp_path, results_dir, "crossrl", every_seconds=None, final=False)
    out = _evaluate(results_dir, "ev-crossrl")
    assert out.returncode == 2 and "Traceback" not in out.stderr
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "crossrl-ppo-w1-s0" in lines[0] and "has no checkpoint" in lines[0], lines
    assert _evaluate(results_dir, "no-such-scenario").returncode == 2
