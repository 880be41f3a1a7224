"""Env construction shared by every engine, so that all of them step the very same env."""

from __future__ import annotations

import importlib
import time
from typing import Any

import gymnasium as gym

from crossrl.scenarios.spec import EnvSpec


class StepLatency(gym.Wrapper):
    """Adds wall time to every step without using CPU (a simulated simulator's cost)."""

    def __init__(self, env: gym.Env, latency_ms: float) -> None:
        super().__init__(env)
        self._latency_s = latency_ms / 1000.0

    def step(self, action: Any):  # type: ignore[override]
        time.sleep(self._latency_s)
        return self.env.step(action)


def registered_spec(env_id: str) -> gym.envs.registration.EnvSpec:
    """The registry entry for ``env_id``; ``module:Id`` imports ``module`` first (as gymnasium.make does)."""
    module, sep, name = env_id.rpartition(":")
    if sep:
        importlib.import_module(module)
    return gym.spec(name)


def make_env(spec: EnvSpec, **overrides: Any) -> gym.Env:
    """One env as the spec describes it (with the latency wrapper when ``step_latency_ms`` > 0)."""
    env = gym.make(spec.id, **{**spec.kwargs, **overrides})
    if spec.step_latency_ms > 0:
        env = StepLatency(env, spec.step_latency_ms)
    return env


def make_vector_env(spec: EnvSpec, num_envs: int) -> gym.vector.VectorEnv:
    """``num_envs`` copies stepped in this process, autoresetting on the next step after an episode ends.

    Uses the env's native vector implementation where it has one and no latency is simulated (CartPole
    has one: several times faster than SyncVectorEnv), otherwise SyncVectorEnv over :func:`make_env`.
    Latency envs are stepped one after another, so each worker pays ``num_envs x latency`` per step,
    as a worker driving a real simulator per env would. ``copy=False``: the observations come back in
    the vector env's own buffer, overwritten by the next step (callers copy what they keep; a deep copy
    per step cost ~9 us of CPU per step here, a tenth of a latency worker's CPU per step).
    """
    env_spec = registered_spec(spec.id)
    if spec.step_latency_ms == 0 and env_spec.vector_entry_point is not None:
        return gym.make_vec(spec.id, num_envs=num_envs, vectorization_mode="vector_entry_point", **spec.kwargs)
    return gym.vector.SyncVectorEnv([lambda: make_env(spec) for _ in range(num_envs)], copy=False)
