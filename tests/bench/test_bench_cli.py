"""`crossrl bench sampling` end to end: real processes, figures printed, JSON written, logged to the store."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from crossrl.reports.store import ResultsStore

pytestmark = pytest.mark.integration


def test_bench_sampling_logs_its_figures_to_the_store(tmp_path: Path) -> None:
    results = tmp_path / "results"
    out = tmp_path / "bench.json"
    cmd = [sys.executable, "-m", "crossrl.cli", "bench", "sampling", "--engines", "raw,crossrl", "--workers", "1"]
    cmd += ["--envs-per-worker", "2", "--repeat", "1", "--seconds", "0.5", "--fragment", "32"]
    cmd += ["--json", str(out), "--results-dir", str(results)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "experiment bench-sampling" in proc.stdout
    data = json.loads(out.read_text())
    crossrl_row = next(r for r in data["rows"] if r["engine"] == "crossrl")
    assert data["conditions"]["fragment"] == 32
    # CPUs in use while timed: the env-stepping actor keeps most of a core busy, the machine at least that
    cpus = crossrl_row["cpus"]
    assert 0.2 < cpus["workers_cpus"] <= cpus["machine_busy_cpus"] + 0.05 and cpus["driver_cpus"] >= 0

    store = ResultsStore(None, results_dir=results)
    exp = store.client.get_experiment_by_name("bench-sampling")
    assert exp is not None
    [run] = store.client.search_runs([exp.experiment_id])
    assert run.data.tags["crossrl.kind"] == "bench" and run.data.params["conditions.fragment"] == "32"
    metrics = run.data.metrics
    assert metrics["crossrl.w1.steps_per_s"] == pytest.approx(crossrl_row["steps_per_s"]["median"])
    assert metrics["crossrl.w1.ratio_to_raw"] == pytest.approx(crossrl_row["ratio_to_raw"])
    assert metrics["raw.w1.ratio_to_raw"] == pytest.approx(1.0)
    assert metrics["crossrl.w1.workers_cpus"] == pytest.approx(cpus["workers_cpus"])


def test_bench_scaling_takes_a_fragment_and_rejects_a_bad_one(tmp_path: Path) -> None:
    out = tmp_path / "scaling.json"
    base = [sys.executable, "-m", "crossrl.cli", "bench", "scaling", "--engines", "raw", "--workers", "1,2"]
    base += ["--env-latency-ms", "1", "--seconds", "0.3", "--no-store"]
    proc = subprocess.run([*base, "--fragment", "16", "--json", str(out)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = json.loads(out.read_text())
    assert data["conditions"]["fragment"] == 16 and data["conditions"]["env_latency_ms"] == 1.0
    assert {(r["workers"], r["fragment"]) for r in data["rows"]} == {(1, 16), (2, 16)}
    for flag in ("0", "16,x", "8,-1"):
        bad = subprocess.run([*base, "--fragment", flag], capture_output=True, text=True, timeout=120)
        assert bad.returncode != 0 and "--fragment" in bad.stdout + bad.stderr and "Traceback" not in bad.stderr


def test_bench_scaling_sweeps_fragments_in_one_run(tmp_path: Path) -> None:
    out = tmp_path / "sweep.json"
    cmd = [sys.executable, "-m", "crossrl.cli", "bench", "scaling", "--engines", "raw", "--workers", "1,2"]
    cmd += ["--env-latency-ms", "1", "--seconds", "0.3", "--no-store", "--fragment", "8,32", "--json", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = json.loads(out.read_text())
    assert data["conditions"]["fragment"] == [8, 32]
    rows = {(r["workers"], r["fragment"]): r for r in data["rows"]}
    assert set(rows) == {(1, 8), (2, 8), (1, 32), (2, 32)}
    for f in (8, 32):  # each fragment's 2-worker row scales against its own 1-worker row
        assert rows[2, f]["speedup"] == pytest.approx(
            rows[2, f]["steps_per_s"]["median"] / rows[1, f]["steps_per_s"]["median"]
        )
    assert "fragment 32" in proc.stdout  # the progress lines say which fragment each measurement had


@pytest.mark.integration
def test_bench_transport_times_each_transport_per_fragment(tmp_path: Path) -> None:
    """Both transports carry real fragments with new weights; the figures are per fragment and positive."""
    out = tmp_path / "t.json"
    base = [sys.executable, "-m", "crossrl.cli", "bench", "transport", "--no-store"]
    proc = subprocess.run([*base, "--fragments", "5", "--repeat", "2", "--json", str(out)], capture_output=True,
                          text=True, timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads(out.read_text())
    assert [r["transport"] for r in doc["rows"]] == ["calls", "stream"]
    for r in doc["rows"]:
        assert len(r["actor_cpu_us"]) == len(r["wall_us"]) == 2 and r["wall_us_median"] > 0
    assert doc["batch_kib"] > 0 and doc["weights_kib"] > 0 and doc["fragment"] == 64
    bad = subprocess.run([*base, "--transports", "pigeon"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "known: calls, stream" in bad.stderr + bad.stdout
