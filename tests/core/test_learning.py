"""Learning targets of issue 3 (2 remote evaluators; slow: only in `make learning-tests`).

Run one case by hand: ``.venv/bin/pytest -m learning tests/core/test_learning.py -k "ppo and CartPole" -s``.
Each case prints env steps and wall seconds to target per seed; the target is checked against the
mean return of the episodes completed since the previous point (the common metric).
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from typing import Any

import pytest
import ray

from crossrl.adapters.base import ListSink
from crossrl.adapters.crossrl import CrossrlAdapter
from crossrl.core import cluster
from crossrl.core import metrics as M
from crossrl.scenarios.spec import ScenarioSpec

pytestmark = pytest.mark.learning

# (algorithm, env, target return, env-step budget, hyperparameter overrides)
CASES: list[tuple[str, str, float, int, dict[str, Any]]] = [
    ("ppo", "CartPole-v1", 450.0, 100_000, {}),
    ("a2c", "CartPole-v1", 400.0, 300_000, {}),
    ("a3c", "CartPole-v1", 400.0, 300_000, {}),
    ("impala", "CartPole-v1", 400.0, 500_000, {}),
    ("ppo", "Pendulum-v1", -300.0, 500_000, {}),
]
SEEDS = (0, 1, 2)


@pytest.fixture(scope="module", autouse=True)
def ray_cluster() -> Iterator[None]:
    cluster.connect(None, num_cpus=2)
    yield
    ray.shutdown()


def learn(
    algorithm: str, env_id: str, *, target: float, budget: int, seed: int, envs_per_worker: int = 4, **hp: Any
) -> dict[str, float]:
    """One trial through the adapter; returns steps/wall seconds to target (nan when missed) and the best return."""
    spec = ScenarioSpec.model_validate(
        {
            "name": f"learn-{algorithm}",
            "env": {"id": env_id},
            "algorithm": {"name": algorithm, "hyperparams": hp},
            "engines": ["crossrl"],
            "execution": {"workers": 2, "envs_per_worker": envs_per_worker},
            "budget": {"env_steps": budget, "wall_seconds": 3600},
            "target": {"episode_return_mean": target},
            "seeds": [seed],
        }
    )
    trial = spec.trials()[0]

    class StopAtTarget(ListSink):
        reached = False

        @property
        def exhausted(self) -> bool:
            return self.reached or super().exhausted

        def _emit(self, message: dict[str, Any]) -> None:
            super()._emit(message)
            if message["kind"] == "point" and message["values"].get(M.EPISODE_RETURN_MEAN, -math.inf) >= target:
                self.reached = True

    sink = StopAtTarget(trial)
    t0 = time.perf_counter()
    CrossrlAdapter().run(trial, sink)
    hit = next((p for p in sink.points if p.get(M.EPISODE_RETURN_MEAN, -math.inf) >= target), None)
    returns = [p[M.EPISODE_RETURN_MEAN] for p in sink.points if M.EPISODE_RETURN_MEAN in p]
    result = {
        "steps_to_target": hit[M.ENV_STEPS_SAMPLED] if hit else math.nan,
        "wall_s_to_target": hit[M.WALL_TIME_S] if hit else math.nan,
        "best_return": max(returns) if returns else math.nan,
        "env_steps": sink.points[-1][M.ENV_STEPS_SAMPLED],
        "run_s": time.perf_counter() - t0,
    }
    print(f"{algorithm} {env_id} seed={seed}: {result}", flush=True)
    return result


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize(("algorithm", "env_id", "target", "budget", "hp"), CASES, ids=lambda c: str(c))
def test_reaches_target(algorithm: str, env_id: str, target: float, budget: int, hp: dict[str, Any], seed: int) -> None:
    result = learn(algorithm, env_id, target=target, budget=budget, seed=seed, **hp)
    assert result["steps_to_target"] <= budget, f"{algorithm} on {env_id} seed {seed} missed {target}: {result}"
