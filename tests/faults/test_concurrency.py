"""Several `crossrl run` on one fresh embedded store at the same moment: the first opening creates the schema
under the store's lock file, the others wait for it, and every run and trial ends FINISHED."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from crossrl.reports.store import ResultsStore

RUNS = 3


@pytest.mark.integration
@pytest.mark.system  # three whole runs at once
def test_runs_started_together_on_a_fresh_store_all_finish(tmp_path: Path) -> None:
    results = tmp_path / "fresh"  # not even the folder exists yet
    cmd = [
        sys.executable, "-m", "crossrl.cli", "run", "smoke",
        "--engines", "crossrl", "--workers", "1", "--seeds", "0", "--steps", "512",
        "--results-dir", str(results), "--no-report",
    ]  # fmt: skip
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for _ in range(RUNS)]
    outs = [p.communicate(timeout=300)[0].decode() for p in procs]
    for p, out in zip(procs, outs, strict=True):
        assert p.returncode == 0, out
    store = ResultsStore(None, results_dir=results)
    parents = store.parent_runs("smoke")
    assert len(parents) == RUNS
    for parent in parents:
        assert parent.info.status == "FINISHED"
        trials = store.load(parent_id=parent.info.run_id).trials
        assert list(trials.status) == ["FINISHED"]
