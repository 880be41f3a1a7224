"""A trial killed mid-run continues from its checkpoint, on every engine, for PPO and for SAC (whose checkpoints hold its
replay buffer and temperature): `crossrl run` SIGKILLed once its trial has written two checkpoints, the newer one then damaged, and `crossrl run --resume` passes over the damaged one with one
line, continues from the one before, ends FINISHED, and the resumed trial's run holds one continuous curve. Then
`crossrl evaluate` reloads the trial's final policy from its final checkpoint and plays it without training, and
`crossrl export` writes it as a file that acts as the engine does without crossrl (tests/support/export_check.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml
from export_check import check_exports

from crossrl.adapters import checkpoints
from crossrl.reports.store import SUPERSEDED_TAG, ResultsStore
from crossrl.scenarios import metrics as M

CLI = [sys.executable, "-m", "crossrl.cli"]
# env steps: (budget, checkpoint interval) per algorithm; SAC's points come every 1,000 env steps on RLlib and TorchRL
BUDGETS = {"ppo": (8000, 1500), "sac": (5000, 1000)}
ALGORITHMS = {
    "ppo": {"name": "ppo", "hyperparams": {"train_batch": 500, "minibatch": 250, "epochs": 2}},
    # a tenth of an update per env step after 500 uniform ones (RLlib's SAC makes about 8 updates/s here): what is
    # checked is the checkpoint's buffer and temperature, not learning (at 0.25, RLlib's case alone took 158 s of CI)
    "sac": {"name": "sac", "hyperparams": {"learning_starts": 500, "updates_per_step": 0.1, "train_batch": 64}},
}
ENVS = {"ppo": "CartPole-v1", "sac": "Pendulum-v1"}
RETURNS = {"ppo": (1, 500), "sac": (-2000, 0)}  # an episode's return: CartPole's, Pendulum's (200 steps of -16.3..0)
CASES = [(e, "ppo") for e in ("crossrl", "rllib", "torchrl")] + [(e, "sac") for e in ("crossrl", "rllib", "torchrl")]


def _spec(tmp_path: Path, engine: str, algorithm: str) -> Path:
    budget, every = BUDGETS[algorithm]
    spec = {
        "name": f"ck-{engine}-{algorithm}",
        "env": {"id": ENVS[algorithm]},
        "algorithm": ALGORITHMS[algorithm],
        "engines": [engine],
        "budget": {"env_steps": budget, "wall_seconds": 600},
        "checkpoint": {"every_env_steps": every, "keep": 3},
    }
    path = tmp_path / f"ck-{engine}-{algorithm}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def _gone(pids: list[int], within_s: float = 60) -> None:
    deadline = time.monotonic() + within_s
    while any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in pids):
        assert time.monotonic() < deadline, "processes of the killed run are still alive"
        time.sleep(0.2)


@pytest.mark.integration
@pytest.mark.system  # 100-130 s per engine for PPO: `make test-system`, run by CI
@pytest.mark.parametrize(("engine", "algorithm"), CASES)
def test_a_killed_trial_resumes_from_its_newest_good_checkpoint(
    engine: str, algorithm: str, results_dir: Path, tmp_path: Path
) -> None:
    spec = _spec(tmp_path, engine, algorithm)
    scenario, (BUDGET, EVERY) = f"ck-{engine}-{algorithm}", BUDGETS[algorithm]
    trial = f"{engine}-{algorithm}-w1-s0"
    proc = subprocess.Popen(
        [*CLI, "run", str(spec), "--results-dir", str(results_dir), "--no-report"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 400
    while len(found := checkpoints.checkpoints(next(iter(results_dir.glob(f"checkpoints/*/*/{trial}")), tmp_path))) < 2:
        assert proc.poll() is None and time.monotonic() < deadline, "the run ended before two checkpoints"
        time.sleep(0.2)
    tree = [proc.pid, *(p.pid for p in psutil.Process(proc.pid).children(recursive=True))]
    os.kill(proc.pid, signal.SIGKILL)  # a lost node: nothing is closed, nothing is cleaned up
    proc.wait(timeout=30)
    _gone(tree)
    # listed again: on an idle machine crossrl's core can write one more checkpoint between the listing above and the
    # kill, and the newest at the kill is the one a resume reads first
    found = checkpoints.checkpoints(next(iter(results_dir.glob(f"checkpoints/*/*/{trial}"))))
    newer, older = found[0], found[1]
    older_step = checkpoints.read_meta(older)["env_steps_sampled"]
    victim = max((p for p in (newer / "engine").rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)
    victim.write_bytes(victim.read_bytes()[: victim.stat().st_size // 2])  # a half-written disk block

    out = subprocess.run(
        [*CLI, "run", str(spec), "--resume", "--no-report", "--results-dir", str(results_dir)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    said = [line for line in (out.stdout + out.stderr).splitlines() if "cannot be used" in line]
    assert len(said) == 1 and newer.name in said[0] and "truncated" in said[0], said
    assert f"{trial}: resumed from env step {older_step:,}" in out.stdout  # the console says what it continues from

    store = ResultsStore(None, results_dir=results_dir)
    parent = store.parent_runs(scenario)[0]
    runs = store.children(parent, superseded=True)
    killed = next(r for r in runs if SUPERSEDED_TAG in r.data.tags)
    rerun = next(r for r in runs if SUPERSEDED_TAG not in r.data.tags)
    assert killed.data.tags[SUPERSEDED_TAG] == rerun.info.run_id
    assert rerun.data.tags["status"] == "FINISHED", rerun.data.tags.get("reason")
    assert rerun.data.tags["resumed.env_step"] == str(older_step)
    assert rerun.data.tags["resumed.from_run"] == killed.info.run_id

    before = store.points_of(killed.info.run_id)
    after = store.points_of(rerun.info.run_id)
    steps = [s for s, _ in after]
    assert steps == sorted(set(steps)) and steps[-1] >= BUDGET  # one curve, in order, to the budget
    assert after[: len([s for s, _ in before if s <= older_step])] == [(s, p) for s, p in before if s <= older_step]
    new = [(s, p) for s, p in after if s > older_step]
    iteration = max(b - a for a, b in zip(steps, steps[1:], strict=False))
    # env steps sampled across both attempts: at most the budget, one checkpoint interval and one iteration more
    assert before[-1][0] + (steps[-1] - older_step) <= BUDGET + EVERY + iteration + iteration
    assert new[0][1][M.WALL_TIME_S] > after[len(after) - len(new) - 1][1][M.WALL_TIME_S]  # training time goes on
    loaded = store.load(scenario=scenario)
    assert list(loaded.trials.trial) == [trial] and list(loaded.trials.status) == ["FINISHED"]

    # crossrl evaluate: the final checkpoint's policy, by scenario (greedy) and by trial run id (sampled)
    last_step = after[-1][0]
    for args in ([scenario, "--episodes", "3"], [rerun.info.run_id, "--episodes", "2", "--sample"]):
        ev = subprocess.run(
            [*CLI, "evaluate", *args, "--results-dir", str(results_dir)], capture_output=True, text=True, timeout=300
        )
        assert ev.returncode == 0, ev.stdout[-3000:] + ev.stderr[-3000:]
        assert trial in ev.stdout and f"{last_step:,}" in ev.stdout  # the final checkpoint's env step
    tags = store.client.get_run(rerun.info.run_id).data.tags
    assert tags["evaluate.episodes"] == "2" and tags["evaluate.mode"] == "sample"
    low, high = RETURNS[algorithm]
    assert low <= float(tags["evaluate.return_mean"]) <= high
    assert float(tags["evaluate.ci_low"]) <= float(tags["evaluate.return_mean"]) <= float(tags["evaluate.ci_high"])

    # crossrl export: the same final checkpoint as TorchScript, acting as the engine does in a process without crossrl
    check_exports(results_dir, scenario, engines=[engine], algorithm=algorithm, env_id=ENVS[algorithm],
                  env_steps=BUDGET, tmp_path=tmp_path)  # fmt: skip
