"""QPolicy (DQN/Ape-X loss, epsilon-greedy, worker postprocessing) and the sync replay optimizer, no Ray."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from torch import nn

from crossrl.core import algorithms
from crossrl.core import sample_batch as sb
from crossrl.core.evaluator import EvaluatorSet, PolicyEvaluator
from crossrl.core.optimizers.sync_replay import SyncReplayOptimizer
from crossrl.core.policy import PolicySpec
from crossrl.core.q_policy import QPolicy, apex_epsilons, linear_epsilon
from crossrl.scenarios import metrics as M
from crossrl.scenarios.catalog import HYPERPARAM_DEFAULTS
from crossrl.scenarios.spec import EnvSpec, ModelSpec

CARTPOLE = EnvSpec(id="CartPole-v1")


def resolved(algorithm: str) -> dict[str, Any]:
    """The hyperparameters the crossrl engine gives a policy: shared defaults over crossrl's own settings."""
    return algorithms.load(algorithm).hyperparams(HYPERPARAM_DEFAULTS[algorithm])


def make_policy(**hp: Any) -> QPolicy:
    return QPolicy(
        observation_space=gym.spaces.Box(-1.0, 1.0, (2,), np.float32),
        action_space=gym.spaces.Discrete(2),
        hyperparams={**resolved("dqn"), **hp},
        model=ModelSpec(hidden=(8,)),
        seed=0,
    )


def linear(weight: list[list[float]]) -> nn.Linear:
    layer = nn.Linear(2, 2, bias=False)
    with torch.no_grad():
        layer.weight.copy_(torch.tensor(weight))
    return layer


def test_apex_epsilons_follow_the_paper() -> None:
    eps = apex_epsilons(8)
    assert eps[0] == pytest.approx(0.4) and eps[-1] == pytest.approx(0.4**8)
    assert eps == sorted(eps, reverse=True)
    assert apex_epsilons(2) == pytest.approx([0.4, 0.4**8])
    assert apex_epsilons(1) == [0.4]


def test_linear_epsilon_schedule() -> None:
    kw = {"initial": 1.0, "final": 0.1, "timesteps": 100}
    assert linear_epsilon(env_steps=0, **kw) == 1.0
    assert linear_epsilon(env_steps=50, **kw) == pytest.approx(0.55)
    assert linear_epsilon(env_steps=1000, **kw) == pytest.approx(0.1)


def test_epsilon_greedy_actions() -> None:
    policy = make_policy()
    obs = np.random.default_rng(0).uniform(-1, 1, (2000, 2)).astype(np.float32)
    greedy = policy.q_values(obs).argmax(axis=1)
    policy.set_epsilon(0.0)
    actions, extra = policy.compute_actions(obs)
    np.testing.assert_array_equal(actions, greedy)
    assert extra == {}
    policy.set_epsilon(1.0)
    actions, _ = policy.compute_actions(obs)
    # Uniform random: half the actions differ from the greedy ones (4 s.e. = 0.045).
    assert abs((actions != greedy).mean() - 0.5) < 0.045
    actions, _ = policy.compute_actions(obs, explore=False)
    np.testing.assert_array_equal(actions, greedy)
    with pytest.raises(ValueError):
        policy.set_epsilon(1.5)


@pytest.mark.parametrize(("double_q", "expected_td"), [(True, -1.0), (False, -3.0)])
def test_td_error_double_q_hand_computed(double_q: bool, expected_td: float) -> None:
    policy = make_policy(double_q=double_q)
    policy.q = linear([[1.0, 0.0], [0.0, 1.0]])  # Q(s) = s
    policy.target = linear([[0.0, 2.0], [2.0, 0.0]])  # Q'(s) = 2 * (s1, s0)
    batch = {
        sb.OBS: torch.tensor([[1.0, 0.0]]),
        sb.ACTIONS: torch.tensor([0]),
        sb.N_STEP_RETURNS: torch.tensor([1.0]),
        sb.N_STEP_DISCOUNTS: torch.tensor([0.5]),
        sb.N_STEP_NEXT_OBS: torch.tensor([[3.0, 1.0]]),
    }
    # Q(s, 0) = 1. Next: Q = (3, 1), Q' = (2, 6). Double: a* = 0 -> y = 1 + 0.5 * 2 = 2, td = -1.
    # Plain: max Q' = 6 -> y = 4, td = -3.
    td = policy._td_error(batch).detach()
    assert float(td[0]) == pytest.approx(expected_td)
    loss, stats = policy.loss({**batch, sb.WEIGHTS: torch.tensor([0.5])})
    huber = 0.5 if double_q else 2.5  # 0.5 td**2 below 1, |td| - 0.5 above
    assert float(loss.detach()) == pytest.approx(0.5 * huber)
    assert stats[M.VALUE_LOSS] == pytest.approx(0.5 * huber)


def test_terminal_transition_does_not_bootstrap() -> None:
    policy = make_policy()
    batch = {
        sb.OBS: torch.zeros((1, 2)),
        sb.ACTIONS: torch.tensor([1]),
        sb.N_STEP_RETURNS: torch.tensor([1.0]),
        sb.N_STEP_DISCOUNTS: torch.tensor([0.0]),
        sb.N_STEP_NEXT_OBS: torch.full((1, 2), 100.0),
    }
    q = float(policy.q(batch[sb.OBS])[0, 1].detach())
    assert float(policy._td_error(batch)[0].detach()) == pytest.approx(q - 1.0, abs=1e-6)


def test_weights_round_trip_and_target_update() -> None:
    a, b = make_policy(), make_policy()
    with torch.no_grad():
        for p in a.q.parameters():
            p.add_(1.0)
    a.update_target()
    b.set_weights(a.get_weights())
    obs = np.ones((3, 2), np.float32)
    np.testing.assert_allclose(b.q_values(obs), a.q_values(obs))
    with torch.no_grad():
        np.testing.assert_allclose(b.target(torch.ones(3, 2)).numpy(), a.target(torch.ones(3, 2)).numpy())
    assert any(k.startswith("target.") for k in a.get_weights())


def test_worker_postprocessing_n_step_columns_and_priorities() -> None:
    hp = {**resolved("apex"), "n_step": 3}
    ev = PolicyEvaluator(
        env_spec=CARTPOLE,
        num_envs=3,
        policy_factory=PolicySpec(policy_cls=QPolicy, hyperparams=hp, model=ModelSpec(hidden=(16,))),
        seed=0,
        worker_index=0,
    )
    ev.set_epsilon(1.0)
    batch = ev.sample(num_steps=60)
    assert batch.episode_returns, "60 random steps x 3 envs should end some CartPole episodes"
    assert {sb.N_STEP_RETURNS, sb.N_STEP_DISCOUNTS, sb.N_STEP_NEXT_OBS, sb.PRIORITIES, sb.VALID} <= set(batch)
    assert sb.REWARDS not in batch  # replay does not need raw rewards: dropped on the worker
    valid = batch[sb.VALID]
    assert (~valid).sum() >= len(batch.episode_returns)  # one autoreset row per ended episode
    # CartPole: reward 1 per step, so a full 3-step window returns 1 + g + g^2 with discount g^3.
    g = hp["gamma"]
    # Windows cut by the fragment's end are shorter: return 1 + g (+ ...) with discount g**m, m < 3.
    full = valid & np.isclose(batch[sb.N_STEP_DISCOUNTS], g**3)
    np.testing.assert_allclose(batch[sb.N_STEP_RETURNS][full], 1 + g + g**2, rtol=1e-6)
    # An episode's final step (terminated) has a one-step window and no bootstrap.
    assert (batch[sb.N_STEP_DISCOUNTS][valid] == 0).sum() >= 1
    flat = batch.flatten()
    assert len(flat[sb.OBS]) == batch.num_env_steps() == valid.sum()
    # Worker priorities are |TD error| under the worker's copy of both networks.
    with torch.no_grad():
        td = ev.policy._td_error({k: torch.as_tensor(v) for k, v in flat.items() if k != sb.PRIORITIES})
    np.testing.assert_allclose(flat[sb.PRIORITIES], np.abs(td.numpy()), rtol=1e-5, atol=1e-6)


def test_sync_replay_local_counts_and_learns_without_ray() -> None:
    hp = {
        **resolved("dqn"),
        "learning_starts": 200,
        "replay_ratio": 2.0,
        "train_batch": 16,
        "rollout_fragment": 10,
        "target_update": 100,
        "steps_per_iteration": 250,
        "prioritized_replay": True,
    }
    evaluators = EvaluatorSet(
        env_spec=CARTPOLE,
        num_envs=1,
        policy_factory=PolicySpec(policy_cls=QPolicy, hyperparams=hp, model=ModelSpec(hidden=(16,))),
        num_remote=0,
        seed=0,
        local_num_envs=2,
    )
    opt = SyncReplayOptimizer(evaluators, hyperparams=hp)
    before = evaluators.local.policy.get_weights()
    first = opt.step()
    second = opt.step()
    sampled = first.env_steps_sampled + second.env_steps_sampled
    assert 500 <= sampled < 520  # whole rounds of 2 envs x 10 steps minus autoreset rows
    assert len(opt.buffer) == sampled
    # Training owed: 2 x (transitions after the round that passed learning_starts), in batches of 16.
    trained = first.env_steps_trained + second.env_steps_trained
    assert trained % 16 == 0 and 2 * (sampled - 220) - 16 <= trained <= 2 * (sampled - 200)
    assert M.VALUE_LOSS in second.values and M.TIME_LEARN_S in second.values
    assert second.values[M.DIAG_EPSILON] < first.values[M.DIAG_EPSILON]
    after = evaluators.local.policy.get_weights()
    assert any(not np.allclose(before[k], after[k]) for k in before)
    # The target network was synced at least once: equal to the online net at that time, not the initial one.
    assert not np.allclose(before["target.0.weight"], after["target.0.weight"])


@pytest.mark.parametrize("double_q", [True, False])
def test_numpy_td_error_for_worker_priorities_matches_the_torch_loss(double_q: bool) -> None:
    policy = make_policy(double_q=double_q)
    with torch.no_grad():
        for p in policy.target.parameters():
            p.mul_(-0.5)  # a target that differs from the online net
    policy._weights_changed()
    rng = np.random.default_rng(0)
    batch = {
        sb.OBS: rng.normal(size=(16, 2)).astype(np.float32),
        sb.ACTIONS: rng.integers(0, 2, 16),
        sb.N_STEP_RETURNS: rng.normal(size=16).astype(np.float32),
        sb.N_STEP_DISCOUNTS: rng.uniform(0, 1, 16).astype(np.float32),
        sb.N_STEP_NEXT_OBS: rng.normal(size=(16, 2)).astype(np.float32),
    }
    expected = policy._td_error({k: torch.as_tensor(v) for k, v in batch.items()}).detach().numpy()
    np.testing.assert_allclose(policy._np_td_error(batch), expected, rtol=1e-5, atol=1e-6)
    with torch.no_grad():
        q = policy.q(torch.as_tensor(batch[sb.OBS])).numpy()
    np.testing.assert_allclose(policy.q_values(batch[sb.OBS]), q, rtol=1e-5, atol=1e-6)
