"""A real Ray cluster (tests/cluster/conftest.py: two nodes on loopback): `crossrl run smoke --ray-address`
on it, per engine, one trial after another as without --parallel.

The test checks each trial joined *that* cluster (its GCS address is tagged on the run), not a fresh
local one.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from ray_nodes import Cluster

from crossrl.reports.store import ResultsStore

pytestmark = [pytest.mark.integration, pytest.mark.cluster]


@pytest.mark.parametrize("engine", ["crossrl", "rllib", "torchrl"])
def test_smoke_runs_on_an_existing_cluster(ray_cluster: Cluster, engine: str, tmp_path: Path) -> None:
    ray_head = ray_cluster.address
    results = tmp_path / "res"
    proc = subprocess.run(
        [
            sys.executable, "-m", "crossrl.cli", "run", "smoke", "--engines", engine, "--workers", "2",
            "--seeds", "0", "--ray-address", ray_head, "--results-dir", str(results), "--no-report",
        ],
        capture_output=True, text=True, env=ray_cluster.env, timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    loaded = ResultsStore(None, results_dir=results).load(scenario="smoke")
    [row] = loaded.trials.to_dict("records")
    assert row["status"] == "FINISHED"
    run = ResultsStore(None, results_dir=results).client.get_run(row["run_id"])
    assert run.data.tags.get("ray_gcs_address") == ray_head, run.data.tags
