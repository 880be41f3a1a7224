"""The limit of a DreamerV3 learner on this machine: crossrl's own DreamerV3 update in a bare loop, no framework.

The networks of the ``model_size`` preset (:data:`~crossrl.core.dreamer_policy.DREAMER_SIZES`, the widths every
engine builds), the same B x T batch and horizon, the same work per update (the world model over the batch, the actor
and the critic over ``horizon_H`` imagined steps from every replayed state, the slow critic): the update crossrl's
core makes, called on a fixed batch with no env, no replay sampling, no Ray and no acting around it. Its updates per
second are what a DreamerV3 learner of these networks reaches here; ``crossrl bench dreamer`` quotes each engine's
against it, measured in the same run.
"""

from __future__ import annotations

import time
from typing import Any


def plain_dreamer_updates_per_s(*, env_id: str, hyperparams: dict[str, Any], seconds: float, warmup: int = 3,
                                seed: int = 0) -> dict[str, float]:  # fmt: skip
    """Updates per second over ``seconds`` (after ``warmup`` updates) on one torch thread, on a fixed batch of B
    sequences of T steps shaped as ``env_id``'s observations and actions, and the CPU seconds per update."""
    import gymnasium as gym
    import numpy as np
    import torch

    from crossrl.core import sample_batch as sb
    from crossrl.core.algorithms import load
    from crossrl.core.sequence_replay import IS_FIRST, IS_TERMINAL, PREV_ACTIONS
    from crossrl.scenarios.catalog import HYPERPARAM_DEFAULTS
    from crossrl.scenarios.spec import ModelSpec

    torch.set_num_threads(1)
    env = gym.make(env_id)
    obs_space, act_space = env.observation_space, env.action_space
    env.close()
    alg = load("dreamer")
    policy = alg.policy_cls(
        observation_space=obs_space,
        action_space=act_space,
        hyperparams=alg.hyperparams({**HYPERPARAM_DEFAULTS["dreamer"], **hyperparams}),
        model=ModelSpec(),
        seed=seed,
    )
    rng = np.random.default_rng(seed)
    b, length = int(policy.batch_size_B), int(policy.batch_length_T)
    shape = (b, length)
    actions = np.stack([np.stack([act_space.sample() for _ in range(length)]) for _ in range(b)])
    batch = {
        sb.OBS: rng.standard_normal((*shape, *(obs_space.shape or ()))).astype(np.float32),
        PREV_ACTIONS: actions,
        sb.REWARDS: rng.random(shape).astype(np.float32),
        IS_FIRST: np.zeros(shape, bool),
        IS_TERMINAL: np.zeros(shape, bool),
    }
    for _ in range(warmup):
        policy.learn_on_replay_batch(batch)
    n, t0, c0 = 0, time.perf_counter(), time.process_time()
    while time.perf_counter() - t0 < seconds:
        policy.learn_on_replay_batch(batch)
        n += 1
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    return {"updates_per_s": n / wall, "cpu_s_per_update": cpu / n, "updates": float(n)}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """``python -m crossrl.measure.bench.dreamer_limit ENV_ID HYPERPARAMS_JSON SECONDS``: one measurement, printed as
    JSON (a fresh process per measurement, as the other benchmarks take theirs)."""
    import json
    import sys

    env_id, hp, seconds = (argv if argv is not None else sys.argv[1:])[:3]
    out = plain_dreamer_updates_per_s(env_id=env_id, hyperparams=json.loads(hp), seconds=float(seconds))
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
