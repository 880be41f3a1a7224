"""`crossrl tune --ray-address ADDR --parallel 2` on the two-node loopback cluster: a search's configurations run as
Ray Tune trials on both nodes at once; SIGTERM mid-search ends it KILLED (exit 143) and `--resume` completes it."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from ray_nodes import Cluster

from crossrl.orchestration.tuning import SEARCH_KIND
from crossrl.reports.store import ResultsStore

pytestmark = [pytest.mark.integration, pytest.mark.cluster]

# Each configuration needs 2 CPUs (its driver and one worker) on one node of 3: two at once land one on each node.
# Training time, not env steps, so that both are still running when the stop comes, however slowly one starts.
SEARCH = {
    "name": "tune-cluster",
    "env": {"id": "CartPole-v1"},
    "algorithm": {"name": "ppo", "hyperparams": {"train_batch": 250, "minibatch": 125, "epochs": 1}},
    "engines": ["crossrl"],
    "execution": {"workers": [1], "envs_per_worker": 2},
    "budget": {"env_steps": 100_000, "wall_seconds": 300},
    "search": {"space": {"lr": {"loguniform": [1e-4, 3e-3]}}, "scheduler": "random", "configurations": 3,
               "env_steps": 60_000, "tuning_seeds": [7], "test_seeds": [0]},
}  # fmt: skip


def _searches(results: Path) -> list:  # type: ignore[type-arg]
    store = ResultsStore(None, results_dir=results)
    exp = store.experiment_id("tune-cluster", create=False)
    if exp is None:
        return []
    return list(store.client.search_runs([exp], filter_string=f"tags.`crossrl.kind` = '{SEARCH_KIND}'"))


def test_a_search_runs_on_both_nodes_and_a_sigterm_then_resume_completes_it(
    ray_cluster: Cluster, tmp_path: Path
) -> None:
    spec = tmp_path / "tune-cluster.yaml"
    spec.write_text(yaml.safe_dump(SEARCH))
    results = tmp_path / "results"
    cmd = [sys.executable, "-m", "crossrl.cli", "tune", str(spec), "--ray-address", ray_cluster.address,
           "--parallel", "2", "--no-test", "--results-dir", str(results)]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ray_cluster.env)
    store = ResultsStore(None, results_dir=results)
    try:
        deadline = time.time() + 400
        running: list = []  # type: ignore[type-arg]
        while len(running) < 2:  # two configurations training at once, each placed on its node
            assert proc.poll() is None and time.time() < deadline, proc.communicate()
            time.sleep(2)
            searches = _searches(results)
            children = store.children(searches[0]) if searches else []
            running = [r for r in children if "node.id" in r.data.tags and "env_steps_sampled" in r.data.metrics]
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143, f"exit {proc.returncode}\n{out[-3000:]}\n{err[-3000:]}"
    assert "Traceback" not in err
    assert sorted(r.data.tags["node.id"] for r in running) == sorted(ray_cluster.nodes.values())
    [search] = _searches(results)
    assert search.data.tags["status"] == "KILLED"

    again = subprocess.run([*cmd, "--resume"], capture_output=True, text=True, env=ray_cluster.env, timeout=900)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    [search] = _searches(results)  # the same search, taken up
    assert search.data.tags["status"] == "FINISHED" and search.data.tags["resumes"] == "1"
    ended = {r.info.run_name: r.data.tags for r in store.children(search)}
    assert sorted(ended) == [f"crossrl-ppo-w1-s7-c0{i}" for i in range(3)]
    assert {t["status"] for t in ended.values()} == {"FINISHED"}, {n: t.get("reason") for n, t in ended.items()}
    assert {t["node.id"] for t in ended.values()} <= set(ray_cluster.nodes.values())
