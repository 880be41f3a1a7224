"""Local (in-process) evaluator and policy: autoreset handling, episode stats, numpy inference, batches."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from crossrl.core import sample_batch as sb
from crossrl.core.algorithms import load
from crossrl.core.evaluator import PolicyEvaluator, pack_weights, unpack_batch
from crossrl.core.policy import PolicySpec
from crossrl.core.sample_batch import SampleBatch, concat
from crossrl.scenarios.catalog import HYPERPARAM_DEFAULTS
from crossrl.scenarios.spec import EnvSpec, ModelSpec


def evaluator(
    env_id: str = "CartPole-v1", num_envs: int = 2, algorithm: str = "ppo", activation: str = "tanh", **kwargs: object
) -> PolicyEvaluator:
    alg = load(algorithm)
    return PolicyEvaluator(
        env_spec=EnvSpec(id=env_id, kwargs=dict(kwargs)),
        num_envs=num_envs,
        policy_factory=PolicySpec(
            policy_cls=alg.policy_cls,
            hyperparams=alg.hyperparams(HYPERPARAM_DEFAULTS[algorithm]),
            model=ModelSpec(hidden=(16, 16), activation=activation),  # type: ignore[arg-type]
        ),
        seed=3,
        worker_index=0,
    )


def test_autoreset_rows_are_not_transitions_and_truncation_bootstraps_from_final_obs() -> None:
    ev = evaluator(max_episode_steps=5)  # random CartPole never falls within 5 steps: all truncated
    batch = ev.sample(num_steps=12)
    assert batch.time_major and batch[sb.OBS].shape == (12, 2, 4)
    valid = batch[sb.VALID][:, 0]
    assert valid.tolist() == [True] * 5 + [False] + [True] * 5 + [False]
    assert batch[sb.TRUNCATEDS][:, 0].tolist() == [False] * 4 + [True] + [False] * 5 + [True, False]
    assert not batch[sb.TERMINATEDS].any()
    assert batch.num_env_steps() == 20
    assert batch.episode_lengths == [5, 5, 5, 5] and batch.episode_returns == [5.0] * 4
    # The autoreset row holds the final obs; its value is what the truncated row bootstraps on.
    np.testing.assert_allclose(batch[sb.VF_PREDS][5], ev.policy.value(batch[sb.OBS][5]), rtol=1e-6)  # type: ignore[attr-defined]
    assert sb.NEXT_OBS not in batch  # GAE was its only use: not shipped to the learner
    raw = evaluator("CartPole-v1", algorithm="impala", max_episode_steps=5).sample(num_steps=12)  # keeps NEXT_OBS
    np.testing.assert_array_equal(raw[sb.OBS][5], raw[sb.NEXT_OBS][4])
    # Truncated row: advantage = r + gamma * V(final obs) - V(obs); GAE stops there.
    gamma = ev.policy.hp["gamma"]
    v, vn = batch[sb.VF_PREDS][4], batch[sb.VF_PREDS][5]
    np.testing.assert_allclose(batch[sb.ADVANTAGES][4], 1.0 + gamma * vn - v, rtol=1e-5)
    np.testing.assert_array_equal(batch[sb.ADVANTAGES][~batch[sb.VALID]], 0.0)
    flat = batch.flatten()
    assert len(flat[sb.OBS]) == 20 and flat[sb.VALID].all()
    # The next call continues the episodes: row 11 was the reset, so row 0 is a transition again.
    nxt = ev.sample(num_steps=3)
    assert nxt[sb.VALID].all() and nxt.episode_lengths == []


def test_latency_envs_reuse_one_obs_buffer_and_the_batch_still_holds_every_step() -> None:
    """Latency envs come from SerialVectorEnv: each step overwrites one obs buffer in place."""
    ev = PolicyEvaluator(
        env_spec=EnvSpec(id="CartPole-v1", step_latency_ms=0.01),
        num_envs=2,
        policy_factory=PolicySpec(
            policy_cls=load("impala").policy_cls,
            hyperparams=load("impala").hyperparams(HYPERPARAM_DEFAULTS["impala"]),
            model=ModelSpec(hidden=(16, 16)),
        ),
        seed=3,
        worker_index=0,
    )
    first = ev.sample(num_steps=6)
    second = ev.sample(num_steps=6)
    obs = np.concatenate([first[sb.OBS], second[sb.OBS]])
    assert len({row.tobytes() for row in obs}) == len(obs)  # no row aliased to a later step's obs
    np.testing.assert_array_equal(first[sb.OBS][1:], first[sb.NEXT_OBS][:-1])
    np.testing.assert_array_equal(first[sb.NEXT_OBS][-1], second[sb.OBS][0])


def test_continuous_actions_are_clipped_for_the_env_but_stored_raw() -> None:
    ev = evaluator("Pendulum-v1", num_envs=3)
    batch = ev.sample(num_steps=20)
    assert batch[sb.ACTIONS].shape == (20, 3, 1)
    assert batch[sb.ADVANTAGES].shape == (20, 3)
    assert (batch[sb.REWARDS] <= 0).all()
    logp, _, values = ev.policy.evaluate(  # type: ignore[attr-defined]
        torch.as_tensor(batch[sb.OBS]), torch.as_tensor(batch[sb.ACTIONS])
    )
    np.testing.assert_allclose(logp.detach().numpy(), batch[sb.LOGP], rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(values.detach().numpy(), batch[sb.VF_PREDS], rtol=1e-4, atol=1e-5)


def test_a_discrete_fragment_stores_the_logp_and_values_torch_computes_for_it() -> None:
    """The fragment actor acts feature-major on the evaluator's own observation rows: what it stores (OBS, LOGP of
    the chosen actions, VF_PREDS) is what the torch networks give for the same observations and actions."""
    ev = evaluator("CartPole-v1", num_envs=3)
    batch = ev.sample(num_steps=20)
    assert batch[sb.OBS].shape == (20, 3, 4) and batch[sb.OBS].flags.c_contiguous
    logp, _, values = ev.policy.evaluate(  # type: ignore[attr-defined]
        torch.as_tensor(batch[sb.OBS]), torch.as_tensor(batch[sb.ACTIONS])
    )
    np.testing.assert_allclose(logp.detach().numpy(), batch[sb.LOGP], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(values.detach().numpy(), batch[sb.VF_PREDS], rtol=1e-5, atol=1e-6)


def test_numpy_inference_matches_torch_and_gumbel_sampling_matches_softmax() -> None:
    ev = evaluator()
    pol = ev.policy
    obs = np.random.default_rng(0).normal(size=(4096, 4)).astype(np.float32)
    obs[:] = obs[0]  # one state, many draws
    actions, extra = pol.compute_actions(obs)
    logp, _, values = pol.evaluate(torch.as_tensor(obs), torch.as_tensor(actions))  # type: ignore[attr-defined]
    np.testing.assert_allclose(extra[sb.LOGP], logp.detach().numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(extra[sb.VF_PREDS], values.detach().numpy(), rtol=1e-5, atol=1e-6)
    p1 = float(np.exp(logp.detach().numpy()[actions == 1][0])) if (actions == 1).any() else 0.0
    assert abs((actions == 1).mean() - p1) < 0.03
    # Weights set from elsewhere change the numpy path too (its cache is dropped).
    w = pol.get_weights()
    w = {k: v * 0 for k, v in w.items()}
    pol.set_weights(w)
    _, extra = pol.compute_actions(obs[:2])
    np.testing.assert_allclose(extra[sb.VF_PREDS], 0.0)
    np.testing.assert_allclose(extra[sb.LOGP], np.log(0.5), rtol=1e-6)


def test_gradients_computed_elsewhere_apply_like_local_sgd() -> None:
    a, b = evaluator(algorithm="a2c"), evaluator(algorithm="a2c")
    b.set_weights(a.get_weights())
    batch = a.sample(num_steps=16)
    grads, stats = b.compute_gradients(batch)
    assert {"policy_loss", "value_loss", "entropy"} <= set(stats)
    a.policy.apply_gradients(grads)
    b.learn_on_batch(batch)  # one full-batch SGD step with the same optimizer settings
    for k, v in a.get_weights().items():
        np.testing.assert_allclose(v, b.get_weights()[k], rtol=1e-5, atol=1e-6)


def test_sample_batch_concat_pickle_and_minibatches() -> None:
    import pickle

    ev = evaluator()
    b1, b2 = ev.sample(num_steps=8), ev.sample(num_steps=8)
    both = concat([b1, b2])
    assert both[sb.OBS].shape == (8, 4, 4)  # time-major: along the env axis
    assert both.num_env_steps() == b1.num_env_steps() + b2.num_env_steps()
    copy = pickle.loads(pickle.dumps(both))
    assert isinstance(copy, SampleBatch) and copy.time_major and copy.episode_returns == both.episode_returns
    rows = sum(len(mb[sb.OBS]) for mb in both.minibatches(size=5, rng=np.random.default_rng(0)))
    assert rows == both.num_env_steps()
    stats = both.stats_only()
    assert not stats and stats.num_env_steps() == both.num_env_steps()
    with pytest.raises(ValueError, match="columns differ"):
        concat([b1, SampleBatch({sb.OBS: b1[sb.OBS]}, time_major=True)])


def test_policy_rejects_unsupported_spaces() -> None:
    alg = load("ppo")
    with pytest.raises(TypeError, match="Discrete and Box"):
        alg.policy_cls(
            observation_space=gym.spaces.Box(-1, 1, (3,)),
            action_space=gym.spaces.MultiBinary(2),
            hyperparams=alg.hyperparams(HYPERPARAM_DEFAULTS["ppo"]),
            model=ModelSpec(),
            seed=0,
        )


@pytest.mark.parametrize("activation", ["tanh", "relu"])
def test_fragment_columns_match_the_torch_policy_for_discrete_actions(activation: str) -> None:
    ev = evaluator(num_envs=3, activation=activation)
    batch = ev.sample(num_steps=40)
    logp, _, values = ev.policy.evaluate(  # type: ignore[attr-defined]
        torch.as_tensor(batch[sb.OBS]), torch.as_tensor(batch[sb.ACTIONS])
    )
    np.testing.assert_allclose(logp.detach().numpy(), batch[sb.LOGP], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(values.detach().numpy(), batch[sb.VF_PREDS], rtol=1e-4, atol=1e-5)


def test_weights_travel_with_the_sample_call_and_are_set_once_per_version() -> None:
    ev, src = evaluator(), evaluator()
    w = src.get_weights()
    # Version 0 (async_samples' first learner version) is set too: a fresh evaluator has none yet.
    first = {k: v + 0.5 for k, v in w.items()}
    ev.sample(num_steps=2, weights=first, version=0)
    assert ev.weights_version == 0
    np.testing.assert_array_equal(ev.get_weights()["pi.0.weight"], first["pi.0.weight"])
    w["pi.0.bias"] = w["pi.0.bias"] + 1.0
    ev.sample(num_steps=2, weights=w, version=7)
    assert ev.weights_version == 7
    np.testing.assert_array_equal(ev.get_weights()["pi.0.bias"], w["pi.0.bias"])
    stale = {k: v * 0 for k, v in w.items()}
    ev.sample(num_steps=2, weights=stale, version=7)  # same version: already set, not set again
    np.testing.assert_array_equal(ev.get_weights()["pi.0.bias"], w["pi.0.bias"])
    ev.sample(num_steps=2, weights=stale, version=8)
    assert not ev.get_weights()["pi.0.bias"].any()
    ev.sample(num_steps=2, weights=pack_weights(w), version=9)  # packed once for many remotes
    assert ev.weights_version == 9
    np.testing.assert_array_equal(ev.get_weights()["pi.0.bias"], w["pi.0.bias"])


def test_the_packed_sample_remotes_return_is_the_same_batch_as_sample() -> None:
    """``sample_packed`` (what remote callers use: positional arguments, one pickle back) returns exactly
    what ``sample`` does, episode stats and weights version included; ``unpack_batch`` rejects other payloads."""
    a, b = evaluator(), evaluator()  # same seed: same env and policy streams
    w = {k: v + 0.25 for k, v in a.get_weights().items()}
    for kwargs in ({}, {"weights": pack_weights(w), "version": 4}):
        want = a.sample(num_steps=40, **kwargs)  # type: ignore[arg-type]
        got = unpack_batch(b.sample_packed(40, *kwargs.values()))
        assert isinstance(got, SampleBatch) and got.keys() == want.keys() and got.time_major
        for k in want:
            np.testing.assert_array_equal(got[k], want[k], err_msg=k)
            assert got[k].dtype == want[k].dtype
        assert (got.episode_returns, got.episode_lengths) == (want.episode_returns, want.episode_lengths)
        assert b.weights_version == a.weights_version
    assert b.weights_version == 4
    q = evaluator(algorithm="dqn")
    q.sample_packed(3, None, None, 0.0)  # epsilon travels fourth, with no weights
    assert q.policy.epsilon == 0.0
    with pytest.raises(TypeError, match="SampleBatch"):
        unpack_batch(pack_weights(w))


SAMPLING_ONLY = """
import sys
import numpy as np
from crossrl.core.algorithms import load
from crossrl.scenarios.catalog import HYPERPARAM_DEFAULTS
from crossrl.core.evaluator import PolicyEvaluator
from crossrl.core.policy import PolicySpec
from crossrl.scenarios.spec import EnvSpec, ModelSpec

alg = load("ppo")
spec = PolicySpec(policy_cls=alg.policy_cls, hyperparams=alg.hyperparams(HYPERPARAM_DEFAULTS["ppo"]), model=ModelSpec())
ev = PolicyEvaluator(env_spec=EnvSpec(id="CartPole-v1"), num_envs=2, policy_factory=spec, seed=0, worker_index=1)
weights = {k: np.asarray(v) for k, v in WEIGHTS.items()}
batch = ev.sample(num_steps=50, weights=weights, version=1)
assert batch.num_env_steps() > 0
print("torch" in sys.modules)
"""


def test_a_sampling_only_evaluator_never_imports_torch() -> None:
    """Evaluator actors that only sample keep numpy weights: torch's ~220 MiB of RSS is not paid there."""
    import subprocess
    import sys

    weights = {k: v.tolist() for k, v in evaluator().get_weights().items()}
    code = f"WEIGHTS = {weights!r}\n" + SAMPLING_ONLY
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.strip() == "False", out.stderr


@pytest.mark.parametrize(("env_id", "hidden"), [("CartPole-v1", (16, 16)), ("Pendulum-v1", (8, 12, 8))])
def test_a_sampling_copy_takes_new_weights_in_place_and_acts_like_a_fresh_copy(
    env_id: str, hidden: tuple[int, ...]
) -> None:
    """Sampling-only policies (torch never built) write new weights into their numpy nets in place."""
    alg = load("ppo")
    env = gym.make(env_id)

    def policy(seed: int):  # noqa: ANN202
        return alg.policy_cls(
            observation_space=env.observation_space, action_space=env.action_space,
            hyperparams=alg.hyperparams(HYPERPARAM_DEFAULTS["ppo"]), model=ModelSpec(hidden=hidden), seed=seed,
        )  # fmt: skip

    rng = np.random.default_rng(0)
    w1 = policy(1).get_weights()
    w2 = {k: (v + rng.normal(size=v.shape)).astype(np.float32) for k, v in w1.items()}  # every entry moves
    obs = rng.normal(size=(5, *env.observation_space.shape)).astype(np.float32)
    sampler = policy(2)
    sampler.set_weights(w1)
    net = sampler._numpy_net()  # built from w1
    v1 = sampler.value(obs)
    sampler.set_weights(w2)
    assert sampler._numpy_net() is net and sampler._torch is None  # refreshed in place, torch never imported
    fresh = policy(2)
    fresh.set_weights(w2)
    np.testing.assert_array_equal(sampler.value(obs), fresh.value(obs))
    assert not np.allclose(sampler.value(obs), v1)
    a1, x1 = sampler.compute_actions(obs, explore=False)
    a2, x2 = fresh.compute_actions(obs, explore=False)
    np.testing.assert_array_equal(a1, a2)
    np.testing.assert_array_equal(x1[sb.LOGP], x2[sb.LOGP])
    acts = [p.fragment_actor(num_steps=2, num_envs=5) for p in (sampler, fresh)]
    for t in range(2):
        np.testing.assert_array_equal(acts[0](obs, t), acts[1](obs, t))
    for k, col in acts[0].columns().items():
        np.testing.assert_array_equal(col, acts[1].columns()[k], err_msg=k)
    # and against torch, which learns with these weights
    learner = policy(3)
    learner.set_weights(w2)
    _, _, values = learner.evaluate(torch.as_tensor(obs), torch.as_tensor(a1))  # type: ignore[attr-defined]
    np.testing.assert_allclose(sampler.value(obs), values.detach().numpy(), rtol=1e-5, atol=1e-5)


def test_a_learning_policys_weights_are_its_current_parameters_and_a_copy() -> None:
    """get_weights reads the torch parameters through cached views: after set_weights and after a learning step it
    returns the new values, and what it returns is the caller's own (changing it changes nothing)."""
    alg = load("ppo")
    ev = PolicyEvaluator(
        env_spec=EnvSpec(id="CartPole-v1"),
        num_envs=2,
        policy_factory=PolicySpec(
            policy_cls=alg.policy_cls, hyperparams=alg.hyperparams(HYPERPARAM_DEFAULTS["ppo"]), model=ModelSpec()
        ),
        seed=3,
        worker_index=0,
    )
    policy = ev.policy
    policy.net  # noqa: B018 - torch built: the learning copy
    w1 = policy.get_weights()
    w2 = {k: v + 1.0 for k, v in w1.items()}
    policy.set_weights(w2)
    got = policy.get_weights()
    for k in w2:
        np.testing.assert_array_equal(got[k], w2[k])
    got["pi.0.weight"][:] = 0.0  # the caller's copy
    np.testing.assert_array_equal(policy.get_weights()["pi.0.weight"], w2["pi.0.weight"])
    policy.learn_on_batch(ev.sample(64))
    after = policy.get_weights()
    state = {k: v.detach().numpy() for k, v in policy.net.state_dict().items()}
    assert any(not np.array_equal(after[k], w2[k]) for k in w2)  # it learned
    for k in state:
        np.testing.assert_array_equal(after[k], state[k])
