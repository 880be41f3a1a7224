"""`crossrl run ma-smoke` through the real runner: a PettingZoo env (MPE simple_spread, 3 agents, one shared
policy) on every engine that runs multi-agent envs; each trial FINISHED with the team return as its headline
return and each agent's return beside it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from crossrl.reports.store import ResultsStore
from crossrl.scenarios import metrics as M
from crossrl.scenarios.loader import load

pytestmark = pytest.mark.integration


def test_ma_smoke_finishes_with_team_and_agent_returns(tmp_path: Path) -> None:
    results = tmp_path / "results"
    proc = subprocess.run(
        [sys.executable, "-m", "crossrl.cli", "run", "ma-smoke", "--results-dir", str(results), "--no-report"],
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "160"},
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    spec, _ = load("ma-smoke")
    loaded = ResultsStore(None, results_dir=results).load(scenario="ma-smoke")
    assert sorted(loaded.trials.trial) == sorted(t.name for t in spec.trials())
    agents = [M.agent_metric(f"agent_{i}") for i in range(3)]
    for row in loaded.trials.to_dict("records"):
        assert row["status"] == "FINISHED", f"{row['trial']}: {row['reason']}"
        hist = loaded.points[loaded.points.run_id == row["run_id"]]
        assert set(M.REQUIRED_POINT_METRICS) | set(agents) <= set(hist.metric), sorted(set(hist.metric))
        steps = hist[hist.metric == M.ENV_STEPS_SAMPLED].value
        assert steps.max() >= spec.budget.env_steps
        team = hist[hist.metric == M.EPISODE_RETURN_MEAN].sort_values("step")
        per_agent = hist[hist.metric.isin(agents)].groupby("step").value.sum()
        # simple_spread's rewards are negative distances; the team return sums the three agents'
        assert (team.value < 0).all()
        assert team.set_index("step").value.to_numpy() == pytest.approx(per_agent.loc[team.step].to_numpy())
