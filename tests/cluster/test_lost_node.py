"""A node lost half-way through a fanned-out sweep (`crossrl run --ray-address ADDR --parallel 2`): its trial is started
again on the surviving node from its newest checkpoint, which reached the launcher's results folder before the node
went (each node keeps its trials' own files in a folder of its own, removed with the node, so nothing left there can
be read by accident). With ``--max-retries 0`` the trial ends naming the lost node and ``--resume`` finishes it. A
`crossrl tune` search's configuration lost the same way is started again by Ray Tune from its newest checkpoint.

Each test starts a two-node cluster of its own: the second node is SIGKILLed whole (raylet, workers, the trial's
actors), as a crashed or preempted machine goes.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from mlflow.tracking import MlflowClient
from ray_nodes import Cluster, two_nodes

from crossrl.orchestration.tuning import SEARCH_KIND
from crossrl.reports.store import ResultsStore

pytestmark = [pytest.mark.integration, pytest.mark.cluster]

EVERY = 4000  # env steps between checkpoints
# (env steps per trial, train batch): long enough that the second node's trial is still training a few checkpoints in
BUDGETS = {"crossrl": (48000, 1000), "rllib": (20000, 1000), "torchrl": (24000, 1000)}


@pytest.fixture
def own_cluster(tmp_path: Path) -> Iterator[Cluster]:
    logs = tmp_path / "ray-nodes"
    logs.mkdir()
    with two_nodes(logs) as cluster:
        yield cluster


def _spec(tmp_path: Path, engine: str) -> Path:
    steps, batch = BUDGETS[engine]
    spec = {
        "name": "lost-node",
        "env": {"id": "CartPole-v1"},
        "algorithm": {"name": "ppo", "hyperparams": {"train_batch": batch, "minibatch": 250, "epochs": 2}},
        "engines": [engine],
        "execution": {"workers": [1], "envs_per_worker": 2},
        "budget": {"env_steps": steps, "wall_seconds": 900},
        "checkpoint": {"every_env_steps": EVERY, "keep": 3},
        "seeds": [0, 1],
    }
    path = tmp_path / "lost-node.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def _client(results: Path) -> MlflowClient:
    return MlflowClient(f"sqlite:///{results / 'mlflow.db'}")


def _trial_runs(results: Path) -> list[Any]:
    store = ResultsStore(None, results_dir=results)
    parents = store.parent_runs("lost-node")
    if not parents:  # a search's: its parent run is of kind `search`
        exp = store.experiment_id("lost-node", create=False)
        parents = list(store.client.search_runs([exp], filter_string=f"tags.`crossrl.kind` = '{SEARCH_KIND}'"))
    [parent] = parents
    return list(store.children(parent, superseded=True))


def _kill_second_node_half_way(cluster: Cluster, run: subprocess.Popen[str], results: Path, steps: int) -> int:
    """Waits for the trial on the second node to pass a checkpoint and half its budget, then kills the node; returns
    the env step the launcher had from that trial then."""
    node_b = cluster.nodes["crossrl_test_node_b"]
    deadline = time.time() + 600
    while True:
        assert run.poll() is None and time.time() < deadline, run.communicate()
        time.sleep(1)
        if not (results / "mlflow.db").exists():
            continue
        try:
            on_b = [r for r in _trial_runs(results) if r.data.tags.get("node.id") == node_b]
        except Exception:  # the store is not created yet
            continue
        if not on_b or "checkpoint.latest" not in on_b[0].data.tags:
            continue
        history = _client(results).get_metric_history(on_b[0].info.run_id, "env_steps_sampled")
        step = max((int(m.step) for m in history), default=0)
        if step >= steps // 2:
            cluster.kill_second_node()
            return step


def _start(cluster: Cluster, spec: Path, results: Path, *extra: str) -> subprocess.Popen[str]:
    cmd = [sys.executable, "-m", "crossrl.cli", "run", str(spec), "--ray-address", cluster.address, "--parallel", "2",
           "--results-dir", str(results), "--no-report", *extra]  # fmt: skip
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=cluster.env)


def _finish(run: subprocess.Popen[str]) -> tuple[str, str]:
    try:
        return run.communicate(timeout=900)
    finally:
        if run.poll() is None:
            run.kill()


def _check_resumed(attempt: Any, lost: Any, results: Path, node_a: str) -> None:
    """The new attempt ran on the head node from the newest checkpoint the lost one shipped before the kill (at most
    one interval and one train batch before its last point), stored in the launcher's results folder."""
    lost_steps = [int(m.step) for m in _client(results).get_metric_history(lost.info.run_id, "env_steps_sampled")]
    resumed_at = int(attempt.data.tags["resumed.env_step"])
    assert max(lost_steps) - EVERY - 1000 <= resumed_at <= max(lost_steps), (resumed_at, max(lost_steps))
    assert attempt.data.tags["resumed.from_run"] == lost.info.run_id
    assert Path(attempt.data.tags["resumed.checkpoint"]).is_relative_to(results)
    assert attempt.data.tags["node.id"] == node_a
    # one continuous curve: the points up to the checkpoint carried over, then on to the budget
    steps = [int(m.step) for m in _client(results).get_metric_history(attempt.info.run_id, "env_steps_sampled")]
    assert (
        steps == sorted(steps)
        and steps[0] <= resumed_at
        and [s for s in lost_steps if s <= resumed_at] == [s for s in steps if s <= resumed_at]
    )


@pytest.mark.parametrize("engine", ["crossrl", "rllib", "torchrl"])
def test_a_lost_nodes_trial_is_resumed_on_the_other_node_and_the_sweep_finishes(
    own_cluster: Cluster, tmp_path: Path, engine: str
) -> None:
    results = tmp_path / "results"
    steps, _ = BUDGETS[engine]
    run = _start(own_cluster, _spec(tmp_path, engine), results)
    _kill_second_node_half_way(own_cluster, run, results, steps)
    out, err = _finish(run)
    assert run.returncode == 0, f"exit {run.returncode}\n{out[-4000:]}\n{err[-4000:]}"
    node_a, node_b = own_cluster.nodes["crossrl_test_node_a"], own_cluster.nodes["crossrl_test_node_b"]
    runs = _trial_runs(results)
    newest = {r.info.run_name: r for r in sorted(runs, key=lambda r: r.info.start_time)}
    assert {n: r.data.tags["status"] for n, r in newest.items()} == {
        f"{engine}-ppo-w1-s0": "FINISHED",
        f"{engine}-ppo-w1-s1": "FINISHED",
    }, {n: r.data.tags.get("reason") for n, r in newest.items()}
    [lost] = [r for r in runs if r.data.tags.get("status") == "KILLED"]
    reason = lost.data.tags["reason"]
    assert f"({node_b[:12]}) was lost at env step" in reason, reason
    assert lost.data.tags["lost.node.id"] == node_b and lost.data.tags.get("crossrl.superseded_by")
    attempt = newest[lost.info.run_name]
    assert attempt.data.tags["attempt"] == "2" and "was lost" in attempt.data.tags["retry.after"]
    _check_resumed(attempt, lost, results, node_a)
    assert f"{lost.info.run_name}: resumed on node " in out and "after node " in out
    loaded = ResultsStore(None, results_dir=results).load(scenario="lost-node")  # the report's view: one row each
    assert sorted(loaded.trials.trial) == sorted(newest) and set(loaded.trials.status) == {"FINISHED"}


def test_without_retries_the_lost_trial_names_its_node_and_resume_finishes_it(
    own_cluster: Cluster, tmp_path: Path
) -> None:
    results = tmp_path / "results"
    spec = _spec(tmp_path, "crossrl")
    run = _start(own_cluster, spec, results, "--max-retries", "0")
    _kill_second_node_half_way(own_cluster, run, results, BUDGETS["crossrl"][0])
    out, err = _finish(run)
    assert run.returncode == 1, f"exit {run.returncode}\n{out[-4000:]}\n{err[-4000:]}"
    assert "--resume` runs them again from their newest checkpoints" in err and "Traceback" not in err
    node_a, node_b = own_cluster.nodes["crossrl_test_node_a"], own_cluster.nodes["crossrl_test_node_b"]
    [lost] = [r for r in _trial_runs(results) if r.data.tags.get("status") == "KILLED"]
    assert f"({node_b[:12]}) was lost at env step" in lost.data.tags["reason"]

    resumed = subprocess.run(
        [sys.executable, "-m", "crossrl.cli", "run", str(spec), "--resume", "--ray-address", own_cluster.address,
         "--parallel", "2", "--results-dir", str(results), "--no-report"],
        capture_output=True, text=True, env=own_cluster.env, timeout=900,
    )  # fmt: skip
    assert resumed.returncode == 0, resumed.stdout[-4000:] + resumed.stderr[-4000:]
    assert "1 trial to run, 1 kept" in resumed.stdout
    runs = _trial_runs(results)
    newest = {r.info.run_name: r for r in sorted(runs, key=lambda r: r.info.start_time)}
    assert {r.data.tags["status"] for r in newest.values()} == {"FINISHED"}
    _check_resumed(newest[lost.info.run_name], lost, results, node_a)


def test_a_lost_nodes_search_configuration_is_resumed_by_tune_and_the_search_finishes(
    own_cluster: Cluster, tmp_path: Path
) -> None:
    spec = _spec(tmp_path, "crossrl")
    raw = yaml.safe_load(spec.read_text())
    raw["search"] = {"space": {"lr": {"loguniform": [1e-4, 3e-3]}}, "scheduler": "random", "configurations": 2,
                     "env_steps": BUDGETS["crossrl"][0], "tuning_seeds": [7], "test_seeds": [0]}  # fmt: skip
    spec.write_text(yaml.safe_dump(raw))
    results = tmp_path / "results"
    run = subprocess.Popen(
        [sys.executable, "-m", "crossrl.cli", "tune", str(spec), "--ray-address", own_cluster.address, "--parallel",
         "2", "--no-test", "--results-dir", str(results)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=own_cluster.env,
    )  # fmt: skip
    _kill_second_node_half_way(own_cluster, run, results, BUDGETS["crossrl"][0])
    out, err = _finish(run)
    assert run.returncode == 0, f"exit {run.returncode}\n{out[-4000:]}\n{err[-4000:]}"
    node_a, node_b = own_cluster.nodes["crossrl_test_node_a"], own_cluster.nodes["crossrl_test_node_b"]
    runs = _trial_runs(results)
    newest = {r.info.run_name: r for r in sorted(runs, key=lambda r: r.info.start_time)}
    assert {r.data.tags["status"] for r in newest.values()} == {"FINISHED"} and len(newest) == 2, {
        n: r.data.tags.get("reason") for n, r in newest.items()
    }
    [lost] = [r for r in runs if r.data.tags.get("status") == "KILLED"]
    assert f"({node_b[:12]}) was lost at env step" in lost.data.tags["reason"], lost.data.tags["reason"]
    attempt = newest[lost.info.run_name]
    assert attempt.data.tags["attempt"] == "2" and "was lost" in attempt.data.tags["retry.after"]
    _check_resumed(attempt, lost, results, node_a)
