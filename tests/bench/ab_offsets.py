"""Where a measurement process's speed offset lives (the A/B gate's limit, docs/performance.md): one process, Ray
started once, ``ACTORS`` fresh crossrl evaluator actors in turn (1 worker x 8 CartPole-v1 envs, fragment 500, the
gate's contestant), each warmed up for 3 s, pinned as the gate pins, then measured in ``WINDOWS`` windows of 1 s of
env steps per CPU-second (the driver and the actor). Prints one JSON line per actor; run it in several processes and
compare the spread of windows, of actor means and of process means.

    python tests/bench/ab_offsets.py 6 5
"""

from __future__ import annotations

import json
import os
import sys
import time

import psutil
import ray

from crossrl.adapters.crossrl import start_core
from crossrl.core.algorithms import load
from crossrl.measure.bench.contestants import alg_defaults, getpid, pin, process_cpu_s, ray_up
from crossrl.measure.bench.nolearn import NoLearnPolicy
from crossrl.measure.bench.samplers import DEFAULT_MODEL
from crossrl.scenarios.spec import EnvSpec

FRAGMENT = 500


def main(actors: int, windows: int) -> None:
    allowed = os.sched_getaffinity(0)  # before the first pin narrows this process to one CPU
    ray_up(1)
    alg = load("ppo")
    hp = {**alg.hyperparams(alg_defaults("ppo")), "train_batch": FRAGMENT * 8, "rollout_fragment": FRAGMENT}
    for k in range(actors):
        t0 = time.perf_counter()
        evaluators, opt = start_core(
            env_spec=EnvSpec(id="CartPole-v1"), workers=1, envs_per_worker=8, policy_cls=NoLearnPolicy,
            hyperparams=hp, model=DEFAULT_MODEL, optimizer="sync_samples", seed=0, remote_num_cpus=1.0,
        )  # fmt: skip
        pids = [int(p) for p in ray.get([r.apply.remote(getpid) for r in evaluators.remotes])]
        end = time.perf_counter() + 3.0
        while time.perf_counter() < end:
            opt.step()
        procs = [psutil.Process(p) for p in pids] + [psutil.Process()]
        pin(procs, allowed)
        setup_s = time.perf_counter() - t0
        figures = []
        for _ in range(windows):
            cpu0, steps, t1 = sum(process_cpu_s(p) for p in procs), 0, time.perf_counter()
            while time.perf_counter() - t1 < 1.0:
                steps += opt.step().env_steps_sampled
            figures.append(steps / (sum(process_cpu_s(p) for p in procs) - cpu0))
        opt.stop()
        evaluators.stop()
        print(json.dumps({"actor": k, "setup_s": setup_s, "steps_per_cpu_s": figures}), flush=True)
    ray.shutdown()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
