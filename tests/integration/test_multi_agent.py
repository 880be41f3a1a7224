"""`crossrl run` on multi-agent scenarios through the real runner, every engine: `ma-smoke` (MPE simple_spread,
3 agents, one shared policy, 1 and 2 workers) and `speaker-listener-untuned` (2 agents whose spaces differ, one
policy each, catalog defaults). Each trial FINISHED with the team return as its headline return, each agent's
return beside it, and the report's per-agent table."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from crossrl.core.envs import make_parallel_env
from crossrl.reports.store import ResultsStore
from crossrl.scenarios import metrics as M
from crossrl.scenarios.loader import load

pytestmark = [pytest.mark.integration, pytest.mark.system]


@pytest.mark.parametrize("scenario", ["ma-smoke", "speaker-listener-untuned"])
def test_multi_agent_scenario_finishes_on_every_engine(tmp_path: Path, scenario: str) -> None:
    results = tmp_path / "results"
    proc = subprocess.run(
        [sys.executable, "-m", "crossrl.cli", "run", scenario, "--results-dir", str(results), "-o", str(tmp_path)],
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "160"},
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    spec, _ = load(scenario)
    assert set(spec.engines) == {"crossrl", "rllib", "torchrl"}
    loaded = ResultsStore(None, results_dir=results).load(scenario=scenario)
    assert sorted(loaded.trials.trial) == sorted(t.name for t in spec.trials())
    env_agents = list(make_parallel_env(spec.env).possible_agents)
    agents = [M.agent_metric(a) for a in env_agents]
    for row in loaded.trials.to_dict("records"):
        assert row["status"] == "FINISHED", f"{row['trial']}: {row['reason']}"
        hist = loaded.points[loaded.points.run_id == row["run_id"]]
        assert set(M.REQUIRED_POINT_METRICS) | set(agents) <= set(hist.metric), (row["trial"], sorted(set(hist.metric)))
        steps = hist[hist.metric == M.ENV_STEPS_SAMPLED].value
        assert steps.max() >= spec.budget.env_steps
        team = hist[hist.metric == M.EPISODE_RETURN_MEAN].sort_values("step")
        per_agent = hist[hist.metric.isin(agents)].groupby("step").value.sum()
        # MPE rewards are negative distances; the team return sums the agents'
        assert (team.value < 0).all()
        assert team.set_index("step").value.to_numpy() == pytest.approx(
            per_agent.loc[team.step].to_numpy(), rel=1e-4
        ), row["trial"]
    report = (tmp_path / "report.md").read_text()
    table = report.split("## Final return per agent", 1)[1].split("\n## ", 1)[0]
    for engine in spec.engines:
        for agent in env_agents:
            assert f"| {engine} | " in table and f" | {agent} | " in table, (engine, agent, table)
