"""MLflow round trips: the same write/read path against a real `mlflow server` and the embedded store."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from crossrl.reports.store import ResultsStore
from crossrl.scenarios.loader import load


def _round_trip(store: ResultsStore) -> None:
    spec, path = load("smoke")
    trial = spec.trials()[0]
    parent = store.start_parent(spec, spec_path=path, command="crossrl run smoke")
    run_id = store.start_trial(parent, trial, spec=spec)
    points = [(s, {"episode_return_mean": float(s) / 100, "sample_throughput": 1000.0 + s}) for s in range(0, 5000, 10)]
    store.log_points(run_id, points)
    store.set_tags(run_id, {"engine_version": "9.9"})
    store.log_native_config(run_id, {"lr": 0.1, "nested": {"k": [1, 2]}})
    store.finish_trial(
        run_id,
        status="FINISHED",
        summary={"final_return_mean": 49.9, "steps_to_target": None, "peak_rss_mb": 123.0},
        history=points,
        last_step=4990,
    )
    store.finish_parent(parent, status="FINISHED", counts={"FINISHED": 1})

    loaded = store.load(scenario="smoke")
    assert loaded.meta["parent_run_id"] == parent and loaded.meta["fingerprint"] == spec.fingerprint()
    assert loaded.meta["versions"]["mlflow"].startswith("3.")
    [row] = loaded.trials.to_dict("records")
    assert row["trial"] == trial.name and row["engine"] == "crossrl" and row["engine_version"] == "9.9"
    assert row["status"] == "FINISHED" and row["workers"] == 1 and row["seed"] == 0
    assert row["final_return_mean"] == 49.9 and math.isnan(row["steps_to_target"])
    ret = loaded.points[loaded.points.metric == "episode_return_mean"].sort_values("step")
    assert len(ret) == 500 and ret.value.iloc[-1] == pytest.approx(49.9)
    # the metric history in MLflow itself (what the UI plots) matches the artifact
    hist = store.client.get_metric_history(run_id, "sample_throughput")
    assert len(hist) == 500 and {m.step for m in hist} == set(range(0, 5000, 10))
    run = store.client.get_run(run_id)
    assert run.data.params["hp.lr"] == "0.0003" and run.data.params["native.nested.k"] == "[1, 2]"
    assert run.data.tags["mlflow.parentRunId"] == parent and run.info.status == "FINISHED"


def test_embedded_store_round_trip(tmp_path: Path) -> None:
    """The product's own first opening of a folder with no store (the `results_dir` fixture copies a made one)."""
    results_dir = tmp_path / "crossrl-results"
    store = ResultsStore(None, results_dir=results_dir)
    assert store.uri == f"sqlite:///{results_dir / 'mlflow.db'}" and (results_dir / "mlflow.db").is_file()
    _round_trip(store)
    assert (results_dir / "artifacts").is_dir()


@pytest.mark.integration
def test_tracking_server_round_trip(mlflow_server: str, tmp_path: Path) -> None:
    store = ResultsStore(mlflow_server, results_dir=tmp_path / "unused")
    assert store.uri.startswith("http://127.0.0.1:")
    _round_trip(store)
