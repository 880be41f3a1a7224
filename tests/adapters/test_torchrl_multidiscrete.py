"""TorchRL's on-policy learners on MultiDiscrete actions: the factored categorical (one categorical per dimension over
its slice of one logits vector, log-probabilities and entropies summed, each dimension's argmax as the deterministic
action) against values computed by hand; crossrl's core's parameter count; the action format from the collector to
the env and to TorchRL's own losses."""

from __future__ import annotations

import math
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import spaces_env  # noqa: F401 - registers spaces_env:MultiDiscreteCartPole-v0
import torch
from gymnasium import spaces
from tensordict import TensorDict
from torchrl.envs.utils import ExplorationType, set_exploration_type

from crossrl.adapters.torchrl.adapter import learner_dims, local_collector
from crossrl.adapters.torchrl.algorithms import FactoredCategorical, build_learner
from crossrl.scenarios.spec import EnvSpec, ScenarioSpec, Trial

ENV = "spaces_env:MultiDiscreteCartPole-v0"
# nvec [2, 3]: the first dimension's probabilities (1/4, 3/4), the second's (1/4, 1/4, 1/2)
LOGITS = torch.tensor([0.0, math.log(3.0), 0.0, 0.0, math.log(2.0)])


def trials(algorithm: str, **hp: Any) -> dict[str, Trial]:
    spec = ScenarioSpec.model_validate(
        {"name": "md", "env": {"id": ENV}, "algorithm": {"name": algorithm, "hyperparams": hp},
         "execution": {"workers": [1], "envs_per_worker": 2}, "budget": {"env_steps": 256}}
    )  # fmt: skip
    return {t.engine: t for t in spec.trials()}


def test_factored_categorical_log_prob_entropy_and_mode_by_hand() -> None:
    dist = FactoredCategorical(LOGITS.expand(3, 5), (2, 3))
    assert dist.batch_shape == (3,) and dist.event_shape == (2,)
    actions = torch.tensor([[1, 2], [0, 0], [1, 1]])
    by_hand = torch.tensor([math.log(3 / 4 * 1 / 2), math.log(1 / 4 * 1 / 4), math.log(3 / 4 * 1 / 4)])
    assert torch.allclose(dist.log_prob(actions), by_hand)
    h1 = -(1 / 4 * math.log(1 / 4) + 3 / 4 * math.log(3 / 4))
    h2 = -(2 * 1 / 4 * math.log(1 / 4) + 1 / 2 * math.log(1 / 2))
    assert torch.allclose(dist.entropy(), torch.full((3,), h1 + h2))
    assert torch.equal(dist.mode, torch.tensor([[1, 2]] * 3)) and torch.equal(dist.deterministic_sample, dist.mode)
    torch.manual_seed(0)
    draws = dist.sample((4000,))
    assert draws.shape == (4000, 3, 2) and draws.dtype == torch.int64
    assert draws[..., 0].max() == 1 and draws[..., 1].max() == 2 and draws.min() == 0
    freq = draws[:, 0].float().mean(0)  # P(first = 1) = 3/4, E[second] = 1/4 + 2 * 1/2 = 5/4
    assert abs(float(freq[0]) - 0.75) < 0.03 and abs(float(freq[1]) - 1.25) < 0.05
    with pytest.raises(ValueError, match="needs 5"):
        FactoredCategorical(torch.zeros(4), (2, 3))


@pytest.mark.parametrize("algorithm", ["ppo", "a2c", "a3c", "impala"])
def test_multidiscrete_actor_has_crossrl_parameter_count(algorithm: str) -> None:
    """Policy MLP -> sum(nvec) = 5 logits, and the critic apart: crossrl's core's 4805 + 4545."""
    from engine_models import count, crossrl_nets, torchrl_model

    by_engine = trials(algorithm)
    assert learner_dims(by_engine["torchrl"].env) == {"obs_shape": (4,), "nvec": [2, 3]}
    _, ours = crossrl_nets(by_engine["crossrl"])
    assert count(torchrl_model(by_engine["torchrl"])) == count(ours) == 4805 + 4545


def test_actor_acts_with_int_vectors_the_env_takes_and_the_losses_train_on_them() -> None:
    """From the collector to the env and to ClipPPOLoss: int64 actions of shape [..., 2] within nvec, the behaviour
    log-probability the factored one of those actions; a PPO update on the batch is finite; the deterministic
    actor and act_fn give each dimension's argmax."""
    trial = trials("ppo", train_batch=64, minibatch=32, epochs=1)["torchrl"]
    learner: Any = build_learner(trial=trial, **learner_dims(trial.env))
    collector, _ = local_collector(trial.env, workers=1, envs_per_worker=2, policy=learner.policy, frames_per_batch=64)
    try:
        data = next(iter(collector))
    finally:
        collector.shutdown()
    action = data["action"]
    assert action.shape == (*data.batch_size, 2) and action.dtype == torch.int64
    assert int(action[..., 0].max()) <= 1 and int(action[..., 1].max()) <= 2 and int(action.min()) >= 0
    with torch.no_grad():
        logp = learner.actor.get_dist(data.select("observation")).log_prob(action)
    assert torch.allclose(logp, data[learner.loss.tensor_keys.sample_log_prob])
    frames, stats = learner.learn(data)
    assert frames == 64 and all(np.isfinite(v) for v in stats.values()), stats
    assert stats["entropy"] > 0
    obs = torch.tensor([[0.01, 0.0, -0.02, 0.0]])
    with torch.no_grad(), set_exploration_type(ExplorationType.DETERMINISTIC):
        greedy = learner.actor(TensorDict({"observation": obs}, batch_size=[1]))["action"][0]
        mode = torch.stack([p.argmax() for p in learner.actor_net(obs)[0].split([2, 3])])
    assert torch.equal(greedy, mode) and np.array_equal(learner.act_fn(deterministic=True)(obs[0].numpy()), mode)


class _EqualControls(gym.Env):  # type: ignore[misc]
    observation_space = spaces.Box(-1.0, 1.0, (3,), np.float32)
    action_space = spaces.MultiDiscrete([3, 3])

    def reset(self, *, seed: int | None = None, options: Any = None) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        return np.zeros(3, np.float32), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        assert np.asarray(action).shape == (2,)
        return np.zeros(3, np.float32), float(np.sum(action)), False, False, {}


def test_equal_nvec_entries_are_read_as_multidiscrete_too() -> None:
    """GymWrapper maps MultiDiscrete([3, 3]) to a Categorical spec of shape [2] (not MultiCategorical): still nvec."""
    if "EqualControlsMD-v0" not in gym.registry:
        gym.register(id="EqualControlsMD-v0", entry_point=_EqualControls, max_episode_steps=10)
    assert learner_dims(EnvSpec(id="EqualControlsMD-v0")) == {"obs_shape": (3,), "nvec": [3, 3]}


def test_multidiscrete_policy_reloads_from_a_checkpoint(tmp_path: Any) -> None:
    """``load_policy`` (crossrl evaluate) rebuilds the factored policy from a checkpoint's dims (``nvec``): each
    dimension's argmax, deterministic; sampled, int vectors within nvec. Export names MultiDiscrete and exits."""
    from crossrl.adapters.torchrl.adapter import export_policy, load_policy

    trial = trials("ppo")["torchrl"]
    learner: Any = build_learner(trial=trial, **learner_dims(trial.env))
    with torch.no_grad():
        learner.actor_net[-1].weight.normal_()
    learner.save(tmp_path)
    greedy, sample = load_policy(trial, tmp_path), load_policy(trial, tmp_path, greedy=False)
    for obs in np.random.default_rng(0).uniform(-0.05, 0.05, (10, 4)).astype(np.float32):
        with torch.no_grad():
            logits = learner.actor_net(torch.as_tensor(obs)[None])[0]
        want = [int(p.argmax()) for p in logits.split([2, 3])]
        assert greedy(obs).tolist() == want
        a = sample(obs)
        assert a.shape == (2,) and 0 <= a[0] <= 1 and 0 <= a[1] <= 2
    with pytest.raises(ValueError, match=r"MultiDiscrete\(\[2, 3\]\)"):
        export_policy(trial, tmp_path)
