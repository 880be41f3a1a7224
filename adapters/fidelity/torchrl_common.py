"""What TorchRL's native loops (``torchrl_loop``: PPO, ``torchrl_impala``: IMPALA) share: their envs, built as
TorchRL's reference scripts build them, and reading the adapter's stored native config."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

ACTIVATIONS = {"tanh": "Tanh", "relu": "ReLU"}


def make_env(env_id: str, kwargs: Mapping[str, Any], num_envs: int) -> Any:
    """``num_envs`` gymnasium envs stepped serially, with episode return and length counters (module-level: a
    collector worker started with spawn unpickles it)."""
    import torch
    from torchrl.envs import Compose, RewardSum, SerialEnv, StepCounter, TransformedEnv

    torch.set_num_threads(1)
    base = SerialEnv(num_envs, functools.partial(gym_env, env_id, dict(kwargs)), serial_for_single=True)
    return TransformedEnv(base, Compose(RewardSum(), StepCounter()))


def gym_env(env_id: str, kwargs: dict[str, Any]) -> Any:
    from torchrl.envs import GymEnv, set_gym_backend

    with set_gym_backend("gymnasium"):
        return GymEnv(env_id, categorical_action_encoding=True, **kwargs)


def stored_value(stored: Mapping[str, Any], *keys: str) -> Any:
    value: Any = stored
    for key in keys:
        if not isinstance(value, Mapping) or key not in value:
            raise ValueError(f"torchrl-native: the stored native config has no {'.'.join(keys)}")
        value = value[key]
    return value
