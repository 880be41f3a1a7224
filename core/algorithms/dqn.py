"""DQN (Mnih et al. 2015) with double-Q targets (van Hasselt et al. 2016) and optional n-step returns
and prioritized replay: the loss is :class:`~crossrl.core.q_policy.QPolicy`'s Huber TD loss, the
default optimizer ``sync_replay`` (a driver-side replay buffer). The shared hyperparameters' defaults
are in :mod:`crossrl.scenarios.catalog`; crossrl-only settings are
its ``CROSSRL_SETTINGS``.
"""

from __future__ import annotations

from crossrl.core.algorithms import AlgorithmDef
from crossrl.core.q_policy import QPolicy

ALGORITHM = AlgorithmDef(name="dqn", policy_cls=QPolicy)
