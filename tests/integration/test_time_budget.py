"""Two checks on one run of every engine (one `crossrl run`, three trials):

- a trial budgeted in training seconds (`budget.train_seconds`) ends FINISHED once that time has passed, having
  reported points while it trained, and the report shows every engine's return after the same training time;
- reward clipping (``env.reward_clip``): learners see sign(reward), reports keep the raw score. The env is a real
  CartPole that scores 3 points per step (tests/support/score_env.py), so every reported episode return must be 3 x
  the episode's length (a clipped return would equal the length). Where each engine clips is held by the unit tests
  beside it (tests/unit/test_reward_clip.py).

(They were two runs of three trials each; one run checks both: the clipping does not depend on the budget's kind.)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from crossrl.reports.store import ResultsStore
from crossrl.scenarios import metrics as M

pytestmark = [pytest.mark.integration, pytest.mark.system]  # three engines' trials, about a minute: `make test-system`
TRAIN_S = 6.0
SUPPORT = Path(__file__).parents[1] / "support"


def test_a_time_budget_ends_each_trial_after_its_training_time_and_clipped_rewards_report_raw_scores(
    tmp_path: Path, results_dir: Path
) -> None:
    spec = {
        "name": "time-budget",
        "env": {"id": "score_env:ScoredCartPole-v0", "reward_clip": True},
        # short iterations: points come while the trial trains, even on a loaded machine
        "algorithm": {"name": "ppo", "hyperparams": {"train_batch": 512, "minibatch": 256, "epochs": 1}},
        "engines": ["crossrl", "rllib", "torchrl"],
        "execution": {"workers": [1], "envs_per_worker": 2},
        "budget": {"train_seconds": TRAIN_S},
        "seeds": [0],
    }
    path = tmp_path / "time-budget.yaml"
    path.write_text(yaml.safe_dump(spec))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(SUPPORT), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run(
        [sys.executable, "-m", "crossrl.cli", "run", str(path), "--results-dir", str(results_dir), "-o",
         str(tmp_path / "report")],
        capture_output=True, text=True, timeout=900, env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    loaded = ResultsStore(None, results_dir=results_dir).load(scenario="time-budget")
    assert sorted(loaded.trials.engine) == ["crossrl", "rllib", "torchrl"]
    for row in loaded.trials.to_dict("records"):
        assert row["status"] == "FINISHED", row["reason"]
        hist = loaded.points[loaded.points.run_id == row["run_id"]]
        wall = hist[hist.metric == M.WALL_TIME_S].value
        assert wall.max() >= TRAIN_S, f"{row['trial']} stopped after {wall.max():.1f} s of training"
        assert wall[wall < TRAIN_S].size > 0  # it reported points while it trained, not one at the end
        # the raw score, not the clipped one the learner saw
        wide = hist.pivot_table(index="step", columns="metric", values="value", aggfunc="last")
        both = wide[[M.EPISODE_RETURN_MEAN, M.EPISODE_LEN_MEAN]].dropna()
        assert len(both) >= 1, f"{row['trial']}: no episode ended"
        for step, (ret, length) in both.iterrows():
            assert ret == pytest.approx(3.0 * length, rel=1e-6), (
                f"{row['trial']} at {step}: return {ret}, length {length}"
            )
    report = json.loads((tmp_path / "report" / "report.json").read_text())
    at_wall = report["return_at_wall"]
    assert {r["engine"] for r in at_wall} == {"crossrl", "rllib", "torchrl"}
    assert len({r["wall_s"] for r in at_wall}) == 1 and at_wall[0]["wall_s"] >= TRAIN_S
