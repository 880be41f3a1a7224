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

from crossrl.reports.store import Loaded, ResultsStore
from crossrl.scenarios import metrics as M
from crossrl.scenarios.loader import load

pytestmark = [pytest.mark.integration, pytest.mark.alone]  # its throughput feeds the regress gate

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
        # every engine's own PPO diagnostics are stored (diag.*), beside the common metrics
        assert {M.DIAG_APPROX_KL, M.DIAG_GRAD_NORM} <= set(hist.metric), f"{name}: {sorted(set(hist.metric))}"
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


def _final_return_from_history(hist: Any) -> float:
    """The runner's definition, recomputed independently: episode-weighted mean of the returns over
    the points in the last 10% of the env steps sampled."""
    wide = hist.pivot_table(index="step", columns="metric", values="value", aggfunc="last")
    wide = wide.dropna(subset=[M.EPISODE_RETURN_MEAN])
    tail = wide[wide.index >= 0.9 * wide.index.max()]
    w = tail[M.EPISODES_THIS_POINT]
    return float((tail[M.EPISODE_RETURN_MEAN] * w).sum() / w.sum())


def test_smoke_report_numbers_match_the_raw_history(smoke_run: dict[str, Any]) -> None:
    import statistics

    from scipy.stats import trim_mean

    from crossrl.reports.render import load_report_json

    doc = load_report_json(smoke_run["report_dir"] / "report.json")
    loaded: Loaded = smoke_run["loaded"]
    assert doc["fingerprint"] == loaded.meta["fingerprint"] and doc["parent_run_id"] == loaded.meta["parent_run_id"]
    assert {r["engine"] for r in doc["final_return"]} == {"crossrl", "rllib", "torchrl"}
    for row in doc["final_return"]:
        trials = loaded.trials[(loaded.trials.engine == row["engine"]) & (loaded.trials.workers == row["workers"])]
        finals = [_final_return_from_history(loaded.points[loaded.points.run_id == rid]) for rid in trials.run_id]
        assert row["iqm"] == pytest.approx(float(trim_mean(finals, 0.25)), rel=1e-9), row
    for row in doc["throughput"]:
        trials = loaded.trials[(loaded.trials.engine == row["engine"]) & (loaded.trials.workers == row["workers"])]
        per_trial = [
            statistics.median(
                loaded.points[(loaded.points.run_id == rid) & (loaded.points.metric == M.SAMPLE_THROUGHPUT)].value
            )
            for rid in trials.run_id
        ]
        assert row["median"] == pytest.approx(statistics.median(per_trial), rel=1e-9), row
        assert row["min"] == pytest.approx(min(per_trial)) and row["max"] == pytest.approx(max(per_trial))
    # the report was also attached to the parent run, so it shows in the MLflow UI
    store: ResultsStore = smoke_run["store"]
    names = {a.path for a in store.client.list_artifacts(loaded.meta["parent_run_id"], "report")}
    assert names == {"report/report.html", "report/report.md", "report/report.json"}


def test_smoke_report_opens_in_chromium(smoke_run: dict[str, Any], tmp_path: Path) -> None:
    from browser import CHROMIUM, check_report_in_chromium

    if not CHROMIUM.exists():
        pytest.skip("needs /usr/bin/chromium (`make test` installs it)")
    shot = check_report_in_chromium(
        smoke_run["report_dir"] / "report.html", tmp_path, engines=["crossrl", "rllib", "torchrl"]
    )
    assert shot.exists()


def test_smoke_has_no_regression_against_the_committed_baseline(smoke_run: dict[str, Any], mlflow_server: str) -> None:
    """The CI gate: this run against reports/baselines/smoke.json. The Markdown table and JUnit XML go to
    crossrl-results/ci/ (printed by `make test`)."""
    repo = Path(__file__).resolve().parents[2]
    out = repo / "crossrl-results" / "ci"
    proc = subprocess.run(
        [
            sys.executable, "-m", "crossrl.cli", "regress", "--baseline", str(repo / "reports/baselines/smoke.json"),
            "--run", smoke_run["loaded"].meta["parent_run_id"], "--tracking-uri", mlflow_server, "--speed",
            "--markdown", str(out / "regress.md"), "--junit", str(out / "regress.xml"),
        ],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (out / "regress.md").read_text().count("| crossrl/ppo/w") == 4  # 2 worker counts x 2 metrics
