"""A sampling worker process killed with SIGKILL mid-trial (after the first point), on each engine.

Each test runs a small real PPO trial on CartPole with 2 workers and a budget of a few iterations, kills
one sampling worker's OS process after the first reported point, and checks what the engine does:

- crossrl: the dead evaluator actor is replaced; the trial samples its whole budget and counts the restart.
- rllib: Ray restarts the env runner (``restart_failed_env_runners``), RLlib samples from the other one
  meanwhile; the trial samples its whole budget and counts the restart.
- torchrl: TorchRL 0.14 does not restart a collector worker; the trial ends FAILED (through the real
  runner) with a reason naming the dead worker, promptly: a hang would end TIMEOUT, and fails the test.
  A worker killed while the learner trains or while weights are sent (where TorchRL itself waits
  forever for the dead worker's acknowledgement) fails the same way.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from crossrl.adapters.base import ListSink
from crossrl.adapters.registry import engine_ids
from crossrl.orchestration.runner import run_scenario
from crossrl.reports.store import ResultsStore
from crossrl.scenarios import metrics as M
from crossrl.scenarios.loader import validate
from crossrl.scenarios.spec import ScenarioSpec, Trial

ITERATION = 256  # env steps per PPO iteration: train_batch
ITERATIONS = 5
# RLlib counts a restart only once a later train() finds the new env runner answering its health probe;
# until then each iteration takes ~2 s (measured), and the new process took ~4 s to start on a busy 2-core
# machine: more iterations leave it room.
RLLIB_ITERATIONS = 8
PPO = {"train_batch": ITERATION, "minibatch": 64, "epochs": 2, "rollout_fragment": ITERATION // 4}


def spec_dict(engine: str, iterations: int = ITERATIONS) -> dict[str, Any]:
    """PPO on CartPole, 2 workers x 2 envs, a 32x32 MLP, ``iterations`` x 256 env steps; a wall budget as a backstop."""
    return {
        "name": f"worker-killed-{engine}",
        "env": {"id": "CartPole-v1"},
        "algorithm": {"name": "ppo", "hyperparams": PPO, "model": {"hidden": [32, 32]}},
        "engines": [engine],
        "execution": {"workers": [2], "envs_per_worker": 2},
        "budget": {"env_steps": iterations * ITERATION, "wall_seconds": 90},
        "seeds": [0],
    }


def make_trial(engine: str, iterations: int = ITERATIONS) -> Trial:
    (trial,) = ScenarioSpec.model_validate(spec_dict(engine, iterations)).trials()
    return trial


def sigkill(pid: int) -> None:
    """SIGKILL ``pid`` and wait until it is gone (a zombie counts as gone)."""
    proc = psutil.Process(pid)
    proc.send_signal(signal.SIGKILL)
    deadline = time.monotonic() + 10
    while proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline, f"pid {pid} outlived SIGKILL"
        time.sleep(0.05)


def check_survived(sink: ListSink, killed: list[int]) -> list[dict[str, float]]:
    """The trial sampled its whole budget after the kill and counted one restart."""
    assert len(killed) == 1, "no worker was killed"
    points = sink.points
    steps = [p[M.ENV_STEPS_SAMPLED] for p in points]
    assert steps == sorted(steps) and steps[-1] >= sink.trial.budget.env_steps, steps
    restarts = [p.get(M.WORKER_RESTARTS) for p in points]
    assert restarts[0] == 0 and restarts[-1] is not None and restarts[-1] >= 1, restarts
    assert not psutil.pid_exists(killed[0]) or psutil.Process(killed[0]).status() == psutil.STATUS_ZOMBIE
    return points


@pytest.mark.integration
@pytest.mark.usefixtures("ray_cluster")
def test_crossrl_restarts_a_killed_evaluator() -> None:
    from crossrl.adapters.crossrl import CrossrlAdapter

    killed: list[int] = []

    def kill_evaluator_process(i: int, evaluators: Any) -> None:
        if i == 0:
            pid = evaluators.pids()[0]
            assert pid != os.getpid()
            sigkill(pid)
            killed.append(pid)

    trial = make_trial("crossrl")
    sink = ListSink(trial)
    CrossrlAdapter(on_iteration=kill_evaluator_process).run(trial, sink)
    check_survived(sink, killed)


@pytest.mark.integration
@pytest.mark.usefixtures("ray_cluster")
def test_rllib_restarts_a_killed_env_runner() -> None:
    from crossrl.adapters.rllib.adapter import RllibAdapter

    killed: list[int] = []

    def kill_env_runner_process(i: int, algo: Any) -> None:
        if i == 0:
            pids = algo.env_runner_group.foreach_env_runner(lambda runner: os.getpid(), local_env_runner=False)
            assert len(pids) == 2 and os.getpid() not in pids
            sigkill(pids[0])
            killed.append(pids[0])
        elif i == RLLIB_ITERATIONS - 2:
            # Ray restarts the env runner in the background; on a loaded machine its new process may take longer
            # than the remaining iterations to come up. Wait for it here (RLlib's own probe, which counts the
            # restart), so that the last point can show it.
            group, deadline = algo.env_runner_group, time.monotonic() + 120
            while group.num_remote_worker_restarts() == 0 and time.monotonic() < deadline:
                group.probe_unhealthy_env_runners()
                time.sleep(0.5)

    trial = make_trial("rllib", RLLIB_ITERATIONS)
    sink = ListSink(trial)
    RllibAdapter(on_iteration=kill_env_runner_process).run(trial, sink)
    check_survived(sink, killed)
    (native,) = [m["config"] for m in sink.messages if m["kind"] == "native_config"]
    assert native["restart_failed_env_runners"] is True


def _collector_workers(trial_pid: int) -> list[psutil.Process]:
    """The trial process's collector workers (multiprocessing spawn children; not its resource tracker)."""
    out = []
    for child in psutil.Process(trial_pid).children():
        try:
            if "spawn_main" in " ".join(child.cmdline()):
                out.append(child)
        except psutil.Error:
            continue
    return out


@pytest.mark.integration
def test_torchrl_fails_with_the_dead_worker_named(results_dir: Path) -> None:
    killed: list[int] = []

    def kill_collector_worker(event: str, payload: dict[str, Any]) -> None:
        if event != "point" or killed:
            return
        (trial_proc,) = [
            p for p in psutil.Process().children() if "crossrl.orchestration.trial_proc" in " ".join(p.cmdline())
        ]
        workers = _collector_workers(trial_proc.pid)
        assert len(workers) == 2, workers
        sigkill(workers[0].pid)
        killed.append(workers[0].pid)

    spec = validate(spec_dict("torchrl"), label="worker-killed.yaml", engines=engine_ids())
    store = ResultsStore(None, results_dir=results_dir)
    outcome = run_scenario(spec, store=store, progress=kill_collector_worker)
    (result,) = outcome.results
    assert killed, "no collector worker was killed"
    assert result.status != M.TIMEOUT, f"the trial hung after its worker died: {result.reason}"
    assert result.status == M.FAILED, (result.status, result.reason)
    assert "CollectorWorkerDied" in result.reason and f"(pid {killed[0]}) killed by SIGKILL" in result.reason
    assert 0 < result.env_steps < ITERATIONS * ITERATION  # the points before the kill are kept
    assert result.wall_s < 60

    loaded = store.load(scenario=spec.name)
    (row,) = loaded.trials.itertuples()
    assert row.status == M.FAILED and f"(pid {killed[0]}) killed by SIGKILL" in row.reason


@pytest.mark.integration
@pytest.mark.timeout(120)  # a hang fails here rather than blocking the suite
@pytest.mark.parametrize("moment", ["learning", "weight_sync"])
def test_torchrl_worker_killed_while_learning_or_syncing_fails_instead_of_hanging(
    moment: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After the second batch: in ``learn`` (the adapter checks the workers before sending weights), or
    inside ``update_policy_weights_`` (TorchRL waits for the dead worker's ack; the adapter's watch ends it)."""
    from crossrl.adapters.torchrl import adapter as TR

    killed: list[int] = []

    def kill_a_worker() -> None:
        (worker, _) = _collector_workers(os.getpid())
        sigkill(worker.pid)
        killed.append(worker.pid)

    def on_second_call(fn: Any) -> Any:
        calls = [0]

        def wrapped(*args: Any, **kwargs: Any) -> Any:
            calls[0] += 1
            if calls[0] == 2 and moment == "learning":
                out = fn(*args, **kwargs)
                kill_a_worker()
                return out
            if calls[0] == 2:
                kill_a_worker()
            return fn(*args, **kwargs)

        return wrapped

    build_learner, build_collector = TR.build_learner, TR.build_collector

    def learner_killing(**kwargs: Any) -> Any:
        learner = build_learner(**kwargs)
        if moment == "learning":
            learner.learn = on_second_call(learner.learn)
        return learner

    def collector_killing(**kwargs: Any) -> Any:
        collector, desc = build_collector(**kwargs)
        if moment == "weight_sync":
            collector.update_policy_weights_ = on_second_call(collector.update_policy_weights_)
        return collector, desc

    monkeypatch.setattr(TR, "build_learner", learner_killing)
    monkeypatch.setattr(TR, "build_collector", collector_killing)
    trial = make_trial("torchrl")
    sink = ListSink(trial)
    t0 = time.monotonic()
    with pytest.raises(TR.CollectorWorkerDied, match=r"worker \d \(pid \d+\) killed by SIGKILL") as err:
        TR.TorchrlAdapter().run(trial, sink)
    assert killed and f"(pid {killed[0]})" in str(err.value)
    assert len(sink.points) == 1 and time.monotonic() - t0 < 60
    assert not _collector_workers(os.getpid()), "collector workers outlived the failed trial"
