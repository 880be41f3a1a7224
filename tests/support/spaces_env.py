"""Real CartPole dynamics behind the observation spaces users' envs have (the spaces tests with real engines).

Importing this module registers ``spaces_env:DictCartPole-v0`` (observations ``{"pole": Box(2), "cart": Box(2)}``:
the pole's angle and angular velocity, the cart's position and velocity; keys given out of order on purpose),
``spaces_env:TupleCartPole-v0`` (the same two parts as a Tuple), ``spaces_env:MultiDiscreteCartPole-v0`` (two
controls at once) and ``spaces_env:DictMultiDiscreteCartPole-v0`` (both); gymnasium imports the module itself when
an id is written that way, in any process (Ray workers included) that has tests/support on its PYTHONPATH.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.envs.classic_control.cartpole import CartPoleEnv

_HIGH = np.array([4.8, np.inf, 0.42, np.inf], dtype=np.float32)


class _SplitCartPole(CartPoleEnv):
    def _parts(self, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        obs = np.asarray(obs, dtype=np.float32)
        return obs[2:4].copy(), obs[0:2].copy()  # pole, cart

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):  # type: ignore[override]
        obs, info = super().reset(seed=seed, options=options)
        return self._wrap(obs), info

    def step(self, action: Any):  # type: ignore[override]
        obs, reward, terminated, truncated, info = super().step(action)
        return self._wrap(obs), reward, terminated, truncated, info

    def _wrap(self, obs: np.ndarray) -> Any:
        raise NotImplementedError


class DictCartPole(_SplitCartPole):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.observation_space = spaces.Dict(  # type: ignore[assignment]
            {"pole": spaces.Box(-_HIGH[2:4], _HIGH[2:4]), "cart": spaces.Box(-_HIGH[0:2], _HIGH[0:2])}
        )

    def _wrap(self, obs: np.ndarray) -> Any:
        pole, cart = self._parts(obs)
        return {"pole": pole, "cart": cart}


class TupleCartPole(_SplitCartPole):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.observation_space = spaces.Tuple(  # type: ignore[assignment]
            (spaces.Box(-_HIGH[2:4], _HIGH[2:4]), spaces.Box(-_HIGH[0:2], _HIGH[0:2]))
        )

    def _wrap(self, obs: np.ndarray) -> Any:
        return self._parts(obs)


for _id, _cls in (("DictCartPole-v0", DictCartPole), ("TupleCartPole-v0", TupleCartPole)):
    if _id not in gym.registry:
        gym.register(id=_id, entry_point=_cls, max_episode_steps=500)


class MultiDiscreteCartPole(CartPoleEnv):
    """CartPole pushed by two controls at once, ``MultiDiscrete([2, 3])``: the direction (left, right) and the force
    (half, full, one and a half times CartPole's 10 N)."""

    FORCES = (0.5, 1.0, 1.5)

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.action_space = spaces.MultiDiscrete([2, 3])  # type: ignore[assignment]
        self._base_force = self.force_mag
        self._push: Any = spaces.Discrete(2)

    def step(self, action: Any):  # type: ignore[override]
        direction, force = (int(a) for a in np.asarray(action).reshape(2))
        self.force_mag = self._base_force * self.FORCES[force]
        space, self.action_space = self.action_space, self._push  # CartPoleEnv.step checks its own action space
        try:
            return super().step(direction)
        finally:
            self.action_space = space


if "MultiDiscreteCartPole-v0" not in gym.registry:
    gym.register(id="MultiDiscreteCartPole-v0", entry_point=MultiDiscreteCartPole, max_episode_steps=500)


class DictMultiDiscreteCartPole(DictCartPole, MultiDiscreteCartPole):
    """:class:`MultiDiscreteCartPole`'s two controls with :class:`DictCartPole`'s observations (one run checks both):
    the Dict wrapping's step calls the two controls' step, which calls CartPole's."""


if "DictMultiDiscreteCartPole-v0" not in gym.registry:
    gym.register(id="DictMultiDiscreteCartPole-v0", entry_point=DictMultiDiscreteCartPole, max_episode_steps=500)
