"""Learning: DQN and Ape-X on CartPole-v1 with 2 workers reach the issue's targets within budget.

DQN: return >= 400 within 150k env steps; Ape-X: >= 400 within 300k. A run counts as reaching the
target at the first point (one per ~1000 env steps) whose mean return over the episodes completed
since the previous point is >= 400, which is how the runner computes ``steps_to_target``. Each trial
stops there. Run with ``pytest -m learning -s tests/core/test_replay_learning.py`` (minutes per seed).
"""

from __future__ import annotations

from typing import Any

import pytest

from crossrl.adapters.base import ListSink
from crossrl.adapters.crossrl import CrossrlAdapter
from crossrl.scenarios import metrics as M
from crossrl.scenarios.spec import ScenarioSpec, Trial

pytestmark = [pytest.mark.learning, pytest.mark.integration]

TARGET = 400.0
# The scenario a learning run uses (what `make learning-tests` should reproduce): hyperparameters not
# set here take the catalog's defaults.
SETTINGS: dict[str, dict[str, Any]] = {
    "dqn": {
        "budget": 150_000,
        # Prioritized replay: the slowest of seeds 0-2 reached 400 at 63k env steps with it, 133k without.
        "hyperparams": {"lr": 5.0e-4, "n_step": 3, "replay_ratio": 8.0, "prioritized_replay": True},
        "model": {"hidden": [64, 64], "activation": "relu"},
    },
    "apex": {
        "budget": 300_000,
        "hyperparams": {"lr": 5.0e-4, "replay_ratio": 8.0},
        "model": {"hidden": [64, 64], "activation": "relu"},
    },
}


class _Reached(Exception):
    """Raised from the adapter's per-iteration hook to end a trial once the target is reached."""


def make_trial(algorithm: str, seed: int) -> Trial:
    s = SETTINGS[algorithm]
    spec = ScenarioSpec.model_validate(
        {
            "name": f"learning-{algorithm}",
            "env": {"id": "CartPole-v1"},
            "algorithm": {"name": algorithm, "hyperparams": s["hyperparams"], "model": s["model"]},
            "engines": ["crossrl"],
            "execution": {"workers": 2, "envs_per_worker": 4},
            "budget": {"env_steps": s["budget"], "wall_seconds": 1800},
            "target": {"episode_return_mean": TARGET},
            "seeds": [seed],
        }
    )
    return spec.trials()[0]


def run_to_target(trial: Trial) -> tuple[float | None, float | None, float]:
    """(env steps, wall seconds) at the first point reaching the target (None, None if never) and the best return."""
    sink = ListSink(trial)

    def stop_at_target(_: int, __: Any) -> None:
        last = sink.points[-1]
        if last.get(M.EPISODE_RETURN_MEAN, float("-inf")) >= TARGET:
            raise _Reached

    try:
        CrossrlAdapter(on_iteration=stop_at_target).run(trial, sink)
    except _Reached:
        pass
    best = max((p.get(M.EPISODE_RETURN_MEAN, float("-inf")) for p in sink.points), default=float("-inf"))
    for p in sink.points:
        if p.get(M.EPISODE_RETURN_MEAN, float("-inf")) >= TARGET:
            return p[M.ENV_STEPS_SAMPLED], p[M.WALL_TIME_S], best
    return None, None, best


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("algorithm", ["dqn", "apex"])
def test_reaches_target(algorithm: str, seed: int, record_property: Any) -> None:
    trial = make_trial(algorithm, seed)
    steps, wall_s, best = run_to_target(trial)
    record_property("env_steps_to_target", steps)
    record_property("wall_s_to_target", wall_s)
    print(f"\n{algorithm} seed {seed}: env steps to {TARGET}: {steps}, wall s: {wall_s}, best return {best:.1f}")
    assert steps is not None, f"{algorithm} seed {seed} never reached {TARGET} in {trial.budget.env_steps} env steps"
    assert steps <= trial.budget.env_steps
