"""Asynchronous sampling (IMPALA): evaluators sample continuously with possibly stale weights; a learner
thread consumes a queue of batches; the loss (V-trace) corrects for the policy lag.

The driver thread keeps each remote sampling ``rollout_fragment`` steps per env at a time (one fragment asked for
on the ``calls`` transport, two on the ``stream``, so that an evaluator samples its next fragment while the last
one travels), moves each finished batch into a bounded queue and asks that remote for the next, with the newest
weights if the learner has updated them (packed once per weight version, see ``EvaluatorSet.payload``).
The policy lag of a fragment is the learner's version when it arrives minus the version it was sampled with.
The learner thread concatenates fragments into ``train_batch`` env steps and learns. One ``step()`` returns once
``max(train_batch, iteration_env_steps)`` env steps were sampled (default 1000); it reports what the
learner did in the meantime.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import numpy as np
import ray

from crossrl.core.evaluator import EvaluatorSet
from crossrl.core.maths import mean_stats
from crossrl.core.optimizers.base import PolicyOptimizer, StepStats
from crossrl.core.sample_batch import SampleBatch, concat
from crossrl.scenarios import metrics as M


class _Learner(threading.Thread):
    def __init__(self, evaluators: EvaluatorSet, *, train_batch: int, max_queue: int) -> None:
        super().__init__(name="crossrl-learner", daemon=True)
        self.evaluators = evaluators
        self.train_batch = train_batch
        self.inqueue: queue.Queue[SampleBatch] = queue.Queue(maxsize=max_queue)
        self.lock = threading.Lock()  # guards the local policy and the counters below
        self.version = 0
        self.steps_trained = 0
        self.time_learn_s = 0.0
        self.stats: list[dict[str, float]] = []
        self.stopped = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        pending: list[SampleBatch] = []
        try:
            while not self.stopped.is_set():
                try:
                    pending.append(self.inqueue.get(timeout=0.1))
                except queue.Empty:
                    continue
                if sum(b.num_env_steps() for b in pending) < self.train_batch:
                    continue
                # Fragments of one T concatenate along the env axis and stay time-major for V-trace.
                batch = concat(pending)
                pending = []
                t0 = time.perf_counter()
                with self.lock:
                    info = self.evaluators.local.learn_on_batch(batch)
                    self.version += 1
                    self.steps_trained += batch.num_env_steps()
                    self.time_learn_s += time.perf_counter() - t0
                    self.stats.append(info)
        except BaseException as e:  # noqa: BLE001 - surfaced by the driver thread in step()
            self.error = e

    def take(self) -> tuple[int, float, list[dict[str, float]]]:
        with self.lock:
            out = (self.steps_trained, self.time_learn_s, self.stats)
            self.steps_trained, self.time_learn_s, self.stats = 0, 0.0, []
        return out


class AsyncSamplesOptimizer(PolicyOptimizer):
    name = "async_samples"

    def __init__(self, evaluators: EvaluatorSet, *, hyperparams: Mapping[str, Any]) -> None:
        super().__init__(evaluators, hyperparams=hyperparams)
        if not evaluators.remotes:
            raise ValueError("async_samples needs at least one remote evaluator")
        self.fragment = int(self.hp["rollout_fragment"])
        self.train_batch = int(self.hp["train_batch"])
        # One step() reports over at least this many sampled env steps (enough episodes per point).
        self.iteration_env_steps = max(self.train_batch, int(self.hp["iteration_env_steps"]))
        self.learner = _Learner(
            evaluators,
            train_batch=self.train_batch,
            max_queue=int(self.hp["queue_per_worker"]) * len(evaluators.remotes),
        )
        # fragments each remote has been asked for ahead: one Ray call returns one; the stream keeps two
        self.ahead = 2 if evaluators.transport == "stream" else 1
        self._worker_version = [-1] * len(evaluators.remotes)
        self._weights: tuple[int, ray.ObjectRef | bytes] | None = None
        self._started = False

    @contextmanager
    def _paused(self) -> Iterator[None]:
        with self.learner.lock:  # between two learner updates; fragments queued for it are not part of the state
            yield

    def _own_state(self, *, replay: bool = True) -> dict[str, Any]:  # noqa: ARG002 - no replay here
        return {"version": self.learner.version}

    def _set_own_state(self, state: Mapping[str, Any]) -> None:
        self.learner.version = int(state["version"])
        self._weights = None  # the restored weights go out with the next requests

    def _weights_ref(self) -> tuple[int, ray.ObjectRef | bytes]:
        """The newest weights, packed once per learner update: inline bytes when small, else one ``ray.put``."""
        with self.learner.lock:
            version = self.learner.version
            if self._weights is None or self._weights[0] != version:
                weights = self.evaluators.local.get_weights()
                self._weights = (version, self.evaluators.payload(weights))
        return self._weights

    def _launch(self, i: int, credits: int = 1) -> None:
        with self.timer(M.TIME_SYNC_WEIGHTS_S):
            version, ref = self._weights_ref()
        if self._worker_version[i] != version:  # new weights travel with the request
            self.evaluators.launch(i, self.fragment, weights=ref, version=version, credits=credits)
            self._worker_version[i] = version
        else:
            self.evaluators.launch(i, self.fragment, credits=credits)

    def step(self) -> StepStats:
        if not self._started:
            self.learner.start()
            for i in range(len(self.evaluators.remotes)):
                self._launch(i, credits=self.ahead)
            self._started = True
        stats = StepStats()
        lags = []
        while stats.env_steps_sampled < self.iteration_env_steps:
            if self.learner.error is not None:
                raise RuntimeError("learner thread failed") from self.learner.error
            with self.timer(M.TIME_SAMPLE_S):
                ready = self.evaluators.ready()
            # Relaunch first: on calls a worker idles from the end of its sample until its next call starts, so
            # the driver's bookkeeping and a full learner queue must not sit in between.
            for i, batch in ready:
                if batch is None:  # its actor died: restarted, the batch is lost and never counted
                    self.evaluators.restart(i)
                    self._worker_version[i] = -1
                    self._launch(i, credits=self.ahead)
                    continue
                if batch.weights_version is not None:
                    lags.append(self.learner.version - batch.weights_version)
                self._launch(i)
            for _, batch in ready:
                if batch is not None:
                    stats.add_episodes(batch)
                    with self.timer("time_enqueue_s"):
                        self._enqueue(batch)
        trained, learn_s, infos = self.learner.take()
        stats.env_steps_trained = trained
        stats.values[M.TIME_LEARN_S] = learn_s
        stats.values.update(mean_stats(infos))
        stats.values[M.DIAG_POLICY_LAG] = float(np.mean(lags)) if lags else 0.0
        return self._account(stats)

    def _enqueue(self, batch: SampleBatch) -> None:
        """Blocks while the learner is behind (back-pressure), but not on a learner that died."""
        while True:
            if self.learner.error is not None:
                raise RuntimeError("learner thread failed") from self.learner.error
            try:
                self.learner.inqueue.put(batch, timeout=1.0)
                return
            except queue.Full:
                continue

    def stop(self) -> None:
        self.learner.stopped.set()
        if self.learner.is_alive():
            self.learner.join(timeout=10)
        self.evaluators.cancel()


OPTIMIZER = AsyncSamplesOptimizer
