"""The one network builder every engine uses, so that architectures match across engines.

:func:`build_mlp` builds the spec's MLP; :func:`build_net` puts the spec's conv stack
(:func:`build_conv_trunk`) before it when the spec has one. TorchRL builds its conv stack with its own
``ConvNet`` (``crossrl.adapters.torchrl.algorithms``) and RLlib with its CNN encoder; both match these layer
for layer (the tests count the parameters).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from crossrl.scenarios.spec import ModelSpec, conv_output_sizes, conv_problem

_ACTIVATIONS: dict[str, type[nn.Module]] = {"tanh": nn.Tanh, "relu": nn.ReLU}


def activation_class(name: str) -> type[nn.Module]:
    """The torch module of a spec's ``activation``."""
    return _ACTIVATIONS[name]


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


def init_linears_(module: nn.Module, *, out_gain: float) -> nn.Module:
    """Every Linear in ``module``, in order, initialised as :func:`build_mlp` initialises its layers: orthogonal,
    gain sqrt(2) but ``out_gain`` on the last, biases zero (for MLPs built by another library: TorchRL's)."""
    linears = [m for m in module.modules() if isinstance(m, nn.Linear)]
    for i, layer in enumerate(linears):
        _init(layer, out_gain if i == len(linears) - 1 else math.sqrt(2.0))
    return module


def init_convs_(module: nn.Module) -> nn.Module:
    """Every Conv2d in ``module`` orthogonal with gain sqrt(2), biases zero (as :func:`build_mlp`'s hidden layers)."""
    for layer in module.modules():
        if isinstance(layer, nn.Conv2d):
            nn.init.orthogonal_(layer.weight, gain=math.sqrt(2.0))
            if layer.bias is not None:
                nn.init.zeros_(layer.bias)
    return module


def scale_frames(x: torch.Tensor) -> torch.Tensor:
    """uint8 frames as float in [0, 1] (x / 255); other dtypes as float, unscaled."""
    return x.float() / 255.0 if x.dtype == torch.uint8 else x.float()


class ScaleFrames(nn.Module):
    """:func:`scale_frames` as a module (no parameters): frames travel as uint8 and become float here."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return scale_frames(x)


class FramesIn(nn.Module):
    """Frames ``[..., H, W, C]`` (channels last, as envs give them) -> float ``[..., C, H, W]`` (:func:`scale_frames`)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return scale_frames(x.movedim(-1, -3))


def image_shape(obs_shape: Sequence[int], model: ModelSpec) -> tuple[int, int, int]:
    """(H, W, C) of the observations a conv model reads; a ValueError naming the spec field when it cannot."""
    if len(obs_shape) != 3:
        raise ValueError(
            f"algorithm.model.conv needs image observations [H, W, C]; the env gives shape {list(obs_shape)} "
            "(use an MLP: conv: [])"
        )
    h, w, c = (int(n) for n in obs_shape)
    problem = conv_problem(h, w, model.conv)
    if problem:
        raise ValueError(f"algorithm.model.conv: {problem}")
    return h, w, c


def conv_flat_dim(obs_shape: Sequence[int], model: ModelSpec) -> int:
    """Features out of the flattened conv stack (its input to the MLP)."""
    h, w, _ = image_shape(obs_shape, model)
    out_h, out_w = conv_output_sizes(h, w, model.conv)[-1]
    return out_h * out_w * model.conv[-1][0]


def build_conv_trunk(*, obs_shape: Sequence[int], model: ModelSpec) -> tuple[nn.Sequential, int]:
    """The spec's conv stack on frames ``[B, H, W, C]``: :class:`FramesIn`, each Conv2d (no padding) and the
    activation, then flattened; returns it and its number of output features."""
    _, _, prev = image_shape(obs_shape, model)
    act = _ACTIVATIONS[model.activation]
    layers: list[nn.Module] = [FramesIn()]
    for filters, kernel, stride in model.conv:
        layers += [nn.Conv2d(prev, filters, kernel, stride), act()]
        prev = filters
    layers.append(nn.Flatten())
    return init_convs_(nn.Sequential(*layers)), conv_flat_dim(obs_shape, model)  # type: ignore[return-value]


def build_net(*, obs_shape: Sequence[int], out_dim: int, model: ModelSpec, out_gain: float = 1.0) -> nn.Sequential:
    """:func:`build_mlp` on the flat observation, or ``Sequential(conv trunk, MLP)`` when the spec has a conv stack."""
    if not model.conv:
        return build_mlp(in_dim=math.prod(obs_shape), out_dim=out_dim, model=model, out_gain=out_gain)
    trunk, flat = build_conv_trunk(obs_shape=obs_shape, model=model)
    return nn.Sequential(trunk, build_mlp(in_dim=flat, out_dim=out_dim, model=model, out_gain=out_gain))


def module_weights(modules: Mapping[str, nn.Module]) -> dict[str, np.ndarray]:
    """Every tensor of named modules as numpy copies, keyed ``<name>.<state_dict key>``."""
    out: dict[str, np.ndarray] = {}
    for name, module in modules.items():
        out.update({f"{name}.{k}": v.detach().numpy().copy() for k, v in module.state_dict().items()})
    return out


def load_module_weights(modules: Mapping[str, nn.Module], weights: Mapping[str, np.ndarray]) -> None:
    """:func:`module_weights`'s arrays back into the named modules; a module with none of its keys in ``weights`` is
    left as it is (a part of the weights, an actor's alone, loads that part)."""
    with torch.no_grad():
        for name, module in modules.items():
            prefix = name + "."
            part = {
                k[len(prefix) :]: torch.as_tensor(np.asarray(v)) for k, v in weights.items() if k.startswith(prefix)
            }
            if part:
                module.load_state_dict(part)


def count_params(module: nn.Module) -> int:
    """Trainable parameters (for the native-config audit)."""
    return sum(p.numel() for p in module.parameters() if p.requires_grad)


def inference_forward(net: nn.Module) -> Callable[[torch.Tensor], torch.Tensor]:
    """``net``'s forward pass for acting, to be called under ``torch.inference_mode`` (or ``no_grad``): the same
    layers in the same order, called as torch functions on the module's own parameters (weights loaded into the
    module later apply), activations in place. The same outputs, bit for bit (tests/bench/test_pixel_bench.py);
    what it saves is the per-module call overhead and a few fresh tensors: ~25 us of the ~110 us a MinAtar actor's
    module call costs for 8 frames on one torch thread, ~0.1 ms of ~2 ms on the Nature CNN (2026-11-24). Layers it
    does not know are called as modules."""
    ops: list[Callable[[torch.Tensor], torch.Tensor]] = []
    for m in _leaf_modules(net):
        if isinstance(m, FramesIn):
            ops.append(_frames_in)
        elif isinstance(m, nn.Conv2d) and m.padding_mode == "zeros":
            ops.append(
                lambda x, m=m: F.conv2d(x, m.weight, m.bias, m.stride, m.padding, m.dilation, m.groups)  # type: ignore[misc]
            )
        elif isinstance(m, nn.Linear):
            ops.append(lambda x, m=m: F.linear(x, m.weight, m.bias))  # type: ignore[misc]
        elif isinstance(m, nn.ReLU):
            ops.append(torch.relu_)
        elif isinstance(m, nn.Tanh):
            ops.append(torch.tanh_)
        elif isinstance(m, nn.Flatten):
            ops.append(lambda x, m=m: x.flatten(m.start_dim, m.end_dim))  # type: ignore[misc]
        else:
            ops.append(m)

    def forward(x: torch.Tensor) -> torch.Tensor:
        for op in ops:
            x = op(x)
        return x

    return forward


def _leaf_modules(net: nn.Module) -> list[nn.Module]:
    """The layers of nested ``nn.Sequential`` containers in call order (any other module is a layer)."""
    if isinstance(net, nn.Sequential):
        return [leaf for child in net for leaf in _leaf_modules(child)]
    return [net]


def _frames_in(x: torch.Tensor) -> torch.Tensor:
    """:class:`FramesIn` with the scaling in place on the fresh float copy (same values as :func:`scale_frames`)."""
    x = x.movedim(-1, -3)
    return x.float().div_(255.0) if x.dtype == torch.uint8 else x.float()
