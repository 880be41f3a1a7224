"""SACPolicy (squashed Gaussian actor, twin critics, Polyak targets, learned temperature) and SAC under the sync
replay optimizer on a real env, no Ray."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch

from crossrl.core import algorithms
from crossrl.core import sample_batch as sb
from crossrl.core.evaluator import EvaluatorSet
from crossrl.core.optimizers.sync_replay import SyncReplayOptimizer
from crossrl.core.policy import PolicySpec
from crossrl.core.sac_policy import ACTOR, LOG_ALPHA, NonFiniteError, SACPolicy, target_entropy
from crossrl.scenarios import metrics as M
from crossrl.scenarios.catalog import HYPERPARAM_DEFAULTS
from crossrl.scenarios.spec import EnvSpec, ModelSpec, Trial

OBS = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
UNIT = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)


def resolved(**hp: Any) -> dict[str, Any]:
    return algorithms.load("sac").hyperparams({**HYPERPARAM_DEFAULTS["sac"], **hp})


def make_policy(action_space: gym.Space = UNIT, seed: int = 0, **hp: Any) -> SACPolicy:
    return SACPolicy(
        observation_space=OBS,
        action_space=action_space,
        hyperparams=resolved(**hp),
        model=ModelSpec(hidden=(16, 16), activation="relu"),
        seed=seed,
    )


def replay_batch(n: int = 32, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        sb.OBS: rng.uniform(-1, 1, (n, 3)).astype(np.float32),
        sb.ACTIONS: rng.uniform(-1, 1, (n, 2)).astype(np.float32),
        sb.N_STEP_RETURNS: rng.standard_normal(n).astype(np.float32),
        sb.N_STEP_DISCOUNTS: np.where(rng.random(n) < 0.1, 0.0, 0.99).astype(np.float32),
        sb.N_STEP_NEXT_OBS: rng.uniform(-1, 1, (n, 3)).astype(np.float32),
    }


def test_log_probability_is_the_squashed_gaussians() -> None:
    """The actor's log pi(a|s) equals torch's Normal pushed through a tanh (the change of variables)."""
    policy = make_policy()
    nets = policy._nets()
    obs = torch.as_tensor(replay_batch()[sb.OBS])
    torch.manual_seed(3)
    unit, logp = nets.sample(obs)
    out = nets.actor(obs)
    mean, log_std = out[:, :2], out[:, 2:].clamp(-5, 2)
    dist = torch.distributions.TransformedDistribution(
        torch.distributions.Normal(mean, log_std.exp()), [torch.distributions.TanhTransform(cache_size=1)]
    )
    clipped = unit.clamp(-1 + 1e-6, 1 - 1e-6)
    assert torch.allclose(logp, dist.log_prob(clipped).sum(dim=1), atol=1e-3)
    assert unit.abs().max() <= 1.0


def test_actions_fill_the_envs_bounds_and_the_mean_action_is_tanh_of_the_mean() -> None:
    space = gym.spaces.Box(np.array([-2.0, 0.0], np.float32), np.array([2.0, 10.0], np.float32))
    policy = make_policy(space)
    obs = replay_batch(64)[sb.OBS]
    explored, _ = policy.compute_actions(obs)
    assert explored.shape == (64, 2) and explored.dtype == np.float32
    assert np.all(explored >= space.low) and np.all(explored <= space.high)
    greedy, _ = policy.compute_actions(obs, explore=False)
    mean = policy._nets().actor(torch.as_tensor(obs))[:, :2].detach().numpy()
    np.testing.assert_allclose(
        greedy, np.array([0.0, 5.0]) + np.array([2.0, 5.0]) * np.tanh(mean), rtol=1e-5, atol=1e-5
    )
    policy.set_epsilon(1.0)  # uniform over the bounds: the spread of a uniform, not of the near-zero initial mean
    uniform, _ = policy.compute_actions(np.zeros((4000, 3), np.float32))
    assert uniform[:, 0].std() == pytest.approx(4 / np.sqrt(12), rel=0.05)
    assert uniform[:, 1].mean() == pytest.approx(5.0, abs=0.2)


def test_one_update_moves_the_targets_by_tau_and_learns_the_temperature() -> None:
    policy = make_policy(tau=0.1)
    nets = policy._nets()
    targets_before = [p.detach().clone() for p in nets.targets.parameters()]
    stats, td = policy.learn_on_replay_batch(replay_batch())
    critics_after = list(nets.critics.parameters())
    for before, target, online in zip(targets_before, nets.targets.parameters(), critics_after, strict=True):
        torch.testing.assert_close(target, 0.9 * before + 0.1 * online.detach())
    assert td.shape == (32,) and np.all(td >= 0)
    for key in (M.VALUE_LOSS, M.POLICY_LOSS, M.ENTROPY, M.DIAG_ALPHA, M.DIAG_Q_MEAN):
        assert np.isfinite(stats[key])
    # A near-uniform initial policy has more entropy than -|A|: the temperature falls
    alpha0 = policy.alpha
    for i in range(20):
        policy.learn_on_replay_batch(replay_batch(seed=i))
    assert policy.alpha < alpha0
    assert policy.updates == 21


def test_target_entropy_auto_is_minus_the_action_dimensions() -> None:
    assert target_entropy("auto", 6) == -6.0
    assert target_entropy(-1.5, 6) == -1.5
    assert make_policy().target_entropy == -2.0


def test_a_sampling_copy_acts_from_the_actors_weights_alone_without_torch() -> None:
    learner, worker = make_policy(seed=0), make_policy(seed=0)
    learner.learn_on_replay_batch(replay_batch())
    acting = learner.acting_weights()
    assert acting and all(k.startswith(ACTOR + ".") for k in acting)
    worker.set_weights(acting)
    obs = replay_batch()[sb.OBS]
    np.testing.assert_allclose(
        worker.compute_actions(obs, explore=False)[0], learner.compute_actions(obs, explore=False)[0], rtol=1e-6
    )
    assert worker._torch is None  # acting never built the torch networks


def test_state_round_trip_restores_weights_optimizers_and_temperature() -> None:
    a = make_policy(seed=0)
    for i in range(3):
        a.learn_on_replay_batch(replay_batch(seed=i))
    b = make_policy(seed=5, actor_lr=1e-2)
    b.set_state(a.get_state())
    for k, v in a.get_weights().items():
        np.testing.assert_array_equal(v, b.get_weights()[k])
    assert b.alpha == pytest.approx(a.alpha) and b.updates == 3
    assert LOG_ALPHA in b.get_weights()
    opt_a, opt_b = a._nets().actor_opt.state_dict(), b._nets().actor_opt.state_dict()
    assert opt_a["state"][0]["step"] == opt_b["state"][0]["step"]
    assert b._nets().actor_opt.param_groups[0]["lr"] == 1e-2  # the restoring policy's own learning rate


def test_non_finite_actions_and_q_values_fail_naming_them() -> None:
    policy = make_policy()
    weights = policy.get_weights()
    bad = {k: (np.full_like(v, np.nan) if k.startswith("q1.") else v) for k, v in weights.items()}
    policy.set_weights(bad)
    with pytest.raises(NonFiniteError, match="Q value is not finite.*Q1 = nan"):
        policy.learn_on_replay_batch(replay_batch())
    policy.set_weights({k: (np.full_like(v, np.inf) if k.startswith("actor.") else v) for k, v in weights.items()})
    with pytest.raises(NonFiniteError, match="mean action is not finite"):
        policy.compute_actions(replay_batch()[sb.OBS])


def test_sac_trials_see_unit_actions_and_the_env_is_rescaled() -> None:
    from crossrl.core.envs import make_env

    trial = Trial.model_validate(
        {
            "scenario": "t",
            "fingerprint": "0",
            "engine": "crossrl",
            "algorithm": "sac",
            "optimizer": "sync_replay",
            "hyperparams": HYPERPARAM_DEFAULTS["sac"],
            "model": ModelSpec(),
            "env": EnvSpec(id="Pendulum-v1"),
            "workers": 1,
            "envs_per_worker": 1,
            "seed": 0,
            "budget": {"env_steps": 100},
        }
    )
    assert trial.env.actions == "unit"
    env = make_env(trial.env)
    try:
        assert np.all(env.action_space.low == -1.0) and np.all(env.action_space.high == 1.0)
        env.reset(seed=0)
        # -1 in the unit space is the env's own low bound (-2 torque): the same affine map on every engine
        assert isinstance(env, gym.wrappers.RescaleAction) or any(
            isinstance(w, gym.wrappers.RescaleAction) for w in _wrappers(env)
        )
    finally:
        env.close()
    ppo = trial.model_copy(update={"algorithm": "ppo", "env": EnvSpec(id="Pendulum-v1")})
    assert make_env(ppo.env).action_space.high[0] == 2.0


def _wrappers(env: gym.Env) -> list[gym.Env]:
    out = []
    while isinstance(env, gym.Wrapper):
        out.append(env)
        env = env.env
    return out


def pendulum_sync_replay() -> SyncReplayOptimizer:
    """SAC under sync_replay on the real Pendulum-v1: a local evaluator of 2 envs, a [16, 16] MLP, learning starting
    at 200 env steps, a point per 100."""
    hp = resolved(train_batch=32, learning_starts=200, steps_per_iteration=100, buffer_size=10_000)
    evaluators = EvaluatorSet(
        env_spec=EnvSpec(id="Pendulum-v1", actions="unit"),
        num_envs=1,
        policy_factory=PolicySpec(policy_cls=SACPolicy, hyperparams=hp, model=ModelSpec(hidden=(16, 16))),
        num_remote=0,
        seed=0,
        local_num_envs=2,
    )
    return SyncReplayOptimizer(evaluators, hyperparams=hp)


def test_sac_learns_pendulum_steps_under_sync_replay_with_random_actions_first() -> None:
    """A short SAC run under sync_replay on the real Pendulum-v1: uniform actions until learning_starts, then one
    update per env step; the counts add up."""
    opt = pendulum_sync_replay()
    first = opt.step()
    assert first.values[M.DIAG_EPSILON] == 1.0 and first.values[M.DIAG_UPDATES] == 0
    for _ in range(3):
        last = opt.step()
    sampled = opt.num_steps_sampled
    assert sampled >= 400
    assert last.values[M.DIAG_EPSILON] == 0.0
    # one update per env step sampled once learning started (rounds of 2 envs x 1 step: 2 updates each)
    assert last.values[M.DIAG_UPDATES] == pytest.approx(sampled - 200, abs=2)
    assert last.values[M.DIAG_REPLAY_SIZE] == sampled
    assert np.isfinite(last.values[M.VALUE_LOSS]) and M.DIAG_ALPHA in last.values
    state = opt.get_state()
    assert state["updates"] == last.values[M.DIAG_UPDATES]


def test_a_state_without_the_buffer_refills_it_with_the_policy_before_training() -> None:
    """``get_state(replay=False)`` (checkpoint.replay_buffer: false) leaves the buffer out; an optimizer restored from
    it starts with an empty buffer, acts with the restored policy (epsilon 0) and makes no update until the buffer
    holds learning_starts transitions again; then one per env step, as before."""
    first = pendulum_sync_replay()
    for _ in range(3):
        first.step()
    kept, dropped = first.get_state(), first.get_state(replay=False)
    assert len(kept["buffer"]) == first.num_steps_sampled and dropped["buffer"] is None
    assert dropped["updates"] == kept["updates"] > 0

    second = pendulum_sync_replay()
    second.set_state(dropped)
    updates = int(dropped["updates"])
    refill = second.step()  # 100 env steps into the empty buffer: no update
    assert refill.values[M.DIAG_REPLAY_SIZE] == 100 and refill.values[M.DIAG_UPDATES] == updates
    assert refill.values[M.DIAG_EPSILON] == 0.0  # the restored policy acts: no uniform warm-up again
    second.step()  # the buffer reaches 200 in this step's last round: that round's 2 env steps train
    after = second.step()
    assert after.values[M.DIAG_REPLAY_SIZE] == 300
    assert after.values[M.DIAG_UPDATES] == updates + 102
    restored = pendulum_sync_replay()
    restored.set_state(kept)  # with the buffer: training goes on at once
    assert restored.step().values[M.DIAG_UPDATES] == updates + 100
