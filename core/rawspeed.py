"""The raw limit: how fast gymnasium itself steps the scenario's envs with random actions.

Measured in the same run as the engines (DESIGN.md, "Measuring speed"), so that throughput can be
quoted as a ratio to it and a slower machine is not mistaken for a slower engine. The runner measures it in a
child process of its own (``python -m crossrl.core.rawspeed``, :func:`main`) with a time limit: the user's env may
hang or crash there, and that must cost seconds, never the run.
"""

from __future__ import annotations

import sys
import time

from crossrl.core.envs import make_parallel_env, make_vector_env
from crossrl.scenarios.spec import EnvSpec


def raw_env_steps_per_s(spec: EnvSpec, *, num_envs: int, seconds: float = 1.0, seed: int = 0) -> float:
    """Env steps per second of one process stepping ``num_envs`` copies with random actions.

    A short warm-up (50 vector steps) comes first; then vector steps until ``seconds`` have passed.
    A multi-agent env (``spec.agents``) is stepped likewise: ``num_envs`` PettingZoo parallel envs one after
    another, a random action for every live agent, each reset when no agent is left; an env step is one
    joint step.
    """
    if spec.multi_agent:
        return _parallel_env_steps_per_s(spec, num_envs=num_envs, seconds=seconds, seed=seed)
    env = make_vector_env(spec, num_envs)
    try:
        env.reset(seed=seed)
        space = env.action_space
        space.seed(seed)
        actions = [space.sample() for _ in range(64)]
        for i in range(50):
            env.step(actions[i % 64])
        n, t0 = 0, time.perf_counter()
        deadline = t0 + seconds
        while True:
            for _ in range(20):
                env.step(actions[n % 64])
                n += 1
            if time.perf_counter() >= deadline:
                break
        return float(n * num_envs / (time.perf_counter() - t0))
    finally:
        env.close()


def _parallel_env_steps_per_s(spec: EnvSpec, *, num_envs: int, seconds: float, seed: int) -> float:
    envs = [make_parallel_env(spec) for _ in range(num_envs)]
    try:
        for i, env in enumerate(envs):
            env.reset(seed=seed + i)
            for j, agent in enumerate(env.possible_agents):
                env.action_space(agent).seed(seed + 1000 * i + j)

        def step_all() -> None:
            for env in envs:
                if not env.agents:
                    env.reset()
                env.step({a: env.action_space(a).sample() for a in env.agents})

        for _ in range(50):
            step_all()
        n, t0 = 0, time.perf_counter()
        deadline = t0 + seconds
        while True:
            for _ in range(20):
                step_all()
                n += 1
            if time.perf_counter() >= deadline:
                break
        return float(n * num_envs / (time.perf_counter() - t0))
    finally:
        for env in envs:
            env.close()


def main(argv: list[str]) -> int:
    """``python -m crossrl.core.rawspeed NUM_ENVS SECONDS`` with the EnvSpec's JSON on stdin: prints env steps per
    second on stdout; an env that fails prints its error on stderr (one line) and exits 1."""
    spec = EnvSpec.model_validate_json(sys.stdin.read())
    try:
        speed = raw_env_steps_per_s(spec, num_envs=int(argv[1]), seconds=float(argv[2]))
    except Exception as e:  # the user's env: its problem in one line, for the run's tag
        print(f"{type(e).__name__}: {' '.join(str(e).split())}"[:500], file=sys.stderr, flush=True)
        return 1
    print(repr(speed), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
