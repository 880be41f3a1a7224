"""SACPolicy: the policy graph of soft actor-critic (Haarnoja et al. 2018, with the learned temperature of
"Soft Actor-Critic Algorithms and Applications").

- **Actor**: the spec's MLP (:func:`crossrl.core.models.build_mlp`) from the observation to a mean and a log std per
  action dimension; the action is ``tanh(mean + std * noise)``, a squashed Gaussian in [-1, 1], mapped affinely to
  the env's bounds (with ``env.actions: unit``, sac's default, the env's actions are already [-1, 1]: every engine
  sees the same rescaled env). Its log-probability carries the tanh's change of variables. Acting uses numpy copies
  of the actor (:mod:`crossrl.core.numpy_net`): a sampling-only evaluator never imports torch.
- **Critics**: two Q networks (the spec's MLP from ``[observation, action]`` to one value) and their
  Polyak-averaged target copies (``tau`` per update); targets use the smaller of the two target values.
- **Temperature**: ``log alpha``, learned toward ``target_entropy`` (``'auto'``: minus the number of action
  dimensions).
- **Postprocessing** on the worker: the same n-step columns as DQN's (:func:`crossrl.core.maths.n_step_returns`; SAC's
  default n is 1), so the replay optimizers store and sample SAC's transitions as they do DQN's.

One update (:meth:`SACPolicy.learn_on_replay_batch`): the critics on ``R + discount * (min Q_target(s', a') - alpha
log pi(a'|s'))`` with ``a'`` drawn from the current actor (mean squared error, each critic); then the actor on
``alpha log pi(a|s) - min Q(s, a)`` with the updated critics; then the temperature on ``-log alpha (log pi(a|s) +
target entropy)``; then the target critics by Polyak averaging. Three Adam optimizers (``actor_lr``, ``critic_lr``,
``alpha_lr``), no gradient clipping. A non-finite Q value or action raises :class:`NonFiniteError` naming it.

``set_epsilon`` sets the probability of a uniformly random action: the replay optimizers act uniformly at random
(1.0) until ``learning_starts`` env steps, then with the policy (0.0), as CleanRL's and TorchRL's SAC do.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np

from crossrl.core import sample_batch as sb
from crossrl.core.numpy_net import NpLayer, np_forward, np_layers
from crossrl.core.policy import Policy
from crossrl.core.q_policy import n_step_batch
from crossrl.core.sample_batch import SampleBatch
from crossrl.scenarios import metrics as M
from crossrl.scenarios.spec import ModelSpec

if TYPE_CHECKING:
    import torch
    from torch import nn

ACTOR = "actor"
CRITICS = ("q1", "q2")
TARGETS = ("target_q1", "target_q2")
LOG_ALPHA = "log_alpha"
_TANH_EPS = 1e-6


class NonFiniteError(FloatingPointError):
    """An action or a Q value of the policy is NaN or infinite: training diverged (the trial fails naming it)."""


def target_entropy(value: float | str, act_dim: int) -> float:
    """The temperature's target: ``value``, or for ``'auto'`` minus the number of action dimensions."""
    return -float(act_dim) if value == "auto" else float(value)


class SACPolicy(Policy):
    """Soft actor-critic over a bounded ``Box`` action space and a flat ``Box`` observation space."""

    def __init__(
        self,
        *,
        observation_space: gym.Space,
        action_space: gym.Space,
        hyperparams: Mapping[str, Any],
        model: ModelSpec,
        seed: int,
    ) -> None:
        super().__init__(
            observation_space=observation_space,
            action_space=action_space,
            hyperparams=hyperparams,
            model=model,
            seed=seed,
        )
        if not isinstance(action_space, gym.spaces.Box):
            raise TypeError(f"SACPolicy (sac) needs a continuous (Box) action space, got {action_space}")
        if not (np.all(np.isfinite(action_space.low)) and np.all(np.isfinite(action_space.high))):
            raise TypeError(f"SACPolicy (sac) needs bounded actions, got {action_space}")
        if not isinstance(observation_space, gym.spaces.Box):
            raise TypeError(f"SACPolicy needs a Box observation space, got {observation_space}")
        if model.conv:
            raise TypeError("SACPolicy runs MLP models only (algorithm.model.conv must be empty for sac)")
        self.obs_dim = int(np.prod(observation_space.shape))
        self.act_shape = tuple(int(n) for n in action_space.shape)
        self.act_dim = int(np.prod(self.act_shape))
        low, high = action_space.low.reshape(-1), action_space.high.reshape(-1)
        self.act_scale = ((high - low) / 2.0).astype(np.float32)
        self.act_mid = ((high + low) / 2.0).astype(np.float32)
        self.log_std_min = float(self.hp["log_std_min"])
        self.log_std_max = float(self.hp["log_std_max"])
        self.gamma = float(self.hp["gamma"])
        self.n_step = int(self.hp["n_step"])
        self.tau = float(self.hp["tau"])
        self.target_entropy = target_entropy(self.hp["target_entropy"], self.act_dim)
        self.epsilon = 0.0  # probability of a uniformly random action (the optimizers set it)
        # how the replay optimizers replay it (crossrl.core.optimizers.sync_replay.ReplayPolicy)
        self.replay_ratio = float(self.hp["updates_per_step"]) * int(self.hp["train_batch"])
        self.target_update: int | None = None  # Polyak averaging inside each update
        self.prioritized = False
        self.learning_starts = int(self.hp["learning_starts"])
        self.replay_batch_size = int(self.hp["train_batch"])
        self.updates = 0
        self._torch: _Nets | None = None
        self._np_weights: dict[str, np.ndarray] | None = None
        self._np_actor: list[NpLayer] | None = None

    # -- torch, built on first use (a sampling-only evaluator never builds it) ---------------------------------------
    def _nets(self) -> _Nets:
        if self._torch is None:
            self._torch = _Nets(self)
            if self._np_weights is not None:
                self._torch.load(self._np_weights)
                self._np_weights = None
        return self._torch

    def rollout_fragment(self, num_envs: int) -> int:
        """Env steps per env and sample call: the ``rollout_fragment`` hyperparameter."""
        return int(self.hp["rollout_fragment"])

    # -- acting ----------------------------------------------------------------------------------------------------
    def set_epsilon(self, epsilon: float) -> None:
        if not 0.0 <= epsilon <= 1.0:
            raise ValueError(f"epsilon must be in [0, 1], got {epsilon}")
        self.epsilon = float(epsilon)

    def exploration_epsilon(self, env_steps: int) -> float:
        """1 (uniformly random actions) until ``learning_starts`` env steps were sampled, then 0."""
        return 1.0 if env_steps < self.learning_starts else 0.0

    def _actor_np(self) -> list[NpLayer]:
        if self._np_actor is None:
            self._np_actor = np_layers(self.acting_weights(), ACTOR, self.model_spec.activation)
        return self._np_actor

    def compute_actions(self, obs: np.ndarray, *, explore: bool = True) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """``tanh(mean + std * noise)`` exploring, ``tanh(mean)`` not, in the env's bounds; exploring, each action is
        uniform over the bounds with probability ``epsilon``."""
        with np.errstate(invalid="ignore", over="ignore"):  # a diverged actor is named below, not warned about
            out = np_forward(self._actor_np(), np.asarray(obs, np.float32).reshape(len(obs), self.obs_dim))
        mean = out[:, : self.act_dim]
        if not np.all(np.isfinite(mean)):
            raise NonFiniteError(f"sac: the actor's mean action is not finite ({_first_bad(mean)})")
        if explore:
            log_std = np.clip(out[:, self.act_dim :], self.log_std_min, self.log_std_max)
            unit = np.tanh(mean + np.exp(log_std) * self.rng.standard_normal(mean.shape, np.float32))
            if self.epsilon > 0:
                random = self.rng.random(len(unit)) < self.epsilon
                uniform = self.rng.uniform(-1.0, 1.0, unit.shape).astype(np.float32)
                unit = np.where(random[:, None], uniform, unit)
        else:
            unit = np.tanh(mean)
        actions = self.act_mid + self.act_scale * unit
        return actions.astype(np.float32).reshape(len(obs), *self.act_shape), {}

    # -- postprocessing (on the worker) ----------------------------------------------------------------------------
    def postprocess_trajectory(self, batch: SampleBatch) -> SampleBatch:
        """n-step columns for a time-major batch (:data:`~crossrl.core.q_policy.REPLAY_COLUMNS`), nothing else."""
        return n_step_batch(batch, gamma=self.gamma, n=self.n_step)

    # -- learning --------------------------------------------------------------------------------------------------
    def learn_on_replay_batch(self, batch: Mapping[str, np.ndarray]) -> tuple[dict[str, float], np.ndarray]:
        """One SAC update on a flat replay sample; returns (stats, ``|TD error|`` of the first critic per row)."""
        stats, td = self._nets().update(batch)
        self.updates += 1
        self._np_actor = None
        return stats, td

    def learn_on_batch(self, batch: SampleBatch) -> dict[str, float]:
        stats, _ = self.learn_on_replay_batch(batch.flatten())
        return stats

    def loss(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, float]]:
        """The critics' loss (the actor's and the temperature's follow the critics' step: :meth:`learn_on_replay_batch`)."""
        loss, _, stats = self._nets().critic_loss(batch)
        return loss, stats

    def compute_gradients(self, batch: SampleBatch) -> tuple[list[np.ndarray], dict[str, float]]:
        raise NotImplementedError("sac trains on replay batches (sync_replay, async_replay), not shipped gradients")

    def apply_gradients(self, grads: list[np.ndarray]) -> None:
        raise NotImplementedError("sac trains on replay batches (sync_replay, async_replay), not shipped gradients")

    def update_target(self) -> None:
        """Nothing: the target critics follow the critics by Polyak averaging after every update."""

    # -- weights and state -----------------------------------------------------------------------------------------
    def get_weights(self) -> dict[str, np.ndarray]:
        """Actor, critics, target critics and ``log_alpha`` (numpy copies)."""
        if self._torch is None:
            if self._np_weights is None or LOG_ALPHA not in self._np_weights:
                # the initial weights, built once in torch and then dropped (a sampling evaluator gets the actor's
                # from the driver before it acts, and never builds them)
                self._np_weights = {**_Nets(self).weights(), **(self._np_weights or {})}
            return {k: v.copy() for k, v in self._np_weights.items()}
        return self._torch.weights()

    def acting_weights(self) -> dict[str, np.ndarray]:
        """The actor's weights alone (``actor.*``): what a sampling evaluator acts with (sent every round: the
        critics, their targets and the temperature are not copied for it)."""
        if self._torch is not None:
            return {f"{ACTOR}.{k}": v.detach().numpy().copy() for k, v in self._torch.actor.state_dict().items()}
        weights = self._np_weights if self._np_weights is not None else self.get_weights()
        return {k: v for k, v in weights.items() if k.startswith(ACTOR + ".")}

    def set_weights(self, weights: Mapping[str, np.ndarray]) -> None:
        """All the weights, or a part of them (the actor's alone, as evaluators receive them)."""
        if self._torch is None:
            self._np_weights = {**(self._np_weights or {}), **{k: np.array(v) for k, v in weights.items()}}
        else:
            self._torch.load(weights)
        self._np_actor = None

    def get_state(self) -> dict[str, Any]:
        """:meth:`Policy.get_state` with the three Adam optimizers' states and the update count."""
        nets = self._nets()
        return {
            "weights": self.get_weights(),
            "optimizer": {name: opt.state_dict() for name, opt in nets.optimizers().items()},
            "rng": self.rng.bit_generator.state,
            "epsilon": self.epsilon,
            "updates": self.updates,
        }

    def set_state(self, state: Mapping[str, Any]) -> None:
        """Back to :meth:`get_state`'s state; the learning rates are this policy's hyperparameters'."""
        self.set_weights(state["weights"])
        nets = self._nets()
        saved = state.get("optimizer") or {}
        for name, opt in nets.optimizers().items():
            if name in saved:
                opt.load_state_dict(saved[name])
            for group in opt.param_groups:
                group["lr"] = float(self.hp[f"{name}_lr"])
        self.rng.bit_generator.state = state["rng"]
        self.epsilon = float(state.get("epsilon") or 0.0)
        self.updates = int(state.get("updates", 0))

    @property
    def alpha(self) -> float:
        return float(self._nets().log_alpha.detach().exp())


def _first_bad(x: np.ndarray) -> str:
    bad = np.argwhere(~np.isfinite(x))[0]
    return f"{x[tuple(bad)]} at row {int(bad[0])}"


class _Nets:
    """The torch side of a :class:`SACPolicy`: networks, target critics, temperature and optimizers."""

    def __init__(self, policy: SACPolicy) -> None:
        import torch
        from torch import nn

        from crossrl.core.models import build_mlp

        self.p = policy
        torch.manual_seed(policy.seed)
        spec, obs_dim, act_dim = policy.model_spec, policy.obs_dim, policy.act_dim
        self.actor = build_mlp(in_dim=obs_dim, out_dim=2 * act_dim, model=spec, out_gain=0.01)
        self.critics = nn.ModuleList(
            [build_mlp(in_dim=obs_dim + act_dim, out_dim=1, model=spec, out_gain=1.0) for _ in CRITICS]
        )
        self.targets = copy.deepcopy(self.critics).requires_grad_(False)
        self.log_alpha = nn.Parameter(torch.tensor(math.log(float(policy.hp["initial_alpha"])), dtype=torch.float32))
        self.act_scale = torch.as_tensor(policy.act_scale)
        self.act_mid = torch.as_tensor(policy.act_mid)
        hp = policy.hp
        self.actor_opt = torch.optim.Adam(self.actor.parameters(), lr=float(hp["actor_lr"]), eps=float(hp["adam_eps"]))
        self.critic_opt = torch.optim.Adam(
            self.critics.parameters(), lr=float(hp["critic_lr"]), eps=float(hp["adam_eps"])
        )
        self.alpha_opt = torch.optim.Adam([self.log_alpha], lr=float(hp["alpha_lr"]), eps=float(hp["adam_eps"]))

    def optimizers(self) -> dict[str, torch.optim.Optimizer]:
        """By the hyperparameter that names each one's learning rate (``<name>_lr``)."""
        return {"actor": self.actor_opt, "critic": self.critic_opt, "alpha": self.alpha_opt}

    # -- weights -------------------------------------------------------------------------------------------------
    def modules(self) -> dict[str, nn.Module]:
        return {
            ACTOR: self.actor,
            **{name: net for name, net in zip(CRITICS, self.critics, strict=True)},
            **{name: net for name, net in zip(TARGETS, self.targets, strict=True)},
        }

    def weights(self) -> dict[str, np.ndarray]:
        from crossrl.core.models import module_weights

        out = module_weights(self.modules())
        out[LOG_ALPHA] = self.log_alpha.detach().numpy().copy()
        return out

    def load(self, weights: Mapping[str, np.ndarray]) -> None:
        import torch

        from crossrl.core.models import load_module_weights

        load_module_weights(self.modules(), weights)
        if LOG_ALPHA in weights:
            with torch.no_grad():
                self.log_alpha.copy_(torch.as_tensor(np.asarray(weights[LOG_ALPHA])))

    # -- maths ---------------------------------------------------------------------------------------------------
    def sample(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A squashed-Gaussian action in [-1, 1] (reparameterized) and its log-probability."""
        import torch

        out = self.actor(obs)
        mean, log_std = out[:, : self.p.act_dim], out[:, self.p.act_dim :]
        log_std = log_std.clamp(self.p.log_std_min, self.p.log_std_max)
        std = log_std.exp()
        pre = mean + std * torch.randn_like(mean)
        unit = torch.tanh(pre)
        # log N(pre; mean, std) - sum log(1 - tanh(pre)^2), in the stable form 2 (log 2 - pre - softplus(-2 pre))
        normal = -0.5 * (((pre - mean) / std) ** 2) - log_std - 0.5 * math.log(2 * math.pi)
        squash = 2.0 * (math.log(2.0) - pre - torch.nn.functional.softplus(-2.0 * pre))
        return unit, (normal - squash).sum(dim=1)

    def q(self, nets: nn.ModuleList, obs: torch.Tensor, unit_actions: torch.Tensor) -> list[torch.Tensor]:
        x = self._qin(obs, unit_actions)
        return [net(x)[:, 0] for net in nets]

    @staticmethod
    def _qin(obs: torch.Tensor, unit_actions: torch.Tensor) -> torch.Tensor:
        import torch

        return torch.cat([obs, unit_actions], dim=1)

    def tensors(self, batch: Mapping[str, Any]) -> dict[str, torch.Tensor]:
        import torch

        p = self.p

        def t(key: str) -> torch.Tensor:
            return torch.as_tensor(np.require(batch[key], np.float32, "W"))

        actions = t(sb.ACTIONS).reshape(-1, p.act_dim)
        return {
            sb.OBS: t(sb.OBS).reshape(-1, p.obs_dim),
            # the critics see actions in [-1, 1] whatever the env's bounds (identity for a 'unit' env)
            sb.ACTIONS: ((actions - self.act_mid) / self.act_scale).clamp(-1.0, 1.0),
            sb.N_STEP_RETURNS: t(sb.N_STEP_RETURNS).reshape(-1),
            sb.N_STEP_DISCOUNTS: t(sb.N_STEP_DISCOUNTS).reshape(-1),
            sb.N_STEP_NEXT_OBS: t(sb.N_STEP_NEXT_OBS).reshape(-1, p.obs_dim),
        }

    def critic_loss(self, batch: Mapping[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
        import torch

        alpha = self.log_alpha.detach().exp()
        with torch.no_grad():
            next_actions, next_logp = self.sample(batch[sb.N_STEP_NEXT_OBS])
            next_q = torch.min(*self.q(self.targets, batch[sb.N_STEP_NEXT_OBS], next_actions))
            target = batch[sb.N_STEP_RETURNS] + batch[sb.N_STEP_DISCOUNTS] * (next_q - alpha * next_logp)
        q1, q2 = self.q(self.critics, batch[sb.OBS], batch[sb.ACTIONS])
        if not (torch.isfinite(q1).all() and torch.isfinite(q2).all()):
            raise NonFiniteError(f"sac: a Q value is not finite after {self.p.updates} updates ({_bad_q(q1, q2)})")
        loss = ((q1 - target) ** 2).mean() + ((q2 - target) ** 2).mean()
        stats = {M.VALUE_LOSS: float(loss.detach()), M.DIAG_Q_MEAN: float(q1.detach().mean())}
        return loss, (q1 - target).detach(), stats

    def update(self, replay: Mapping[str, np.ndarray]) -> tuple[dict[str, float], np.ndarray]:
        import torch

        batch = self.tensors(replay)
        critic_loss, td, stats = self.critic_loss(batch)
        self.critic_opt.zero_grad(set_to_none=True)
        critic_loss.backward()
        self.critic_opt.step()

        actions, logp = self.sample(batch[sb.OBS])
        self.critics.requires_grad_(False)  # the actor's loss differentiates through the critics, not into them
        try:
            q = torch.min(*self.q(self.critics, batch[sb.OBS], actions))
            alpha = self.log_alpha.detach().exp()
            actor_loss = (alpha * logp - q).mean()
            self.actor_opt.zero_grad(set_to_none=True)
            actor_loss.backward()
        finally:
            self.critics.requires_grad_(True)
        self.actor_opt.step()

        alpha_loss = -(self.log_alpha * (logp.detach() + self.p.target_entropy)).mean()
        self.alpha_opt.zero_grad(set_to_none=True)
        alpha_loss.backward()
        self.alpha_opt.step()

        with torch.no_grad():
            for target, online in zip(self.targets.parameters(), self.critics.parameters(), strict=True):
                target.lerp_(online, self.p.tau)
        stats.update(
            {
                M.POLICY_LOSS: float(actor_loss.detach()),
                M.ENTROPY: float(-logp.detach().mean()),
                M.DIAG_ALPHA: float(alpha),
                M.DIAG_ALPHA_LOSS: float(alpha_loss.detach()),
            }
        )
        return stats, np.abs(td.numpy())


def _bad_q(q1: torch.Tensor, q2: torch.Tensor) -> str:
    import torch

    for name, q in (("Q1", q1), ("Q2", q2)):
        bad = (~torch.isfinite(q)).nonzero()
        if len(bad):
            row = int(bad[0, 0])
            return f"{name} = {float(q[row].detach())} at batch row {row}"
    return "none"
