"""Asynchronous distributed prioritized replay (Ape-X, Horgan et al. 2018), for DQN and, with uniform replay, SAC.

- Replay shards are Ray actors (:class:`ReplayShard`, ``num_replay_shards`` of them, ``buffer_size``
  split evenly), each a :class:`~crossrl.core.replay.PrioritizedReplayBuffer`.
- Each remote evaluator acts with its own fixed epsilon ``0.4 ** (1 + 7 i / (N - 1))``, computes the
  initial priorities of its transitions itself (``QPolicy.postprocess_trajectory``) and pushes them
  straight to a shard: transitions never pass through the driver, only episode statistics do.
- A learner thread on the driver pulls prioritized batches from the shards (one request in flight per
  shard, so sampling overlaps training), trains the driver's policy, sends the new priorities back
  to the shard that served the batch, syncs the target network every ``target_update`` env steps, and
  publishes weights (one ``ray.put``) every ``weights_every`` SGD steps.
- The driver loop (``step()``) keeps one sample task in flight per evaluator; when one returns it
  sends that evaluator the latest weights if it has older ones, then relaunches it.

SAC runs the same way with uniform (unprioritized) shards: its evaluators act uniformly at random until
``learning_starts`` env steps were sampled, then with their copy of the policy (no per-worker epsilons), and its
target critics follow by Polyak averaging inside each update (no ``target_update``).

The learner trains at most ``replay_ratio`` transitions per transition sampled (SAC: ``updates_per_step`` x
``train_batch``; after
``learning_starts``). On a small machine the learner can also fall behind; then the driver holds
new sample tasks back while the learner is more than ``max_replay_lag`` transitions short, so that
sample efficiency does not depend on how the cores happen to be shared (``max_replay_lag: None``
turns the brake off, as in the paper, where the learner runs on its own GPU).
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import numpy as np
import ray
from ray.exceptions import RayActorError

from crossrl.core import sample_batch as sb
from crossrl.core.evaluator import EvaluatorSet, PolicyEvaluator
from crossrl.core.maths import mean_stats
from crossrl.core.optimizers.base import PolicyOptimizer, StepStats
from crossrl.core.optimizers.sync_replay import ReplayPolicy, replay_columns
from crossrl.core.q_policy import QPolicy, apex_epsilons
from crossrl.core.replay import PrioritizedReplayBuffer, ReplayBuffer
from crossrl.core.sac_policy import SACPolicy
from crossrl.core.sample_batch import SampleBatch
from crossrl.scenarios import metrics as M

log = logging.getLogger(__name__)

Replayed = tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]


class ReplayShard:
    """One replay shard, run as a Ray actor (no CPU reserved: it mostly waits): prioritized (``alpha`` given) or
    uniform (``alpha`` None)."""

    def __init__(self, *, capacity: int, alpha: float | None, seed: int) -> None:
        rng = np.random.default_rng(seed)
        self.buffer: ReplayBuffer = (
            ReplayBuffer(capacity, rng=rng)
            if alpha is None
            else PrioritizedReplayBuffer(capacity, alpha=alpha, rng=rng)
        )

    def add(self, columns: dict[str, np.ndarray], priorities: np.ndarray | None) -> int:
        """Store transitions with their worker-computed priorities; returns the shard's size."""
        if isinstance(self.buffer, PrioritizedReplayBuffer):
            self.buffer.add(columns, priorities=priorities)
        else:
            self.buffer.add(columns)
        return len(self.buffer)

    def sample(self, batch_size: int, beta: float) -> Replayed | None:
        """A batch ``(columns, ids, importance weights)``, or None while the shard holds fewer than ``batch_size``; a
        uniform shard's ids are empty and its weights ones."""
        if len(self.buffer) < batch_size:
            return None
        if isinstance(self.buffer, PrioritizedReplayBuffer):
            return self.buffer.sample_prioritized(batch_size, beta=beta)
        return self.buffer.sample(batch_size), np.empty(0, np.int64), np.ones(batch_size, np.float32)

    def update_priorities(self, ids: np.ndarray, priorities: np.ndarray) -> int:
        return self.buffer.update_priorities(ids, priorities)

    def size(self) -> int:
        return len(self.buffer)

    def get_state(self) -> ReplayBuffer:
        return self.buffer

    def set_state(self, buffer: ReplayBuffer) -> None:
        self.buffer = buffer


RemoteReplayShard = ray.remote(num_cpus=0)(ReplayShard)


def sample_into_shard(evaluator: PolicyEvaluator, *, epsilon: float, shard: Any, num_steps: int) -> SampleBatch:
    """Worker side (run through ``PolicyEvaluator.apply``): act with ``epsilon``, push to ``shard``.

    Setting epsilon with every call means a restarted evaluator explores with its own epsilon at once.
    Returns the batch's statistics only (env steps, completed episodes).
    """
    evaluator.set_epsilon(epsilon)
    batch = evaluator.sample(num_steps=num_steps)
    columns, priorities = replay_columns(batch)
    shard.add.remote(columns, priorities)
    return batch.stats_only()


class AsyncReplayOptimizer(PolicyOptimizer):
    """Ape-X's execution over an :class:`EvaluatorSet` with at least one remote evaluator."""

    name = "async_replay"

    def __init__(self, evaluators: EvaluatorSet, *, hyperparams: Mapping[str, Any]) -> None:
        super().__init__(evaluators, hyperparams=hyperparams)
        policy = evaluators.local.policy
        if not isinstance(policy, QPolicy | SACPolicy):
            raise TypeError(f"async_replay trains a QPolicy (dqn, apex) or a SACPolicy, got {type(policy).__name__}")
        if not evaluators.remotes:
            raise ValueError("async_replay needs at least one remote evaluator (workers >= 1)")
        self.policy: ReplayPolicy = policy
        # Ape-X's priorities for a Q-policy (whatever its prioritized_replay says, as always); SAC replays uniformly
        self.prioritized = isinstance(policy, QPolicy)
        n_shards = int(self.hp["num_replay_shards"])
        capacity = max(1, int(self.hp["buffer_size"]) // n_shards)
        alpha = policy.priority_alpha if isinstance(policy, QPolicy) else None
        self.shards: list[Any] = [
            RemoteReplayShard.remote(  # type: ignore[attr-defined]
                capacity=capacity, alpha=alpha, seed=evaluators.seed * 100 + i
            )
            for i in range(n_shards)
        ]
        # Ape-X's fixed per-worker epsilons; SAC's epsilon follows the env steps sampled (exploration_epsilon)
        self.epsilons: list[float] | None = apex_epsilons(len(evaluators.remotes)) if self.prioritized else None

        self.train_batch = int(self.hp["train_batch"])
        self.steps_per_iteration = int(self.hp["steps_per_iteration"])
        self.weights_every = int(self.hp["weights_every"])
        lag = self.hp["max_replay_lag"]
        self.max_replay_lag = None if lag is None else float(lag)
        self._rng = np.random.default_rng([evaluators.seed, 11])

        self._lock = threading.Lock()
        self._policy_lock = threading.Lock()  # the learner thread holds it while it changes the policy
        self._last_target_sync = 0  # env steps sampled at the last target-network sync (the learner thread's)
        self._sgd_steps = 0
        self._stop = threading.Event()
        self._sampled = 0  # env steps sampled (shared with the learner thread)
        # After a resume from a checkpoint without the shards: no training until this env step, and the training
        # the refill's env steps would have owed under replay_ratio, never owed.
        self._refill_until = 0
        self._skipped = 0.0
        self._trained = 0  # env steps trained, written by the learner thread
        self._trained_reported = 0  # env steps trained that step() has reported
        self._learn_stats: list[dict[str, float]] = []
        self._learn_s = 0.0
        self._learner_error: BaseException | None = None
        self._weights_ref = ray.put(self.policy.acting_weights())
        self._weights_version = 1
        self._worker_version = [0] * len(evaluators.remotes)
        self._in_flight: dict[ray.ObjectRef, int] = {}
        # Sampling and the learner start with the first step(): a restored state (set_state) is neither trained on
        # before the trial's clock runs nor joined by transitions sampled with the weights it replaced.
        self._learner = threading.Thread(target=self._learner_loop, name="apex-learner", daemon=True)

    # -- driver: sampling ----------------------------------------------------------------------------
    def _launch(self, i: int) -> None:
        """Bring remote ``i`` up to the latest weights if needed, then start its next sample task."""
        actor = self.evaluators.remotes[i]
        with self.timer(M.TIME_SYNC_WEIGHTS_S):
            with self._lock:
                ref, version = self._weights_ref, self._weights_version
            if self._worker_version[i] < version:
                actor.set_weights.remote(ref, version)
                self._worker_version[i] = version
        if self.epsilons is not None:
            epsilon = self.epsilons[i]
        else:
            with self._lock:
                epsilon = self.policy.exploration_epsilon(self._sampled)
        fn = functools.partial(
            sample_into_shard,
            epsilon=epsilon,
            shard=self.shards[int(self._rng.integers(len(self.shards)))],
            num_steps=int(self.hp["rollout_fragment"]),
        )
        self._in_flight[actor.apply.remote(fn)] = i

    def _learner_behind(self) -> bool:
        if self.max_replay_lag is None:
            return False
        with self._lock:
            owed = self._owed_locked()
        return owed > self.max_replay_lag and self._learner.is_alive()

    def _owed_locked(self) -> float:
        """Transitions the learner may still train on under ``replay_ratio`` (caller holds the lock)."""
        if self._sampled < max(int(self.hp["learning_starts"]), self._refill_until):
            return 0.0
        return self.policy.replay_ratio * self._sampled - self._trained - self._skipped

    def step(self) -> StepStats:
        stats = StepStats()
        idle: list[int] = []
        if not self._learner.is_alive() and self._learner.ident is None:
            self._learner.start()
            idle = list(range(len(self.evaluators.remotes)))  # the first step launches every evaluator
        while stats.env_steps_sampled < self.steps_per_iteration:
            self._raise_learner_error()
            if idle and not self._learner_behind():
                for i in idle:
                    self._launch(i)
                idle = []
            if not self._in_flight:
                time.sleep(0.002)  # every evaluator is held back: let the learner catch up
                continue
            with self.timer(M.TIME_SAMPLE_S):
                ready, _ = ray.wait(list(self._in_flight), num_returns=1, timeout=1.0)
            for ref in ready:
                i = self._in_flight.pop(ref)
                try:
                    batch: SampleBatch = ray.get(ref)
                except RayActorError:
                    self.evaluators.restart(i)
                    self._worker_version[i] = 0
                    idle.append(i)
                    continue
                stats.add_episodes(batch)
                with self._lock:
                    self._sampled += batch.num_env_steps()
                idle.append(i)
        for i in idle:
            self._launch(i)
        with self._lock:
            learn_stats, self._learn_stats = self._learn_stats, []
            # what the learner trained since the last step's report (also while the driver was between steps)
            stats.env_steps_trained = self._trained - self._trained_reported
            self._trained_reported = self._trained
            stats.values[M.DIAG_UPDATES] = float(self._sgd_steps)
            self._timers[M.TIME_LEARN_S] = self._learn_s
            self._learn_s = 0.0
        stats.values.update(mean_stats(learn_stats))
        stats.values["weights_version"] = float(self._weights_version)
        stats.values[M.DIAG_REPLAY_SIZE] = float(sum(self.replay_sizes()))
        return self._account(stats)

    # -- learner thread ------------------------------------------------------------------------------
    def _learner_loop(self) -> None:
        try:
            self._learn_until_stopped()
        except BaseException as e:  # noqa: BLE001 - handed to the driver, which raises it in step()
            log.exception("apex learner thread failed")
            self._learner_error = e

    def _learn_until_stopped(self) -> None:
        beta = self.policy.priority_beta if isinstance(self.policy, QPolicy) else 0.0
        pending: dict[ray.ObjectRef, int] = {}  # replay sample request -> shard index
        while not self._stop.is_set():
            with self._lock:
                may_train = self._owed_locked() >= self.train_batch
            if not may_train:
                time.sleep(0.001)
                continue
            for j, shard in enumerate(self.shards):
                if j not in pending.values():
                    pending[shard.sample.remote(self.train_batch, beta)] = j
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=0.5)
            if not ready:
                continue
            j = pending.pop(ready[0])
            replayed: Replayed | None = ray.get(ready[0])
            if replayed is None:
                time.sleep(0.005)  # this shard is still filling up
                continue
            columns, ids, weights = replayed
            t0 = time.perf_counter()
            with self._policy_lock:
                learn_stats, td = self.policy.learn_on_replay_batch({**columns, sb.WEIGHTS: weights})
                if len(ids):
                    self.shards[j].update_priorities.remote(ids, td)
                with self._lock:
                    sampled = self._sampled
                target_update = self.policy.target_update
                if target_update is not None and sampled - self._last_target_sync >= target_update:
                    self.policy.update_target()
                    self._last_target_sync = sampled
                if (self._sgd_steps + 1) % self.weights_every == 0:
                    ref = ray.put(self.policy.acting_weights())
                    with self._lock:
                        self._weights_ref, self._weights_version = ref, self._weights_version + 1
                with self._lock:  # the update's count and its transitions trained move together
                    self._sgd_steps += 1
                    self._trained += self.train_batch
                    self._learn_stats.append(learn_stats)
                    self._learn_s += time.perf_counter() - t0

    @contextmanager
    def _paused(self) -> Iterator[None]:
        with self._policy_lock:  # the learner thread waits between two SGD steps
            yield

    def _own_state(self, *, replay: bool = True) -> dict[str, Any]:
        """Every replay shard's buffer (transitions and priorities; None when not ``replay``), the sampled count the
        replay ratio reads, the learner's target-sync and SGD-step counters. Sample requests in flight are not part
        of it."""
        with self._lock:
            sampled, trained, skipped = self._sampled, self._trained, self._skipped
        return {
            "shards": ray.get([shard.get_state.remote() for shard in self.shards]) if replay else None,
            "sampled": sampled,
            "trained": trained,
            "skipped": skipped,
            "last_target_sync": self._last_target_sync,
            "sgd_steps": self._sgd_steps,
        }

    def _set_own_state(self, state: Mapping[str, Any]) -> None:
        shards = state["shards"]
        if shards is not None:
            if len(shards) != len(self.shards):
                raise ValueError(f"a checkpoint of {len(shards)} replay shards cannot restore {len(self.shards)}")
            ray.get([shard.set_state.remote(buf) for shard, buf in zip(self.shards, shards, strict=True)])
        self._last_target_sync, self._sgd_steps = int(state["last_target_sync"]), int(state["sgd_steps"])
        ref = ray.put(self.policy.acting_weights())
        with self._lock:
            self._sampled, self._trained = int(state["sampled"]), int(state["trained"])
            self._skipped = float(state.get("skipped", 0.0))
            if shards is None:  # saved without them: the empty shards refill with the restored policy first
                self._refill_until = self._sampled + int(self.hp["learning_starts"])
                self._skipped += self.policy.replay_ratio * int(self.hp["learning_starts"])
            self._trained_reported = self._trained
            self._weights_ref, self._weights_version = ref, self._weights_version + 1

    def _raise_learner_error(self) -> None:
        if self._learner_error is not None:
            raise RuntimeError("the Ape-X learner thread failed") from self._learner_error

    def replay_sizes(self) -> list[int]:
        """Transitions held by each shard (a blocking call; for tests and logs)."""
        return [int(s) for s in ray.get([shard.size.remote() for shard in self.shards])]

    def stop(self) -> None:
        self._stop.set()
        if self._learner.is_alive():
            self._learner.join(timeout=10.0)
        for ref in list(self._in_flight):
            try:
                ray.cancel(ref)
            except Exception:  # noqa: BLE001 - the task may have finished or its actor died
                pass
        self._in_flight.clear()
        for shard in self.shards:
            try:
                ray.kill(shard, no_restart=True)
            except Exception:  # noqa: BLE001 - shutting down anyway
                pass
        self.shards = []


OPTIMIZER = AsyncReplayOptimizer
