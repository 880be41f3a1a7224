"""One conv model on every engine: built by crossrl's core, RLlib and TorchRL for a MinAtar env, the same
parameter count (hand-computed too), and each takes the env's uint8 frames as they are."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from engine_models import count, crossrl_nets, rllib_module, torchrl_model
from torch import nn

from crossrl.adapters.torchrl.adapter import env_dims
from crossrl.core.envs import make_env
from crossrl.scenarios.spec import ScenarioSpec, Trial

MINATAR = "MinAtar/Breakout-v1"  # frames [10, 10, 4], 3 actions
CONV, HIDDEN = [[16, 3, 1]], [128]
# By hand: conv 16 * 4 * 3 * 3 + 16 = 592; 8 x 8 x 16 = 1024 features; hidden 1024 * 128 + 128 = 131200;
# policy out 128 * 3 + 3 = 387, value out 128 + 1 = 129. PPO: separate policy and value networks; DQN: one
# Q-network (no dueling, target network not counted).
PPO_PARAMS = (592 + 131200 + 387) + (592 + 131200 + 129)
DQN_PARAMS = 592 + 131200 + 387
ATARI = "ALE/Breakout-v5"  # frames [84, 84, 4], 4 actions
NATURE_CNN, NATURE_HIDDEN = [[32, 8, 4], [64, 4, 2], [64, 3, 1]], [512]
# By hand: convs (32*4*8*8 + 32) + (64*32*4*4 + 64) + (64*64*3*3 + 64) = 8224 + 32832 + 36928 = 77984;
# 7 x 7 x 64 = 3136 features; hidden 3136 * 512 + 512 = 1606144; policy out 512 * 4 + 4, value out 513.
ATARI_PPO_PARAMS = (77984 + 1606144 + 2052) + (77984 + 1606144 + 513)


def trials(algorithm: str, env_id: str = MINATAR) -> dict[str, Trial]:
    conv, hidden = (NATURE_CNN, NATURE_HIDDEN) if env_id == ATARI else (CONV, HIDDEN)
    spec = ScenarioSpec.model_validate(
        {
            "name": "pixels-test",
            "env": {"id": env_id},
            "algorithm": {"name": algorithm, "model": {"conv": conv, "hidden": hidden, "activation": "relu"}},
            "budget": {"env_steps": 100},
        }
    )
    return {t.engine: t for t in spec.trials()}


def frames(n: int = 2) -> np.ndarray:
    env = make_env(trials("ppo")["crossrl"].env)
    obs, _ = env.reset(seed=0)
    assert obs.dtype == np.uint8
    return np.stack([obs] * n)


def torchrl_nets(trial: Trial) -> list[nn.Module]:
    obs_shape, n_actions = env_dims(trial.env)
    assert (obs_shape, n_actions) == (((84, 84, 4), 4) if trial.env.id == ATARI else ((10, 10, 4), 3))
    return torchrl_model(trial)


@pytest.mark.parametrize(("algorithm", "n_params"), [("ppo", PPO_PARAMS), ("dqn", DQN_PARAMS)])
def test_every_engine_builds_the_same_conv_model(algorithm: str, n_params: int) -> None:
    by_engine = trials(algorithm)
    policy, ours = crossrl_nets(by_engine["crossrl"])
    theirs = torchrl_nets(by_engine["torchrl"])
    module = rllib_module(by_engine["rllib"])
    assert type(module).__name__.startswith("Frames"), "RLlib's CNN must get the uint8-frames module"
    assert {"crossrl": count(ours), "torchrl": count(theirs), "rllib": count([module])} == dict.fromkeys(
        ("crossrl", "torchrl", "rllib"), n_params
    )
    # The same layers on each: one 3x3 conv with no padding (RLlib's default would pad: "same"), ReLU after it.
    for modules in (ours, theirs, [module]):
        convs = [m for net in modules for m in net.modules() if isinstance(m, nn.Conv2d)]
        assert convs and all(c.kernel_size == (3, 3) and c.stride == (1, 1) and c.padding == (0, 0) for c in convs)
        assert not any(type(m).__name__ == "ZeroPad2d" for net in modules for m in net.modules())

    # Each takes the uint8 frames as the env gives them.
    x = frames()
    actions, _ = policy.compute_actions(x)
    assert actions.shape == (2,)
    with torch.no_grad():
        out = theirs[0](torch.as_tensor(x))
        assert out.shape == (2, 3) and torch.isfinite(out).all()
        rl_out = module.forward_inference({"obs": torch.as_tensor(x)})
    assert all(torch.isfinite(v.float()).all() for v in rl_out.values())


def test_crossrl_and_torchrl_compute_the_same_function_given_the_same_weights() -> None:
    """Not just the count: TorchRL's ConvNet + crossrl's MLP and crossrl's conv trunk + MLP are the same layers in
    the same order (both flatten channels-first), so copying the weights across gives the same logits."""
    by_engine = trials("ppo")
    _, (pi, _) = crossrl_nets(by_engine["crossrl"])
    actor = torchrl_nets(by_engine["torchrl"])[0]
    with torch.no_grad():
        for a, b in zip(actor.parameters(), pi.parameters(), strict=True):
            a.copy_(b)
        x = torch.as_tensor(frames())
        torch.testing.assert_close(actor(x), pi(x))
        # uint8 frames are scaled by 1/255 inside the model: the same as 0/1 floats given to its layers
        trunk, mlp = pi
        assert trunk[0](x).dtype == torch.float32 and float(trunk[0](x).max()) == 1.0
        torch.testing.assert_close(pi(x), mlp(trunk[1:](x.movedim(-1, -3).float() / 255.0)))


def test_every_engine_builds_the_same_nature_cnn_for_atari() -> None:
    by_engine = trials("ppo", ATARI)
    _, ours = crossrl_nets(by_engine["crossrl"])
    counts = {
        "crossrl": count(ours),
        "torchrl": count(torchrl_nets(by_engine["torchrl"])),
        "rllib": count([rllib_module(by_engine["rllib"])]),
    }
    assert (
        counts == dict.fromkeys(("crossrl", "torchrl", "rllib"), ATARI_PPO_PARAMS) == dict.fromkeys(counts, 3_370_821)
    )
