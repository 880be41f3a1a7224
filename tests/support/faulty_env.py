"""Real CartPoles that break in one way (the env-fault tests, on every engine).

Importing this module registers ``FaultyCartPole-v0``; write the id ``faulty_env:FaultyCartPole-v0`` and gymnasium
imports it in any process (Ray's workers, TorchRL's collector processes, the raw-speed probe) that has tests/support
on its PYTHONPATH. ``kwargs``:

- ``fault``: ``raise`` (``step`` raises RuntimeError), ``hang`` (``step`` never returns), ``nan`` (the reward is
  NaN), ``shape`` (the observation has 5 numbers where the space declares 4), ``float64`` (float64 observations where
  the space declares float32), ``huge`` (finite rewards of 1e30, whose
  squares overflow: the value loss is not finite), ``none``;
- ``at``: the fault comes at this env step of the process (counted over its env copies), or
- ``after_s``: at the first step this many seconds after the process built its first copy (a fault mid-trial that
  the runner's raw-speed probe, a second long, never reaches).
"""

from __future__ import annotations

import time
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.envs.classic_control.cartpole import CartPoleEnv

_steps = 0
_born: float | None = None


class FaultyCartPole(CartPoleEnv):
    def __init__(self, fault: str = "none", at: int | None = None, after_s: float | None = None, **kw: Any) -> None:
        global _born
        super().__init__(**kw)
        self.fault, self.at, self.after_s = fault, at, after_s
        _born = _born or time.monotonic()

    def _due(self) -> bool:
        if self.at is not None:
            return _steps >= self.at
        return self.after_s is not None and _born is not None and time.monotonic() - _born >= self.after_s

    def step(self, action: Any):  # type: ignore[override]
        global _steps
        _steps += 1
        obs, reward, terminated, truncated, info = super().step(action)
        if not self._due():
            return obs, reward, terminated, truncated, info
        if self.fault == "raise":
            raise RuntimeError(f"FaultyCartPole: the simulator crashed at step {_steps}")
        if self.fault == "hang":
            while True:
                time.sleep(1.0)
        if self.fault == "nan":
            return obs, float("nan"), terminated, truncated, info
        if self.fault == "huge":
            return obs, 1e30, terminated, truncated, info
        if self.fault == "shape":
            return np.append(obs, np.float32(0.0)), reward, terminated, truncated, info
        if self.fault == "float64":
            return obs.astype(np.float64), reward, terminated, truncated, info
        return obs, reward, terminated, truncated, info


if "FaultyCartPole-v0" not in gym.registry:
    gym.register(id="FaultyCartPole-v0", entry_point=FaultyCartPole, max_episode_steps=500)
