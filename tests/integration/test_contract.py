"""The adapter contract, checked on every engine: `crossrl run smoke` against a real MLflow server.

One real run of the smoke scenario (PPO CartPole, crossrl/rllib/torchrl x 1 and 2 workers x 2 seeds,
a tiny budget) feeds every test here; each engine's child runs must carry the common metrics, sane
values, the native config and the engine version.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest

from crossrl.core import metrics as M
from crossrl.reports.store import Loaded, ResultsStore
from crossrl.scenarios.loader import load

pytestmark = pytest.mark.integration

ENGINE_DIST = {"crossrl": None, "rllib": "ray", "torchrl": "torchrl"}


@pytest.fixture(scope="module")
def smoke_run(mlflow_server: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out_dir = tmp_path_factory.mktemp("smoke-report")
    proc = subprocess.run(
        [sys.executable, "-m", "crossrl.cli", "run", "smoke", "--tracking-uri", mlflow_server, "-o", str(out_dir)],
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "160"},
        timeout=1500,
    )
    store = ResultsStore(mlflow_server)
    loaded = store.load(scenario="smoke")
    return {"proc": proc, "store": store, "loaded": loaded, "report_dir": out_dir}


def test_smoke_run_exits_cleanly(smoke_run: dict[str, Any]) -> None:
    proc = smoke_run["proc"]
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    loaded: Loaded = smoke_run["loaded"]
    spec, _ = load("smoke")
    assert sorted(loaded.trials.trial) == sorted(t.name for t in spec.trials())
    assert set(loaded.trials.status) == {"FINISHED"}, loaded.trials[["trial", "status", "reason"]]


@pytest.mark.parametrize("engine", ["crossrl", "rllib", "torchrl"])
def test_engine_honours_the_contract(smoke_run: dict[str, Any], engine: str) -> None:
    loaded: Loaded = smoke_run["loaded"]
    store: ResultsStore = smoke_run["store"]
    spec, _ = load("smoke")
    rows = loaded.trials[loaded.trials.engine == engine]
    assert len(rows) == 4, f"{engine}: expected 1 and 2 workers x 2 seeds"
    dist = ENGINE_DIST[engine]
    for row in rows.to_dict("records"):
        name = row["trial"]
        assert row["status"] == "FINISHED", f"{name}: {row['reason']}"
        hist = loaded.points[loaded.points.run_id == row["run_id"]]
        for metric in M.REQUIRED_POINT_METRICS:
            assert metric in set(hist.metric), f"{name}: no {metric}"
        steps = hist[hist.metric == M.ENV_STEPS_SAMPLED].sort_index().value.tolist()
        assert steps == sorted(steps) and steps[-1] >= spec.budget.env_steps, f"{name}: env steps {steps}"
        returns = hist[hist.metric == M.EPISODE_RETURN_MEAN].value
        assert len(returns) and all(math.isfinite(v) and 1 <= v <= 500 for v in returns), f"{name}: {list(returns)}"
        thr = hist[hist.metric == M.SAMPLE_THROUGHPUT].value
        assert (thr > 0).all(), f"{name}: throughput {list(thr)}"
        assert row["peak_rss_mb"] > 50 and row["cpu_seconds"] > 0 and row["setup_s"] >= 0
        native = json.loads(Path(store.client.download_artifacts(row["run_id"], "native_config.json")).read_text())
        assert isinstance(native, dict) and len(native) >= 3, f"{name}: native config {native}"
        expected = metadata.version(dist) if dist else __import__("crossrl").__version__
        assert row["engine_version"] == expected, name
        run = store.client.get_run(row["run_id"])
        assert run.data.params["hp.train_batch"] == "512"
        assert any(k.startswith("native.") for k in run.data.params), f"{name}: no native.* params"
