"""Ape-X DQN (Horgan et al. 2018): the same double-Q, n-step Huber TD loss as DQN
(:class:`~crossrl.core.q_policy.QPolicy`), under distributed prioritized replay (``async_replay``):
per-worker fixed epsilons, priorities computed on the workers, replay shards as actors, a learner
thread. The shared hyperparameters' defaults are in :mod:`crossrl.scenarios.catalog`; the extras below
are crossrl-only settings.
"""

from __future__ import annotations

from crossrl.core.algorithms import AlgorithmDef
from crossrl.core.q_policy import QPolicy

ALGORITHM = AlgorithmDef(
    name="apex",
    policy_cls=QPolicy,
    extra_defaults={
        # env steps sampled per optimizer step() (one reported point)
        "steps_per_iteration": 1000,
        # learner SGD steps between weight publications (the paper: actors refresh every 400 frames)
        "weights_every": 8,
        # the driver holds sampling back while the learner is this many transitions short of replay_ratio
        "max_replay_lag": 2_000,
    },
)
