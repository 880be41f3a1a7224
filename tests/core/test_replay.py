"""Replay buffers, the sum tree and n-step returns against hand-computed cases and plain loops."""

from __future__ import annotations

import numpy as np
import pytest

from crossrl.core.maths import n_step_returns
from crossrl.core.replay import PrioritizedReplayBuffer, ReplayBuffer, SumTree


def test_sum_tree_sums_and_prefix_search() -> None:
    tree = SumTree(4)
    tree.update(np.array([0, 1, 2, 3]), np.array([1.0, 2.0, 3.0, 4.0]))
    assert tree.total == 10.0
    assert tree.min == 1.0
    # Leaf i covers [sum(v[:i]), sum(v[:i+1])): [0,1) [1,3) [3,6) [6,10).
    found = tree.find_prefix(np.array([0.0, 0.99, 1.0, 2.5, 3.0, 5.9, 6.0, 9.99]))
    np.testing.assert_array_equal(found, [0, 0, 1, 1, 2, 2, 3, 3])
    tree.update(np.array([1]), np.array([0.5]))
    assert tree.total == 8.5
    assert tree.min == 0.5


def test_sum_tree_non_power_of_two_skips_empty_and_zero_leaves() -> None:
    tree = SumTree(5)  # 8 leaves inside, 3 never set
    tree.update(np.array([0, 2, 4]), np.array([1.0, 0.0, 2.0]))
    assert tree.total == 3.0
    assert tree.min == 0.0
    found = tree.find_prefix(np.array([0.5, 1.0, 2.99, 3.0, 100.0]))
    # A mass at or past the total (rounding) lands on the last non-zero leaf, never on an empty one.
    np.testing.assert_array_equal(found, [0, 4, 4, 4, 4])


def test_sum_tree_repeated_index_last_value_wins() -> None:
    tree = SumTree(3)
    tree.update(np.array([1, 1]), np.array([5.0, 2.0]))
    assert tree.total == 2.0


def test_sum_tree_rejects_bad_input() -> None:
    tree = SumTree(3)
    with pytest.raises(IndexError):
        tree.update(np.array([3]), np.array([1.0]))
    with pytest.raises(ValueError, match=">= 0"):
        tree.update(np.array([0]), np.array([-1.0]))


def test_uniform_buffer_wraps_around_and_samples_only_stored_rows() -> None:
    buf = ReplayBuffer(3, rng=np.random.default_rng(0))
    slots = buf.add({"x": np.array([0, 1]), "y": np.zeros((2, 2), dtype=np.float32)})
    np.testing.assert_array_equal(slots, [0, 1])
    assert len(buf) == 2
    assert set(buf.sample(100)["x"].tolist()) == {0, 1}
    slots = buf.add({"x": np.array([2, 3, 4]), "y": np.ones((3, 2), dtype=np.float32)})
    np.testing.assert_array_equal(slots, [2, 0, 1])
    assert len(buf) == 3 and buf.num_added == 5
    out = buf.sample(300)
    assert set(out["x"].tolist()) == {2, 3, 4}
    assert out["y"].shape == (300, 2) and out["y"].dtype == np.float32


@pytest.mark.parametrize("prioritized", [False, True])
def test_a_pickled_buffer_holds_its_filled_rows_only_and_comes_back_whole(prioritized: bool) -> None:
    """A checkpoint writes what was added, not the capacity allocated at the first add; unpickled, the buffer has its
    capacity again, the same rows, and draws the same samples (its generator is part of it)."""
    import pickle

    def make() -> ReplayBuffer:
        rng = np.random.default_rng(3)
        return PrioritizedReplayBuffer(100_000, alpha=0.6, rng=rng) if prioritized else ReplayBuffer(100_000, rng=rng)

    buf, empty = make(), make()
    buf.add({"obs": np.arange(2000, dtype=np.float32).reshape(1000, 2), "rew": np.ones(1000, np.float32)})
    blob = pickle.dumps(buf)
    # 1,000 rows of 12 bytes over an empty buffer (a prioritized one's sum tree is sized by its capacity)
    assert len(blob) < 20_000 + len(pickle.dumps(empty))
    back = pickle.loads(blob)
    assert len(back) == 1000 and back.capacity == 100_000 and back._columns["obs"].shape == (100_000, 2)
    for k in buf._columns:
        assert np.array_equal(back._columns[k], buf._columns[k])
    assert np.array_equal(back.sample(64)["obs"], buf.sample(64)["obs"])
    back.add({"obs": np.zeros((5, 2), np.float32), "rew": np.zeros(5, np.float32)})  # and goes on filling
    assert len(back) == 1005


def test_uniform_buffer_batch_larger_than_capacity_keeps_newest() -> None:
    buf = ReplayBuffer(2, rng=np.random.default_rng(0))
    buf.add({"x": np.arange(5)})
    assert set(buf.sample(50)["x"].tolist()) == {3, 4}
    assert buf.num_added == 5


def test_uniform_buffer_rejects_mismatched_columns() -> None:
    buf = ReplayBuffer(4, rng=np.random.default_rng(0))
    with pytest.raises(ValueError, match="differ in length"):
        buf.add({"x": np.zeros(2), "y": np.zeros(3)})
    buf.add({"x": np.zeros(2)})
    with pytest.raises(ValueError, match="differ from"):
        buf.add({"z": np.zeros(2)})


def test_prioritized_sampling_proportions() -> None:
    buf = PrioritizedReplayBuffer(4, alpha=1.0, eps=0.0, rng=np.random.default_rng(1))
    buf.add({"x": np.arange(4)}, priorities=np.array([1.0, 2.0, 3.0, 4.0]))
    counts = np.zeros(4)
    draws = 0
    for _ in range(500):
        cols, _, _ = buf.sample_prioritized(40, beta=0.4)
        counts += np.bincount(cols["x"], minlength=4)
        draws += 40
    freq = counts / draws
    # Stratified sampling has lower variance than i.i.d.; 20k draws puts 4 s.e. well under 0.015.
    np.testing.assert_allclose(freq, [0.1, 0.2, 0.3, 0.4], atol=0.015)


def test_prioritized_alpha_shapes_priorities() -> None:
    buf = PrioritizedReplayBuffer(2, alpha=0.5, eps=0.0, rng=np.random.default_rng(0))
    buf.add({"x": np.arange(2)}, priorities=np.array([1.0, 9.0]))
    # p**0.5 = [1, 3] -> probabilities [0.25, 0.75]
    np.testing.assert_allclose(buf.probabilities(np.array([0, 1])), [0.25, 0.75])


def test_importance_weights_hand_computed() -> None:
    buf = PrioritizedReplayBuffer(4, alpha=1.0, eps=0.0, rng=np.random.default_rng(0))
    buf.add({"x": np.arange(4)}, priorities=np.array([1.0, 2.0, 3.0, 4.0]))
    cols, ids, weights = buf.sample_prioritized(200, beta=1.0)
    # P = [.1 .2 .3 .4], N = 4: (N P)^-1 = [2.5 1.25 .833 .625], / max 2.5 -> [1 .5 .333 .25]
    expected = np.array([1.0, 0.5, 1 / 3, 0.25])[cols["x"]]
    np.testing.assert_allclose(weights, expected, rtol=1e-6)
    np.testing.assert_array_equal(ids, cols["x"])  # ids are insertion counters: 0..3 here
    _, _, w0 = buf.sample_prioritized(50, beta=0.0)
    np.testing.assert_array_equal(w0, np.ones(50, dtype=np.float32))


def test_new_transitions_get_max_priority() -> None:
    buf = PrioritizedReplayBuffer(4, alpha=1.0, eps=0.0, rng=np.random.default_rng(0))
    buf.add({"x": np.arange(2)}, priorities=np.array([1.0, 5.0]))
    buf.add({"x": np.arange(2, 4)})
    np.testing.assert_allclose(buf.probabilities(np.arange(4)), np.array([1, 5, 5, 5]) / 16)


def test_priority_update_and_stale_ids_after_wraparound() -> None:
    buf = PrioritizedReplayBuffer(3, alpha=1.0, eps=0.0, rng=np.random.default_rng(0))
    buf.add({"x": np.arange(3)}, priorities=np.ones(3))
    _, ids, _ = buf.sample_prioritized(30, beta=0.4)
    assert set(ids.tolist()) == {0, 1, 2}
    # Two new transitions overwrite slots 0 and 1 (ids 3 and 4) before the learner's update arrives.
    buf.add({"x": np.array([3, 4])}, priorities=np.ones(2))
    applied = buf.update_priorities(np.array([0, 1, 2]), np.array([7.0, 7.0, 7.0]))
    assert applied == 1  # only id 2 still lives
    np.testing.assert_allclose(buf.probabilities(np.arange(3)), np.array([1, 1, 7]) / 9)
    cols, ids, _ = buf.sample_prioritized(60, beta=0.4)
    # Ids after wraparound: slot 0 holds id 3 (x=3), slot 1 id 4, slot 2 id 2.
    np.testing.assert_array_equal(ids % 3, np.array([{3: 0, 4: 1, 2: 2}[int(v)] for v in cols["x"]]))
    np.testing.assert_array_equal(ids, cols["x"])


def _n_step_loop(
    rewards: np.ndarray, term: np.ndarray, trunc: np.ndarray, valid: np.ndarray, gamma: float, n: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    horizon, envs = rewards.shape
    ret = np.zeros((horizon, envs))
    last = np.tile(np.arange(horizon)[:, None], (1, envs))
    disc = np.zeros((horizon, envs))
    for j in range(envs):
        for t in range(horizon):
            if not valid[t, j]:
                continue
            g, s = 0.0, t
            for k in range(n):
                s = t + k
                g += gamma**k * rewards[s, j]
                if term[s, j] or trunc[s, j] or s == horizon - 1:
                    break
            ret[t, j], last[t, j] = g, s
            disc[t, j] = 0.0 if term[s, j] else gamma ** (s - t + 1)
    return ret, last, disc


def test_n_step_hand_computed_terminated_and_autoreset_step() -> None:
    r = np.ones((5, 1))
    term = np.array([[0], [0], [1], [0], [0]], dtype=bool)
    trunc = np.zeros((5, 1), dtype=bool)
    valid = np.array([[1], [1], [1], [0], [1]], dtype=bool)  # step 3: gymnasium's reset step
    ret, disc, last = n_step_returns(rewards=r, terminated=term, truncated=trunc, valid=valid, gamma=0.5, n=3)
    np.testing.assert_allclose(ret[:, 0], [1.75, 1.5, 1.0, 0.0, 1.0])
    np.testing.assert_array_equal(last[[0, 1, 2, 4], 0], [2, 2, 2, 4])
    # Terminated at step 2: no bootstrap; step 4 ends the fragment: bootstrap with gamma**1.
    np.testing.assert_allclose(disc[:, 0], [0.0, 0.0, 0.0, 0.0, 0.5])


def test_n_step_hand_computed_truncated_bootstraps() -> None:
    r = np.array([[1.0], [2.0], [4.0], [0.0]])
    trunc = np.array([[0], [0], [1], [0]], dtype=bool)
    ret, disc, last = n_step_returns(
        rewards=r,
        terminated=np.zeros((4, 1), dtype=bool),
        truncated=trunc,
        valid=np.array([[1], [1], [1], [0]], dtype=bool),
        gamma=0.5,
        n=2,
    )
    np.testing.assert_allclose(ret[:3, 0], [1 + 1.0, 2 + 2.0, 4.0])
    np.testing.assert_array_equal(last[:3, 0], [1, 2, 2])
    np.testing.assert_allclose(disc[:3, 0], [0.25, 0.25, 0.5])


@pytest.mark.parametrize("n", [1, 3, 5])
def test_n_step_matches_plain_loop(n: int) -> None:
    rng = np.random.default_rng(n)
    horizon, envs = 40, 3
    rewards = rng.normal(size=(horizon, envs))
    ends = rng.random((horizon, envs)) < 0.15
    kind = rng.random((horizon, envs)) < 0.5
    term, trunc = ends & kind, ends & ~kind
    valid = np.ones((horizon, envs), dtype=bool)
    valid[1:] = ~ends[:-1]  # the step after an episode end is gymnasium's reset step
    term &= valid
    trunc &= valid
    ret, disc, last = n_step_returns(rewards=rewards, terminated=term, truncated=trunc, valid=valid, gamma=0.9, n=n)
    ref_ret, ref_last, ref_disc = _n_step_loop(rewards, term, trunc, valid, 0.9, n)
    np.testing.assert_allclose(ret, ref_ret)
    np.testing.assert_array_equal(last[valid], ref_last[valid])
    np.testing.assert_allclose(disc, ref_disc)
