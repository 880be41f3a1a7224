"""A3C (Mnih et al. 2016): A2C's loss under asynchronous gradients (workers compute, the driver applies).

The maths is :class:`~crossrl.core.algorithms.a2c.A2CPolicy` unchanged; only the optimizer differs,
which is the RLlib paper's point. ``train_batch`` is the env steps behind each worker's gradient.
"""

from __future__ import annotations

from crossrl.core.algorithms import AlgorithmDef
from crossrl.core.algorithms.a2c import A2CPolicy

ALGORITHM = AlgorithmDef(name="a3c", policy_cls=A2CPolicy)
