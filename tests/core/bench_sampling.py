"""Sampling speed of crossrl's evaluators against raw gymnasium, side by side in one run.

``.venv/bin/python tests/core/bench_sampling.py [--workers 2] [--envs 8] [--seconds 5] [--rounds 3]``

Raw: one Ray actor per worker steps ``gym.make_vec(id, n, vectorization_mode="vector_entry_point")``
with random actions. crossrl: an :class:`EvaluatorSet` with the same actors' layout, a random-weights
MLP policy (64x64 tanh), one weight broadcast (one ``ray.put``) per iteration and no per-step Ray calls.
Both count transitions only (gymnasium's autoreset steps are not env steps), over the driver's wall
time. Rounds interleave raw and crossrl after a warm-up; medians and the ratio are printed.
"""

from __future__ import annotations

import argparse
import statistics
import time

import gymnasium as gym
import numpy as np
import ray


@ray.remote(num_cpus=1)
class RawVectorEnv:
    def __init__(self, env_id: str, num_envs: int, seed: int) -> None:
        self.env = gym.make_vec(env_id, num_envs=num_envs, vectorization_mode="vector_entry_point")
        self.env.reset(seed=seed)
        self.env.action_space.seed(seed)
        self.autoreset = np.zeros(num_envs, bool)

    def run(self, *, num_steps: int) -> int:
        """``num_steps`` vector steps with random actions; returns transitions (autoreset steps excluded)."""
        count = 0
        for _ in range(num_steps):
            _, _, term, trunc, _ = self.env.step(self.env.action_space.sample())
            count += int((~self.autoreset).sum())
            self.autoreset = term | trunc
        return count


def bench_raw(actors: list, *, num_steps: int, seconds: float) -> float:
    """env steps/s of all actors together over ``seconds`` of wall time."""
    steps, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        steps += sum(ray.get([a.run.remote(num_steps=num_steps) for a in actors]))
    return steps / (time.perf_counter() - t0)


def bench_crossrl(evaluators, *, num_steps: int, seconds: float) -> float:  # type: ignore[no-untyped-def]
    steps, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        evaluators.broadcast_weights()
        steps += sum(b.num_env_steps() for b in evaluators.sample(num_steps=num_steps))
    return steps / (time.perf_counter() - t0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--envs", type=int, default=8)
    parser.add_argument("--fragment", type=int, default=256, help="vector steps per sample call")
    parser.add_argument("--seconds", type=float, default=5.0, help="per measurement")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    from crossrl.core import cluster
    from crossrl.core.algorithms import load
    from crossrl.core.evaluator import EvaluatorSet
    from crossrl.core.policy import PolicySpec
    from crossrl.scenarios.catalog import HYPERPARAM_DEFAULTS
    from crossrl.scenarios.spec import EnvSpec, ModelSpec

    # Raw and crossrl actors take turns, never run together: room for both sets (logical CPUs).
    cluster.connect(None, num_cpus=2 * args.workers)
    raw = [RawVectorEnv.remote(args.env, args.envs, seed=i) for i in range(args.workers)]
    alg = load("ppo")
    evaluators = EvaluatorSet(
        env_spec=EnvSpec(id=args.env),
        num_envs=args.envs,
        policy_factory=PolicySpec(
            policy_cls=alg.policy_cls,
            hyperparams=alg.hyperparams(HYPERPARAM_DEFAULTS["ppo"]),
            model=ModelSpec(hidden=(64, 64)),
        ),
        num_remote=args.workers,
        seed=0,
    )
    # Warm-up: actors started, code paths hot.
    bench_raw(raw, num_steps=args.fragment, seconds=1.0)
    bench_crossrl(evaluators, num_steps=args.fragment, seconds=1.0)
    raw_s, core_s = [], []
    for r in range(args.rounds):
        raw_s.append(bench_raw(raw, num_steps=args.fragment, seconds=args.seconds))
        core_s.append(bench_crossrl(evaluators, num_steps=args.fragment, seconds=args.seconds))
        print(f"round {r}: raw {raw_s[-1]:,.0f} steps/s  crossrl {core_s[-1]:,.0f} steps/s", flush=True)
    raw_m, core_m = statistics.median(raw_s), statistics.median(core_s)
    print(f"{args.env}, {args.workers} workers x {args.envs} envs, fragment {args.fragment}")
    print(f"raw gymnasium vector env: {raw_m:,.0f} env steps/s (median of {args.rounds})")
    print(f"crossrl evaluators:       {core_m:,.0f} env steps/s (median of {args.rounds})")
    print(f"ratio crossrl/raw:        {core_m / raw_m:.2f}")
    evaluators.stop()
    ray.shutdown()


if __name__ == "__main__":
    main()
