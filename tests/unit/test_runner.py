"""The runner: isolation per trial, FINISHED / FAILED / TIMEOUT / KILLED paths, SKIPPED, the store's content."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml

from crossrl.adapters.registry import engine_ids
from crossrl.orchestration.runner import plan_trials, run_scenario
from crossrl.orchestration.trials import summarize
from crossrl.reports.store import ResultsStore
from crossrl.scenarios.loader import SpecError, validate


def fault_spec(seeds: list[int], *, wall: float = 60, steps: int = 1000, algorithm: str = "ppo") -> dict:
    return {
        "name": "fault-test",
        "env": {"id": "CartPole-v1"},
        "algorithm": {"name": algorithm},
        "engines": ["fault"],
        "budget": {"env_steps": steps, "wall_seconds": wall},
        "target": {"episode_return_mean": 30},
        "seeds": seeds,
    }


def test_summary_is_computed_from_points_alone() -> None:
    pts = [
        (100, {"episode_return_mean": 10.0, "episodes_this_point": 2.0, "wall_time_s": 1.0}),
        (200, {"episode_return_mean": 40.0, "episodes_this_point": 1.0, "wall_time_s": 2.0}),
        (1000, {"episode_return_mean": 20.0, "episodes_this_point": 3.0, "wall_time_s": 9.0}),
        (950, {"episode_return_mean": 60.0, "episodes_this_point": 1.0, "wall_time_s": 8.0}),
    ]
    pts.sort()
    s = summarize(pts, target=30.0, setup_s=1.5)
    assert s["steps_to_target"] == 200 and s["wall_s_to_target"] == 2.0
    # last 10% of 1000 steps: points at 950 and 1000, weighted by their episode counts
    assert s["final_return_mean"] == pytest.approx((60 * 1 + 20 * 3) / 4)
    assert "steps_to_target" not in summarize(pts, target=1000.0, setup_s=None)


def test_crash_hang_and_hard_exit_are_recorded_and_the_next_trial_runs(fault_engine: Path, results_dir: Path) -> None:
    # seeds: 1 raises, 2 hangs (TIMEOUT), 3 exits hard, 0 is fine: the crash comes first, the rest still run
    spec = validate(fault_spec([1, 2, 3, 0], wall=12), label="fault.yaml", engines=engine_ids())
    store = ResultsStore(None, results_dir=results_dir)
    outcome = run_scenario(spec, store=store)
    by_seed = {r.trial.seed: r for r in outcome.results}
    assert [r.trial.seed for r in outcome.results] == [1, 2, 3, 0]
    assert by_seed[1].status == "FAILED" and "injected failure at 300 env steps" in by_seed[1].reason
    assert by_seed[2].status == "TIMEOUT" and "wall-clock budget of 12 s" in by_seed[2].reason
    assert by_seed[3].status == "FAILED" and "exited with code 3" in by_seed[3].reason
    assert by_seed[0].status == "FINISHED" and by_seed[0].env_steps >= 1000

    # the hung trial's process is gone, and its partial metrics are kept in the store
    hung_pid = int((fault_engine / "started-2").read_text())
    assert not psutil.pid_exists(hung_pid) or psutil.Process(hung_pid).status() == psutil.STATUS_ZOMBIE

    loaded = store.load(scenario="fault-test")
    trials = loaded.trials.set_index("seed")
    assert trials.loc[1, "status"] == "FAILED" and trials.loc[2, "status"] == "TIMEOUT"
    assert "injected failure" in trials.loc[1, "reason"]
    run_points = loaded.points[loaded.points.run_id == trials.loc[2, "run_id"]]
    assert sorted(run_points[run_points.metric == "env_steps_sampled"].step) == [100]
    ok = loaded.points[
        (loaded.points.run_id == trials.loc[0, "run_id"]) & (loaded.points.metric == "env_steps_sampled")
    ]
    assert list(ok.step) == sorted(ok.step) and ok.step.max() == 1000
    assert trials.loc[0, "peak_rss_mb"] > 10 and trials.loc[0, "cpu_seconds"] > 0

    # the traceback and the trial's log are artifacts of the failed run
    client = store.client
    tb = Path(client.download_artifacts(trials.loc[1, "run_id"], "traceback.txt")).read_text()
    assert "RuntimeError: injected failure" in tb and "Traceback" in tb
    params = client.get_run(trials.loc[0, "run_id"]).data.params
    assert params["native.model _unused_.hidden"] == "[8]"  # a key MLflow refuses is made valid, not fatal
    arts = {a.path for a in client.list_artifacts(trials.loc[1, "run_id"])}
    assert {"traceback.txt", "fault-ppo-w1-s1.log", "native_config.json", "metrics.csv"} <= arts


def test_skip_unsupported_records_skipped_with_reason(fault_engine: Path, results_dir: Path) -> None:
    raw = fault_spec([0], algorithm="a2c")
    raw["engines"] = ["fault"]
    spec = validate(raw, label="x", engines=engine_ids())
    store = ResultsStore(None, results_dir=results_dir)
    outcome = run_scenario(spec, store=store, skip_unsupported=True)
    [r] = outcome.results
    assert r.status == "SKIPPED" and "fault has no a2c" in r.reason
    loaded = store.load(scenario="fault-test")
    assert list(loaded.trials.status) == ["SKIPPED"]


def test_the_plan_refuses_an_unsupported_trial_unless_it_is_skipped(fault_engine: Path) -> None:
    """The run's first step, alone: its trials, and the unsupported ones named with why (nothing stored yet)."""
    raw = fault_spec([0, 1], algorithm="a2c")
    spec = validate(raw, label="x", engines=engine_ids())
    with pytest.raises(SpecError, match="fault has no a2c"):
        plan_trials(spec, ray_address=None, skip_unsupported=False, parallel=1, placement="node")
    trials, bad = plan_trials(spec, ray_address=None, skip_unsupported=True, parallel=1, placement="node")
    assert [t.name for t in trials] == sorted(bad) and all("fault has no a2c" in why for why in bad.values())
    with pytest.raises(SpecError, match="--parallel must be at least 1, got 0"):
        plan_trials(spec, ray_address=None, skip_unsupported=True, parallel=0, placement="node")


def test_ctrl_c_kills_the_running_trial_and_keeps_finished_ones(fault_engine: Path, tmp_path: Path) -> None:
    spec_file = tmp_path / "slow.yaml"
    # seed 0 steps 100k random actions (a few seconds) and finishes; seed 4 is slow and gets interrupted
    spec_file.write_text(yaml.safe_dump(fault_spec([0, 4], steps=100_000, wall=120)))
    results = tmp_path / "res"
    proc = subprocess.Popen(
        [sys.executable, "-m", "crossrl.cli", "run", str(spec_file), "--results-dir", str(results), "--no-report"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env={**os.environ, "COLUMNS": "120"},
        # a shell that starts jobs in the background (`cmd &`) hands them SIGINT ignored: undo that here
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    deadline = time.time() + 120
    while not (fault_engine / "started-4").exists():
        assert time.time() < deadline and proc.poll() is None, "slow trial never started"
        time.sleep(0.2)
    time.sleep(2.0)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130, out.decode()
    slow_pid = int((fault_engine / "started-4").read_text())
    assert not psutil.pid_exists(slow_pid) or psutil.Process(slow_pid).status() == psutil.STATUS_ZOMBIE
    loaded = ResultsStore(None, results_dir=results).load(scenario="fault-test")
    status = dict(zip(loaded.trials.seed, loaded.trials.status, strict=True))
    assert status == {0: "FINISHED", 4: "KILLED"}
    assert loaded.meta["status"] == "KILLED"
    first = loaded.trials.set_index("seed").loc[0, "run_id"]
    steps = loaded.points[(loaded.points.run_id == first) & (loaded.points.metric == "env_steps_sampled")].step
    assert steps.max() == 100_000 and len(steps) == 1000


@pytest.mark.integration
@pytest.mark.system  # a whole run of two trials on a real engine
def test_real_engine_crash_is_failed_with_traceback_and_the_next_trial_runs(
    fault_engine: Path, results_dir: Path
) -> None:
    raw = {
        "name": "crash-test",
        "env": {"id": "crash_env:CrashingCartPole-v0", "kwargs": {"crash_at": 200}},
        "algorithm": {"name": "ppo", "hyperparams": {"train_batch": 256, "minibatch": 64, "epochs": 1}},
        "engines": ["crossrl"],
        "execution": {"workers": [1], "envs_per_worker": 2},
        "budget": {"env_steps": 2000, "wall_seconds": 180},
        "seeds": [0, 1],
    }
    spec = validate(raw, label="crash.yaml", engines=engine_ids())
    store = ResultsStore(None, results_dir=results_dir)
    outcome = run_scenario(spec, store=store)
    assert [r.status for r in outcome.results] == ["FAILED", "FAILED"]  # the second ran after the first failed
    for r in outcome.results:
        assert "simulator crashed" in r.reason
        tb = Path(store.client.download_artifacts(r.run_id, "traceback.txt")).read_text()
        assert "RuntimeError: CrashingCartPole: simulator crashed" in tb


def test_ctrl_c_during_a_store_write_is_raised_after_it() -> None:
    from crossrl.orchestration.signals import deferred_signals

    finished = []
    before = signal.signal(signal.SIGINT, signal.default_int_handler)  # may be SIG_IGN under a background shell
    try:
        with pytest.raises(KeyboardInterrupt), deferred_signals():
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)
            finished.append(True)  # the write runs to its end
        assert finished == [True]
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # restored
    finally:
        signal.signal(signal.SIGINT, before)


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--max-retries", "1"], "retries are for trials fanned out over a Ray cluster; add --parallel 2 or more"),
        (["--max-retries", "-1", "--parallel", "2"], "--max-retries -1: it cannot be negative"),
    ],
)
def test_max_retries_without_a_fanned_out_sweep_or_below_zero_is_one_line(
    flags: list[str], says: str, tmp_path: Path
) -> None:
    from typer.testing import CliRunner

    from crossrl.cli import app

    out = CliRunner().invoke(app, ["run", "smoke", "--results-dir", str(tmp_path / "r"), *flags])
    assert out.exit_code == 2 and says in out.output, out.output
    assert not (tmp_path / "r").exists()  # nothing stored


@pytest.mark.parametrize(
    ("sets", "says"),
    [
        (["--set", "target.episode_return_mean=null"], "--set target.episode_return_mean=VALUE"),
        (["--set", "target.episode_return_mean=high"], "target.episode_return_mean"),
    ],
)
def test_bench_e2e_times_to_a_target_given_by_set_and_says_when_there_is_none(
    sets: list[str], says: str, tmp_path: Path
) -> None:
    from typer.testing import CliRunner

    from crossrl.cli import app

    out = CliRunner().invoke(app, ["bench", "e2e", "--scenario", "smoke", "--results-dir", str(tmp_path / "r"), *sets])
    assert out.exit_code == 2 and says in out.output, out.output
    assert "Traceback" not in out.output
    assert not (tmp_path / "r").exists()  # nothing run, nothing stored
