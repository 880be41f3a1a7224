"""DreamerV3 (Hafner et al. 2023): a recurrent world model learned from replayed sequences, an actor and a critic
learned in its imagination (:class:`~crossrl.core.dreamer_policy.DreamerPolicy`), under synchronous replay
(``sync_replay`` with a sequence buffer: :mod:`crossrl.core.sequence_replay`). The shared hyperparameters' defaults
are in :mod:`crossrl.scenarios.catalog`; crossrl-only settings (Adam's epsilons, gradient clips, moving-average
decays) are its ``CROSSRL_SETTINGS``.
"""

from __future__ import annotations

from crossrl.core.algorithms import AlgorithmDef
from crossrl.core.dreamer_policy import DreamerPolicy

ALGORITHM = AlgorithmDef(name="dreamer", policy_cls=DreamerPolicy)
