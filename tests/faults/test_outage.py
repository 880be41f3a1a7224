"""A real `mlflow server` killed mid-run: the trials go on, and every point reaches the server once.

Killed and restarted while the run goes on: the run ends with exit 0 and the server's metric history of
each trial equals the points the trial produced (its metric history artifact), with no duplicates. Still
down when the run ends: exit 3 with one line, the writes wait in the journal, and `crossrl sync` sends them
once the server is back.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from mlflow.tracking import MlflowClient
from mlflow_server import MlflowServer

CLI = [sys.executable, "-m", "crossrl.cli"]


def _trials(client: MlflowClient, scenario: str) -> list:  # type: ignore[type-arg]
    exp = client.get_experiment_by_name(scenario)
    if exp is None:
        return []
    return client.search_runs([exp.experiment_id], filter_string="tags.`crossrl.kind` = 'trial'")


def _assert_every_point_once(client: MlflowClient, run_id: str) -> int:
    """The server's metric history of a trial equals the points the runner recorded: each once, none missing."""
    history = pd.read_csv(client.download_artifacts(run_id, "metrics.csv"))
    assert not history.empty
    for key, rows in history.groupby("metric"):
        stored = sorted(m.step for m in client.get_metric_history(run_id, str(key)))
        assert stored == sorted(rows.step), f"{key}: {len(stored)} points stored, {len(rows)} recorded"
    return len(history)


def _wait_for(predicate, timeout: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.time() + timeout
    while not predicate():
        if time.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.5)


# Two MLflow servers' lifetimes each, 100-170 s: `make test-system`, run by CI.
pytestmark = [pytest.mark.integration, pytest.mark.system]


def test_server_killed_and_restarted_mid_run_loses_nothing(tmp_path: Path) -> None:
    server = MlflowServer(tmp_path / "server").start()
    client = MlflowClient(server.url)
    results = tmp_path / "results"
    # Three short trials: the server is down from the first trial's first points until it has restarted
    # (its own start takes seconds), so later trials start, log and end while it is down.
    cmd = [*CLI, "run", "smoke", "--engines", "crossrl", "--seeds", "0,1,2", "--workers", "1"]
    cmd += ["--steps", "4000", "--tracking-uri", server.url, "--results-dir", str(results), "--no-report"]
    run = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for(
            lambda: any(
                client.get_metric_history(r.info.run_id, "env_steps_sampled") for r in _trials(client, "smoke")
            ),
            timeout=180,
            what="the first trial's first points in the server",
        )
        server.stop(hard=True)  # the whole server tree, as a crash or a node going away would
        outage_start = time.time()
        time.sleep(5)
        server.start()  # same store, same port: the sender catches up
        outage = time.time() - outage_start
        out, err = run.communicate(timeout=600)
    finally:
        if run.poll() is None:
            run.kill()
    try:
        assert run.returncode == 0, f"exit {run.returncode}\n{out[-3000:]}\n{err[-3000:]}"
        assert "Traceback" not in err
        trials = _trials(client, "smoke")
        assert sorted(r.info.run_name for r in trials) == [
            "crossrl-ppo-w1-s0",
            "crossrl-ppo-w1-s1",
            "crossrl-ppo-w1-s2",
        ]
        for r in trials:
            assert r.info.status == "FINISHED" and r.data.tags["status"] == "FINISHED", r.data.tags.get("reason")
            assert _assert_every_point_once(client, r.info.run_id) > 0
        assert not list((results / "journal").glob("*.jsonl"))  # the server has it all: nothing pending
        assert outage > 5  # the server was down for a while (its restart alone takes seconds)
    finally:
        server.stop()


def test_server_down_when_the_run_ends_then_crossrl_sync(tmp_path: Path) -> None:
    server = MlflowServer(tmp_path / "server").start()
    results = tmp_path / "results"
    cmd = [*CLI, "run", "smoke", "--engines", "crossrl", "--seeds", "0", "--workers", "1"]
    cmd += ["--tracking-uri", server.url, "--results-dir", str(results), "--store-wait", "3"]
    run = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for(lambda: any((results / "journal").glob("*.jsonl")), timeout=120, what="the run's journal")
        server.stop(hard=True)  # down from the first trial on, for longer than the run
        out, err = run.communicate(timeout=600)
    finally:
        if run.poll() is None:
            run.kill()
    assert run.returncode == 3, f"exit {run.returncode}\n{out[-3000:]}\n{err[-3000:]}"
    lines = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and "are not in" in lines[0] and f"crossrl sync {results}" in lines[0], err
    assert "Traceback" not in err and "FINISHED" in out  # the trials ran whole meanwhile
    pending = list((results / "journal").glob("*.jsonl"))
    assert len(pending) == 1

    server.start()
    try:
        synced = subprocess.run([*CLI, "sync", str(results)], capture_output=True, text=True, timeout=300)
        assert synced.returncode == 0, synced.stderr
        assert not list((results / "journal").glob("*.jsonl"))
        again = subprocess.run([*CLI, "sync", str(results)], capture_output=True, text=True, timeout=300)
        assert again.returncode == 0 and "nothing to send" in again.stdout
        client = MlflowClient(server.url)
        trials = _trials(client, "smoke")
        assert [r.info.run_name for r in trials] == ["crossrl-ppo-w1-s0"]
        for r in trials:
            assert r.info.status == "FINISHED"
            _assert_every_point_once(client, r.info.run_id)
        [parent] = client.search_runs([trials[0].info.experiment_id], filter_string="tags.`crossrl.kind` = 'parent'")
        assert parent.info.status == "FINISHED" and parent.data.tags["trials.FINISHED"] == "1"
    finally:
        server.stop()


@pytest.fixture(autouse=True)
def _no_telemetry(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
