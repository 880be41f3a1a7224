"""A PPO policy that never learns: the crossrl sampling benchmarks run the real optimizers with it."""

from __future__ import annotations

from typing import Any

from crossrl.core.algorithms.ppo import PPOPolicy


class NoLearnPolicy(PPOPolicy):
    """PPO's policy (random-weights MLP, GAE postprocessing on the worker) whose learning step does nothing.

    Lives in its own importable module so that Ray actors unpickle it by name.
    """

    def learn_on_batch(self, batch: Any) -> dict[str, float]:
        return {}
