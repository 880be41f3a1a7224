"""SIGTERM and SIGHUP stop `crossrl run` as Ctrl-C does, and `crossrl ui` takes its whole server tree down.

`crossrl run`: the running trial ends KILLED with the signal's name and its partial points, finished trials
stay FINISHED, the parent run is closed with its counts, the summary is printed, the exit code is 128 +
the signal's number, and no process of the run is left.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import psutil
import pytest
import yaml

from crossrl.orchestration.signals import Interrupted, deferred_signals, stop_on_signals
from crossrl.reports.store import ResultsStore

CLI = [sys.executable, "-m", "crossrl.cli"]
STEPS = 5000  # seed 0 (fault engine: ok) takes a second; seed 4 (slow: 0.5 s per 100 env steps) about 25 s


def _default_signals() -> None:
    """In the child: the stop signals at their default action, whatever the shell that started pytest set
    (a shell that starts jobs in the background hands them SIGINT ignored; nohup, SIGHUP)."""
    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, signal.SIG_DFL)


def _left(procs: list[psutil.Process], timeout: float = 10.0) -> list[psutil.Process]:
    """Those of ``procs`` still running (zombies count as gone) after up to ``timeout`` seconds."""
    deadline = time.time() + timeout
    while True:
        left = []
        for p in procs:
            try:
                if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                    left.append(p)
            except psutil.Error:
                continue
        if not left or time.time() > deadline:
            return left
        time.sleep(0.2)


def _trial_run(store: ResultsStore, seed: int) -> object | None:
    exp = store.client.get_experiment_by_name("signal-test")
    if exp is None:
        return None
    runs = store.client.search_runs(
        [exp.experiment_id], filter_string=f"tags.`crossrl.kind` = 'trial' and tags.seed = '{seed}'"
    )
    return runs[0] if runs else None


@pytest.mark.integration
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_signal_stops_a_run_like_ctrl_c(signum: int, fault_engine: Path, tmp_path: Path) -> None:
    name = signal.Signals(signum).name
    spec = tmp_path / "signal-test.yaml"
    spec.write_text(
        yaml.safe_dump(
            {
                "name": "signal-test",
                "env": {"id": "CartPole-v1"},
                "algorithm": {"name": "ppo"},
                "engines": ["fault"],
                "budget": {"env_steps": STEPS, "wall_seconds": 120},
                "seeds": [0, 4],
            }
        )
    )
    results = tmp_path / "res"
    proc = subprocess.Popen(
        [*CLI, "run", str(spec), "--results-dir", str(results), "--no-report"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        preexec_fn=_default_signals,
    )
    try:
        deadline = time.time() + 120
        while not (fault_engine / "started-4").exists():
            assert time.time() < deadline and proc.poll() is None, "the slow trial never started"
            time.sleep(0.2)
        store = ResultsStore(None, results_dir=results)
        # the trial's process can start before its run is searchable in the store: wait for both
        while (slow := _trial_run(store, 4)) is None:
            assert time.time() < deadline and proc.poll() is None, "the slow trial's run never reached the store"
            time.sleep(0.2)
        while not store.client.get_metric_history(slow.info.run_id, "env_steps_sampled"):  # type: ignore[attr-defined]
            assert time.time() < deadline and proc.poll() is None, "the slow trial stored no point"
            time.sleep(0.5)
        tree = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
        slow_pid = int((fault_engine / "started-4").read_text())
        assert slow_pid in {p.pid for p in tree}
        proc.send_signal(signum)
        out = proc.communicate(timeout=90)[0].decode()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 128 + signum, out
    assert "signal-test: {" in out and f"interrupted ({name})" in out and "results: sqlite" in out  # the summary
    assert _left(tree) == []

    loaded = store.load(scenario="signal-test")
    trials = loaded.trials.set_index("seed")
    assert trials.loc[0, "status"] == "FINISHED" and trials.loc[4, "status"] == "KILLED"
    assert trials.loc[4, "reason"] == f"interrupted ({name})"
    for seed, top in ((0, STEPS), (4, None)):
        rid = trials.loc[seed, "run_id"]
        steps = loaded.points[(loaded.points.run_id == rid) & (loaded.points.metric == "env_steps_sampled")].step
        assert len(steps) > 0 and (steps.max() == top if top else 0 < steps.max() < STEPS)
    parent = store.client.get_run(loaded.meta["parent_run_id"])
    assert parent.info.status == "KILLED"  # closed, not left RUNNING
    tags = parent.data.tags
    assert (tags["status"], tags["trials.FINISHED"], tags["trials.KILLED"]) == ("KILLED", "1", "1")
    assert tags["reason"] == f"interrupted ({name})"


@pytest.mark.integration
def test_sigterm_takes_the_whole_ui_server_tree_down(results_dir: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [*CLI, "ui", "--port", str(port), "--results-dir", str(results_dir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        preexec_fn=_default_signals,
        start_new_session=True,
    )
    seen: dict[int, psutil.Process] = {}
    try:
        deadline = time.time() + 120
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            assert proc.poll() is None and time.time() < deadline, "crossrl ui did not come up"
            time.sleep(0.5)
        for _ in range(6):  # the job runner starts its workers after the server answers
            seen.update((p.pid, p) for p in psutil.Process(proc.pid).children(recursive=True))
            time.sleep(0.5)
        assert len(seen) >= 2, [p.cmdline() for p in seen.values()]  # mlflow server and uvicorn at least
        proc.send_signal(signal.SIGTERM)
        out = proc.communicate(timeout=60)[0].decode()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        for p in seen.values():  # never leave a server behind, whatever the outcome
            try:
                p.kill()
            except psutil.Error:
                pass
    assert proc.returncode == 0, out
    assert _left(list(seen.values())) == [], out


def test_a_stop_signal_during_a_store_write_is_raised_after_it() -> None:
    finished = []
    before = signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        with stop_on_signals():
            with pytest.raises(Interrupted) as stop, deferred_signals():
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(0.05)
                finished.append(True)  # the write runs to its end
            assert finished == [True]
            assert (stop.value.label, stop.value.exit_code) == ("SIGTERM", 143)
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL  # restored
    finally:
        signal.signal(signal.SIGTERM, before)


def test_an_ignored_sighup_stays_ignored() -> None:
    before = signal.signal(signal.SIGHUP, signal.SIG_IGN)  # as under nohup
    try:
        with stop_on_signals():
            assert signal.getsignal(signal.SIGHUP) == signal.SIG_IGN
            os.kill(os.getpid(), signal.SIGHUP)  # nothing happens
            time.sleep(0.05)
    finally:
        signal.signal(signal.SIGHUP, before)
