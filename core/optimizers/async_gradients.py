"""Asynchronous gradients (A3C): each evaluator samples and computes a gradient on its own batch; the driver
applies each gradient as it arrives (``ray.wait``) and sends fresh weights to that evaluator only.

Every remote always has one ``sample_and_compute_gradients`` call in flight; each gradient covers about
``train_batch`` env steps (``ceil(train_batch / envs)`` per env). One ``step()`` applies gradients until
``iteration_env_steps`` (default 1000) env steps were sampled, so that every reported point averages
over enough episodes to mean something.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import ray
from ray.exceptions import RayActorError

from crossrl.core.evaluator import EvaluatorSet, cancel_in_flight
from crossrl.core.maths import mean_stats
from crossrl.core.optimizers.base import PolicyOptimizer, StepStats
from crossrl.scenarios import metrics as M


class AsyncGradientsOptimizer(PolicyOptimizer):
    name = "async_gradients"

    def __init__(self, evaluators: EvaluatorSet, *, hyperparams: Mapping[str, Any]) -> None:
        super().__init__(evaluators, hyperparams=hyperparams)
        if not evaluators.remotes:
            raise ValueError("async_gradients needs at least one remote evaluator")
        self.fragment = max(1, math.ceil(int(self.hp["train_batch"]) / evaluators.num_envs))
        self.iteration_env_steps = int(self.hp["iteration_env_steps"])
        self._in_flight: dict[ray.ObjectRef, int] = {}
        self._started = False

    def _launch(self, i: int) -> None:
        ref = self.evaluators.remotes[i].sample_and_compute_gradients.remote(num_steps=self.fragment)
        self._in_flight[ref] = i

    def step(self) -> StepStats:
        if not self._started:
            with self.timer(M.TIME_SYNC_WEIGHTS_S):
                self.evaluators.broadcast_weights()
            for i in range(len(self.evaluators.remotes)):
                self._launch(i)
            self._started = True
        stats = StepStats()
        infos: list[dict[str, float]] = []
        while stats.env_steps_sampled < self.iteration_env_steps:
            with self.timer("time_wait_s"):
                ready, _ = ray.wait(list(self._in_flight), num_returns=1)
            i = self._in_flight.pop(ready[0])
            try:
                grads, info, meta = ray.get(ready[0])
            except RayActorError:
                self.evaluators.restart(i)  # its gradient is lost, never counted
                self._launch(i)
                continue
            self.evaluators.delivered(i)
            stats.add_episodes(meta)
            with self.timer(M.TIME_LEARN_S):
                self.evaluators.local.policy.apply_gradients(grads)
            with self.timer(M.TIME_SYNC_WEIGHTS_S):
                self.evaluators.remotes[i].set_weights.remote(ray.put(self.evaluators.local.get_weights()))
            self._launch(i)
            stats.env_steps_trained += meta.num_env_steps()
            infos.append(info)
        stats.values.update(mean_stats(infos))
        # Workers sampled while the driver waited: their own sampling time is the sampling cost.
        stats.values[M.TIME_SAMPLE_S] = float(sum(d.get("worker_time_sample_s", 0.0) for d in infos))
        return self._account(stats)

    def stop(self) -> None:
        cancel_in_flight(self._in_flight)


OPTIMIZER = AsyncGradientsOptimizer
