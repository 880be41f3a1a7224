"""TorchRL 0.14 as a crossrl engine: its envs, collectors, losses and value estimators.

``adapter.py`` the single-agent engine (envs, collectors, the training loop, checkpoints, reloading a policy);
``algorithms.py`` the learners (PPO, A2C, A3C, IMPALA's V-trace, DQN, SAC: losses, estimators, replay);
``multi_agent.py`` independent PPO and A2C on PettingZoo envs. The registry loads the names below.

May import: ``crossrl.scenarios``, ``crossrl.core``, ``crossrl.reports`` and ``crossrl.adapters`` (the layer rule of
``crossrl.adapters``).
"""

from crossrl.adapters.torchrl.adapter import TorchrlAdapter, export_policy, load_policy
from crossrl.adapters.torchrl.multi_agent import TorchrlMultiAgentAdapter

__all__ = ["TorchrlAdapter", "TorchrlMultiAgentAdapter", "export_policy", "load_policy"]
