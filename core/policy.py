"""The policy graph (RLlib paper, section 3): model + action distribution + postprocessing + loss.

:class:`Policy` is what evaluators and optimizers see; :class:`PolicySpec` builds one in an evaluator.
An evaluator samples a whole fragment through :meth:`Policy.fragment_actor` (a :class:`FragmentActor`);
the default, :class:`StepwiseActor`, calls :meth:`Policy.compute_actions` per step. The concrete
policies: :class:`~crossrl.core.actor_critic.ActorCriticPolicy` (ppo/a2c/a3c/impala) and
:class:`~crossrl.core.q_policy.QPolicy` (dqn/apex).
"""

from __future__ import annotations

import abc
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

import gymnasium as gym
import numpy as np

from crossrl.core import sample_batch as sb
from crossrl.core.sample_batch import SampleBatch
from crossrl.scenarios.spec import ModelSpec

if TYPE_CHECKING:
    import torch


class Policy(abc.ABC):
    """Abstract policy graph. Subclasses keep this constructor signature (evaluators build them by keyword).

    ``hyperparams`` are the trial's resolved hyperparameters (crossrl's shared names, see
    :mod:`crossrl.scenarios.catalog`) over crossrl's own settings (``CROSSRL_SETTINGS``).
    """

    def __init__(
        self,
        *,
        observation_space: gym.Space,
        action_space: gym.Space,
        hyperparams: Mapping[str, Any],
        model: ModelSpec,
        seed: int,
    ) -> None:
        self.observation_space = observation_space
        self.action_space = action_space
        self.hp: dict[str, Any] = dict(hyperparams)
        self.model_spec = model
        self.seed = seed
        self.rng = np.random.default_rng(seed)

    @abc.abstractmethod
    def compute_actions(self, obs: np.ndarray, *, explore: bool = True) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Actions for a batch ``obs[B, ...]`` and extra columns (e.g. LOGP, VF_PREDS) each ``[B, ...]``."""

    def fragment_actor(self, *, num_steps: int, num_envs: int) -> FragmentActor:
        """Acting for one ``sample()`` call of ``num_steps`` x ``num_envs``; the default calls compute_actions per step."""
        return StepwiseActor(self, num_steps)

    def postprocess_trajectory(self, batch: SampleBatch) -> SampleBatch:
        """Runs on the worker right after sampling, on the time-major batch (GAE, n-step, priorities)."""
        return batch

    @abc.abstractmethod
    def loss(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, float]]:
        """Scalar loss to minimise and stats (metric names from :mod:`crossrl.scenarios.metrics` where they apply)."""

    @abc.abstractmethod
    def learn_on_batch(self, batch: SampleBatch) -> dict[str, float]:
        """Improve the policy on ``batch`` (SGD epochs/minibatches as the hyperparameters say); returns stats."""

    @abc.abstractmethod
    def compute_gradients(self, batch: SampleBatch) -> tuple[list[np.ndarray], dict[str, float]]:
        """Gradients of :meth:`loss` on the whole batch, one array per parameter (``parameters()`` order)."""

    @abc.abstractmethod
    def apply_gradients(self, grads: list[np.ndarray]) -> None:
        """One optimizer step with ``grads`` (as returned by :meth:`compute_gradients`, maybe from another copy)."""

    @abc.abstractmethod
    def get_weights(self) -> dict[str, np.ndarray]:
        """Every tensor needed to act and learn identically elsewhere (copies, numpy)."""

    @abc.abstractmethod
    def set_weights(self, weights: Mapping[str, np.ndarray]) -> None: ...

    def acting_weights(self) -> dict[str, np.ndarray]:
        """The weights a sampling evaluator needs to act (what :class:`~crossrl.core.evaluator.EvaluatorSet` sends
        it): all of :meth:`get_weights` by default; SAC's actor alone (its critics learn on the driver only)."""
        return self.get_weights()

    def set_epsilon(self, epsilon: float) -> None:
        """Exploration hook for epsilon-greedy policies; a no-op for stochastic ones."""

    def get_state(self) -> dict[str, Any]:
        """Everything learning continues from (a checkpoint): the weights (a target network's too), the torch
        optimizer's state (Adam's moments and step counts), the policy's random generator, its exploration epsilon."""
        optimizer = getattr(self, "optimizer", None)
        return {
            "weights": self.get_weights(),
            "optimizer": optimizer.state_dict() if optimizer is not None else None,
            "rng": self.rng.bit_generator.state,
            "epsilon": getattr(self, "epsilon", None),
        }

    def learning_rate(self) -> float:
        """The learning rate of the policy's one torch optimizer (its hyperparameters'), which a restored optimizer
        continues with; a policy with several optimizers (SAC) restores them itself (its own :meth:`set_state`)."""
        raise NotImplementedError(f"{type(self).__name__} has no single learning rate")

    def set_state(self, state: Mapping[str, Any]) -> None:
        """Back to :meth:`get_state`'s state; the learning rate is then the one in this policy's hyperparameters
        (a resumed or perturbed trial's own, not the saved one)."""
        self.set_weights(state["weights"])
        optimizer = getattr(self, "optimizer", None)
        if optimizer is not None and state.get("optimizer") is not None:
            optimizer.load_state_dict(state["optimizer"])
            for group in optimizer.param_groups:
                group["lr"] = self.learning_rate()
        self.rng.bit_generator.state = state["rng"]
        if state.get("epsilon") is not None:
            self.set_epsilon(float(state["epsilon"]))


class FragmentActor(Protocol):
    """Acts for one fragment: ``actor(obs, t)`` returns step ``t``'s actions; ``columns()`` the per-step extras."""

    def __call__(self, obs: np.ndarray, t: int) -> np.ndarray: ...

    def columns(self) -> dict[str, np.ndarray]:
        """ACTIONS and the policy's extra columns, each ``[num_steps, num_envs, ...]``."""
        ...


class StepwiseActor:
    """The generic fragment actor: ``compute_actions`` per step, columns stacked as they come."""

    def __init__(self, policy: Policy, num_steps: int) -> None:
        self.policy = policy
        self.num_steps = num_steps
        self.cols: dict[str, np.ndarray] = {}

    def __call__(self, obs: np.ndarray, t: int) -> np.ndarray:
        actions, extra = self.policy.compute_actions(obs)
        if not self.cols:
            for k, v in {sb.ACTIONS: actions, **extra}.items():
                self.cols[k] = np.empty((self.num_steps, *v.shape), v.dtype)
        self.cols[sb.ACTIONS][t] = actions
        for k, v in extra.items():
            self.cols[k][t] = v
        return actions

    def columns(self) -> dict[str, np.ndarray]:
        return self.cols


class PolicyFactory(Protocol):
    """Builds a policy in an evaluator (must pickle: it travels to Ray actors)."""

    def __call__(self, *, observation_space: gym.Space, action_space: gym.Space, seed: int) -> Policy: ...


class PolicySpec:
    """A picklable :class:`PolicyFactory`: a policy class with its hyperparameters and model spec."""

    def __init__(self, *, policy_cls: type[Policy], hyperparams: Mapping[str, Any], model: ModelSpec) -> None:
        self.policy_cls = policy_cls
        self.hyperparams = dict(hyperparams)
        self.model = model

    def __call__(self, *, observation_space: gym.Space, action_space: gym.Space, seed: int) -> Policy:
        return self.policy_cls(
            observation_space=observation_space,
            action_space=action_space,
            hyperparams=self.hyperparams,
            model=self.model,
            seed=seed,
        )
