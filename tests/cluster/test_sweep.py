"""A sweep fanned out over two Ray nodes (`crossrl run --ray-address ADDR --parallel 2`).

Each node has 3 CPUs and each trial here needs 2 (its driver and one worker, on one node), so two trials at
once must land one on each node: checked through the node ids stored on the trials and the nodes' own custom
resources. The same trials run one after another (`--parallel 1`) give the same trial names and metrics.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from mlflow.tracking import MlflowClient
from ray_nodes import Cluster

from crossrl.reports.store import ResultsStore, StoreError
from crossrl.scenarios.loader import load

pytestmark = [pytest.mark.integration, pytest.mark.cluster]


def _run(cluster: Cluster, results: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "crossrl.cli", "run", "smoke", "--workers", "1", "--ray-address", cluster.address,
         "--results-dir", str(results), "--no-report", *args],
        capture_output=True, text=True, env=cluster.env, timeout=900,
    )  # fmt: skip


def _trials(results: Path, scenario: str = "smoke") -> dict[str, object]:
    store = ResultsStore(None, results_dir=results)
    [parent] = store.parent_runs(scenario)
    return {str(r.info.run_name): r for r in store.children(parent)}


def test_two_trials_at_once_land_on_both_nodes_and_match_a_sequential_run(ray_cluster: Cluster, tmp_path: Path) -> None:
    fanned = _run(ray_cluster, tmp_path / "fanned", "--engines", "crossrl", "--seeds", "0,1", "--parallel", "2")
    assert fanned.returncode == 0, fanned.stdout[-3000:] + fanned.stderr[-3000:]
    runs = _trials(tmp_path / "fanned")
    spec, _ = load("smoke", overrides={"engines": ["crossrl"], "execution.workers": [1], "seeds": [0, 1]})
    assert sorted(runs) == sorted(t.name for t in spec.trials())
    tags = {name: r.data.tags for name, r in runs.items()}  # type: ignore[attr-defined]
    assert all(t["status"] == "FINISHED" for t in tags.values()), {n: t.get("reason") for n, t in tags.items()}
    # one trial on each node (the nodes' ids, as Ray names them, against each node's own resource)
    assert sorted(t["node.id"] for t in tags.values()) == sorted(ray_cluster.nodes.values())
    assert all(t["node.shared"] == "false" and t["node.shared_with"] == "" for t in tags.values())
    assert all(t["placement"] == "node" and t["placement.free_cpus"] == "0" for t in tags.values())
    # ... at the same time
    (a0, a1), (b0, b1) = [(r.info.start_time, r.info.end_time) for r in runs.values()]  # type: ignore[attr-defined]
    assert a0 < b1 and b0 < a1, "the two trials did not overlap in time"

    one_by_one = _run(ray_cluster, tmp_path / "sequential", "--engines", "crossrl", "--seeds", "0,1")
    assert one_by_one.returncode == 0, one_by_one.stderr[-3000:]
    seq = _trials(tmp_path / "sequential")
    assert sorted(seq) == sorted(runs)
    for name in runs:
        fan_metrics = set(runs[name].data.metrics)  # type: ignore[attr-defined]
        seq_metrics = set(seq[name].data.metrics)  # type: ignore[attr-defined]
        # the same, and what shipping its checkpoints to the launcher cost (a fanned-out trial's only)
        assert fan_metrics == seq_metrics | {"checkpoint.ship_s"}, f"{name}: {fan_metrics ^ seq_metrics}"
        history = MlflowClient(f"sqlite:///{tmp_path / 'fanned' / 'mlflow.db'}").get_metric_history(
            runs[name].info.run_id,  # type: ignore[attr-defined]
            "env_steps_sampled",
        )
        assert len(history) >= 2, f"{name}: points were not streamed back as the trial went"


def test_rllib_and_torchrl_trials_run_in_their_placement_groups(ray_cluster: Cluster, tmp_path: Path) -> None:
    """RLlib's env runners and TorchRL's Ray collectors are started by the engines themselves: the trial's
    placement group captures them: once a trial trains, its group has no CPU left (the runner or collector
    holds the worker's bundle), and the two trials ran on different nodes."""
    proc = _run(ray_cluster, tmp_path / "r", "--engines", "rllib,torchrl", "--seeds", "0", "--parallel", "2")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    tags = {name: r.data.tags for name, r in _trials(tmp_path / "r").items()}  # type: ignore[attr-defined]
    assert sorted(tags) == ["rllib-ppo-w1-s0", "torchrl-ppo-w1-s0"]
    assert all(t["status"] == "FINISHED" for t in tags.values()), {n: t.get("reason") for n, t in tags.items()}
    assert sorted(t["node.id"] for t in tags.values()) == sorted(ray_cluster.nodes.values())
    # the engine joined the launcher's cluster from inside its actor, on its node
    assert all(t["ray_gcs_address"] == ray_cluster.address for t in tags.values())
    # while training, the trial's group had no CPU left: its runner / collector held the group's worker CPU
    free = {n: t.get("placement.free_cpus") for n, t in tags.items()}
    assert set(free.values()) == {"0"}, free


def test_a_trial_bigger_than_any_node_is_refused_before_anything_runs(ray_cluster: Cluster, tmp_path: Path) -> None:
    big = subprocess.run(
        [sys.executable, "-m", "crossrl.cli", "run", "smoke", "--engines", "crossrl", "--workers", "3", "--seeds", "0",
         "--ray-address", ray_cluster.address, "--parallel", "2", "--results-dir", str(tmp_path / "big2")],
        capture_output=True, text=True, env=ray_cluster.env, timeout=300,
    )  # fmt: skip
    assert big.returncode == 2, big.stdout + big.stderr
    assert "needs 4 CPUs (3 workers + its driver) on one node (the biggest has 3 CPUs)" in big.stderr
    assert "Traceback" not in big.stderr
    if (tmp_path / "big2" / "mlflow.db").exists():  # opened, but nothing stored
        assert ResultsStore(None, results_dir=tmp_path / "big2").experiment_id("smoke", create=False) is None
    # --placement spread, one trial at a time (--parallel 1): its group of 4 spans both nodes (3 CPUs each), its
    # workers on both, and it trains
    spread = subprocess.run(
        [sys.executable, "-m", "crossrl.cli", "run", "smoke", "--engines", "crossrl", "--workers", "3", "--seeds", "0",
         "--ray-address", ray_cluster.address, "--placement", "spread", "--results-dir", str(tmp_path / "spread"),
         "--no-report"],
        capture_output=True, text=True, env=ray_cluster.env, timeout=600,
    )  # fmt: skip
    assert spread.returncode == 0, spread.stdout[-3000:] + spread.stderr[-3000:]
    [run] = _trials(tmp_path / "spread").values()
    tags = run.data.tags  # type: ignore[attr-defined]
    assert tags["status"] == "FINISHED" and tags["placement"] == "spread", tags.get("reason")
    bundles = [int(part.split(":")[1]) for part in tags["placement.bundles"].split(",")]
    assert tags["placement.nodes"] == "2" and sorted(bundles) in ([1, 3], [2, 2]), tags


# Three trials of 40 s of training each: the two running ones are stopped long before either can end, however
# slowly the second one starts on a busy machine (an env-step budget let the first end first once, so that the
# third had started when the stop came).
TIMED = """name: smoke-timed
env: {id: CartPole-v1}
algorithm:
  name: ppo
  hyperparams: {train_batch: 512, minibatch: 128, epochs: 2}
engines: [crossrl]
execution: {workers: [1], envs_per_worker: 2}
budget: {train_seconds: 40, wall_seconds: 300}
seeds: [0, 1, 2]
"""


def test_sigterm_kills_every_running_trial_and_resume_runs_the_rest(ray_cluster: Cluster, tmp_path: Path) -> None:
    results = tmp_path / "stopped"
    scenario = tmp_path / "smoke-timed.yaml"
    scenario.write_text(TIMED)
    cmd = [sys.executable, "-m", "crossrl.cli", "run", str(scenario), "--ray-address", ray_cluster.address,
           "--parallel", "2", "--results-dir", str(results), "--no-report"]  # fmt: skip
    run = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ray_cluster.env)
    try:
        deadline = time.time() + 300
        while True:  # both running trials have reported points
            assert run.poll() is None and time.time() < deadline, run.communicate()
            time.sleep(2)
            try:
                with_points = ResultsStore(None, results_dir=results).load(scenario="smoke-timed").points
            except StoreError:  # not created yet
                continue
            if with_points.run_id.nunique() >= 2:
                break
        run.send_signal(signal.SIGTERM)
        out, err = run.communicate(timeout=120)
    finally:
        if run.poll() is None:
            run.kill()
    assert run.returncode == 143, f"exit {run.returncode}\n{out[-3000:]}\n{err[-3000:]}"
    assert "Traceback" not in err
    runs = _trials(results, "smoke-timed")
    assert len(runs) == 2  # the third never started: nothing recorded for it
    for name, r in runs.items():
        assert r.data.tags["status"] == "KILLED", name  # type: ignore[attr-defined]
        assert r.data.tags["reason"] == "interrupted (SIGTERM)", name  # type: ignore[attr-defined]
    hosts = [p for p in ray_cluster.processes() if "ray::TrialHost" in " ".join(p.cmdline())]  # this cluster's own
    _, alive = psutil.wait_procs(hosts, timeout=30)
    assert not alive, "trial actors left running after the launcher stopped"

    resumed = subprocess.run([*cmd, "--resume"], capture_output=True, text=True, env=ray_cluster.env, timeout=900)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    store = ResultsStore(None, results_dir=results)
    loaded = store.load(scenario="smoke-timed")  # the resumed run: the newest attempt of each trial
    assert sorted(loaded.trials.trial) == ["crossrl-ppo-w1-s0", "crossrl-ppo-w1-s1", "crossrl-ppo-w1-s2"]
    assert set(loaded.trials.status) == {"FINISHED"}


def test_bench_sweep_times_the_fanned_out_and_the_sequential_sweep(ray_cluster: Cluster, tmp_path: Path) -> None:
    import json

    out = tmp_path / "sweep.json"
    proc = subprocess.run(
        [sys.executable, "-m", "crossrl.cli", "bench", "sweep", "smoke", "--ray-address", ray_cluster.address,
         "--engines", "crossrl", "--workers", "1", "--seeds", "0,1", "--parallel", "2", "--json", str(out),
         "--no-store"],
        capture_output=True, text=True, env=ray_cluster.env, timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    rows = {r["parallel"]: r for r in doc["rows"]}
    assert sorted(rows) == [1, 2] and all(r["trials"] == r["finished"] == 2 for r in rows.values())
    assert doc["speedup"] == rows[1]["wall_s"] / rows[2]["wall_s"]  # a ratio from the same run, not asserted
    assert "speedup (one at a time / fanned out, wall seconds)" in proc.stdout
