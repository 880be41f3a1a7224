"""`make learning-tests K=resume`: a learning trial SIGKILLed part-way (a lost node: `crossrl run` and everything it
started die at once) and continued with `crossrl run --resume` learns on from its checkpoint, on every engine.

- MinAtar Breakout PPO (``minatar-breakout-ppo``, 1 seed, a budget of a few minutes), killed at about 60 % of its
  budget: FINISHED; env steps sampled across both attempts at most the budget + one checkpoint interval + one
  iteration; the resumed run holds one continuous curve; its first points after the checkpoint are as good as the
  last ones before it (not back at random play).
- CartPole PPO (``cartpole-ppo``, 1 seed), killed at about half of its env steps to target (20,000; RLlib 45,000 of a
  200,000 budget, room past its target):
  still reaches the target; then `crossrl evaluate` (20 greedy episodes) of its final policy returns at least 450.
- DreamerV3 on CartPole (``cartpole-dreamer`` with the nano model at ratio 64, 1 seed, one worker, 4,000 env steps),
  killed at half of them:
  FINISHED within budget + one checkpoint interval + one iteration, one continuous curve, the replay buffer and the
  world model restored (its losses go on from where they were, not from a fresh model's).

Each case appends a row to ``crossrl-results/learning/resume.md`` (with each checkpoint's write time and the cost of
checkpoints at the default interval, ``checkpoint.every_seconds`` = 300, as a share of training time).
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
from crossrl.core.envs import random_returns
from crossrl.reports.store import SUPERSEDED_TAG, ResultsStore
from crossrl.scenarios import metrics as M
from crossrl.scenarios.loader import load_raw
from crossrl.scenarios.spec import DEFAULT_CHECKPOINT_EVERY_S, ScenarioSpec

pytestmark = pytest.mark.learning

RESULTS = Path(__file__).resolve().parents[2] / "crossrl-results" / "learning"
CLI = [sys.executable, "-m", "crossrl.cli"]
CASES = {  # scenario: (env steps budget, checkpoint interval, kill once a checkpoint at or past this env step exists)
    "minatar-breakout-ppo": (150_000, 15_000, 90_000),
    "cartpole-ppo": (100_000, 5_000, 20_000),
    "cartpole-dreamer": (4_000, 1_000, 2_000),
}
WORKERS = {"cartpole-dreamer": 1}  # DreamerV3: one worker, one env, as its scenario runs
# a kill and a resume need no learning: DreamerV3's smallest model at ratio 64 (one update per 16 env steps), some
# 4x cheaper than the scenario's mini model at ratio 256
HYPERPARAMS = {"cartpole-dreamer": {"model_size": "nano", "training_ratio": 64}}
# CartPole on RLlib: its PPO reaches 450 near the end of the 100,000 budget when unkilled (median 94,773 env steps over
# seeds 0-2; seed 0 not at all, final return 211 at 103,081), and a resumed trial's env runners follow another random
# stream than the unkilled one's, so at 100,000 a resume could not be told from a seed's luck. RLlib's case gets room
# past the target (200,000) and is killed at about half of its median steps to target, on seed 1.
SEEDS = {("cartpole-ppo", "rllib"): 1}
KILL_AT = {("cartpole-ppo", "rllib"): 45_000}
BUDGET = {("cartpole-ppo", "rllib"): 200_000}


def _spec(tmp: Path, scenario: str, engine: str) -> tuple[Path, ScenarioSpec]:
    _, every, _ = CASES[scenario]
    budget = BUDGET.get((scenario, engine), CASES[scenario][0])
    raw, _, _ = load_raw(scenario)
    raw.update(
        name=f"resume-{scenario}-{engine}",
        engines=[engine],
        seeds=[SEEDS.get((scenario, engine), 0)],
        checkpoint={"every_env_steps": every, "keep": 3},
    )
    raw["budget"] = {**raw["budget"], "env_steps": budget, "stop_at_target": False}
    raw["algorithm"]["hyperparams"] = {**raw["algorithm"].get("hyperparams", {}), **HYPERPARAMS.get(scenario, {})}
    raw["execution"] = {**raw.get("execution", {}), "workers": [WORKERS.get(scenario, 2)]}
    path = tmp / f"{raw['name']}.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path, ScenarioSpec.model_validate(raw)


@pytest.mark.parametrize("engine", ["crossrl", "rllib", "torchrl"])
@pytest.mark.parametrize("scenario", list(CASES))
def test_a_trial_killed_part_way_resumes_and_learns_on(scenario: str, engine: str, tmp_path: Path) -> None:
    budget, every, kill_at = CASES[scenario]
    kill_at = KILL_AT.get((scenario, engine), kill_at)
    budget = BUDGET.get((scenario, engine), budget)
    path, spec = _spec(tmp_path, scenario, engine)
    # a store of its own per run: `--resume` takes the scenario's newest run, and an earlier run's checkpoints (another
    # budget, so another fingerprint) must not be mistaken for this one's
    results = RESULTS / "resume" / f"{spec.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    trial = spec.trials()[0].name
    t0 = time.monotonic()
    proc = subprocess.Popen(
        [*CLI, "run", str(path), "--results-dir", str(results), "--no-report"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    root = None
    while True:
        assert proc.poll() is None, "the run ended before it was killed"
        root = root or next(iter(sorted(results.glob(f"checkpoints/{spec.name}/*/{trial}"))[-1:]), None)
        found = checkpoints.checkpoints(root) if root else []
        if found and int(found[0].name.removeprefix(checkpoints.PREFIX)) >= kill_at:
            break
        time.sleep(0.5)
    time.sleep(every / budget * 20)  # part-way into the next interval
    tree = [proc.pid, *(p.pid for p in psutil.Process(proc.pid).children(recursive=True))]
    for pid in tree:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait(timeout=60)
    first_s = time.monotonic() - t0
    out = subprocess.run(
        [*CLI, "run", str(path), "--resume", "--results-dir", str(results)], capture_output=True, text=True, check=False
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]

    store = ResultsStore(None, results_dir=results)
    parent = store.parent_runs(spec.name)[0]
    runs = store.children(parent, superseded=True)
    killed = next(r for r in runs if SUPERSEDED_TAG in r.data.tags)
    rerun = next(r for r in runs if SUPERSEDED_TAG not in r.data.tags)
    assert rerun.data.tags["status"] == "FINISHED", rerun.data.tags.get("reason")
    resumed_at = int(rerun.data.tags["resumed.env_step"])
    before, after = store.points_of(killed.info.run_id), store.points_of(rerun.info.run_id)
    steps = [s for s, _ in after]
    assert steps == sorted(set(steps)) and steps[-1] >= budget
    iteration = max(b - a for a, b in zip(steps, steps[1:], strict=False))
    sampled = before[-1][0] + steps[-1] - resumed_at  # env steps sampled across both attempts
    assert sampled <= budget + every + iteration

    returns = [(s, p[M.EPISODE_RETURN_MEAN]) for s, p in after if M.EPISODE_RETURN_MEAN in p]
    last_before = [r for s, r in returns if s <= resumed_at][-5:]
    first_after = [r for s, r in returns if s > resumed_at][:5]
    random_mean = statistics.mean(random_returns(spec.env, episodes=100)[0])
    gained = statistics.mean(last_before) - random_mean
    if gained > 0:  # not back at random play: at least half of what was learned is there after the resume
        assert statistics.mean(first_after) >= random_mean + 0.5 * gained, (last_before, first_after, random_mean)
    if spec.algorithm.name == "dreamer":  # the world model came back: its loss nearer where it was than a fresh one's
        wm = M.DIAG_WORLD_MODEL_LOSS
        losses_before = [p[wm] for _, p in before if p.get(wm) is not None]
        first_loss_after = next(p[wm] for s, p in after if s > resumed_at and p.get(wm) is not None)
        assert first_loss_after < (losses_before[0] + losses_before[-1]) / 2, (losses_before, first_loss_after)
    greedy = ""
    if scenario == "cartpole-ppo":
        hit = [s for s, r in returns if r >= (spec.target.episode_return_mean or 0)]
        assert hit, f"never reached the target: {returns[-5:]}"
        ev = subprocess.run(
            [*CLI, "evaluate", rerun.info.run_id, "--episodes", "20", "--results-dir", str(results)],
            capture_output=True,
            text=True,
            check=False,
        )
        assert ev.returncode == 0, ev.stdout[-3000:] + ev.stderr[-3000:]
        print(ev.stdout)
        greedy = store.client.get_run(rerun.info.run_id).data.tags["evaluate.return_mean"]

    # checkpoint cost: each write's seconds; at the default interval a share of training time
    writes = [m.value for m in store.client.get_metric_history(rerun.info.run_id, "checkpoint.write_s")] + [
        m.value for m in store.client.get_metric_history(killed.info.run_id, "checkpoint.write_s")
    ]
    sizes = [m.value for m in store.client.get_metric_history(rerun.info.run_id, "checkpoint.mb")]
    median_write = statistics.median(writes)
    row = (
        f"| {engine} | {scenario} | {budget:,} | {every:,} | {before[-1][0]:,} | {resumed_at:,} | {sampled:,} | "
        f"{statistics.mean(last_before):.2f} | {statistics.mean(first_after):.2f} | {random_mean:.2f} | "
        f"{median_write:.2f} | {max(sizes):.1f} | {100 * median_write / DEFAULT_CHECKPOINT_EVERY_S:.2f} % | "
        f"{greedy or '-'} | {first_s:.0f} | {time.strftime('%Y-%m-%d')} |"
    )
    RESULTS.mkdir(parents=True, exist_ok=True)
    table = RESULTS / "resume.md"
    if not table.exists():
        table.write_text(
            "| engine | scenario | budget | checkpoint every | killed at | resumed from | sampled in all | return "
            "last 5 before | return first 5 after | random | median write s | size MB | cost at 300 s | greedy return "
            "(evaluate, 20 episodes) | s to kill | date |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n"
        )
    with table.open("a") as f:
        f.write(row + "\n")
    print(row)
    if greedy:
        assert float(greedy) >= 450, f"crossrl evaluate: greedy return {greedy}"
