"""GAE, V-trace and n-step returns: hand-computed cases and cross-checks against TorchRL's functional ones."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torchrl.objectives.value import functional as tf

from crossrl.core import maths


def col(*xs: float) -> np.ndarray:
    """A [T, 1] column."""
    return np.asarray(xs, np.float64)[:, None]


def flags(*xs: int) -> np.ndarray:
    return np.asarray(xs, bool)[:, None]


def test_gae_no_episode_end_bootstraps_last_row() -> None:
    adv, targets = maths.gae(
        rewards=col(1, 1, 1),
        values=col(0, 0, 0),
        next_values=col(0, 0, 5),
        terminated=flags(0, 0, 0),
        truncated=flags(0, 0, 0),
        gamma=0.5,
        lam=1.0,
    )
    np.testing.assert_allclose(adv[:, 0], [2.375, 2.75, 3.5])
    np.testing.assert_allclose(targets, adv)


def test_gae_termination_cuts_the_chain_and_drops_the_bootstrap() -> None:
    adv, _ = maths.gae(
        rewards=col(1, 1, 1),
        values=col(1, 1, 1),
        next_values=col(2, 7, 4),
        terminated=flags(0, 1, 0),
        truncated=flags(0, 0, 0),
        gamma=0.5,
        lam=1.0,
    )
    np.testing.assert_allclose(adv[:, 0], [1.0, 0.0, 2.0])


def test_gae_truncation_bootstraps_from_final_obs_and_skips_autoreset_row() -> None:
    # Row 1 is truncated; row 2 is gymnasium's autoreset step (OBS = final obs, V = 3, reward 0).
    adv, targets = maths.gae(
        rewards=col(1, 1, 0, 1),
        values=col(0, 0, 3, 0),
        next_values=col(0, 3, 0, 2),
        terminated=flags(0, 0, 0, 0),
        truncated=flags(0, 1, 0, 0),
        valid=flags(1, 1, 0, 1),
        gamma=0.5,
        lam=1.0,
    )
    np.testing.assert_allclose(adv[:, 0], [2.25, 2.5, 0.0, 2.0])
    np.testing.assert_allclose(targets[:, 0], [2.25, 2.5, 3.0, 2.0])


def test_gae_lambda_weights_the_tail() -> None:
    adv, _ = maths.gae(
        rewards=col(1, 1),
        values=col(0, 0),
        next_values=col(0, 0),
        terminated=flags(0, 0),
        truncated=flags(0, 0),
        gamma=1.0,
        lam=0.5,
    )
    np.testing.assert_allclose(adv[:, 0], [1.5, 1.0])


def test_discounted_returns_hand_case() -> None:
    ret = maths.discounted_returns(
        rewards=col(1, 1, 0, 1),
        next_values=col(0, 3, 0, 2),
        terminated=flags(0, 0, 0, 0),
        truncated=flags(0, 1, 0, 0),
        valid=flags(1, 1, 0, 1),
        gamma=0.5,
    )
    np.testing.assert_allclose(ret[:, 0], [2.25, 2.5, 0.0, 2.0])


def test_n_step_returns_termination_and_truncation() -> None:
    ret, disc, last = maths.n_step_returns(
        rewards=col(1, 2, 3, 4),
        terminated=flags(0, 0, 1, 0),
        truncated=flags(0, 0, 0, 0),
        valid=flags(1, 1, 1, 0),
        gamma=0.5,
        n=2,
    )
    np.testing.assert_allclose(ret[:, 0], [2.0, 3.5, 3.0, 0.0])
    np.testing.assert_allclose(disc[:, 0], [0.25, 0.0, 0.0, 0.0])
    assert last[:, 0].tolist() == [1, 2, 2, 3]
    ret, disc, last = maths.n_step_returns(
        rewards=col(1, 2, 0, 4),
        terminated=flags(0, 0, 0, 0),
        truncated=flags(0, 1, 0, 0),
        valid=flags(1, 1, 0, 1),
        gamma=0.5,
        n=3,
    )
    np.testing.assert_allclose(ret[:, 0], [2.0, 2.0, 0.0, 4.0])
    np.testing.assert_allclose(disc[:, 0], [0.25, 0.5, 0.0, 0.5])  # truncation still bootstraps
    assert last[:, 0].tolist() == [1, 1, 2, 3]


def test_vtrace_hand_case_off_policy() -> None:
    vs, pg = maths.vtrace(
        behaviour_logp=col(0.0, 0.0),
        target_logp=col(np.log(2.0), np.log(0.5)),
        rewards=col(1, 1),
        values=col(1, 2),
        next_values=col(2, 4),
        terminated=flags(0, 0),
        truncated=flags(0, 0),
        gamma=0.5,
        clip_rho=1.0,
        clip_c=1.0,
    )
    np.testing.assert_allclose(vs[:, 0], [2.25, 2.5])
    np.testing.assert_allclose(pg[:, 0], [1.25, 0.5])


def _random_case(rng: np.random.Generator, T: int = 37, N: int = 5) -> dict[str, np.ndarray]:
    """Random episodes; inside an episode next_values[t] == values[t+1], as a sampler produces them."""
    values = rng.normal(size=(T, N))
    terminated = rng.random((T, N)) < 0.08
    truncated = rng.random((T, N)) < 0.05
    next_values = np.concatenate([values[1:], rng.normal(size=(1, N))])
    cut = terminated | truncated
    next_values[cut] = rng.normal(size=int(cut.sum()))
    return {
        "rewards": rng.normal(size=(T, N)),
        "values": values,
        "next_values": next_values,
        "terminated": terminated,
        "truncated": truncated,
    }


def _torch_tm(x: np.ndarray) -> torch.Tensor:
    """[T, N] numpy -> TorchRL's [N, T, 1] (time_dim=-2)."""
    return torch.as_tensor(x).T.unsqueeze(-1)


def test_gae_matches_torchrl_on_random_arrays() -> None:
    rng = np.random.default_rng(0)
    for _ in range(5):
        c = _random_case(rng)
        adv, targets = maths.gae(**c, gamma=0.97, lam=0.9)
        done = c["terminated"] | c["truncated"]
        t_adv, t_targets = tf.generalized_advantage_estimate(
            0.97,
            0.9,
            _torch_tm(c["values"]),
            _torch_tm(c["next_values"]),
            _torch_tm(c["rewards"]),
            _torch_tm(done),
            _torch_tm(c["terminated"]),
        )
        np.testing.assert_allclose(adv, t_adv[..., 0].T.numpy(), rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(targets, t_targets[..., 0].T.numpy(), rtol=1e-5, atol=1e-5)


def test_vtrace_matches_torchrl_on_random_arrays() -> None:
    rng = np.random.default_rng(1)
    for _ in range(5):
        c = _random_case(rng)
        mu = rng.normal(size=c["rewards"].shape) - 1.0
        pi = mu + rng.normal(scale=0.5, size=mu.shape)
        vs, pg = maths.vtrace(**c, behaviour_logp=mu, target_logp=pi, gamma=0.97, clip_rho=1.0, clip_c=0.9)
        done = c["terminated"] | c["truncated"]
        # TorchRL computes rho = exp(log_pi - log_mu): log_pi is the learner's policy, log_mu the behaviour.
        t_adv, t_vs = tf.vtrace_advantage_estimate(
            0.97,
            _torch_tm(pi),
            _torch_tm(mu),
            _torch_tm(c["values"]),
            _torch_tm(c["next_values"]),
            _torch_tm(c["rewards"]),
            _torch_tm(done),
            _torch_tm(c["terminated"]),
            rho_thresh=1.0,
            c_thresh=0.9,
        )
        np.testing.assert_allclose(vs, t_vs[..., 0].T.numpy(), rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(pg, t_adv[..., 0].T.numpy(), rtol=1e-5, atol=1e-5)


def test_on_policy_vtrace_equals_lambda_one_returns() -> None:
    rng = np.random.default_rng(2)
    c = _random_case(rng)
    done = c["terminated"] | c["truncated"]
    valid = np.concatenate([np.ones((1, done.shape[1]), bool), ~done[:-1]])  # autoreset rows follow ends
    logp = rng.normal(size=valid.shape)
    vs, _ = maths.vtrace(**c, valid=valid, behaviour_logp=logp, target_logp=logp, gamma=0.9)
    _, targets = maths.gae(**c, valid=valid, gamma=0.9, lam=1.0)
    ret = maths.discounted_returns(
        rewards=c["rewards"],
        next_values=c["next_values"],
        terminated=c["terminated"],
        truncated=c["truncated"],
        valid=valid,
        gamma=0.9,
    )
    np.testing.assert_allclose(vs, targets, atol=1e-10)
    np.testing.assert_allclose(ret[valid], targets[valid], atol=1e-10)


def test_shape_errors_name_the_argument() -> None:
    with pytest.raises(ValueError, match=r"next_values has shape \(3,\)"):
        maths.gae(
            rewards=col(1, 1, 1),
            values=col(0, 0, 0),
            next_values=np.zeros(3),
            terminated=flags(0, 0, 0),
            truncated=flags(0, 0, 0),
            gamma=0.5,
            lam=1.0,
        )
    with pytest.raises(ValueError, match="time-major"):
        maths.discounted_returns(
            rewards=np.zeros(3), next_values=np.zeros(3), terminated=np.zeros(3), truncated=np.zeros(3), gamma=1.0
        )
    with pytest.raises(ValueError, match="n=0"):
        maths.n_step_returns(rewards=col(1), terminated=flags(0), truncated=flags(0), gamma=1.0, n=0)


@settings(derandomize=True, max_examples=60, deadline=None)
@given(
    steps=st.integers(1, 300),
    envs=st.integers(1, 5),
    coef=st.floats(0.0, 1.0),
    cut=st.floats(0.0, 0.5),
    seed=st.integers(0, 2**16),
)
def test_the_doubling_scan_sums_what_the_step_by_step_recursion_sums(
    steps: int, envs: int, coef: float, cut: float, seed: int
) -> None:
    """GAE's backward sum ``y[t] = x[t] + c[t] * y[t+1]`` (a scan in log2(T) passes) against the recursion itself,
    with the chain cut at random rows (episode ends) and any coefficient from 0 to 1."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(steps, envs)) * 10
    c = coef * (rng.random((steps, envs)) >= cut)
    want = x.copy()
    for t in range(steps - 2, -1, -1):
        want[t] += c[t] * want[t + 1]
    np.testing.assert_allclose(maths._reverse_discounted_sum(x, c), want, rtol=1e-10, atol=1e-9)
