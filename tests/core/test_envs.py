"""crossrl's lean vector env against gymnasium's SyncVectorEnv: the same transitions, step for step."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from crossrl.core.envs import SerialVectorEnv, make_env, make_vector_env
from crossrl.scenarios.spec import EnvSpec


def _pair(spec: EnvSpec, n: int) -> tuple[gym.vector.VectorEnv, gym.vector.VectorEnv]:
    fns = [lambda: make_env(spec) for _ in range(n)]
    return SerialVectorEnv(fns), gym.vector.SyncVectorEnv(fns, copy=False)


@pytest.mark.parametrize(
    ("spec", "steps"),
    [(EnvSpec(id="CartPole-v1", step_latency_ms=0.001), 400), (EnvSpec(id="Pendulum-v1"), 450)],
    ids=["cartpole-latency", "pendulum"],
)
def test_serial_vector_env_steps_exactly_like_sync_vector_env(spec: EnvSpec, steps: int) -> None:
    lean, ref = _pair(spec, 3)
    o1, _ = lean.reset(seed=7)
    o2, _ = ref.reset(seed=7)
    np.testing.assert_array_equal(o1, o2)
    lean.action_space.seed(1)
    ends = 0
    for t in range(steps):
        a = lean.action_space.sample()
        got, want = lean.step(a), ref.step(a)
        for g, w, name in zip(got[:4], want[:4], ("obs", "rewards", "terminated", "truncated"), strict=True):
            np.testing.assert_array_equal(g, w, err_msg=f"{name} differ at step {t}")
            assert g.dtype == w.dtype and g.shape == w.shape
        ends += int(np.count_nonzero(got[2] | got[3]))
    assert ends >= 3  # episodes ended and the autoreset steps (reward 0, a fresh obs) matched too


def test_reset_mid_episode_and_with_a_mask_matches_too() -> None:
    lean, ref = _pair(EnvSpec(id="CartPole-v1", step_latency_ms=0.001), 2)
    for env in (lean, ref):
        env.reset(seed=3)
    actions = np.ones(2, np.int64)
    for _ in range(12):  # always pushing right: both episodes end within a dozen steps
        lean.step(actions)
        ref.step(actions)
    mask = np.array([True, False])
    np.testing.assert_array_equal(
        lean.reset(options={"reset_mask": mask})[0], ref.reset(options={"reset_mask": mask})[0]
    )
    for t in range(30):
        got, want = lean.step(actions), ref.step(actions)
        for g, w in zip(got[:4], want[:4], strict=True):
            np.testing.assert_array_equal(g, w, err_msg=f"step {t} after the masked reset")


def test_make_vector_env_picks_the_native_vector_env_without_latency_and_the_lean_one_with() -> None:
    assert not isinstance(make_vector_env(EnvSpec(id="CartPole-v1"), 2), gym.vector.SyncVectorEnv)
    assert isinstance(make_vector_env(EnvSpec(id="CartPole-v1", step_latency_ms=1.0), 2), SerialVectorEnv)
    assert isinstance(make_vector_env(EnvSpec(id="Pendulum-v1"), 2), SerialVectorEnv)
