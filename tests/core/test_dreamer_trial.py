"""crossrl's DreamerV3 end to end on the crossrl engine: real Ray evaluators on CartPole, sequence replay on the
driver, updates at the training ratio, metrics through a ListSink (continuous actions: tests/core/test_dreamer_policy.py,
on the policy itself)."""

from __future__ import annotations

from typing import Any

import pytest

from crossrl.adapters.base import ListSink
from crossrl.adapters.crossrl import CrossrlAdapter
from crossrl.scenarios import metrics as M
from crossrl.scenarios.spec import ScenarioSpec, Trial

pytestmark = pytest.mark.usefixtures("ray_cluster")

# 4 sequences of 16 steps per update, 4 replayed steps per env step: one update per 16 env steps
TINY = {"model_size": "nano", "batch_size_B": 4, "batch_length_T": 16, "training_ratio": 4.0, "horizon_H": 5}


def make_trial(env_id: str = "CartPole-v1", *, env_steps: int = 400, workers: int = 2, **hp: Any) -> Trial:
    spec = ScenarioSpec.model_validate(
        {
            "name": "crossrl-dreamer-test",
            "env": {"id": env_id},
            "algorithm": {"name": "dreamer", "hyperparams": {**TINY, **hp}},
            "engines": ["crossrl"],
            "execution": {"workers": [workers], "envs_per_worker": 1},
            "budget": {"env_steps": env_steps},
            # a point per 100 env steps, so that a 400-step run reports several
            "native": {"crossrl": {"settings": {"steps_per_iteration": 100}}},
            "seeds": [3],
        }
    )
    return spec.trials()[0]


def test_a_tiny_run_replays_at_the_training_ratio() -> None:
    trial = make_trial()
    sink = ListSink(trial)
    CrossrlAdapter().run(trial, sink)
    points = sink.points
    assert len(points) >= 3 and points[-1][M.ENV_STEPS_SAMPLED] >= 400, sink.messages[-3:]
    last = points[-1]
    for name in (M.POLICY_LOSS, M.VALUE_LOSS, M.ENTROPY, M.DIAG_WORLD_MODEL_LOSS, M.DIAG_UPDATES):
        assert name in last, sorted(last)
    # learning starts after 4 x 16 env steps; then one update of 64 replayed steps per 16 sampled
    sampled = last[M.ENV_STEPS_SAMPLED]
    assert (sampled - 64) / 16 - 2 <= last[M.DIAG_UPDATES] <= sampled / 16
    assert any(M.EPISODE_RETURN_MEAN in p for p in points)
