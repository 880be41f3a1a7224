"""A `crossrl run` killed without cleanup (SIGKILL) is found and marked KILLED by the next command that
opens the store, and `crossrl run --resume` completes only its missing trials under the same parent run."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml
from mlflow.tracking import MlflowClient

from crossrl.cli import _optional_resume_value
from crossrl.reports.store import STALE_AFTER_S, SUPERSEDED_TAG, ResultsStore, _orphan_reason

CLI = [sys.executable, "-m", "crossrl.cli"]


def _spec(tmp_path: Path, *, steps: int = 2000) -> Path:  # a file per budget: the spec's fingerprint differs
    """Seed 0 finishes at once; seed 4 is slow (0.5 s per 100 env steps) and is the one killed."""
    spec = {
        "name": "resume-test",
        "env": {"id": "CartPole-v1"},
        "algorithm": {"name": "ppo"},
        "engines": ["fault"],
        "budget": {"env_steps": steps, "wall_seconds": 120},
        "seeds": [0, 4],
    }
    path = tmp_path / f"resume-test-{steps}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def _cli(*args: str, results: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *args, "--results-dir", str(results)], capture_output=True, text=True, timeout=180, check=False
    )


def _runs(results: Path) -> list:
    """Every run of the scenario, read with MLflow's own client (not through crossrl, which would reap)."""
    client = MlflowClient(tracking_uri=f"sqlite:///{results / 'mlflow.db'}")
    exp = client.get_experiment_by_name("resume-test")
    return list(client.search_runs([exp.experiment_id], max_results=100))


@pytest.mark.integration
@pytest.mark.system  # whole runs: one SIGKILLed, then its store opened, a changed spec refused, then resumed
def test_sigkilled_run_is_marked_killed_then_resumed(fault_engine: Path, results_dir: Path, tmp_path: Path) -> None:
    spec = _spec(tmp_path)
    proc = subprocess.Popen(
        [*CLI, "run", str(spec), "--results-dir", str(results_dir), "--no-report"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 120
    while not (fault_engine / "started-4").exists():  # seed 0 finished, seed 4 is running
        assert proc.poll() is None and time.monotonic() < deadline, "the run ended before the slow trial started"
        time.sleep(0.2)
    time.sleep(2.0)  # a few of its points reach the store
    tree = [proc.pid, *(p.pid for p in psutil.Process(proc.pid).children(recursive=True))]
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    # The trial process notices its runner is gone and stops; nothing of the run is left behind.
    gone_by = time.monotonic() + 30
    while any(psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE for pid in tree):
        assert time.monotonic() < gone_by, "processes of the killed run are still alive"
        time.sleep(0.2)

    before = {r.info.run_name: r for r in _runs(results_dir)}
    parent_name = next(n for n, r in before.items() if r.data.tags.get("crossrl.kind") == "parent")
    assert before[parent_name].info.status == "RUNNING"  # nothing closed it
    assert before["fault-ppo-w1-s4"].info.status == "RUNNING"
    assert before["fault-ppo-w1-s0"].data.tags["status"] == "FINISHED"
    finished_id = before["fault-ppo-w1-s0"].info.run_id
    killed_id = before["fault-ppo-w1-s4"].info.run_id

    # The next command that opens the store marks the orphan KILLED, with the reason.
    out = _cli("report", "resume-test", results=results_dir)
    assert f"run {before[parent_name].info.run_id} was left RUNNING and is now marked KILLED" in out.stderr
    after = {r.info.run_id: r for r in _runs(results_dir)}
    parent = after[before[parent_name].info.run_id]
    assert parent.info.status == "KILLED" and parent.data.tags["status"] == "KILLED"
    assert (
        f"pid {proc.pid}" in parent.data.tags["reason"]
        and "ended without closing the run" in parent.data.tags["reason"]
    )
    assert parent.data.tags["trials.FINISHED"] == "1" and parent.data.tags["trials.KILLED"] == "1"
    assert after[killed_id].data.tags["status"] == "KILLED" and after[killed_id].info.status == "KILLED"
    assert after[finished_id].data.tags["status"] == "FINISHED"

    # A changed spec is refused: exit 2, one line naming the field, nothing started.
    changed = _cli("run", str(_spec(tmp_path, steps=3000)), "--resume", "--no-report", results=results_dir)
    assert changed.returncode == 2, changed.stdout + changed.stderr
    lines = [line for line in changed.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "(budget.env_steps differ)" in lines[0] and "Traceback" not in changed.stderr

    # --resume runs only the trial that did not end, under the same parent run.
    resumed = _cli("run", str(spec), "--resume", "--no-report", results=results_dir)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    # its summary is the whole run's: the trial it kept, read back, beside the one it ran
    assert "resume-test: 1 trial to run, 1 kept" in resumed.stdout
    assert "resume-test: {'FINISHED': 2}" in resumed.stdout, resumed.stdout
    (row,) = [line for line in resumed.stdout.splitlines() if "fault-ppo-w1-s0" in line]
    assert "FINISHED" in row and "2,000" in row and " 0.0 " not in row, row  # its status, env steps and wall time
    runs = {r.info.run_id: r for r in _runs(results_dir)}
    assert len([r for r in runs.values() if r.data.tags.get("crossrl.kind") == "parent"]) == 1
    trials = [r for r in runs.values() if r.data.tags.get("crossrl.kind") == "trial"]
    assert len(trials) == 3  # seed 0 once, seed 4 twice (the killed attempt kept)
    assert runs[finished_id].data.tags.get(SUPERSEDED_TAG) is None  # not rerun
    rerun = next(r for r in trials if r.info.run_name == "fault-ppo-w1-s4" and r.info.run_id != killed_id)
    assert rerun.data.tags["status"] == "FINISHED"
    assert runs[killed_id].data.tags[SUPERSEDED_TAG] == rerun.info.run_id
    parent = runs[parent.info.run_id]
    assert parent.info.status == "FINISHED" and parent.data.tags["status"] == "FINISHED"
    assert parent.data.tags["trials.FINISHED"] == "2" and "trials.KILLED" not in parent.data.tags
    assert parent.data.tags["resumes"] == "1"

    # Reading the run sees each trial once: the finished first attempt and the resumed one.
    loaded = ResultsStore(None, results_dir=results_dir).load(scenario="resume-test")
    assert sorted(loaded.trials.trial) == ["fault-ppo-w1-s0", "fault-ppo-w1-s4"]
    assert set(loaded.trials.status) == {"FINISHED"}


def test_resume_of_nothing_is_one_line(fault_engine: Path, results_dir: Path, tmp_path: Path) -> None:
    out = _cli("run", str(_spec(tmp_path)), "--resume", "--no-report", results=results_dir)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: no results for scenario 'resume-test'"), lines


def test_orphan_reason_same_host_checks_the_pid_and_its_start_time() -> None:
    me = psutil.Process(os.getpid())
    tags = {"owner.host": socket.gethostname(), "owner.pid": str(me.pid), "owner.pid_start": f"{me.create_time():.2f}"}
    assert _orphan_reason(tags, started_s=time.time()) is None  # alive
    reused = {**tags, "owner.pid_start": f"{me.create_time() - 100:.2f}"}  # same pid, another process
    assert "ended without closing the run" in (_orphan_reason(reused, started_s=time.time()) or "")
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    dead = {**tags, "owner.pid": str(child.pid)}
    assert f"pid {child.pid}" in (_orphan_reason(dead, started_s=time.time()) or "")


def test_orphan_reason_other_host_goes_by_the_heartbeat() -> None:
    now = time.time()
    tags = {"owner.host": "elsewhere", "owner.pid": "12", "heartbeat": f"{now - 60:.0f}"}
    assert _orphan_reason(tags, started_s=now - 3600, now=now) is None
    stale = {**tags, "heartbeat": f"{now - STALE_AFTER_S - 1:.0f}"}
    assert "no heartbeat from its process (pid 12 on elsewhere)" in (_orphan_reason(stale, started_s=0, now=now) or "")
    # a run from before owners were recorded: only its start time tells
    assert _orphan_reason({}, started_s=now - STALE_AFTER_S - 1, now=now) is not None
    assert _orphan_reason({}, started_s=now - 10, now=now) is None


def test_resume_takes_an_optional_parent_id() -> None:
    assert _optional_resume_value(["run", "x", "--resume"]) == ["run", "x", "--resume", "latest"]
    assert _optional_resume_value(["run", "x", "--resume", "--no-report"]) == [
        "run", "x", "--resume", "latest", "--no-report"
    ]  # fmt: skip
    assert _optional_resume_value(["run", "x", "--resume", "abc"]) == ["run", "x", "--resume", "abc"]


@pytest.mark.integration
@pytest.mark.system  # whole runs: one stopped, then resumed
def test_resume_finishes_what_the_run_set_out_to_do_with_no_flag_repeated(
    fault_engine: Path, results_dir: Path, tmp_path: Path
) -> None:
    """Run with a selection (--seeds) and an override (--set); kill it; `--resume` alone takes up that run: the
    selected seeds only, the overridden value, and each trial says what it continues from."""
    spec = _spec(tmp_path)
    spec_text = yaml.safe_load(spec.read_text())
    spec_text["seeds"] = [0, 1, 4]
    spec.write_text(yaml.safe_dump(spec_text))
    flags = ["--seeds", "0,4", "--set", "algorithm.hyperparams.lr=0.001"]
    proc = subprocess.Popen([*CLI, "run", str(spec), *flags, "--results-dir", str(results_dir), "--no-report"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    deadline = time.monotonic() + 120
    while not (fault_engine / "started-4").exists():  # seed 0 finished, seed 4 is running
        assert proc.poll() is None and time.monotonic() < deadline, "the run ended before the slow trial started"
        time.sleep(0.2)
    time.sleep(1.0)
    os.kill(proc.pid, signal.SIGTERM)
    assert proc.wait(timeout=60) == 143

    resumed = _cli("run", str(spec), "--resume", "--no-report", results=results_dir)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert "resume-test: 1 trial to run, 1 kept" in resumed.stdout, resumed.stdout[-3000:]  # not seed 1
    assert "fault-ppo-w1-s4: restarted from the start: no checkpoint" in resumed.stdout
    trials = [r for r in _runs(results_dir) if r.data.tags.get("crossrl.kind") == "trial"]
    assert {r.data.tags["seed"] for r in trials} == {"0", "4"}
    assert {float(r.data.params["hp.lr"]) for r in trials} == {0.001}  # the override, not repeated

    again = _cli("run", str(spec), "--resume", "--seeds", "1", "--no-report", results=results_dir)
    assert again.returncode == 2 and "seeds" in again.stderr and len(again.stderr.strip().splitlines()) == 1
