"""A real CartPole that scores 3 points per step (reward-clipping tests with real engines).

Importing this module registers ``score_env:ScoredCartPole-v0``; gymnasium imports the module itself when an
id is written that way, in any process (Ray workers included) that has tests/support on its PYTHONPATH. With
``reward_clip: true`` a learner sees +1 per step while every engine must report the raw 3 per step.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
from gymnasium.envs.classic_control.cartpole import CartPoleEnv

POINTS_PER_STEP = 3.0


class ScoredCartPole(CartPoleEnv):
    def step(self, action: Any):  # type: ignore[override]
        obs, reward, terminated, truncated, info = super().step(action)
        return obs, POINTS_PER_STEP * float(reward), terminated, truncated, info


if "ScoredCartPole-v0" not in gym.registry:
    gym.register(id="ScoredCartPole-v0", entry_point=ScoredCartPole, max_episode_steps=500)
