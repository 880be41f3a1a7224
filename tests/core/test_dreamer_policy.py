"""crossrl's DreamerV3: its maths against known answers, the sequence replay's entries, the recurrent actor's resets,
one update's losses, the state a checkpoint restores, and learning on a fixed batch."""

from __future__ import annotations

from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

from crossrl.core import sample_batch as sb
from crossrl.core.algorithms import load
from crossrl.core.dreamer_policy import (
    BINS,
    DREAMER_SIZES,
    DreamerPolicy,
    bins,
    kl_categorical,
    lambda_returns,
    percentile_range,
    symexp,
    symlog,
    two_hot,
    two_hot_mean,
)
from crossrl.core.sequence_replay import IS_FIRST, IS_TERMINAL, PREV_ACTIONS, SequenceReplayBuffer
from crossrl.scenarios.catalog import HYPERPARAM_DEFAULTS
from crossrl.scenarios.spec import ModelSpec

TINY = {"batch_size_B": 4, "batch_length_T": 8, "horizon_H": 5, "training_ratio": 32.0}


def make_policy(action_space: gym.Space | None = None, seed: int = 0, **hp: object) -> DreamerPolicy:
    merged = load("dreamer").hyperparams({**HYPERPARAM_DEFAULTS["dreamer"], **TINY, **hp})
    return DreamerPolicy(
        observation_space=gym.spaces.Box(-5.0, 5.0, (3,), np.float32),
        action_space=action_space or gym.spaces.Discrete(2),
        hyperparams=merged,
        model=ModelSpec(),
        seed=seed,
    )


# -- maths -------------------------------------------------------------------------------------------------------
def test_symlog_and_symexp_are_inverse_and_odd() -> None:
    x = torch.tensor([-1000.0, -3.0, -0.5, 0.0, 0.5, 3.0, 1000.0])
    assert torch.allclose(symexp(symlog(x)), x, rtol=1e-5)
    assert torch.allclose(symlog(torch.tensor([np.e - 1.0])), torch.tensor([1.0]))
    assert torch.equal(symlog(-x), -symlog(x))


def test_two_hot_puts_a_value_on_its_two_nearest_bins() -> None:
    edges = bins()
    assert len(edges) == BINS and float(edges[0]) == -20.0 and float(edges[-1]) == 20.0
    step = float(edges[1] - edges[0])
    on_bin = two_hot(edges[100:101], edges)
    assert float(on_bin[0, 100]) == pytest.approx(1.0) and float(on_bin.sum()) == pytest.approx(1.0)
    quarter = two_hot(torch.tensor([float(edges[100]) + 0.25 * step]), edges)[0]
    assert float(quarter[100]) == pytest.approx(0.75, abs=1e-4) and float(quarter[101]) == pytest.approx(0.25, abs=1e-4)
    y = torch.tensor([-3.3, 0.0, 0.7, 12.25, 50.0])  # 50 is past the last bin: clipped to 20
    weights = two_hot(y, edges)
    assert torch.allclose(weights.sum(-1), torch.ones(5))
    assert torch.allclose((weights * edges).sum(-1), y.clamp(-20, 20), atol=1e-4)
    # a head whose logits put (almost) all mass on one bin predicts that bin's symexp
    logits = torch.full((BINS,), -1e4)
    logits[140] = 0.0
    assert float(two_hot_mean(logits, edges)) == pytest.approx(float(symexp(edges[140])), rel=1e-4)


def test_lambda_returns_match_a_hand_computed_case() -> None:
    rewards = torch.tensor([[1.0], [2.0]])  # r_1, r_2
    continues = torch.tensor([[1.0], [0.0]])  # the episode ends at step 2
    values = torch.tensor([[0.0], [3.0], [5.0]])  # v_0, v_1, v_2
    out = lambda_returns(rewards, continues, values, gamma=0.5, lam=0.5)
    # R_1 = r_2 + 0.5 * 0 * (...) = 2; R_0 = r_1 + 0.5 * 1 * (0.5 * v_1 + 0.5 * R_1) = 1 + 0.5 * 2.5
    assert out[:, 0].tolist() == pytest.approx([2.25, 2.0])
    # lambda 0: one-step TD targets; lambda 1: the discounted return bootstrapped from v_H
    td = lambda_returns(rewards, torch.ones(2, 1), values, gamma=0.5, lam=0.0)
    assert td[:, 0].tolist() == pytest.approx([1 + 0.5 * 3, 2 + 0.5 * 5])
    mc = lambda_returns(rewards, torch.ones(2, 1), values, gamma=0.5, lam=1.0)
    assert mc[:, 0].tolist() == pytest.approx([1 + 0.5 * 2 + 0.25 * 5, 2 + 0.5 * 5])


def test_the_kl_of_the_latents_is_zero_for_equal_ones_and_positive_otherwise() -> None:
    a = torch.randn(6, 4, 4)
    assert torch.allclose(kl_categorical(a, a), torch.zeros(6), atol=1e-6)
    assert (kl_categorical(a, torch.randn(6, 4, 4)) > 0).all()
    # with 1 % uniform mixed in, even opposite one-hot logits give a bounded KL
    sharp = torch.full((1, 1, 4), -1e4)
    sharp[..., 0] = 1e4
    other = sharp.roll(1, -1)
    assert 0 < float(kl_categorical(sharp, other)) < np.log(4 / 0.01) + 1e-3


def test_the_percentile_range_is_the_5th_to_the_95th() -> None:
    x = torch.arange(101, dtype=torch.float32)
    assert percentile_range(x) == pytest.approx(90.0)


def test_the_sizes_are_the_papers_and_rllibs() -> None:
    assert DREAMER_SIZES["XS"].units == 256 and DREAMER_SIZES["XS"].gru_units == 256
    assert (DREAMER_SIZES["S"].layers, DREAMER_SIZES["XL"].gru_units) == (2, 4096)
    assert DREAMER_SIZES["nano"] == DREAMER_SIZES["nano"].__class__(16, 16, 4, 4, 1)


# -- sequence replay ---------------------------------------------------------------------------------------------
def fragment(rows: list[tuple[float, int, float, bool, bool, bool]], next_last: float) -> dict[str, np.ndarray]:
    """One env's time-major fragment from (obs, action, reward, terminated, truncated, valid) rows."""
    obs = np.array([[[r[0]]] for r in rows], np.float32)
    return {
        sb.OBS: obs,
        sb.NEXT_OBS: np.concatenate([obs[1:], [[[next_last]]]]),
        sb.ACTIONS: np.array([[r[1]] for r in rows]),
        sb.REWARDS: np.array([[r[2]] for r in rows], np.float32),
        sb.TERMINATEDS: np.array([[r[3]] for r in rows]),
        sb.TRUNCATEDS: np.array([[r[4]] for r in rows]),
        sb.VALID: np.array([[r[5]] for r in rows]),
    }


def test_fragments_become_entries_with_firsts_and_terminals() -> None:
    buf = SequenceReplayBuffer(100, length=2, rng=np.random.default_rng(0))
    # obs 0 -> 1 -> 2 (terminal), an autoreset row, then a new episode 10 -> 11 -> 12, truncated at 12
    first = fragment([(0, 1, 0.5, False, False, True), (1, 0, 1.5, True, False, True), (2, 1, 0.0, False, False, False),
                      (10, 1, 2.5, False, False, True)], next_last=11)  # fmt: skip
    assert buf.add_fragment(first, source=(1, 7)) == 3
    second = fragment([(11, 0, 3.5, False, True, True)], next_last=12)
    assert buf.add_fragment(second, source=(1, 7)) == 1
    (stream,) = buf.streams.values()
    got = stream.window(0, len(stream))
    assert got[sb.OBS][:, 0].tolist() == [0, 1, 2, 10, 11, 12]
    assert got[IS_FIRST].tolist() == [True, False, False, True, False, False]
    assert got[IS_TERMINAL].tolist() == [False, False, True, False, False, False]  # truncation is not terminal
    assert got[sb.REWARDS].tolist() == [0.0, 0.5, 1.5, 0.0, 2.5, 3.5]
    assert got[PREV_ACTIONS][[1, 2, 4, 5]].tolist() == [1, 0, 1, 0]
    assert stream.expect_first  # the truncated episode ended: the next row starts one
    # another source is another stream, which starts with an episode's first observation
    buf.add_fragment(fragment([(20, 1, 1.0, False, False, True)], next_last=21), source=(2, 8))
    assert len(buf.streams) == 2 and len(buf) == 8 and buf.num_added == 5


def test_windows_are_consecutive_entries_and_capacity_keeps_the_newest() -> None:
    buf = SequenceReplayBuffer(40, length=5, rng=np.random.default_rng(1))
    assert not buf.can_sample()
    rows = [(float(t), 0, float(t), False, False, True) for t in range(30)]
    buf.add_fragment(fragment(rows, next_last=30), source=(1, 1))
    assert buf.can_sample() and len(buf) == 31
    out = buf.sample(20)  # 20 steps: 4 windows of 5
    assert out[sb.OBS].shape == (4, 5, 1)
    assert np.all(np.diff(out[sb.OBS][..., 0], axis=1) == 1)
    buf.add_fragment(fragment([(30.0 + t, 0, 0.0, False, False, True) for t in range(30)], next_last=60), source=(1, 1))
    (stream,) = buf.streams.values()
    kept = stream.window(0, len(stream))[sb.OBS][:, 0]
    assert len(kept) == 40 and kept[-1] == 60 and kept[0] == 21
    restored = pickle_roundtrip(buf)
    assert restored.sample(10)[sb.OBS].shape == (2, 5, 1) and len(restored) == 40


def pickle_roundtrip(obj: object) -> SequenceReplayBuffer:
    import pickle

    out = pickle.loads(pickle.dumps(obj))
    assert isinstance(out, SequenceReplayBuffer)
    return out


# -- acting ------------------------------------------------------------------------------------------------------
def test_the_recurrent_state_resets_after_the_autoreset_step_of_an_ended_episode() -> None:
    policy = make_policy()
    actor = policy.fragment_actor(num_steps=3, num_envs=2)
    obs = np.ones((2, 3), np.float32)
    actor(obs, 0)
    state = policy.acting_state(2)
    assert float(state.h.abs().sum()) > 0
    actor.ended(np.array([True, False]))  # env 0's episode ended at step 0
    actor(obs, 1)  # the autoreset step: its action is ignored, after it env 0 starts afresh
    assert float(state.h[0].abs().sum()) == 0 and float(state.prev_action[0].abs().sum()) == 0
    assert float(state.h[1].abs().sum()) > 0
    actions = actor(obs, 2)
    assert actions.shape == (2,) and set(actions.tolist()) <= {0, 1}
    assert actor.columns()[sb.ACTIONS].shape == (3, 2)
    # the state carries over into the next fragment's actor
    assert policy.fragment_actor(num_steps=1, num_envs=2).state is state


def test_continuous_actions_stay_in_the_envs_bounds() -> None:
    policy = make_policy(gym.spaces.Box(-2.0, 2.0, (2,), np.float32))
    actions, _ = policy.compute_actions(np.zeros((64, 3), np.float32))
    assert actions.shape == (64, 2) and np.all(np.abs(actions) <= 2.0) and actions.std() > 0.1
    unit = policy.unit_actions(np.array([[-2.0, 2.0], [1.0, 0.0]], np.float32))
    assert unit.tolist() == [[-1.0, 1.0], [0.5, 0.0]]


# -- learning ----------------------------------------------------------------------------------------------------
def replay_batch(policy: DreamerPolicy, seed: int = 0) -> dict[str, np.ndarray]:
    """B x T entries of a fixed, learnable toy: the observation counts up, the reward is the action taken."""
    rng = np.random.default_rng(seed)
    b, length = policy.batch_size_B, policy.batch_length_T
    t = np.arange(length, dtype=np.float32)
    actions = rng.integers(0, 2, (b, length))
    return {
        sb.OBS: np.stack([np.stack([t, -t, np.ones_like(t)], -1)] * b) / length,
        PREV_ACTIONS: actions,
        sb.REWARDS: actions.astype(np.float32),
        IS_FIRST: np.zeros((b, length), bool),
        IS_TERMINAL: np.zeros((b, length), bool),
    }


def test_an_update_reports_every_loss_and_learns_the_fixed_batch() -> None:
    policy = make_policy(world_model_lr=3e-3)  # ten times the paper's, so that 60 updates show it
    batch = replay_batch(policy)
    first, _ = policy.learn_on_replay_batch(batch)
    for name in ("diag.world_model_loss", "policy_loss", "value_loss", "entropy", "diag.kl", "diag.reward_loss"):
        assert np.isfinite(first[name]), name
    for _ in range(60):
        last, _ = policy.learn_on_replay_batch(batch)
    assert policy.updates == 61
    assert last["diag.decoder_loss"] < 0.5 * first["diag.decoder_loss"]
    assert last["diag.reward_loss"] < first["diag.reward_loss"]


def test_continuous_actions_learn_by_backpropagating_the_returns() -> None:
    policy = make_policy(gym.spaces.Box(-1.0, 1.0, (1,), np.float32))
    batch = replay_batch(policy)
    batch[PREV_ACTIONS] = batch[PREV_ACTIONS][..., None] * 2.0 - 1.0
    before = {k: v.copy() for k, v in policy.get_weights().items() if k.startswith("actor.")}
    stats, _ = policy.learn_on_replay_batch(batch)
    after = policy.get_weights()
    assert stats["diag.actor_grad_norm"] > 0
    assert any(not np.array_equal(v, after[k]) for k, v in before.items())


def test_the_state_restores_every_network_optimizer_and_counter() -> None:
    a, b = make_policy(seed=1), make_policy(seed=2)
    batch = replay_batch(a)
    for _ in range(3):
        a.learn_on_replay_batch(batch)
    b.set_state(a.get_state())
    assert b.updates == 3 and b.return_scale == a.return_scale
    for k, v in a.get_weights().items():
        np.testing.assert_array_equal(v, b.get_weights()[k], err_msg=k)
    state = a.get_state()
    stats_a, _ = a.learn_on_replay_batch(batch)
    b.set_state(state)  # the same torch random state too: the same next update
    stats_b, _ = b.learn_on_replay_batch(batch)
    assert stats_a == pytest.approx(stats_b, rel=1e-4, abs=1e-6)


def test_acting_weights_are_what_acting_needs() -> None:
    policy = make_policy()
    parts = {k.split(".", 1)[0] for k in policy.acting_weights()}
    assert parts == {"encoder", "img_in", "gru", "posterior", "actor"}
    fresh = make_policy(seed=5)
    fresh.get_weights()  # its networks built (which seeds torch) before the draws below
    fresh.set_weights(policy.acting_weights())
    obs = np.ones((4, 3), np.float32)
    torch.manual_seed(0)
    x, _ = policy.compute_actions(obs, explore=False)
    torch.manual_seed(0)
    y, _ = fresh.compute_actions(obs, explore=False)
    assert x.tolist() == y.tolist()


def test_it_refuses_what_it_cannot_run() -> None:
    with pytest.raises(TypeError, match="Discrete or Box"):
        make_policy(gym.spaces.MultiDiscrete([2, 3]))
    with pytest.raises(TypeError, match="bounded"):
        make_policy(gym.spaces.Box(-np.inf, np.inf, (1,), np.float32))


# -- a reloaded policy (crossrl evaluate) ------------------------------------------------------------------------
def test_a_reloaded_dreamer_policy_acts_and_starts_each_episode_afresh(tmp_path: Path) -> None:
    import pickle

    from crossrl.adapters.crossrl import STATE_FILE, export_policy, load_policy
    from crossrl.scenarios.spec import ScenarioSpec

    spec = ScenarioSpec.model_validate(
        {
            "name": "d",
            "env": {"id": "CartPole-v1"},
            "algorithm": {"name": "dreamer", "hyperparams": TINY},
            "engines": ["crossrl"],
            "budget": {"env_steps": 100},
        }  # fmt: skip
    )
    trial = spec.trials()[0]
    trained = DreamerPolicy(
        observation_space=gym.spaces.Box(-np.inf, np.inf, (4,), np.float32),
        action_space=gym.spaces.Discrete(2),
        hyperparams=load("dreamer").hyperparams(trial.hyperparams),
        model=ModelSpec(),
        seed=1,
    )
    (tmp_path / STATE_FILE).write_bytes(pickle.dumps({"policy": trained.get_state()}))
    act = load_policy(trial, tmp_path, greedy=True)
    obs = np.zeros(4, np.float32)
    first = [int(act(obs)) for _ in range(3)]
    assert set(first) <= {0, 1}
    state = act.policy.acting_state(1)  # type: ignore[attr-defined]
    assert float(state.h.abs().sum()) > 0
    act.reset()  # type: ignore[attr-defined]
    assert float(act.policy.acting_state(1).h.abs().sum()) == 0  # type: ignore[attr-defined]
    np.testing.assert_array_equal(act.policy.get_weights()["actor.0.weight"], trained.get_weights()["actor.0.weight"])  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="recurrent state"):
        export_policy(trial, tmp_path)
