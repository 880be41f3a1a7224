"""`crossrl bench dreamer`'s parts: the limit (crossrl's DreamerV3 update alone) runs and counts its updates, an
engine's rates are read off its points after learning starts, and the table quotes each against the limit."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from crossrl.measure.bench.commands import _sac_row
from crossrl.measure.bench.dreamer_limit import plain_dreamer_updates_per_s
from crossrl.measure.bench.results import DreamerTable, SacRow
from crossrl.scenarios import metrics as M

TINY = {"batch_size_B": 2, "batch_length_T": 8, "horizon_H": 3}


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1"])
def test_the_limit_makes_updates_on_discrete_and_continuous_actions(env_id: str) -> None:
    out = plain_dreamer_updates_per_s(env_id=env_id, hyperparams=TINY, seconds=0.5, warmup=1)
    assert out["updates"] >= 1 and out["updates_per_s"] > 0 and out["cpu_s_per_update"] > 0


def test_the_limit_runs_as_its_own_process_and_prints_json() -> None:
    args = ["CartPole-v1", json.dumps(TINY), "0.3"]
    out = subprocess.run([sys.executable, "-m", "crossrl.measure.bench.dreamer_limit", *args], capture_output=True,
                         text=True, check=True, timeout=120)  # fmt: skip
    assert json.loads(out.stdout.strip().splitlines()[-1])["updates_per_s"] > 0


def test_rates_start_after_learning_and_are_quoted_against_the_limit() -> None:
    points = [
        {M.ENV_STEPS_SAMPLED: 500, M.WALL_TIME_S: 1.0},  # before learning starts: no updates yet
        {M.ENV_STEPS_SAMPLED: 1500, M.WALL_TIME_S: 10.0, M.DIAG_UPDATES: 30.0},
        {M.ENV_STEPS_SAMPLED: 2500, M.WALL_TIME_S: 30.0, M.DIAG_UPDATES: 92.0},
    ]
    row = _sac_row("crossrl", "FINISHED", points, learning_starts=1024)
    assert row.env_steps_per_s == pytest.approx(1000 / 20) and row.updates_per_s == pytest.approx(62 / 20)
    table = DreamerTable(env="CartPole-v1", model_size="nano", batch="16 x 64", horizon=15,
                         rows=[row, SacRow("rllib", "FAILED", None, None)], limit_updates_per_s=[6.0, 6.4, 6.2])  # fmt: skip
    assert table.limit == 6.2 and table.to_limit("crossrl") == pytest.approx(3.1 / 6.2)
    assert table.to_limit("rllib") is None
    assert table.metrics() == {
        "crossrl.updates_per_s": 3.1,
        "crossrl.env_steps_per_s": 50.0,
        "limit.updates_per_s": 6.2,
    }
    assert table.to_dict()["rows"][0]["to_limit"] == pytest.approx(0.5)
