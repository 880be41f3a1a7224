"""A real CartPole that raises after a number of steps in its process (runner tests with real engines).

Importing this module registers ``crash_env:CrashingCartPole-v0``; gymnasium imports the module
itself when an id is written ``crash_env:CrashingCartPole-v0``, in any process (Ray workers included)
that has tests/support on its PYTHONPATH.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
from gymnasium.envs.classic_control.cartpole import CartPoleEnv

_steps_in_process = 0


class CrashingCartPole(CartPoleEnv):
    def __init__(self, crash_at: int = 300, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.crash_at = crash_at

    def step(self, action: Any):  # type: ignore[override]
        global _steps_in_process
        _steps_in_process += 1
        if _steps_in_process >= self.crash_at:
            raise RuntimeError(f"CrashingCartPole: simulator crashed at step {_steps_in_process}")
        return super().step(action)


if "CrashingCartPole-v0" not in gym.registry:
    gym.register(id="CrashingCartPole-v0", entry_point=CrashingCartPole, max_episode_steps=500)
