"""`make learning-tests K=replay_buffer`: what resuming SAC without its replay buffer costs, on every engine.

Pendulum-v1 SAC (``pendulum-sac`` as shipped: one worker, learning starts at 5,000 env steps, target -200, which every
engine reaches at 8,000-10,000 env steps unkilled), seed 0, a checkpoint every 1,000 env steps, each trial stopping
at its target. ``crossrl run`` is SIGKILLed once a checkpoint at or past 6,000 env steps exists (1,000 updates in,
before the target) and continued with ``crossrl run --resume``: once with the replay buffer in the checkpoints
(``checkpoint.replay_buffer: true``, the default) and once without. Without it the resumed trial refills an empty
buffer with learning_starts (5,000) env steps of its restored policy before it updates again.

Each case appends a row to ``crossrl-results/learning/replay_buffer.md``: env steps to the target, the checkpoint's
size and median write seconds, the mean return of the last 5 points before the resume and of the first 5 after. It
passes when the resumed trial FINISHED at its target; with the buffer left out the checkpoints hold no replay file.
"""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml

from crossrl.adapters import checkpoints
from crossrl.reports.store import SUPERSEDED_TAG, ResultsStore
from crossrl.scenarios import metrics as M
from crossrl.scenarios.loader import load_raw

pytestmark = pytest.mark.learning

RESULTS = Path(__file__).resolve().parents[2] / "crossrl-results" / "learning"
CLI = [sys.executable, "-m", "crossrl.cli"]
SCENARIO = "pendulum-sac"
EVERY = 1_000
KILL_AT = 6_000


@pytest.mark.parametrize("replay_buffer", [True, False], ids=["kept", "left-out"])
@pytest.mark.parametrize("engine", ["crossrl", "rllib", "torchrl"])
def test_sac_resumed_with_and_without_its_replay_buffer(engine: str, replay_buffer: bool, tmp_path: Path) -> None:
    raw, _, _ = load_raw(SCENARIO)
    raw.update(
        name=f"buffer-{SCENARIO}-{engine}-{'kept' if replay_buffer else 'left-out'}",
        engines=[engine],
        seeds=[0],
        checkpoint={"every_env_steps": EVERY, "keep": 2, "replay_buffer": replay_buffer},
    )
    raw["budget"] = {**raw["budget"], "stop_at_target": True}
    path = tmp_path / f"{raw['name']}.yaml"
    path.write_text(yaml.safe_dump(raw))
    results = RESULTS / "replay_buffer" / f"{raw['name']}-{time.strftime('%Y%m%d-%H%M%S')}"
    proc = subprocess.Popen(
        [*CLI, "run", str(path), "--results-dir", str(results), "--no-report"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    while True:
        assert proc.poll() is None, "the run ended before it was killed"
        roots = sorted(results.glob(f"checkpoints/{raw['name']}/*/*"))
        found = checkpoints.checkpoints(roots[-1]) if roots else []
        if found and int(found[0].name.removeprefix(checkpoints.PREFIX)) >= KILL_AT:
            break
        time.sleep(0.5)
    newest = found[0]
    on_disk = {p.name for p in (newest / checkpoints.ENGINE_DIR).iterdir()}
    for pid in [proc.pid, *(p.pid for p in psutil.Process(proc.pid).children(recursive=True))]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait(timeout=60)
    out = subprocess.run(
        [*CLI, "run", str(path), "--resume", "--results-dir", str(results), "--no-report"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]

    store = ResultsStore(None, results_dir=results)
    runs = store.children(store.parent_runs(raw["name"])[0], superseded=True)
    killed = next(r for r in runs if SUPERSEDED_TAG in r.data.tags)
    rerun = next(r for r in runs if SUPERSEDED_TAG not in r.data.tags)
    assert rerun.data.tags["status"] == "FINISHED", rerun.data.tags.get("reason")
    resumed_at = int(rerun.data.tags["resumed.env_step"])
    points = store.points_of(rerun.info.run_id)
    returns = [(s, p[M.EPISODE_RETURN_MEAN]) for s, p in points if M.EPISODE_RETURN_MEAN in p]
    last_before = [r for s, r in returns if s <= resumed_at][-5:]
    first_after = [r for s, r in returns if s > resumed_at][:5]
    to_target = next((s for s, r in returns if r >= -200), None)
    writes = [
        m.value
        for run in (killed, rerun)
        for m in store.client.get_metric_history(run.info.run_id, "checkpoint.write_s")
    ]
    sizes = [m.value for m in store.client.get_metric_history(killed.info.run_id, "checkpoint.mb")]
    row = (
        f"| {engine} | {'kept' if replay_buffer else 'left out'} | {resumed_at:,} | "
        f"{'not reached' if to_target is None else f'{to_target:,}'} | {statistics.mean(last_before):.1f} | "
        f"{statistics.mean(first_after):.1f} | {max(sizes):.2f} | {statistics.median(writes):.3f} | "
        f"{time.strftime('%Y-%m-%d')} |"
    )
    table = RESULTS / "replay_buffer.md"
    if not table.exists():
        table.write_text(
            "| engine | replay buffer | resumed from | env steps to -200 | return last 5 before | return first 5 after "
            "| checkpoint MB | median write s | date |\n|---|---|---|---|---|---|---|---|---|\n"
        )
    with table.open("a") as f:
        f.write(row + "\n")
    print(row)
    holds_replay = bool(on_disk & {"replay", "replay_buffer.pkl"})
    if engine != "crossrl":  # crossrl's buffer is inside its one state pickle: its size says it
        assert holds_replay == replay_buffer, on_disk
    assert to_target is not None, f"{engine} did not reach -200 after the resume: {returns[-5:]}"
