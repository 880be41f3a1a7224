"""MetricSink: derived metrics computed by crossrl, ``budget.stop_at_target`` and ``budget.train_seconds``."""

from __future__ import annotations

import time

import pytest

from crossrl.adapters.base import ListSink
from crossrl.scenarios import metrics as M
from crossrl.scenarios.loader import validate


def trial(*, stop: bool, target: float | None = 100.0):
    raw = {
        "name": "t",
        "env": {"id": "CartPole-v1"},
        "algorithm": {"name": "ppo"},
        "engines": ["crossrl"],
        "budget": {"env_steps": 1000, "stop_at_target": stop},
        "target": {"episode_return_mean": target},
    }
    return validate(raw, label="t.yaml").trials()[0]


def test_points_carry_means_of_the_episodes_since_the_last_point() -> None:
    sink = ListSink(trial(stop=False))
    sink.start_clock()
    sink.point(env_steps_sampled=100, episode_returns=[10.0, 30.0], episode_lengths=[10, 30])
    sink.point(env_steps_sampled=200)
    first, second = sink.points
    assert first[M.EPISODE_RETURN_MEAN] == 20.0 and first[M.EPISODES_THIS_POINT] == 2
    assert first[M.EPISODE_LEN_MEAN] == 20.0
    assert M.EPISODE_RETURN_MEAN not in second and second[M.EPISODES_TOTAL] == 2
    assert second[M.SAMPLE_THROUGHPUT] > 0


@pytest.mark.parametrize("stop", [True, False])
def test_stop_at_target_ends_the_trial_at_the_first_point_reaching_it(stop: bool) -> None:
    sink = ListSink(trial(stop=stop))
    sink.point(env_steps_sampled=100, episode_returns=[99.0])
    assert not sink.exhausted
    sink.point(env_steps_sampled=200, episode_returns=[150.0, 60.0])  # mean 105 >= 100
    assert sink.target_reached
    assert sink.exhausted is stop
    sink.point(env_steps_sampled=1000)
    assert sink.exhausted


def test_without_a_target_only_the_budget_ends_the_trial() -> None:
    sink = ListSink(trial(stop=True, target=None))
    sink.point(env_steps_sampled=100, episode_returns=[1e9])
    assert not sink.exhausted and not sink.target_reached


def test_a_time_budget_ends_the_trial_on_a_point_at_or_past_it() -> None:
    raw = {"name": "t", "env": {"id": "CartPole-v1"}, "algorithm": {"name": "ppo"}, "engines": ["crossrl"],
           "budget": {"train_seconds": 0.2}}  # fmt: skip
    sink = ListSink(validate(raw, label="t.yaml").trials()[0])
    sink.start_clock()
    sink.point(env_steps_sampled=100)
    time.sleep(0.25)  # the time has passed since the last point, which was before it
    assert sink.train_s >= 0.2 and not sink.exhausted
    sink.point(env_steps_sampled=200)
    assert sink.exhausted and sink.points[-1][M.WALL_TIME_S] >= 0.2
