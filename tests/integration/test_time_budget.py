"""A trial budgeted in training seconds (`budget.train_seconds`) ends FINISHED once that time has passed, on
every engine, and the report shows every engine's return after the same training time."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from crossrl.reports.store import ResultsStore
from crossrl.scenarios import metrics as M

pytestmark = [pytest.mark.integration, pytest.mark.system]  # three engines' trials, about 2 min: `make test-system`
TRAIN_S = 6.0


def test_a_time_budget_ends_each_trial_finished_after_its_training_time(tmp_path: Path) -> None:
    spec = {
        "name": "time-budget",
        "env": {"id": "CartPole-v1"},
        # short iterations: points come while the trial trains, even on a loaded machine
        "algorithm": {"name": "ppo", "hyperparams": {"train_batch": 512, "minibatch": 256, "epochs": 1}},
        "engines": ["crossrl", "rllib", "torchrl"],
        "budget": {"train_seconds": TRAIN_S},
        "seeds": [0],
    }
    path = tmp_path / "time-budget.yaml"
    path.write_text(yaml.safe_dump(spec))
    results = tmp_path / "results"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "crossrl.cli",
            "run",
            str(path),
            "--results-dir",
            str(results),
            "-o",
            str(tmp_path / "report"),
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    loaded = ResultsStore(None, results_dir=results).load(scenario="time-budget")
    assert sorted(loaded.trials.engine) == ["crossrl", "rllib", "torchrl"]
    for row in loaded.trials.to_dict("records"):
        assert row["status"] == "FINISHED", row["reason"]
        wall = loaded.points[(loaded.points.run_id == row["run_id"]) & (loaded.points.metric == M.WALL_TIME_S)].value
        assert wall.max() >= TRAIN_S, f"{row['trial']} stopped after {wall.max():.1f} s of training"
        assert wall[wall < TRAIN_S].size > 0  # it reported points while it trained, not one at the end
    report = json.loads((tmp_path / "report" / "report.json").read_text())
    at_wall = report["return_at_wall"]
    assert {r["engine"] for r in at_wall} == {"crossrl", "rllib", "torchrl"}
    assert len({r["wall_s"] for r in at_wall}) == 1 and at_wall[0]["wall_s"] >= TRAIN_S
