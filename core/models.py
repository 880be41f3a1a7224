"""The one network builder every engine uses, so that architectures match across engines."""

from __future__ import annotations

import math

from torch import nn

from crossrl.scenarios.spec import ModelSpec

_ACTIVATIONS: dict[str, type[nn.Module]] = {"tanh": nn.Tanh, "relu": nn.ReLU}


def build_mlp(*, in_dim: int, out_dim: int, model: ModelSpec, out_gain: float = 1.0) -> nn.Sequential:
    """``in_dim -> hidden... -> out_dim`` MLP with the spec's activation between layers (none after the last).

    Weights are orthogonal (gain sqrt(2) on hidden layers, ``out_gain`` on the output layer: 0.01 for
    policy logits/means so the initial policy is near uniform, 1.0 for values), biases zero: the
    CleanRL/openai-baselines initialisation, which the other engines' adapters reproduce.
    """
    if in_dim < 1 or out_dim < 1:
        raise ValueError(f"build_mlp: in_dim={in_dim} and out_dim={out_dim} must be >= 1")
    act = _ACTIVATIONS[model.activation]
    layers: list[nn.Module] = []
    prev = in_dim
    for width in model.hidden:
        layers += [_init(nn.Linear(prev, width), math.sqrt(2.0)), act()]
        prev = width
    layers.append(_init(nn.Linear(prev, out_dim), out_gain))
    return nn.Sequential(*layers)


def _init(layer: nn.Linear, gain: float) -> nn.Linear:
    nn.init.orthogonal_(layer.weight, gain=gain)
    nn.init.zeros_(layer.bias)
    return layer


def count_params(module: nn.Module) -> int:
    """Trainable parameters (for the native-config audit)."""
    return sum(p.numel() for p in module.parameters() if p.requires_grad)
