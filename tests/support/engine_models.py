"""Each engine's networks for a trial, built as the engines build them (parameter-count checks across engines)."""

from __future__ import annotations

from typing import Any

from torch import nn

from crossrl.adapters.rllib import adapter as R
from crossrl.adapters.torchrl.adapter import learner_dims
from crossrl.adapters.torchrl.algorithms import build_learner
from crossrl.core import algorithms
from crossrl.core.envs import make_env
from crossrl.scenarios.spec import Trial


def crossrl_nets(trial: Trial) -> tuple[Any, list[nn.Module]]:
    env = make_env(trial.env)
    alg = algorithms.load(trial.algorithm)
    policy = alg.policy_cls(
        observation_space=env.observation_space,
        action_space=env.action_space,
        hyperparams=alg.hyperparams(trial.hyperparams),
        model=trial.model,
        seed=0,
    )
    nets = [policy.q] if trial.algorithm == "dqn" else [policy.net["pi"], policy.net["vf"]]
    return policy, nets


def torchrl_model(trial: Trial) -> list[nn.Module]:
    """TorchRL's networks for ``trial``'s env (Discrete or MultiDiscrete actions): the Q-network, or the actor and the
    critic."""
    learner: Any = build_learner(trial=trial, **learner_dims(trial.env))
    return [learner.qnet] if trial.algorithm == "dqn" else [learner.actor_net, learner.critic_net]


def rllib_config(trial: Trial) -> Any:
    """The AlgorithmConfig crossrl's RLlib adapter builds for ``trial`` (one worker, two CPUs)."""
    return R.build_config(
        trial, plan=R.plan_resources(algorithm=trial.algorithm, workers=1, available_cpus=2), env_name="x"
    )


def rllib_module(trial: Trial, config: Any = None) -> Any:
    """The RLModule RLlib builds from ``config`` (by default the adapter's for ``trial``) for ``trial``'s env."""
    config = config if config is not None else rllib_config(trial)
    env = make_env(trial.env)
    spec = config.rl_module_spec
    spec.observation_space, spec.action_space, spec.model_config = (
        env.observation_space,
        env.action_space,
        config.model_config,
    )
    return spec.build()


def count(modules: list[nn.Module]) -> int:
    return sum(p.numel() for m in modules for name, p in m.named_parameters() if "target" not in name)
