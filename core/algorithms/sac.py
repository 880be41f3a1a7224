"""SAC (Haarnoja et al. 2018): soft actor-critic with twin Q critics, Polyak-averaged targets and a learned entropy
temperature (:class:`~crossrl.core.sac_policy.SACPolicy`), under synchronous replay (``sync_replay``, the default:
one learner on the driver, N evaluators) or Ape-X-style asynchronous replay (``async_replay``: replay shards as
actors, a learner thread; uniform sampling). The shared hyperparameters' defaults are in
:mod:`crossrl.scenarios.catalog`; crossrl-only settings are its ``CROSSRL_SETTINGS``.
"""

from __future__ import annotations

from crossrl.core.algorithms import AlgorithmDef
from crossrl.core.sac_policy import SACPolicy

ALGORITHM = AlgorithmDef(name="sac", policy_cls=SACPolicy)
