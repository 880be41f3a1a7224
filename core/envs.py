"""Env construction shared by every engine, so that all of them step the very same env."""

from __future__ import annotations

import gc
import sys
import time
import warnings
from collections.abc import Callable
from typing import Any, cast

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode, SyncVectorEnv

from crossrl.scenarios.loader import first_line, registered_spec
from crossrl.scenarios.spec import EnvSpec


class StepLatency(gym.Wrapper):
    """Adds wall time to every step without using CPU (a simulated simulator's cost)."""

    def __init__(self, env: gym.Env, latency_ms: float) -> None:
        super().__init__(env)
        self._latency_s = latency_ms / 1000.0

    def step(self, action: Any):  # type: ignore[override]
        time.sleep(self._latency_s)
        return self.env.step(action)


def make_env(spec: EnvSpec, **overrides: Any) -> gym.Env:
    """One env as the spec describes it (with the latency wrapper when ``step_latency_ms`` > 0)."""
    env = gym.make(spec.id, **{**spec.kwargs, **overrides})
    if spec.step_latency_ms > 0:
        env = StepLatency(env, spec.step_latency_ms)
    return env


class SerialVectorEnv(SyncVectorEnv):
    """gymnasium's SyncVectorEnv (NEXT_STEP autoreset, ``copy=False``) with a lean ``step`` for Box observations
    (other observation spaces take SyncVectorEnv's own ``step``).

    Same sub-envs, seeding, resets and results as SyncVectorEnv, step for step (tests/core/test_envs.py),
    but ``step`` writes each sub-env's results straight into the vector's arrays and returns those
    arrays themselves, all overwritten by the next step (callers copy what they keep), and
    returns no infos (crossrl reads none). SyncVectorEnv's generic path (``iterate`` over the batched
    action space, info merging, ``concatenate``, three copies) cost ~50-70 us of CPU per step with 16
    latency workers sharing 2 cores, a quarter of what a latency worker spent per step
    (``crossrl bench scaling --workers 16``, CPU us/step column; docs/performance.md).
    """

    def __init__(self, env_fns: Any) -> None:
        super().__init__(env_fns, copy=False, autoreset_mode=AutoresetMode.NEXT_STEP)
        self._lean = isinstance(self.single_observation_space, gym.spaces.Box)
        self._ended = [False] * self.num_envs  # the lean step's autoreset flags (SyncVectorEnv's _autoreset_envs)

    def reset(self, *, seed: Any = None, options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        if self._lean:  # SyncVectorEnv's own state, which the lean step does not keep: a reset_mask resets some envs
            self._autoreset_envs = np.array(self._ended, bool)
            self._env_obs = [row.copy() for row in cast(np.ndarray, self._observations)]
        out: tuple[Any, dict[str, Any]] = super().reset(seed=seed, options=options)
        self._ended = [bool(x) for x in self._autoreset_envs]
        return out

    def step(self, actions: Any) -> tuple[Any, Any, Any, Any, dict[str, Any]]:
        if not self._lean:
            return super().step(actions)
        obs = cast(np.ndarray, self._observations)
        rewards, terms, truncs, ended = self._rewards, self._terminations, self._truncations, self._ended
        for i, env in enumerate(self.envs):
            if ended[i]:
                obs[i], _ = env.reset()
                rewards[i], terms[i], truncs[i], ended[i] = 0.0, False, False, False
            else:
                obs[i], rewards[i], term, trunc, _ = env.step(actions[i])
                terms[i], truncs[i], ended[i] = term, trunc, term or trunc
        return obs, rewards, terms, truncs, {}


def make_vector_env(spec: EnvSpec, num_envs: int) -> gym.vector.VectorEnv:
    """``num_envs`` copies stepped in this process, autoresetting on the next step after an episode ends.

    Uses the env's native vector implementation where it has one and no latency is simulated (CartPole
    has one: several times faster than SyncVectorEnv), otherwise :class:`SerialVectorEnv` over
    :func:`make_env`.
    Latency envs are stepped one after another, so each worker pays ``num_envs x latency`` per step,
    as a worker driving a real simulator per env would. The observations come back in the vector
    env's own buffer, overwritten by the next step (callers copy what they keep; a deep copy per step
    cost ~9 us of CPU per step, a tenth of a latency worker's CPU per step in ``crossrl bench scaling``).
    """
    env_spec = registered_spec(spec.id)
    if spec.step_latency_ms == 0 and env_spec.vector_entry_point is not None:
        return gym.make_vec(spec.id, num_envs=num_envs, vectorization_mode="vector_entry_point", **spec.kwargs)
    return SerialVectorEnv([lambda: make_env(spec) for _ in range(num_envs)])


def check_env(spec: EnvSpec) -> str | None:
    """Build the env once as the engines do; the problem on one line, or None when it works.

    Builds :func:`make_env` (what RLlib and TorchRL step: the spec's kwargs and crossrl's wrappers),
    resets it with seed 0 and takes one random step (without the simulated latency), then, where the
    env has its own vector class, builds and resets that too (what crossrl steps, see
    :func:`make_vector_env`); so kwargs the env does not accept fail before any trial starts.
    """
    kwargs = ", **kwargs" if spec.kwargs else ""
    problem = _try_env(f"gymnasium.make({spec.id!r}{kwargs})", lambda: make_env(spec), step=True)
    if problem is None and spec.step_latency_ms == 0 and registered_spec(spec.id).vector_entry_point is not None:
        what = f"gymnasium.make_vec({spec.id!r}, num_envs=1{kwargs})"
        problem = _try_env(what, lambda: make_vector_env(spec, 1), step=False)
    return f"env: {problem}; check env.id and env.kwargs" if problem else None


def _try_env(what: str, build: Callable[[], Any], *, step: bool) -> str | None:
    # A constructor that fails can leave a half-built env whose __del__ raises when it is freed, which
    # Python prints as a traceback (gymnasium 1.2's CartPoleVectorEnv does): such reports are silenced
    # until the env is freed (collected, after a failure). Warnings (deprecations, the env checker's
    # advice) are not problems of the spec either.
    problem = None
    hook = sys.unraisablehook
    sys.unraisablehook = lambda _: None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                env = build()
            except Exception as e:
                problem = f"{what} failed: {first_line(e)}"
                return problem
            try:
                env.reset(seed=0)
                if step:
                    inner = env.env if isinstance(env, StepLatency) else env
                    inner.action_space.seed(0)
                    inner.step(inner.action_space.sample())
            except Exception as e:
                problem = f"{what}: {'reset/step' if step else 'reset'} failed: {first_line(e)}"
            finally:
                try:
                    env.close()
                except Exception:
                    pass
                del env
        return problem
    finally:
        if problem:
            gc.collect()
        sys.unraisablehook = hook
