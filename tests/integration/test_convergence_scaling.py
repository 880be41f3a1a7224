"""Convergence scaling end to end (`make test-system`): one `crossrl run` of PPO on CartPole with env steps that cost
wall time (`step_latency_ms`), crossrl's engine at 1 and 2 workers, 2 seeds, each trial stopping at a low target.
The report's convergence-scaling table has a row per worker count with its seeds, speedup, CI and sample cost, its
figure is drawn, the verdict has the engine's sentence, and the tables say which batch scaling the trials ran (each
trial tagged with it). The statistics themselves are pure functions checked against known answers in
tests/reports/test_scaling.py; this is the path from a spec to them (two seeds are the fewest a CI takes). Four
crossrl trials: about a minute."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from crossrl.reports.store import ResultsStore

pytestmark = [pytest.mark.integration, pytest.mark.system]


def test_two_worker_counts_give_a_convergence_scaling_table_figure_and_sentence(
    tmp_path: Path, results_dir: Path
) -> None:
    spec = {
        "name": "converge",
        "env": {"id": "CartPole-v1", "step_latency_ms": 1},
        "algorithm": {"name": "ppo", "hyperparams": {"train_batch": 256, "minibatch": 128, "epochs": 4, "lr": 1e-3}},
        "engines": ["crossrl"],
        "execution": {"workers": [1, 2], "envs_per_worker": 1},
        "budget": {"env_steps": 20000, "wall_seconds": 300, "stop_at_target": True},
        "target": {"episode_return_mean": 60},
        "seeds": [0, 1],
    }
    path = tmp_path / "converge.yaml"
    path.write_text(yaml.safe_dump(spec))
    out = tmp_path / "report"
    proc = subprocess.run(
        [sys.executable, "-m", "crossrl.cli", "run", str(path), "--results-dir", str(results_dir), "-o", str(out)],
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    loaded = ResultsStore(None, results_dir=results_dir).load(scenario="converge")
    assert set(loaded.trials.status) == {"FINISHED"}, loaded.trials.reason.tolist()
    assert set(loaded.trials.scaling) == {"strong"} and set(loaded.trials.scaling_batch) == {"train_batch=256"}

    data = json.loads((out / "report.json").read_text())
    rows = {r["workers"]: r for r in data["convergence"]}
    assert sorted(rows) == [1, 2] and {r["engine"] for r in rows.values()} == {"crossrl"}
    assert rows[1]["n_seeds"] == rows[2]["n_seeds"] == 2
    assert rows[1]["speedup"] == pytest.approx(1.0)
    two = rows[2]
    assert two["speedup"] > 0 and two["speedup_low"] <= two["speedup"] <= two["speedup_high"]
    assert two["sample_cost"] > 0 and two["worker_seconds"] == pytest.approx(2 * two["median_wall_s"], rel=1e-6)
    md = (out / "report.md").read_text()
    assert "Convergence scaling (time to episode return ≥ 60)" in md
    assert "Batch: strong scaling, the train batch held fixed and split over the workers" in md
    assert "crossrl: 2 workers reach the target" in md or "crossrl: no speedup to tell" in md
    assert "figures/convergence.svg" in md and (out / "figures" / "convergence.svg").exists()
