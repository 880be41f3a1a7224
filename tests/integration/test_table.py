"""`crossrl table run` end to end: a one-row table on MinAtar Breakout with a time budget, A2C and A3C with a conv
model on every engine (crossrl and TorchRL run them; RLlib has neither: SKIPPED with the reason), rendered in the
seed's shape with random play and a published score beside it."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from crossrl.reports.store import ResultsStore
from crossrl.scenarios import metrics as M

pytestmark = [pytest.mark.integration, pytest.mark.system]

TABLE = """kind: table
name: tiny-table
description: one MinAtar row, two algorithms
rows: [MinAtar/Breakout-v1]
columns:
  - {algorithm: a2c, workers: 1, hyperparams: {train_batch: 256}}
  - {algorithm: a3c, workers: 1}
model: {conv: [[16, 3, 1]], hidden: [64], activation: relu}
engines: [crossrl, rllib, torchrl]
envs_per_worker: 2
budget: {train_seconds: 8}
seeds: [0]
published: [{label: somebody's A2C, scores: {MinAtar/Breakout-v1: 12.5}}]
"""


def test_a_table_runs_every_cell_and_renders_the_seed_shape(tmp_path: Path) -> None:
    spec = tmp_path / "tiny-table.yaml"
    spec.write_text(TABLE)
    results = tmp_path / "results"
    proc = subprocess.run(
        [sys.executable, "-m", "crossrl.cli", "table", "run", str(spec), "--results-dir", str(results),
         "--random-episodes", "3"],
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    store = ResultsStore(None, results_dir=results)
    for algorithm in ("a2c", "a3c"):
        trials = store.load(scenario=f"tiny-table.breakout.{algorithm}-w1").trials.set_index("engine")
        assert trials.status["crossrl"] == trials.status["torchrl"] == M.FINISHED, trials.reason.to_dict()
        assert trials.status["rllib"] == M.SKIPPED and algorithm.upper() in trials.reason["rllib"]
    md = (results / "reports" / "tiny-table" / "tiny-table.md").read_text()
    assert (results / "reports" / "tiny-table" / "tiny-table.html").is_file()
    header = next(line for line in md.splitlines() if line.startswith("| game |"))
    assert header == (
        "| game | crossrl A2C 1 workers | rllib A2C 1 workers | torchrl A2C 1 workers | crossrl A3C 1 workers "
        "| rllib A3C 1 workers | torchrl A3C 1 workers | random play | somebody's A2C |"
    )
    row = next(line for line in md.splitlines() if line.startswith("| MinAtar/Breakout-v1 |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    number = re.compile(r"^-?[\d,]+\.\d$")
    assert all(number.match(cells[i]) for i in (1, 3, 4, 6)), row  # the scores
    assert cells[2] == cells[5] == "SKIPPED" and number.match(cells[7]) and cells[8] == "12.5", row
    assert "RLlib 2.60 has no A2C" in md and "RLlib 2.60 has no A3C" in md  # the gaps' reasons
    assert "8 s of training" in md
