"""`make learning-tests`: full learning runs through the real runner, each engine x algorithm over 3 seeds.

Each case runs a built-in scenario restricted to one engine (2 workers, 3 seeds) into a persistent
store under ``crossrl-results/learning`` and passes when the median seed reaches the target within
the budget. Every case appends its row (engine, scenario, random play's mean return over 200 episodes, seeds
reaching the target, median env steps and wall seconds to target, median final return) to
``crossrl-results/learning/table.md``, the table in docs/learning.md. A multi-agent scenario's returns are team returns.
"""

from __future__ import annotations

import math
import statistics
import time
from pathlib import Path

import pytest

from crossrl.core.envs import random_returns
from crossrl.orchestration.runner import run_scenario
from crossrl.reports.store import ResultsStore
from crossrl.scenarios.loader import load

pytestmark = pytest.mark.learning

RESULTS = Path(__file__).resolve().parents[2] / "crossrl-results" / "learning"

CASES = [
    ("cartpole-ppo", "crossrl"),
    ("cartpole-ppo", "rllib"),
    ("cartpole-ppo", "torchrl"),
    ("cartpole-a2c", "crossrl"),
    ("cartpole-a3c", "crossrl"),
    ("cartpole-impala", "crossrl"),
    ("cartpole-dqn", "crossrl"),
    ("cartpole-apex", "crossrl"),
    ("pendulum-ppo", "crossrl"),
    ("cartpole-a2c", "torchrl"),
    ("cartpole-a3c", "torchrl"),
    ("cartpole-impala", "torchrl"),
    ("cartpole-dqn", "torchrl"),
    ("cartpole-impala", "rllib"),
    ("cartpole-dqn", "rllib"),
    # multi-agent: MPE simple_spread (3 agents), IPPO with one shared policy and with one policy per agent
    ("spread-ippo-shared", "crossrl"),
    ("spread-ippo-shared", "rllib"),
    ("spread-ippo-shared", "torchrl"),
    ("spread-ippo-independent", "crossrl"),
    ("spread-ippo-independent", "rllib"),
    ("spread-ippo-independent", "torchrl"),
    # pixels: MinAtar Breakout (10x10x4 uint8 frames) with the MinAtar paper's network, target a mean return of 10
    ("minatar-breakout-ppo", "crossrl"),
    ("minatar-breakout-ppo", "rllib"),
    ("minatar-breakout-ppo", "torchrl"),
    ("minatar-breakout-impala", "crossrl"),
    ("minatar-breakout-impala", "rllib"),
    ("minatar-breakout-impala", "torchrl"),
    # continuous control, off-policy actor-critic: SAC on Pendulum (target -200 within 20,000 env steps)
    ("pendulum-sac", "crossrl"),
    ("pendulum-sac", "rllib"),
    ("pendulum-sac", "torchrl"),
]
RANDOM_EPISODES = 200  # random play's return beside each row: episodes 0-199 of crossrl.core.envs.random_returns


@pytest.mark.parametrize(("scenario", "engine"), CASES, ids=[f"{s}-{e}" for s, e in CASES])
def test_reaches_target(scenario: str, engine: str) -> None:
    # stop each trial at its target: the table needs steps and seconds to target, not the rest of the budget
    spec, path = load(scenario, overrides={"engines": [engine], "budget.stop_at_target": True})
    store = ResultsStore(None, results_dir=RESULTS)
    outcome = run_scenario(spec, store=store, spec_path=path)
    if outcome.interrupted:  # the runner marks the running trial KILLED and returns: stop the session too
        raise KeyboardInterrupt
    target = spec.target.episode_return_mean
    assert target is not None
    steps = [r.summary.get("steps_to_target") for r in outcome.results]
    walls = [r.summary.get("wall_s_to_target") for r in outcome.results]
    reached = [s for s in steps if s is not None]
    med_steps = statistics.median([s if s is not None else math.inf for s in steps])
    med_wall = statistics.median([w if w is not None else math.inf for w in walls])
    finals = [r.summary.get("final_return_mean") for r in outcome.results]
    final = statistics.median([f for f in finals if f is not None]) if any(f is not None for f in finals) else None
    random_play = statistics.fmean(random_returns(spec.env, episodes=RANDOM_EPISODES)[0])
    row = (
        f"| {engine} | {spec.name} | {spec.env.id} | {target:g} | {spec.budget.env_steps:,} | {random_play:.1f} "
        f"| {len(reached)}/{len(steps)} | {_fmt(med_steps, ',.0f')} | {_fmt(med_wall, '.0f')} "
        f"| {'' if final is None else f'{final:.1f}'} "
        f"| {', '.join(r.status for r in outcome.results)} | {time.strftime('%Y-%m-%d')} |\n"
    )
    RESULTS.mkdir(parents=True, exist_ok=True)
    with open(RESULTS / "table.md", "a") as f:
        f.write(row)
    print(row)
    assert med_steps <= spec.budget.env_steps, f"{engine} {scenario}: median seed did not reach {target}: {steps}"


def _fmt(x: float, spec: str) -> str:
    return "not reached" if math.isinf(x) else format(x, spec)
