"""Synchronous sampling (PPO, A2C): broadcast weights, gather one batch from every evaluator, learn on the driver.

Each step samples ``ceil(train_batch / (remotes x envs))`` env steps per env from every remote at once
(one round trip, like RLlib's ``rollout_fragment_length="auto"``), then runs the policy's
``learn_on_batch`` (its epochs and minibatches) on the driver's local policy.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from crossrl.core.evaluator import EvaluatorSet
from crossrl.core.optimizers.base import PolicyOptimizer, StepStats
from crossrl.core.sample_batch import concat
from crossrl.scenarios import metrics as M


class SyncSamplesOptimizer(PolicyOptimizer):
    name = "sync_samples"

    def __init__(self, evaluators: EvaluatorSet, *, hyperparams: Mapping[str, Any]) -> None:
        super().__init__(evaluators, hyperparams=hyperparams)
        envs = max(1, len(evaluators.remotes)) * evaluators.num_envs
        self.fragment = max(1, math.ceil(int(self.hp["train_batch"]) / envs))

    def step(self) -> StepStats:
        stats = StepStats()
        with self.timer(M.TIME_SYNC_WEIGHTS_S):
            self.evaluators.broadcast_weights(with_next_sample=True)  # the ref travels in the sample call
        with self.timer(M.TIME_SAMPLE_S):
            batches = self.evaluators.sample(num_steps=self.fragment)
        for b in batches:
            stats.add_episodes(b)
        lags = [self.evaluators.weights_version - b.weights_version for b in batches if b.weights_version is not None]
        if lags:  # 0 on every transport: each fragment is sampled with the weights sent for it
            stats.values[M.DIAG_POLICY_LAG] = float(sum(lags) / len(lags))
        if batches:
            batch = concat(batches)
            with self.timer(M.TIME_LEARN_S):
                stats.values.update(self.evaluators.local.learn_on_batch(batch))
            stats.env_steps_trained = batch.num_env_steps()
        return self._account(stats)


OPTIMIZER = SyncSamplesOptimizer
