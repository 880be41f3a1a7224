"""Ray RLlib 2.60 (new API stack) as a crossrl engine: PPO, IMPALA, DQN, and IPPO on multi-agent envs.

``adapter.py`` builds the AlgorithmConfig from a trial (hyperparameters mapped name by name), trains, checkpoints
and reloads a policy; ``multi_agent.py`` the multi-agent config and episode statistics; ``results.py`` reading
RLlib's result dicts; ``frames.py`` RLlib's CNN modules for pixel envs. The registry loads the names below.

May import: ``crossrl.scenarios``, ``crossrl.core``, ``crossrl.reports`` and ``crossrl.adapters`` (the layer rule of
``crossrl.adapters``).
"""

from crossrl.adapters.rllib.adapter import RllibAdapter, env_creator, export_policy, load_policy

__all__ = ["RllibAdapter", "env_creator", "export_policy", "load_policy"]
