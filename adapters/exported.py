"""The pure-torch policy `crossrl export` writes: observations ``float32 [B, *obs_shape]`` -> the greedy action
``[B]`` (int64, a Discrete action's index) or ``[B, act_dim]`` (float32, a Box action), built from an engine's own
network and traced to TorchScript, so it loads with torch alone.

Each engine's ``export_policy(trial, folder)`` (the registry's ``policy_exporter``) rebuilds its policy network from a
checkpoint's engine folder and wraps it in a :class:`GreedyPolicy` whose steps reproduce that engine's greedy action
(its ``load_policy(..., greedy=True)``) on the env as :func:`crossrl.core.envs.make_env` builds it: the argmax of the
logits or Q-values, or a Box action from the network's first ``act_dim`` outputs (the mean), optionally ``tanh``
(SAC), clipped to [-1, 1] and mapped affinely (RLlib's ``normalize_actions``, crossrl's SAC), clipped to the bounds.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn


class GreedyPolicy(nn.Module):
    """``net(obs)`` then the engine's greedy action. Discrete (``act_dim`` None): ``argmax`` over the outputs. Box:
    the first ``act_dim`` outputs, then in order ``tanh`` (``squash``), clip to [-1, 1] (``unit_clip``),
    ``mid + scale * a`` (``scale`` given), clip to ``[low, high]`` (``low`` / ``high`` given)."""

    mid: torch.Tensor
    scale: torch.Tensor
    low: torch.Tensor
    high: torch.Tensor

    def __init__(
        self,
        net: nn.Module,
        *,
        act_dim: int | None = None,
        squash: bool = False,
        unit_clip: bool = False,
        mid: Sequence[float] | None = None,
        scale: Sequence[float] | None = None,
        low: Sequence[float] | None = None,
        high: Sequence[float] | None = None,
    ) -> None:
        super().__init__()
        self.net = net
        self.discrete = act_dim is None
        self.act_dim = int(act_dim or 0)
        self.squash, self.unit_clip = squash, unit_clip
        self.affine = scale is not None
        self.clip = low is not None and high is not None
        n = max(self.act_dim, 1)
        self.register_buffer("mid", _vector(mid, n, 0.0))
        self.register_buffer("scale", _vector(scale, n, 1.0))
        self.register_buffer("low", _vector(low, n, 0.0))
        self.register_buffer("high", _vector(high, n, 0.0))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        out = self.net(obs)
        if self.discrete:
            return torch.argmax(out, dim=-1)
        a = out[:, : self.act_dim]
        if self.squash:
            a = torch.tanh(a)
        if self.unit_clip:
            a = torch.clamp(a, -1.0, 1.0)
        if self.affine:
            a = self.mid + self.scale * a
        if self.clip:
            a = torch.maximum(torch.minimum(a, self.high), self.low)
        return a


class EnvActions(nn.Module):
    """A Box policy's actions in [-1, 1] (``env.actions: unit``) mapped to the env's own bounds, as gymnasium's
    ``RescaleAction`` does on every engine's env: ``low + (a + 1) (high - low) / 2``."""

    low: torch.Tensor
    high: torch.Tensor

    def __init__(self, policy: nn.Module, low: Sequence[float], high: Sequence[float]) -> None:
        super().__init__()
        self.policy = policy
        self.register_buffer("low", torch.as_tensor(list(low), dtype=torch.float32))
        self.register_buffer("high", torch.as_tensor(list(high), dtype=torch.float32))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        a = self.policy(obs)
        return self.low + (a + 1.0) * (self.high - self.low) / 2.0


class DictOutput(nn.Module):
    """One output of a module that returns a dict (an RLlib RLModule's ``forward_inference``), for tracing."""

    def __init__(self, module: nn.Module, key: str, in_key: str = "obs") -> None:
        super().__init__()
        self.module, self.key, self.in_key = module, key, in_key

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.module.forward_inference({self.in_key: obs})[self.key]  # type: ignore[operator]
        return out


def _vector(values: Sequence[float] | None, n: int, default: float) -> torch.Tensor:
    if values is None:
        return torch.full((n,), default, dtype=torch.float32)
    return torch.as_tensor([float(v) for v in values], dtype=torch.float32).reshape(n)


def exportable_folder(trial: Any, folder: Path, *, multi_agent: str) -> Path:
    """The checkpoint's engine folder for a trial export takes: single-agent (``multi_agent`` says what the engine's
    multi-agent checkpoint holds instead), flat observations; ValueError naming the trial otherwise. A checkpoint
    folder is taken too (its engine folder inside)."""
    from crossrl.adapters.checkpoints import ENGINE_DIR

    if trial.env.multi_agent:
        raise ValueError(f"{trial.name}: export takes single-agent trials; {multi_agent}")
    if trial.model.conv:
        raise ValueError(f"{trial.name}: export takes flat observations (MLP models); this trial has a conv model")
    folder = Path(folder)
    return folder / ENGINE_DIR if (folder / ENGINE_DIR).is_dir() else folder
