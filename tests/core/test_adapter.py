"""The crossrl engine end to end: real Ray actors, real envs, metrics through a ListSink."""

from __future__ import annotations

from typing import Any

import pytest
import ray
from crossrl_trials import make_trial

from crossrl.adapters.base import ListSink
from crossrl.adapters.crossrl import CrossrlAdapter
from crossrl.scenarios import metrics as M
from crossrl.scenarios.spec import Trial

pytestmark = pytest.mark.usefixtures("ray_cluster")


def run(trial: Trial, adapter: CrossrlAdapter | None = None) -> ListSink:
    sink = ListSink(trial)
    (adapter or CrossrlAdapter()).run(trial, sink)
    return sink


def check_common_metrics(sink: ListSink, *, min_points: int = 2) -> list[dict[str, float]]:
    points = sink.points
    assert len(points) >= min_points
    assert sink.setup_s is not None
    steps = [p[M.ENV_STEPS_SAMPLED] for p in points]
    assert steps == sorted(steps) and steps[-1] >= sink.trial.budget.env_steps
    for p in points:
        for key in (M.ENV_STEPS_SAMPLED, M.WALL_TIME_S, M.EPISODES_TOTAL, M.SAMPLE_THROUGHPUT, M.WORKER_RESTARTS):
            assert key in p, f"{key} missing from {sorted(p)}"
        assert p[M.SAMPLE_THROUGHPUT] > 0
    with_returns = [p for p in points if M.EPISODE_RETURN_MEAN in p]
    assert with_returns, "no point reported an episode return"
    # CartPole pays 1 per step: the mean return equals the mean length, both within [1, 500].
    for p in with_returns:
        assert 1 <= p[M.EPISODE_RETURN_MEAN] <= 500
        assert p[M.EPISODE_RETURN_MEAN] == pytest.approx(p[M.EPISODE_LEN_MEAN])
    trained = [p for p in points if M.POLICY_LOSS in p]
    assert trained and all(M.VALUE_LOSS in p and M.ENTROPY in p for p in trained)
    assert points[-1][M.EPISODES_TOTAL] > 0
    return points


def test_ppo_two_remote_evaluators_reports_common_metrics() -> None:
    trial = make_trial("ppo", env_steps=3000, train_batch=1000, minibatch=250, epochs=2)
    sink = run(trial)
    points = check_common_metrics(sink, min_points=3)
    # 2 evaluators x 4 envs x 125 steps = 1000 rows; autoreset rows (one after each ended episode) are
    # not env steps.
    first = points[0]
    assert 1000 - first[M.EPISODES_TOTAL] <= first[M.ENV_STEPS_SAMPLED] < 1000
    assert all(p[M.WORKER_RESTARTS] == 0 for p in points)
    kinds = {m["kind"] for m in sink.messages}
    assert {"setup", "tags", "native_config", "point"} <= kinds


def test_a2c_two_remote_evaluators_reports_common_metrics() -> None:
    sink = run(make_trial("a2c", env_steps=2000, train_batch=400))
    check_common_metrics(sink, min_points=4)


def kill_and_wait(evaluators: Any, i: int) -> None:
    """``ray.kill`` remote ``i`` and return once its process is gone: the kill itself returns at once, and on a busy
    machine a run can end before a killed actor's process does (so that no restart was ever needed)."""
    import psutil

    pid = evaluators.pids()[i]
    assert pid is not None
    process = psutil.Process(pid)
    ray.kill(evaluators.remotes[i], no_restart=True)
    process.wait(timeout=60)


@pytest.mark.parametrize("transport", ["stream", "calls"])
def test_killed_evaluator_is_restarted_and_the_run_finishes(transport: str) -> None:
    killed: list[int] = []

    def kill_one(iteration: int, evaluators: Any) -> None:
        if iteration == 1:
            kill_and_wait(evaluators, 0)
            killed.append(iteration)

    trial = make_trial("ppo", env_steps=4000, train_batch=800, minibatch=400, epochs=1, transport=transport)
    sink = run(trial, CrossrlAdapter(on_iteration=kill_one))
    points = check_common_metrics(sink, min_points=4)
    assert killed == [1]
    assert points[-1][M.WORKER_RESTARTS] >= 1
    assert points[0][M.WORKER_RESTARTS] == 0
    # The step that lost a batch sampled (and counted) only the surviving evaluator's half.
    deltas = [b[M.ENV_STEPS_SAMPLED] - a[M.ENV_STEPS_SAMPLED] for a, b in zip(points, points[1:], strict=False)]
    assert min(deltas) < 500 <= max(deltas)
    assert points[-1][M.ENV_STEPS_SAMPLED] >= 4000


def test_restarts_past_the_budget_fail_the_trial() -> None:
    """budget.max_worker_restarts: 0: the first dead evaluator ends the trial, named, instead of a restart."""
    from crossrl.core.evaluator import WorkerRestartsExceeded

    def kill_one(iteration: int, evaluators: Any) -> None:
        if iteration == 1:
            kill_and_wait(evaluators, 0)

    trial = make_trial("ppo", env_steps=4000, train_batch=800, minibatch=400, epochs=1)
    trial = trial.model_copy(update={"budget": trial.budget.model_copy(update={"max_worker_restarts": 0})})
    with pytest.raises(WorkerRestartsExceeded, match=r"evaluator 1 died after 0 sampling-worker restarts"):
        run(trial, CrossrlAdapter(on_iteration=kill_one))


@pytest.mark.parametrize("transport", ["stream", "calls"])
def test_killed_evaluator_under_async_sampling_is_restarted(transport: str) -> None:
    """IMPALA: the dead actor's in-flight sample is dropped, the actor replaced, the run finishes."""

    def kill_one(iteration: int, evaluators: Any) -> None:
        if iteration == 1:
            kill_and_wait(evaluators, 1)

    trial = make_trial("impala", env_steps=4000, train_batch=400, rollout_fragment=25, transport=transport)
    points = check_common_metrics(run(trial, CrossrlAdapter(on_iteration=kill_one)), min_points=3)
    assert points[-1][M.WORKER_RESTARTS] >= 1 and points[0][M.WORKER_RESTARTS] == 0
    assert points[-1][M.ENV_STEPS_SAMPLED] >= 4000 and points[-1][M.ENV_STEPS_TRAINED] > 0


@pytest.mark.parametrize(
    ("algorithm", "optimizer", "hp"),
    [
        ("a3c", None, {"train_batch": 100}),
        ("impala", None, {"train_batch": 400, "rollout_fragment": 25}),
        # The paper's point: the same loss under another execution strategy.
        ("ppo", "async_gradients", {"train_batch": 200}),
        pytest.param("a2c", "async_gradients", {"train_batch": 100}, marks=pytest.mark.integration),
        pytest.param("impala", "sync_samples", {"train_batch": 400}, marks=pytest.mark.integration),
    ],
)
def test_algorithm_under_optimizer_reports_common_metrics(
    algorithm: str, optimizer: str | None, hp: dict[str, Any]
) -> None:
    trial = make_trial(algorithm, env_steps=3000, optimizer=optimizer, **hp)  # async steps report >= 1000
    sink = run(trial)
    points = check_common_metrics(sink, min_points=3)
    assert points[-1][M.ENV_STEPS_TRAINED] > 0
    config = next(m["config"] for m in sink.messages if m["kind"] == "native_config")
    assert config["optimizer"] == (optimizer or {"a3c": "async_gradients", "impala": "async_samples"}[algorithm])


@pytest.mark.parametrize(("algorithm", "hp"), [("ppo", {"train_batch": 800, "minibatch": 200, "epochs": 2}),
                                               ("a2c", {"train_batch": 400})])  # fmt: skip
def test_a_synchronous_run_learns_the_same_on_either_transport(algorithm: str, hp: dict[str, Any]) -> None:
    """The transport changes how fragments travel, not what is sampled or learned: the same seed gives the same
    episodes and the same losses at every point on both."""
    runs = {}
    for transport in ("calls", "stream"):
        sink = run(make_trial(algorithm, env_steps=4000, transport=transport, **hp))
        runs[transport] = [
            {k: p.get(k) for k in (M.ENV_STEPS_SAMPLED, M.EPISODE_RETURN_MEAN, M.EPISODES_TOTAL, M.POLICY_LOSS)}
            for p in sink.points
        ]
    assert len(runs["stream"]) >= 4
    assert runs["stream"] == runs["calls"]


def test_the_learning_policy_is_built_before_the_clock() -> None:
    """start_core (all of it before ``sink.start_clock()``) leaves the driver's learning policy built: its torch
    modules and optimizer (~0.7 s) are not paid inside the first timed iteration."""
    from crossrl.adapters.crossrl import start_core
    from crossrl.core.algorithms import load
    from crossrl.scenarios.catalog import HYPERPARAM_DEFAULTS
    from crossrl.scenarios.spec import EnvSpec, ModelSpec

    alg = load("ppo")
    evaluators, opt = start_core(
        env_spec=EnvSpec(id="CartPole-v1"), workers=1, envs_per_worker=2, policy_cls=alg.policy_cls,
        hyperparams=alg.hyperparams(HYPERPARAM_DEFAULTS["ppo"]), model=ModelSpec(), optimizer="sync_samples",
        seed=0, remote_num_cpus=1.0,
    )  # fmt: skip
    try:
        assert evaluators.local.policy._torch is not None
    finally:
        opt.stop()
        evaluators.stop()
