"""Ape-X DQN (Horgan et al. 2018): the same double-Q, n-step Huber TD loss as DQN
(:class:`~crossrl.core.q_policy.QPolicy`), under distributed prioritized replay (``async_replay``):
per-worker fixed epsilons, priorities computed on the workers, replay shards as actors, a learner
thread. The shared hyperparameters' defaults are in :mod:`crossrl.scenarios.catalog`; crossrl-only
settings are its ``CROSSRL_SETTINGS``.
"""

from __future__ import annotations

from crossrl.core.algorithms import AlgorithmDef
from crossrl.core.q_policy import QPolicy

ALGORITHM = AlgorithmDef(name="apex", policy_cls=QPolicy)
