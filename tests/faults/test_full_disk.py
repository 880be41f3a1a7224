"""A full disk under the results folder: a clear error, the journal intact, nothing already stored corrupted.

The results folder lives on a small tmpfs (mounting one needs root, as CI runs here). A first run fills the
store; a second run starts, and once its trial is running the disk is filled up: the run stops with exit 4
and one line when its journal cannot grow. Afterwards every journal line parses, the first run reads back whole from an sqlite
file that passes its integrity check, and once there is room again `crossrl sync` sends what the second run
journaled.
"""

from __future__ import annotations

import contextlib
import errno
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from crossrl.reports.journal import Journal
from crossrl.reports.store import ResultsStore

CLI = [sys.executable, "-m", "crossrl.cli"]


@pytest.fixture
def small_disk(tmp_path: Path):  # -> Iterator[Path]
    mnt = tmp_path / "small"
    mnt.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(mnt)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"a tmpfs cannot be mounted here (needs root): {mounted.stderr.decode().strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def _fill(folder: Path) -> Path:
    """A file that takes all the room there is."""
    filler = folder / "filler"
    with open(filler, "wb") as f:
        try:
            while True:
                f.write(b"\0" * (64 << 10))
                f.flush()
        except OSError as e:
            assert e.errno == errno.ENOSPC
    return filler


def _watch_tree(run: subprocess.Popen[str], seen: dict[int, psutil.Process], trial: threading.Event) -> None:
    while run.poll() is None:
        try:
            for child in psutil.Process(run.pid).children(recursive=True):
                if child.pid not in seen:
                    with contextlib.suppress(psutil.Error):
                        child.info_cmdline = child.cmdline()  # type: ignore[attr-defined]
                        seen[child.pid] = child
                        if "trial_proc" in " ".join(child.info_cmdline):  # type: ignore[attr-defined]
                            trial.set()
        except psutil.Error:
            pass
        time.sleep(0.2)


@pytest.mark.system  # two whole runs, the second on a disk filled under it
def test_a_full_disk_stops_the_run_with_one_line_and_corrupts_nothing(small_disk: Path) -> None:
    results = small_disk / "results"
    common = ["--engines", "crossrl", "--workers", "1", "--seeds", "0", "--results-dir", str(results), "--no-report"]
    first = subprocess.run([*CLI, "run", "smoke", *common], capture_output=True, text=True, timeout=600)
    assert first.returncode == 0, first.stderr
    before = ResultsStore(None, results_dir=results).load(scenario="smoke")

    run = subprocess.Popen(
        [*CLI, "run", "cartpole-ppo", *common, "--steps", "200000"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    seen: dict[int, psutil.Process] = {}  # every process of the run, to check none is left
    trial = threading.Event()
    watch = threading.Thread(target=_watch_tree, args=(run, seen, trial), daemon=True)
    watch.start()
    started = trial.wait(300)
    filler = _fill(small_disk)  # the disk fills up while the trial runs
    out, err = run.communicate(timeout=600)
    watch.join(10)
    assert started, f"the trial never started (exit {run.returncode})\n{out[-3000:]}\n{err[-3000:]}"
    assert run.returncode == 4, f"exit {run.returncode}\n{out[-3000:]}\n{err[-3000:]}"
    lines = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1, err
    assert "cannot write the journal" in lines[0] and "No space left on device" in lines[0]
    assert f"crossrl sync {results}" in lines[0] and "--resume" in lines[0]
    assert "Traceback" not in err
    _, alive = psutil.wait_procs(list(seen.values()), timeout=15)  # the trial's processes went with the run
    assert not alive, f"left running: {[p.pid for p in alive]}"

    [path] = (results / "journal").glob("*.jsonl")
    records = Journal(path).records()  # every line whole: the failed append was cut back
    assert [r["seq"] for r in records] == list(range(1, len(records) + 1))
    assert path.read_bytes().endswith(b"\n")

    db = sqlite3.connect(results / "mlflow.db")
    assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    db.close()
    after = ResultsStore(None, results_dir=results).load(parent_id=before.meta["parent_run_id"])
    assert after.trials[["run_id", "status"]].equals(before.trials[["run_id", "status"]])
    assert len(after.points) == len(before.points)

    filler.unlink()  # room again: what the stopped run journaled goes to the store
    synced = subprocess.run([*CLI, "sync", str(results)], capture_output=True, text=True, timeout=300)
    assert synced.returncode == 0, synced.stderr
    assert not list((results / "journal").glob("*.jsonl"))
    store = ResultsStore(None, results_dir=results)
    [parent] = store.parent_runs("cartpole-ppo")
    assert parent.data.tags["fingerprint"]
