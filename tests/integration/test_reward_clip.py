"""Reward clipping (``env.reward_clip``) on every engine: learners see sign(reward), reports keep the raw score.

Each engine runs PPO on a real CartPole that scores 3 points per step (tests/support/score_env.py) with
``reward_clip: true``: every reported episode return must be the raw score, 3 x the episode's length (a
clipped return would equal the length). Where each engine clips is held by the unit tests beside it
(tests/unit/test_reward_clip.py).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from crossrl.adapters.registry import engine_ids
from crossrl.orchestration.runner import run_scenario
from crossrl.reports.store import ResultsStore
from crossrl.scenarios import metrics as M
from crossrl.scenarios.loader import validate

pytestmark = [pytest.mark.integration, pytest.mark.system]  # a scenario on every engine

SUPPORT = Path(__file__).parents[1] / "support"


@pytest.mark.long
def test_every_engine_reports_raw_scores_while_learning_on_clipped_rewards(
    results_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(SUPPORT), os.environ.get("PYTHONPATH")])))
    raw = {
        "name": "reward-clip-test",
        "env": {"id": "score_env:ScoredCartPole-v0", "reward_clip": True},
        "algorithm": {"name": "ppo", "hyperparams": {"train_batch": 512, "minibatch": 128, "epochs": 1}},
        "engines": ["crossrl", "rllib", "torchrl"],
        "execution": {"workers": [1], "envs_per_worker": 2},
        "budget": {"env_steps": 1536, "wall_seconds": 300},
        "seeds": [0],
    }
    spec = validate(raw, label="reward-clip.yaml", engines=engine_ids())
    store = ResultsStore(None, results_dir=results_dir)
    outcome = run_scenario(spec, store=store)
    loaded = store.load(scenario="reward-clip-test")
    for r in outcome.results:
        assert r.status == "FINISHED", f"{r.trial.name}: {r.reason}"
        hist = loaded.points[loaded.points.run_id == r.run_id]
        wide = hist.pivot_table(index="step", columns="metric", values="value", aggfunc="last")
        both = wide[[M.EPISODE_RETURN_MEAN, M.EPISODE_LEN_MEAN]].dropna()
        assert len(both) >= 1, f"{r.trial.name}: no episode ended"
        for step, (ret, length) in both.iterrows():
            assert ret == pytest.approx(3.0 * length, rel=1e-6), (
                f"{r.trial.name} at {step}: return {ret}, length {length}"
            )
