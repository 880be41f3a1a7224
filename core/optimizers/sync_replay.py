"""Synchronous replay (DQN, SAC, DreamerV3): evaluators sample, transitions go into a replay buffer on the driver, the
driver's policy trains on replayed batches; DQN's target network is synced every ``target_update`` env steps (SAC's
target critics follow by Polyak averaging inside each update). DreamerV3's world model learns from sequences: its
buffer keeps each env's steps in order and replays windows of them (:mod:`crossrl.core.sequence_replay`); the rest of
the round is the same, which is why DreamerV3 needs no optimizer of its own.

One round: set every evaluator's epsilon (DQN: the linear schedule over global env steps; SAC: 1, a uniformly
random action, until ``learning_starts``, then 0), broadcast weights
if they changed, sample ``rollout_fragment`` steps per env from every evaluator in parallel, add the
valid transitions to the buffer, then train ``replay_ratio x new transitions / train_batch`` batches
(a fractional remainder carries over) once ``learning_starts`` env steps were sampled. ``step()`` runs
rounds until ``steps_per_iteration`` env steps were sampled, so a point is reported per ~1000 env
steps rather than per round.

Hyperparameters: ``train_batch``, ``buffer_size``, ``learning_starts``, ``target_update``,
``rollout_fragment``, ``replay_ratio``, ``prioritized_replay``, ``priority_alpha``, ``priority_beta``,
``epsilon_initial``, ``epsilon_final``, ``epsilon_timesteps``; extra: ``steps_per_iteration``. SAC has no
target_update, epsilons or priorities, and says ``updates_per_step`` for its replay ratio (:data:`ReplayPolicy`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeAlias

import numpy as np

from crossrl.core import sample_batch as sb
from crossrl.core.dreamer_policy import DreamerPolicy
from crossrl.core.evaluator import EvaluatorSet
from crossrl.core.maths import mean_stats
from crossrl.core.optimizers.base import PolicyOptimizer, StepStats
from crossrl.core.q_policy import REPLAY_COLUMNS, QPolicy
from crossrl.core.replay import PrioritizedReplayBuffer, ReplayBuffer
from crossrl.core.sac_policy import SACPolicy
from crossrl.core.sample_batch import SampleBatch
from crossrl.core.sequence_replay import SequenceReplayBuffer
from crossrl.scenarios import metrics as M

ReplayPolicy: TypeAlias = QPolicy | SACPolicy | DreamerPolicy
"""The policies the replay optimizers train. Each says how it is replayed: ``replay_ratio`` (transitions trained per
transition sampled), ``target_update`` (env steps between target syncs, or None), ``prioritized``,
``exploration_epsilon(env_steps)``, and learns with ``learn_on_replay_batch``. DreamerV3 replays sequences: a
:class:`~crossrl.core.sequence_replay.SequenceReplayBuffer` of its ``batch_length_T``, one update per ``B x T``
replayed steps (its ``replay_batch_size``), after ``B x T`` env steps (its ``learning_starts``), sampling fragments of
its ``rollout_fragment(envs)`` steps."""


def replay_columns(batch: SampleBatch) -> tuple[dict[str, np.ndarray], np.ndarray | None]:
    """A postprocessed batch as flat replay columns (valid rows only) and its worker-side priorities, if any."""
    flat = batch.flatten()
    cols = {k: flat[k] for k in REPLAY_COLUMNS}
    return cols, flat.get(sb.PRIORITIES)


class SyncReplayOptimizer(PolicyOptimizer):
    """DQN's, SAC's and DreamerV3's execution: synchronous sampling into a driver-side replay buffer, training on the
    driver."""

    name = "sync_replay"

    def __init__(self, evaluators: EvaluatorSet, *, hyperparams: Mapping[str, Any]) -> None:
        super().__init__(evaluators, hyperparams=hyperparams)
        policy = evaluators.local.policy
        if not isinstance(policy, QPolicy | SACPolicy | DreamerPolicy):
            raise TypeError(
                f"sync_replay trains a QPolicy (dqn, apex), a SACPolicy or a DreamerPolicy, got {type(policy).__name__}"
            )
        self.policy: ReplayPolicy = policy
        rng = np.random.default_rng([evaluators.seed, 7])
        capacity = int(self.hp["buffer_size"])
        self.prioritized = policy.prioritized
        self.buffer: ReplayBuffer | SequenceReplayBuffer
        if isinstance(policy, DreamerPolicy):
            self.buffer = SequenceReplayBuffer(capacity, length=policy.batch_length_T, rng=rng)
        elif isinstance(policy, QPolicy) and policy.prioritized:
            self.buffer = PrioritizedReplayBuffer(capacity, alpha=policy.priority_alpha, rng=rng)
        else:
            self.buffer = ReplayBuffer(capacity, rng=rng)
        self.train_batch = policy.replay_batch_size
        self.fragment = policy.rollout_fragment(evaluators.local.num_envs)
        self.learning_starts = policy.learning_starts
        self.steps_per_iteration = int(self.hp["steps_per_iteration"])
        self._owed = 0.0  # transitions of training owed under replay_ratio, not yet trained
        self._last_target_sync = 0
        self._updates = 0  # gradient updates made
        self._weights_dirty = True
        # After a resume from a checkpoint without the buffer: no update until the buffer holds this many again.
        self._refill = 0

    def epsilon(self, env_steps: int | None = None) -> float:
        """The exploration epsilon after ``env_steps`` env steps sampled (default: so far)."""
        return self.policy.exploration_epsilon(self.num_steps_sampled if env_steps is None else env_steps)

    def step(self) -> StepStats:
        stats = StepStats()
        learn_stats: list[dict[str, float]] = []
        while stats.env_steps_sampled < self.steps_per_iteration:
            learn_stats += self._round(stats)
        stats.values.update(mean_stats(learn_stats))
        stats.values[M.DIAG_EPSILON] = self.epsilon()
        stats.values[M.DIAG_REPLAY_SIZE] = float(len(self.buffer))
        stats.values[M.DIAG_UPDATES] = float(self._updates)
        return self._account(stats)

    def _round(self, stats: StepStats) -> list[dict[str, float]]:
        ev = self.evaluators
        sampled_before = self.num_steps_sampled + stats.env_steps_sampled
        eps = self.epsilon(sampled_before)
        with self.timer(M.TIME_SYNC_WEIGHTS_S):
            if self._weights_dirty and ev.remotes:
                ev.broadcast_weights(with_next_sample=True)
                self._weights_dirty = False
            ev.local.set_epsilon(eps)
        with self.timer(M.TIME_SAMPLE_S):
            # weights and epsilon travel in the sample call itself: one actor call per evaluator per round
            batches = ev.sample(num_steps=self.fragment, epsilon=eps)
        new = 0
        for batch in batches:
            stats.add_episodes(batch)
            if isinstance(self.buffer, SequenceReplayBuffer):
                self.buffer.add_fragment(batch, source=batch.source)
                new += batch.num_env_steps()
                continue
            cols, priorities = replay_columns(batch)
            if isinstance(self.buffer, PrioritizedReplayBuffer):
                self.buffer.add(cols, priorities=priorities)
            else:
                self.buffer.add(cols)
            new += batch.num_env_steps()
        sampled = sampled_before + new
        out: list[dict[str, float]] = []
        if sampled < self.learning_starts or len(self.buffer) < self._refill or not self.buffer.can_sample():
            return out
        self._owed += self.policy.replay_ratio * new
        with self.timer(M.TIME_LEARN_S):
            while self._owed >= self.train_batch:
                out.append(self._learn_once())
                self._updates += 1
                self._owed -= self.train_batch
                stats.env_steps_trained += self.train_batch
                self._weights_dirty = True
            target_update = self.policy.target_update
            if target_update is not None and sampled - self._last_target_sync >= target_update:
                self.policy.update_target()
                self._last_target_sync = sampled
                self._weights_dirty = True
        return out

    def _own_state(self, *, replay: bool = True) -> dict[str, Any]:
        """The replay buffer (its transitions, priorities, insertion count and sampling generator; None when not
        ``replay``), the training owed under ``replay_ratio`` and the env step of the last target-network sync."""
        return {
            "buffer": self.buffer if replay else None,
            "owed": self._owed,
            "last_target_sync": self._last_target_sync,
            "updates": self._updates,
        }

    def _set_own_state(self, state: Mapping[str, Any]) -> None:
        if state["buffer"] is None:  # saved without it: refill an empty one with the restored policy first
            self._refill = min(self.learning_starts, self.buffer.capacity)
        else:
            self.buffer = state["buffer"]
        self._owed, self._last_target_sync = float(state["owed"]), int(state["last_target_sync"])
        self._updates = int(state.get("updates", 0))
        self._weights_dirty = True

    def _learn_once(self) -> dict[str, float]:
        if isinstance(self.buffer, PrioritizedReplayBuffer) and isinstance(self.policy, QPolicy):
            cols, ids, weights = self.buffer.sample_prioritized(self.train_batch, beta=self.policy.priority_beta)
            stats, td = self.policy.learn_on_replay_batch({**cols, sb.WEIGHTS: weights})
            self.buffer.update_priorities(ids, td)
            return stats
        stats, _ = self.policy.learn_on_replay_batch(self.buffer.sample(self.train_batch))
        return stats


OPTIMIZER = SyncReplayOptimizer
