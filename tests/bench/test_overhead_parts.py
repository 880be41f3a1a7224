"""The overhead benchmark's parts on small real inputs: timed store writes, report builds, CLI start."""

from __future__ import annotations

import json
from pathlib import Path

from crossrl.measure.bench.commands import _time_help, _time_report_builds, _timed_store, help_command


def test_timed_store_times_real_log_points(results_dir: Path) -> None:
    store, spent = _timed_store(results_dir)
    exp = store.experiment_id("bench-test")
    run_id = store.client.create_run(exp).info.run_id
    store.log_points(run_id, [(i, {"sample_throughput": float(i)}) for i in range(50)])
    assert spent["log_points"] > 0 and spent["set_tags"] == 0
    history = store.client.get_metric_history(run_id, "sample_throughput")
    assert len(history) == 50  # the wrapped call really logged


def test_report_build_on_synthetic_frames(tmp_path: Path) -> None:
    times = _time_report_builds(tmp_path, 1, engines=("crossrl", "rllib"), workers=(1,), seeds=(0, 1), n_points=20)
    assert len(times) == 1 and times[0] > 0
    doc = json.loads((tmp_path / "r0" / "report.json").read_text())
    assert doc["scenario"] == "synthetic-ppo"


def test_help_start_time() -> None:
    assert help_command()[-1] == "--help"
    (t,) = _time_help(1)
    assert 0 < t < 60
