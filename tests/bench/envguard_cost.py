"""What the env guard costs per env step: CPU microseconds per step of an env bare and inside the guard, measured
alternately in one process (rounds of 20,000 steps each), printed side by side with their ratio.

    .venv/bin/python tests/bench/envguard_cost.py [--env CartPole-v1] [--rounds 10]

Also a vector step of gymnasium's CartPoleVectorEnv (8 copies), bare and inside the vector guard.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np

from crossrl.core.envguard import EnvGuard, VectorEnvGuard

STEPS = 20_000


def _per_step_us(env: Any, act: Callable[[int], Any], steps: int) -> float:
    env.reset(seed=0)
    t0 = time.process_time()
    for i in range(steps):
        out = env.step(act(i))
        if not isinstance(out[2], np.ndarray) and (out[2] or out[3]):
            env.reset()
    return (time.process_time() - t0) / steps * 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--env", default="CartPole-v1")
    ap.add_argument("--rounds", type=int, default=10)
    args = ap.parse_args()
    bare, guarded = gym.make(args.env), EnvGuard(gym.make(args.env), env_id=args.env)
    vec = gym.make_vec("CartPole-v1", num_envs=8, vectorization_mode="vector_entry_point")
    vec_guarded = VectorEnvGuard(
        gym.make_vec("CartPole-v1", num_envs=8, vectorization_mode="vector_entry_point"), env_id="CartPole-v1"
    )
    one = [bare.action_space.sample() for _ in range(64)]
    eight = [vec.action_space.sample() for _ in range(64)]
    rows: dict[str, list[float]] = {k: [] for k in ("env", "env+guard", "vector", "vector+guard")}
    for _ in range(args.rounds):
        rows["env"].append(_per_step_us(bare, lambda i: one[i % 64], STEPS))
        rows["env+guard"].append(_per_step_us(guarded, lambda i: one[i % 64], STEPS))
        rows["vector"].append(_per_step_us(vec, lambda i: eight[i % 64], STEPS // 4))
        rows["vector+guard"].append(_per_step_us(vec_guarded, lambda i: eight[i % 64], STEPS // 4))
    med = {k: statistics.median(v) for k, v in rows.items()}
    print(f"{args.env}, {args.rounds} alternating rounds, median CPU us per step")
    for a, b in (("env", "env+guard"), ("vector", "vector+guard")):
        print(
            f"  {a:8s} {med[a]:7.2f}   {b:14s} {med[b]:7.2f}   ratio {med[b] / med[a]:.3f}  (+{med[b] - med[a]:.2f} us)"
        )


if __name__ == "__main__":
    main()
