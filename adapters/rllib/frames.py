"""RLlib 2.60's default RLModules taking uint8 frames: the same modules, with the frames scaled inside the model.

RLlib's CNN encoder (``TorchCNN``) feeds its observations to ``nn.Conv2d`` as they come: uint8 frames fail
("Input type (unsigned char) and bias type (float) should be the same", measured), and RLlib's own Atari
setup scales them to float32 in an env wrapper, so float frames would travel from the env runners to
the learner (4x the bytes). These subclasses instead put crossrl's ``ScaleFrames`` (x / 255, as
crossrl's and TorchRL's conv models do) at the head of every ``TorchCNN`` once the module is set up:
the same parameters, uint8 from the env to the model. Imported only for conv models (it imports RLlib).
"""

from __future__ import annotations

from typing import Any

from ray.rllib.algorithms.dqn.torch.default_dqn_torch_rl_module import DefaultDQNTorchRLModule
from ray.rllib.algorithms.ppo.torch.default_ppo_torch_rl_module import DefaultPPOTorchRLModule
from ray.rllib.core.models.torch.primitives import TorchCNN
from torch import nn

from crossrl.core.models import ScaleFrames


def scale_cnn_inputs(module: nn.Module) -> None:
    """Put :class:`ScaleFrames` first in every RLlib ``TorchCNN`` inside ``module`` (once)."""
    for child in module.modules():
        if isinstance(child, TorchCNN) and not isinstance(child.cnn[0], ScaleFrames):
            child.cnn = nn.Sequential(ScaleFrames(), *child.cnn)


class FramesPPOTorchRLModule(DefaultPPOTorchRLModule):
    """RLlib's PPO (and IMPALA) module, uint8 frames scaled by 1/255 in its CNNs."""

    def setup(self) -> None:
        super().setup()
        scale_cnn_inputs(self)


class FramesDQNTorchRLModule(DefaultDQNTorchRLModule):
    """RLlib's DQN module, uint8 frames scaled by 1/255 in its CNNs (its target networks copy them)."""

    def setup(self) -> None:
        super().setup()
        scale_cnn_inputs(self)


FRAMES_MODULES: dict[type, type] = {
    DefaultPPOTorchRLModule: FramesPPOTorchRLModule,
    DefaultDQNTorchRLModule: FramesDQNTorchRLModule,
}


def frames_module_class(default_class: Any) -> type:
    """The frames-taking subclass of an algorithm's default RLModule class."""
    try:
        return FRAMES_MODULES[default_class]
    except KeyError:
        raise ValueError(f"rllib: no uint8-frames RLModule for {default_class.__name__}") from None
