"""DQN (sync replay) and Ape-X (async replay) a few iterations on CartPole with 2 remote evaluators,
through the crossrl adapter, checking the metrics they report; one evaluator is killed mid-run."""

from __future__ import annotations

import time
from typing import Any

import crossrl_trials
import pytest
import ray

from crossrl.adapters.base import ListSink
from crossrl.adapters.crossrl import CrossrlAdapter
from crossrl.core import algorithms
from crossrl.core.evaluator import EvaluatorSet
from crossrl.core.optimizers.async_replay import AsyncReplayOptimizer
from crossrl.core.policy import PolicySpec
from crossrl.core.q_policy import QPolicy
from crossrl.scenarios import metrics as M
from crossrl.scenarios.catalog import CROSSRL_SETTINGS
from crossrl.scenarios.spec import Trial

FAST = {"learning_starts": 200, "target_update": 200, "buffer_size": 5000}


pytestmark = pytest.mark.usefixtures("ray_cluster")


def make_trial(algorithm: str, *, env_steps: int, optimizer: str | None = None, **hp: Any) -> Trial:
    return crossrl_trials.make_trial(algorithm, env_steps=env_steps, optimizer=optimizer, envs_per_worker=2, **hp)


def kill_first_evaluator_after_first_point(i: int, evaluators: EvaluatorSet) -> None:
    if i == 0:
        ray.kill(evaluators.remotes[0], no_restart=True)


def run(trial: Trial, *, steps_per_iteration: int, monkeypatch: pytest.MonkeyPatch) -> ListSink:
    """Run through the adapter with ``steps_per_iteration`` (a crossrl-only setting, not a spec field) lowered.

    Evaluator 1 is killed after the first point: the run must finish and count the restart.
    """
    settings = {**CROSSRL_SETTINGS[trial.algorithm], "steps_per_iteration": steps_per_iteration}
    monkeypatch.setitem(CROSSRL_SETTINGS, trial.algorithm, settings)
    sink = ListSink(trial)
    CrossrlAdapter(on_iteration=kill_first_evaluator_after_first_point).run(trial, sink)
    return sink


def check_points(sink: ListSink) -> list[dict[str, float]]:
    points = sink.points
    assert len(points) >= 3
    steps = [p[M.ENV_STEPS_SAMPLED] for p in points]
    assert steps == sorted(steps) and steps[-1] >= sink.trial.budget.env_steps
    for p in points:
        for key in (*M.REQUIRED_POINT_METRICS[:2], M.EPISODES_TOTAL, M.SAMPLE_THROUGHPUT, M.WORKER_RESTARTS):
            assert key in p, f"{key} missing from {sorted(p)}"
        assert p[M.SAMPLE_THROUGHPUT] > 0
    assert points[0][M.WORKER_RESTARTS] == 0 and points[-1][M.WORKER_RESTARTS] == 1
    returns = [p for p in points if M.EPISODE_RETURN_MEAN in p]
    assert returns and all(1 <= p[M.EPISODE_RETURN_MEAN] <= 500 for p in returns)
    assert all(p[M.EPISODE_RETURN_MEAN] == pytest.approx(p[M.EPISODE_LEN_MEAN]) for p in returns)
    # Past learning_starts the driver trains and reports the TD loss as the value loss.
    assert M.VALUE_LOSS in points[-1] and points[-1][M.VALUE_LOSS] >= 0
    assert points[-1][M.ENV_STEPS_TRAINED] > 0
    assert points[-1][M.TIME_SAMPLE_S] > 0 and points[-1][M.TIME_LEARN_S] > 0
    return points


def test_dqn_sync_replay_reports_common_metrics(monkeypatch: pytest.MonkeyPatch) -> None:
    trial = make_trial("dqn", env_steps=1200, replay_ratio=2.0, **FAST)
    points = check_points(run(trial, steps_per_iteration=400, monkeypatch=monkeypatch))
    # replay_ratio 2 after learning_starts: trained = 2 x (sampled - ~200), in whole batches of 32.
    last = points[-1]
    assert last[M.ENV_STEPS_TRAINED] % 32 == 0
    assert 2 * (last[M.ENV_STEPS_SAMPLED] - 250) - 32 <= last[M.ENV_STEPS_TRAINED] <= 2 * last[M.ENV_STEPS_SAMPLED]


def test_apex_async_replay_reports_common_metrics(monkeypatch: pytest.MonkeyPatch) -> None:
    trial = make_trial("apex", env_steps=1500, replay_ratio=1.0, **FAST)
    points = check_points(run(trial, steps_per_iteration=400, monkeypatch=monkeypatch))
    # The learner never trains more than replay_ratio (1.0) x sampled transitions.
    assert all(p[M.ENV_STEPS_TRAINED] <= p[M.ENV_STEPS_SAMPLED] for p in points)


def async_replay(trial: Trial, policy_cls: Any, *, num_remote: int) -> tuple[AsyncReplayOptimizer, EvaluatorSet]:
    """The trial's algorithm under async_replay, ``num_remote`` evaluators of 2 envs, a point per 300 env steps."""
    hp = {**algorithms.load(trial.algorithm).hyperparams(trial.hyperparams), "steps_per_iteration": 300}
    evaluators = EvaluatorSet(
        env_spec=trial.env,
        num_envs=2,
        policy_factory=PolicySpec(policy_cls=policy_cls, hyperparams=hp, model=trial.model),
        num_remote=num_remote,
        seed=0,
    )
    return AsyncReplayOptimizer(evaluators, hyperparams=hp), evaluators


def test_apex_shards_fill_from_workers_and_epsilons_differ() -> None:
    opt, evaluators = async_replay(make_trial("apex", env_steps=1, **FAST), QPolicy, num_remote=2)
    try:
        stats = [opt.step() for _ in range(3)]
        sampled = sum(s.env_steps_sampled for s in stats)
        eps = ray.get([r.apply.remote(lambda ev: float(ev.policy.epsilon)) for r in evaluators.remotes])
        # Workers push to shards themselves; their last pushes may land just after the driver's count.
        deadline = time.monotonic() + 10.0
        while sum(sizes := opt.replay_sizes()) < sampled and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        opt.stop()
        evaluators.stop()
    assert eps == pytest.approx([0.4, 0.4**8])
    assert len(sizes) == 2 and all(s > 0 for s in sizes)
    # Every counted transition reached a shard (tasks launched after the last step may add more).
    assert sum(sizes) >= sampled


def pendulum_sac(*, optimizer: str, env_steps: int) -> Trial:
    """SAC on Pendulum-v1, 2 remote evaluators x 2 envs, a 32x32 MLP, a tiny replay."""
    from crossrl.scenarios.spec import ScenarioSpec

    hp = {"learning_starts": 200, "train_batch": 32, "buffer_size": 5000, "updates_per_step": 0.5}
    spec = ScenarioSpec.model_validate(
        {
            "name": "test-sac",
            "env": {"id": "Pendulum-v1"},
            "algorithm": {"name": "sac", "hyperparams": hp, "model": {"hidden": [32, 32]}},
            "engines": ["crossrl"],
            "execution": {"workers": 2, "envs_per_worker": 2, "optimizer": optimizer},
            "budget": {"env_steps": env_steps},
        }
    )
    return spec.trials()[0]


@pytest.mark.parametrize("optimizer", ["sync_replay", "async_replay"])
def test_sac_under_both_replay_optimizers_trains_and_survives_a_killed_evaluator(
    optimizer: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    trial = pendulum_sac(optimizer=optimizer, env_steps=1200)
    assert trial.env.actions == "unit"
    sink = run(trial, steps_per_iteration=300, monkeypatch=monkeypatch)
    points = sink.points
    assert len(points) >= 3 and points[-1][M.ENV_STEPS_SAMPLED] >= 1200
    assert points[0][M.WORKER_RESTARTS] == 0 and points[-1][M.WORKER_RESTARTS] == 1
    returns = [p[M.EPISODE_RETURN_MEAN] for p in points if M.EPISODE_RETURN_MEAN in p]
    assert returns and all(-2000 < r <= 0 for r in returns)  # Pendulum's cost per 200-step episode
    last = points[-1]
    for key in (M.VALUE_LOSS, M.POLICY_LOSS, M.ENTROPY, M.DIAG_ALPHA, M.DIAG_Q_MEAN):
        assert key in last and last[key] == last[key], key
    # half an update of 32 per env step after learning_starts; the asynchronous learner may lag, never lead
    updates = last[M.DIAG_UPDATES]
    assert updates == last[M.ENV_STEPS_TRAINED] / 32  # counted together, even with a learner thread running on
    assert updates <= 0.5 * last[M.ENV_STEPS_SAMPLED]
    if optimizer == "sync_replay":
        assert updates >= 0.5 * (last[M.ENV_STEPS_SAMPLED] - 200) - 2
    else:
        assert updates > 0
    native = next(m for m in sink.messages if m["kind"] == "native_config")
    assert native["config"]["policy_cls"] == "SACPolicy"


def test_sac_async_replay_state_without_its_shards_refills_them_before_training() -> None:
    """checkpoint.replay_buffer: false under async_replay: the state holds no shards; restored, the shards start
    empty, nothing is owed to the learner until learning_starts more env steps were sampled, and then only what was
    owed at the checkpoint plus the new steps' share (the refill's own steps owe nothing)."""
    from crossrl.core.sac_policy import SACPolicy

    trial = pendulum_sac(optimizer="async_replay", env_steps=1)
    first, first_evs = async_replay(trial, SACPolicy, num_remote=1)
    try:
        for _ in range(2):
            first.step()
        state = first.get_state(replay=False)
    finally:
        first.stop()
        first_evs.stop()
    assert state["shards"] is None and state["sampled"] >= 600
    second, second_evs = async_replay(trial, SACPolicy, num_remote=1)
    try:
        second.set_state(state)
        ratio = second.policy.replay_ratio  # updates_per_step 0.5 x train_batch 32 transitions per env step
        owed_at_checkpoint = ratio * state["sampled"] - state["trained"]
        assert sum(second.replay_sizes()) < 100  # only the first sample task's steps (kept: 600 and more)
        with second._lock:
            assert second._owed_locked() == 0.0
            second._sampled += 199  # one short of learning_starts sampled since the restore
            assert second._owed_locked() == 0.0
            second._sampled += 1
            assert second._owed_locked() == pytest.approx(owed_at_checkpoint)
            second._sampled += 10
            assert second._owed_locked() == pytest.approx(owed_at_checkpoint + 10 * ratio)
    finally:
        second.stop()
        second_evs.stop()
