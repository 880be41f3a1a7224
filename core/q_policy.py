"""QPolicy: the policy graph of DQN and Ape-X (Mnih et al. 2015; van Hasselt et al. 2016; Horgan et al. 2018).

A Q-network from :func:`crossrl.core.models.build_net` (the spec's MLP, after its conv stack when it has
one) and a target copy; epsilon-greedy actions;
postprocessing on the worker computes n-step returns and, for prioritized replay, each transition's
initial priority ``|TD error|`` with the worker's own copy of both networks (Ape-X, section 3); the
loss is the importance-weighted Huber TD loss with double-Q targets.

Hyperparameters (crossrl's shared names): ``lr``, ``gamma``, ``n_step``, ``double_q``, ``grad_clip``
(global norm), ``epsilon_initial`` (the epsilon a fresh policy acts with until an optimizer sets
one), ``prioritized_replay``. Optional: ``adam_eps``.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from crossrl.core import maths
from crossrl.core import sample_batch as sb
from crossrl.core.models import build_net
from crossrl.core.numpy_net import NpLayer, np_forward, np_layers
from crossrl.core.policy import Policy
from crossrl.core.sample_batch import SampleBatch
from crossrl.scenarios import metrics as M
from crossrl.scenarios.spec import ModelSpec

# The flat columns a replay buffer stores: what the TD loss reads (plus priorities on the way in).
REPLAY_COLUMNS = (sb.OBS, sb.ACTIONS, sb.N_STEP_RETURNS, sb.N_STEP_DISCOUNTS, sb.N_STEP_NEXT_OBS)
_TARGET_PREFIX = "target."


class QPolicy(Policy):
    """Q-learning over a ``Discrete`` action space with a ``Box`` observation space."""

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
        if not isinstance(action_space, gym.spaces.Discrete):
            raise TypeError(f"QPolicy (dqn, apex) needs a Discrete action space, got {action_space}")
        if not isinstance(observation_space, gym.spaces.Box):
            raise TypeError(f"QPolicy needs a Box observation space, got {observation_space}")
        self.obs_shape = tuple(int(n) for n in observation_space.shape)
        self.obs_dim = int(np.prod(self.obs_shape))
        self.conv = bool(model.conv)  # a conv Q-network runs in torch (numpy_net runs MLPs only)
        self.num_actions = int(action_space.n)
        torch.manual_seed(seed)
        self.q = build_net(obs_shape=self.obs_shape, out_dim=self.num_actions, model=model, out_gain=1.0)
        self.target = copy.deepcopy(self.q).requires_grad_(False)
        self.params = list(self.q.parameters())
        self.optimizer = torch.optim.Adam(self.params, lr=float(self.hp["lr"]), eps=float(self.hp["adam_eps"]))
        self.gamma = float(self.hp["gamma"])
        self.n_step = int(self.hp["n_step"])
        self.double_q = bool(self.hp["double_q"])
        self.epsilon = float(self.hp["epsilon_initial"])
        # how the replay optimizers replay it (crossrl.core.optimizers.sync_replay.ReplayPolicy)
        self.replay_ratio = float(self.hp["replay_ratio"])
        self.target_update: int | None = int(self.hp["target_update"])
        self.prioritized = bool(self.hp["prioritized_replay"])
        self.priority_alpha = float(self.hp["priority_alpha"])
        self.priority_beta = float(self.hp["priority_beta"])
        self.replay_batch_size = int(self.hp["train_batch"])
        self.learning_starts = int(self.hp["learning_starts"])
        self._np_q: list[NpLayer] | None = None  # numpy copies for acting and priorities, dropped on change
        self._np_target: list[NpLayer] | None = None

    def learning_rate(self) -> float:
        return float(self.hp["lr"])

    def rollout_fragment(self, num_envs: int) -> int:
        """Env steps per env and sample call: the ``rollout_fragment`` hyperparameter."""
        return int(self.hp["rollout_fragment"])

    # -- acting ------------------------------------------------------------------------------------
    def set_epsilon(self, epsilon: float) -> None:
        """Probability of a uniformly random action (the optimizer owns the schedule)."""
        if not 0.0 <= epsilon <= 1.0:
            raise ValueError(f"epsilon must be in [0, 1], got {epsilon}")
        self.epsilon = float(epsilon)

    def exploration_epsilon(self, env_steps: int) -> float:
        """The epsilon of the linear schedule after ``env_steps`` env steps sampled."""
        return linear_epsilon(
            env_steps=env_steps,
            initial=float(self.hp["epsilon_initial"]),
            final=float(self.hp["epsilon_final"]),
            timesteps=int(self.hp["epsilon_timesteps"]),
        )

    def q_values(self, obs: np.ndarray, *, target: bool = False) -> np.ndarray:
        """Q(obs, .) for ``obs[B, ...]`` -> ``[B, num_actions]`` (float32), in numpy for an MLP (no torch dispatch
        per step), in torch for a conv network."""
        if self.conv:
            with torch.no_grad():
                frames = torch.as_tensor(np.asarray(obs)).reshape(len(obs), *self.obs_shape)
                return (self.target if target else self.q)(frames).numpy()
        if self._np_q is None or self._np_target is None:
            weights = self.get_weights()
            act = self.model_spec.activation
            self._np_q = np_layers(weights, "", act)
            self._np_target = np_layers(weights, _TARGET_PREFIX, act)
        layers = self._np_target if target else self._np_q
        return np_forward(layers, np.asarray(obs, np.float32).reshape(len(obs), self.obs_dim))

    def _weights_changed(self) -> None:
        self._np_q = self._np_target = None

    def compute_actions(self, obs: np.ndarray, *, explore: bool = True) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Greedy actions, each replaced by a uniform one with probability ``epsilon`` when exploring."""
        actions = np.argmax(self.q_values(obs), axis=1)
        if explore and self.epsilon > 0:
            random = self.rng.random(len(actions)) < self.epsilon
            actions = np.where(random, self.rng.integers(0, self.num_actions, len(actions)), actions)
        return actions.astype(np.int64), {}

    # -- postprocessing (on the worker) --------------------------------------------------------------
    def postprocess_trajectory(self, batch: SampleBatch) -> SampleBatch:
        """n-step columns for a time-major batch, plus PRIORITIES when replay is prioritized.

        Keeps only what replay needs (:data:`REPLAY_COLUMNS`, VALID, PRIORITIES): transitions are
        shipped to the replay buffer and stored there, so unused columns would cost bandwidth and memory.
        """
        out = n_step_batch(batch, gamma=self.gamma, n=self.n_step)
        if self.hp["prioritized_replay"]:
            shape = out[sb.N_STEP_RETURNS].shape
            out[sb.PRIORITIES] = np.abs(self._np_td_error(out)).reshape(shape).astype(np.float32)
        return out

    def _np_td_error(self, batch: Mapping[str, np.ndarray]) -> np.ndarray:
        """:meth:`_td_error` in numpy (the workers' initial Ape-X priorities), flat over the batch's rows."""
        obs = batch[sb.OBS].reshape(-1, self.obs_dim)
        next_obs = batch[sb.N_STEP_NEXT_OBS].reshape(-1, self.obs_dim)
        actions = batch[sb.ACTIONS].reshape(-1)
        rows = np.arange(len(actions))
        q = self.q_values(obs)[rows, actions]
        q_next_target = self.q_values(next_obs, target=True)
        best = (self.q_values(next_obs) if self.double_q else q_next_target).argmax(axis=1)
        target = (
            batch[sb.N_STEP_RETURNS].reshape(-1) + batch[sb.N_STEP_DISCOUNTS].reshape(-1) * q_next_target[rows, best]
        )
        return q - target

    # -- loss --------------------------------------------------------------------------------------
    def _td_error(self, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """``Q(s, a) - (R + discount * Q_target(s', a*))``, ``a*`` from the online net when ``double_q``."""
        obs, next_obs = self._net_input(batch[sb.OBS]), self._net_input(batch[sb.N_STEP_NEXT_OBS])
        actions = batch[sb.ACTIONS].reshape(-1).long()
        q = self.q(obs).gather(1, actions[:, None])[:, 0]
        with torch.no_grad():
            q_next_target = self.target(next_obs)
            # Double Q: the online net picks the action, the target net values it (less overestimation).
            best = (self.q if self.double_q else self.target)(next_obs).argmax(dim=1)
            q_next = q_next_target.gather(1, best[:, None])[:, 0]
            target = (
                batch[sb.N_STEP_RETURNS].reshape(-1).float() + batch[sb.N_STEP_DISCOUNTS].reshape(-1).float() * q_next
            )
        return q - target

    def _net_input(self, obs: torch.Tensor) -> torch.Tensor:
        """Float rows (MLP) or frames ``[B, H, W, C]`` in their own dtype (conv: the network scales uint8)."""
        return obs.reshape(-1, *self.obs_shape) if self.conv else obs.reshape(-1, self.obs_dim).float()

    def _loss_and_td(self, batch: Mapping[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
        td = self._td_error(batch)
        weights = batch.get(sb.WEIGHTS)
        # Huber (delta 1) keeps single large errors from dominating; IS weights correct prioritized sampling.
        per_sample = F.huber_loss(td, torch.zeros_like(td), reduction="none", delta=1.0)
        loss = (per_sample * weights.float()).mean() if weights is not None else per_sample.mean()
        stats = {
            M.VALUE_LOSS: float(loss.detach()),
            "td_error_abs_mean": float(td.detach().abs().mean()),
        }
        return loss, td.detach(), stats

    def loss(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, float]]:
        loss, _, stats = self._loss_and_td(batch)
        return loss, stats

    # -- learning ----------------------------------------------------------------------------------
    @staticmethod
    def to_tensors(batch: Mapping[str, np.ndarray]) -> dict[str, torch.Tensor]:
        # Arrays from the object store are read-only; torch wants writable memory (a copy of 32 rows).
        return {
            k: torch.as_tensor(np.require(v, requirements="W"))
            for k, v in batch.items()
            if k in (*REPLAY_COLUMNS, sb.WEIGHTS)
        }

    def learn_on_replay_batch(self, batch: Mapping[str, np.ndarray]) -> tuple[dict[str, float], np.ndarray]:
        """One SGD step on a flat replay sample; returns (stats, ``|TD error|`` per row for new priorities)."""
        loss, td, stats = self._loss_and_td(self.to_tensors(batch))
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        stats[M.DIAG_GRAD_NORM] = self._clip()
        self.optimizer.step()
        self._weights_changed()
        return stats, np.abs(td.numpy())

    def learn_on_batch(self, batch: SampleBatch) -> dict[str, float]:
        stats, _ = self.learn_on_replay_batch(batch.flatten())
        return stats

    def _clip(self) -> float:
        """Clip the gradients to ``grad_clip`` (global norm); returns the norm before clipping."""
        return float(nn.utils.clip_grad_norm_(self.params, float(self.hp["grad_clip"])))

    def compute_gradients(self, batch: SampleBatch) -> tuple[list[np.ndarray], dict[str, float]]:
        loss, stats = self.loss(self.to_tensors(batch.flatten()))
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grads = [(p.grad.numpy().copy() if p.grad is not None else np.zeros(p.shape, np.float32)) for p in self.params]
        return grads, stats

    def apply_gradients(self, grads: list[np.ndarray]) -> None:
        if len(grads) != len(self.params):
            raise ValueError(f"apply_gradients: got {len(grads)} arrays for {len(self.params)} parameters")
        for p, g in zip(self.params, grads, strict=True):
            p.grad = torch.as_tensor(g).reshape(p.shape).clone()
        self._clip()
        self.optimizer.step()
        self._weights_changed()

    def update_target(self) -> None:
        """Copy the online network into the target network."""
        self.target.load_state_dict(self.q.state_dict())
        self._weights_changed()

    def get_weights(self) -> dict[str, np.ndarray]:
        """Online and target networks (workers need both for their initial priorities)."""
        out = {k: v.detach().numpy().copy() for k, v in self.q.state_dict().items()}
        out.update({_TARGET_PREFIX + k: v.detach().numpy().copy() for k, v in self.target.state_dict().items()})
        return out

    def set_weights(self, weights: Mapping[str, np.ndarray]) -> None:
        online = {k: torch.as_tensor(np.asarray(v)) for k, v in weights.items() if not k.startswith(_TARGET_PREFIX)}
        target = {
            k[len(_TARGET_PREFIX) :]: torch.as_tensor(np.asarray(v))
            for k, v in weights.items()
            if k.startswith(_TARGET_PREFIX)
        }
        self.q.load_state_dict(online)
        # Weights from an older copy may lack the target: then the online net stands in for it.
        self.target.load_state_dict(target or online)
        self._weights_changed()


def n_step_batch(batch: SampleBatch, *, gamma: float, n: int) -> SampleBatch:
    """A time-major sample batch as the replay optimizers store it (:data:`REPLAY_COLUMNS`, and VALID when it has
    one): observations, actions, n-step returns and discounts, the observation n steps on
    (:func:`crossrl.core.maths.n_step_returns`); the episodes' statistics ride along. DQN's and SAC's postprocessing."""
    valid = batch.get(sb.VALID)
    returns, discounts, last = maths.n_step_returns(
        rewards=batch[sb.REWARDS],
        terminated=batch[sb.TERMINATEDS],
        truncated=batch[sb.TRUNCATEDS],
        valid=valid,
        gamma=gamma,
        n=n,
    )
    envs = np.arange(returns.shape[1])[None, :]
    out = SampleBatch(
        {
            sb.OBS: batch[sb.OBS],
            sb.ACTIONS: batch[sb.ACTIONS],
            sb.N_STEP_RETURNS: returns.astype(np.float32),
            sb.N_STEP_DISCOUNTS: discounts.astype(np.float32),
            sb.N_STEP_NEXT_OBS: batch[sb.NEXT_OBS][last, envs],
        },
        time_major=True,
        episode_returns=batch.episode_returns,
        episode_lengths=batch.episode_lengths,
    )
    if valid is not None:
        out[sb.VALID] = valid
    return out


def linear_epsilon(*, env_steps: int, initial: float, final: float, timesteps: int) -> float:
    """Epsilon after ``env_steps`` env steps: linear from ``initial`` to ``final`` over ``timesteps``, then flat."""
    frac = min(1.0, max(0, env_steps) / max(1, timesteps))
    return initial + frac * (final - initial)


def apex_epsilons(num_workers: int, *, base: float = 0.4, alpha: float = 7.0) -> list[float]:
    """Ape-X's fixed per-worker epsilons ``base ** (1 + alpha * i / (N - 1))``, i = 0..N-1 (Horgan et al. 2018).

    A single worker gets ``base`` (the formula's i = 0 term).
    """
    if num_workers < 1:
        raise ValueError(f"num_workers must be >= 1, got {num_workers}")
    if num_workers == 1:
        return [base]
    return [base ** (1 + alpha * i / (num_workers - 1)) for i in range(num_workers)]
