"""DreamerPolicy: DreamerV3 (Hafner et al. 2023, "Mastering Diverse Domains through World Models") as a policy graph.

Written from the paper (its section 2, eq. 1-12 and appendix B); the parts:

- **World model** (the RSSM, eq. 1): an encoder ``e_t = enc(symlog(x_t))``; a GRU sequence model
  ``h_t = f(h_{t-1}, z_{t-1}, a_{t-1})``; a representation model (the posterior) ``z_t ~ q(z | h_t, e_t)`` and a
  dynamics predictor (the prior) ``z_t ~ p(z | h_t)``, ``z`` being ``categoricals`` one-hot vectors of ``classes``
  classes each, sampled with straight-through gradients from distributions mixed with 1 % uniform; from the model
  state ``s_t = [h_t, z_t]`` a decoder (symlog squared error), a reward predictor (two-hot over 255 symlog-spaced
  bins, its output layer initialised to zero) and a continue predictor (Bernoulli). Its loss (eq. 2-5): the
  prediction losses plus ``0.5 max(free_bits, KL[sg(q) || p])`` (dynamics) and ``0.1 max(free_bits, KL[q || sg(p)])``
  (representation).
- **Actor and critic**, learned on trajectories the world model imagines ``horizon_H`` steps ahead from every replayed
  state: lambda-returns (eq. 7) on the predicted rewards and continues and the critic's values; the critic is a
  two-hot regression toward them plus a regularizer toward its slow copy (an exponential moving average of it,
  ``slow_critic_decay`` per update); the actor's advantage is ``(R - v) / max(1, S)``, ``S`` a moving average
  (``return_norm_decay``) of the 5th-to-95th percentile range of the returns (eq. 11-12), with an entropy bonus of
  ``entropy_scale``. Discrete actions learn by REINFORCE, continuous ones by backpropagating the returns through the
  imagined dynamics (as the paper's first release and RLlib's DreamerV3 do); the actor's categorical mixes in 1 %
  uniform, its Gaussian has a tanh mean and a standard deviation in [0.1, 1], actions clipped to [-1, 1] and mapped
  affinely to the env's bounds.
- **Sizes**: :data:`DREAMER_SIZES`, the paper's Table B (``XS`` .. ``XL``) and RLlib's smaller debug presets below it,
  so that a ``model_size`` builds the same widths on either engine. Every MLP layer is Linear, LayerNorm, SiLU.
- **Acting** carries the recurrent state per env across fragments (:class:`RecurrentActor`): reset to zeros at each
  episode's first observation, as the world model resets at each replayed ``is_first``.
- **Learning**: one update of ``batch_size_B`` replayed sequences of ``batch_length_T`` steps
  (:meth:`DreamerPolicy.learn_on_replay_batch`), three Adam optimizers (world model, actor, critic) with the paper's
  learning rates, epsilons and global-norm gradient clips. The sync_replay optimizer replays at ``training_ratio``
  (replayed env steps per sampled env step) from a :class:`~crossrl.core.replay.SequenceReplayBuffer`.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

import gymnasium as gym
import numpy as np

from crossrl.core import sample_batch as sb
from crossrl.core.policy import Policy
from crossrl.core.sample_batch import SampleBatch
from crossrl.core.sequence_replay import IS_FIRST, IS_TERMINAL, PREV_ACTIONS
from crossrl.scenarios import metrics as M
from crossrl.scenarios.spec import ModelSpec

if TYPE_CHECKING:
    import torch
    from torch import nn


@dataclass(frozen=True)
class DreamerSize:
    """One ``model_size``: MLP width and depth, GRU units, the latent's categoricals x classes."""

    units: int
    gru_units: int
    categoricals: int
    classes: int
    layers: int


# The paper's Table B (XS .. XL) and, below it, RLlib 2.60's debug presets (ray.rllib.algorithms.dreamerv3.utils),
# which the rllib engine builds from the same name.
DREAMER_SIZES: Final[dict[str, DreamerSize]] = {
    "nano": DreamerSize(16, 16, 4, 4, 1),
    "micro": DreamerSize(32, 32, 8, 8, 1),
    "mini": DreamerSize(64, 64, 16, 16, 1),
    "XXS": DreamerSize(128, 128, 32, 32, 1),
    "XS": DreamerSize(256, 256, 32, 32, 1),
    "S": DreamerSize(512, 512, 32, 32, 2),
    "M": DreamerSize(640, 1024, 32, 32, 3),
    "L": DreamerSize(768, 2048, 32, 32, 4),
    "XL": DreamerSize(1024, 4096, 32, 32, 5),
}

BINS: Final = 255  # two-hot bins, evenly spaced in symlog space over [BIN_LOW, BIN_HIGH]
BIN_LOW: Final = -20.0
BIN_HIGH: Final = 20.0
UNIMIX: Final = 0.01  # uniform mixed into every categorical (latents, discrete actions)
PRED_SCALE, DYN_SCALE, REP_SCALE = 1.0, 0.5, 0.1  # eq. 2's loss scales
MIN_STD, MAX_STD = 0.1, 1.0  # the continuous actor's standard deviation


class NonFiniteError(FloatingPointError):
    """A loss or an action of the DreamerV3 policy is NaN or infinite: training diverged."""


# -- pure maths (torch) ----------------------------------------------------------------------------------------------
def symlog(x: torch.Tensor) -> torch.Tensor:
    """``sign(x) log(1 + |x|)`` (eq. 9)."""
    import torch

    return torch.sign(x) * torch.log1p(torch.abs(x))


def symexp(x: torch.Tensor) -> torch.Tensor:
    """The inverse of :func:`symlog`: ``sign(x) (exp(|x|) - 1)``."""
    import torch

    return torch.sign(x) * torch.expm1(torch.abs(x))


def bins(device: Any = None) -> torch.Tensor:
    import torch

    return torch.linspace(BIN_LOW, BIN_HIGH, BINS, device=device)


def two_hot(y: torch.Tensor, edges: torch.Tensor) -> torch.Tensor:
    """``y[...]`` (symlog space) as weights on its two nearest ``edges``, ``[..., len(edges)]``; the weights sum to
    one and their mean over the edges is ``y`` (clipped to the edges' range)."""
    import torch

    y = y.clamp(float(edges[0]), float(edges[-1]))
    idx = (torch.searchsorted(edges, y.contiguous(), right=True) - 1).clamp(0, len(edges) - 2)
    lo, hi = edges[idx], edges[idx + 1]
    w_hi = ((y - lo) / (hi - lo)).clamp(0.0, 1.0)
    out = torch.zeros(*y.shape, len(edges), dtype=y.dtype, device=y.device)
    out.scatter_(-1, idx.unsqueeze(-1), (1.0 - w_hi).unsqueeze(-1))
    out.scatter_add_(-1, (idx + 1).unsqueeze(-1), w_hi.unsqueeze(-1))
    return out


def two_hot_mean(logits: torch.Tensor, edges: torch.Tensor) -> torch.Tensor:
    """The value a two-hot head predicts: ``symexp`` of the softmax-weighted mean of ``edges``."""
    import torch

    return symexp((torch.softmax(logits, -1) * edges).sum(-1))


def two_hot_loss(logits: torch.Tensor, target: torch.Tensor, edges: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of a two-hot head against ``symlog(target)`` encoded two-hot, per element."""
    import torch

    return -(two_hot(symlog(target), edges) * torch.log_softmax(logits, -1)).sum(-1)


def lambda_returns(
    rewards: torch.Tensor, continues: torch.Tensor, values: torch.Tensor, *, gamma: float, lam: float
) -> torch.Tensor:
    """Eq. 7 over an imagined trajectory: ``R_t = r_{t+1} + gamma c_{t+1} ((1 - lam) v_{t+1} + lam R_{t+1})``,
    ``R_H = v_H``. ``rewards`` and ``continues`` are ``[H, N]`` (those reached by step t's action, so index 0 is
    ``r_1``), ``values`` ``[H + 1, N]``; returns ``[H, N]`` (``R_0 .. R_{H-1}``)."""
    import torch

    horizon = rewards.shape[0]
    out = []
    last = values[horizon]
    for t in reversed(range(horizon)):
        last = rewards[t] + gamma * continues[t] * ((1.0 - lam) * values[t + 1] + lam * last)
        out.append(last)
    return torch.stack(out[::-1])


def kl_categorical(post_logits: torch.Tensor, prior_logits: torch.Tensor) -> torch.Tensor:
    """``KL[q || p]`` of the latents (logits ``[..., categoricals, classes]``, unimix applied), summed over the
    categoricals."""
    import torch

    log_q, log_p = _unimix_log_probs(post_logits), _unimix_log_probs(prior_logits)
    return (torch.exp(log_q) * (log_q - log_p)).sum((-2, -1))


def _unimix_log_probs(logits: torch.Tensor) -> torch.Tensor:
    import torch

    probs = (1.0 - UNIMIX) * torch.softmax(logits, -1) + UNIMIX / logits.shape[-1]
    return torch.log(probs)


def percentile_range(x: torch.Tensor) -> float:
    """The 5th-to-95th percentile range of ``x`` (eq. 12's ``S`` before its moving average)."""
    import torch

    flat = x.detach().reshape(-1).float()
    return float(torch.quantile(flat, 0.95) - torch.quantile(flat, 0.05))


# -- the policy ------------------------------------------------------------------------------------------------------
@dataclass
class _ActingState:
    """The recurrent state of ``n`` envs while acting: ``h``, ``z`` and the previous (unit) action, and which envs
    reset after their next step (the step that starts their next episode)."""

    h: torch.Tensor
    z: torch.Tensor
    prev_action: torch.Tensor
    reset_after_next: np.ndarray


class DreamerPolicy(Policy):
    """DreamerV3 over a flat ``Box`` observation and a ``Discrete`` or bounded ``Box`` action space."""

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
        if not isinstance(observation_space, gym.spaces.Box):
            raise TypeError(f"DreamerPolicy (dreamer) needs a Box observation space, got {observation_space}")
        if model.conv:
            raise TypeError("dreamer runs flat observations only (algorithm.model.conv must be empty)")
        if isinstance(action_space, gym.spaces.Discrete):
            self.discrete = True
            self.num_actions = int(action_space.n)
            self.act_dim = self.num_actions  # one-hot into the dynamics
            self.act_shape: tuple[int, ...] = ()
        elif isinstance(action_space, gym.spaces.Box):
            if not (np.all(np.isfinite(action_space.low)) and np.all(np.isfinite(action_space.high))):
                raise TypeError(f"DreamerPolicy (dreamer) needs bounded Box actions, got {action_space}")
            self.discrete = False
            self.act_shape = tuple(int(n) for n in action_space.shape)
            self.act_dim = int(np.prod(self.act_shape))
            low, high = action_space.low.reshape(-1), action_space.high.reshape(-1)
            self.act_scale = ((high - low) / 2.0).astype(np.float32)
            self.act_mid = ((high + low) / 2.0).astype(np.float32)
        else:
            raise TypeError(f"DreamerPolicy (dreamer) takes Discrete or Box actions, got {action_space}")
        self.obs_dim = int(np.prod(observation_space.shape))
        self.size = DREAMER_SIZES[str(self.hp["model_size"])]
        self.batch_size_B = int(self.hp["batch_size_B"])
        self.batch_length_T = int(self.hp["batch_length_T"])
        self.horizon = int(self.hp["horizon_H"])
        self.gamma = float(self.hp["gamma"])
        self.lam = float(self.hp["gae_lambda"])
        self.entropy_scale = float(self.hp["entropy_scale"])
        self.free_bits = float(self.hp["free_bits"])
        # how the sync_replay optimizer replays it (crossrl.core.optimizers.sync_replay.ReplayPolicy)
        self.replay_ratio = float(self.hp["training_ratio"])
        self.replay_batch_size = self.batch_size_B * self.batch_length_T
        self.learning_starts = self.replay_batch_size  # RLlib's too: one batch's worth of env steps before learning
        self.target_update: int | None = None
        self.prioritized = False
        self.epsilon = 0.0
        self.updates = 0
        self.return_scale = 0.0  # eq. 12's moving average S of the returns' percentile range (0 before any update)
        self._torch: _Nets | None = None
        self._pending: dict[str, np.ndarray] | None = None
        self._acting: dict[int, _ActingState] = {}

    def rollout_fragment(self, num_envs: int) -> int:
        """Env steps per env and sample call so that one update of B x T follows every ``B x T / training_ratio``
        env steps sampled (the rule the rllib adapter gives RLlib's DreamerV3 too)."""
        return max(1, round(self.replay_batch_size / self.replay_ratio / num_envs))

    def _nets(self) -> _Nets:
        if self._torch is None:
            self._torch = _Nets(self)
            if self._pending is not None:
                self._torch.load(self._pending)
                self._pending = None
        return self._torch

    # -- acting ----------------------------------------------------------------------------------------------------
    def exploration_epsilon(self, env_steps: int) -> float:
        """0: the actor's own distribution explores (DreamerV3 has no epsilon)."""
        return 0.0

    def set_epsilon(self, epsilon: float) -> None:
        """Nothing: DreamerV3 explores by sampling its actor."""

    def fragment_actor(self, *, num_steps: int, num_envs: int) -> RecurrentActor:
        return RecurrentActor(self, num_steps, num_envs)

    def acting_state(self, num_envs: int) -> _ActingState:
        """The recurrent state of ``num_envs`` envs, kept across fragments (zeros at first)."""
        state = self._acting.get(num_envs)
        if state is None:
            import torch

            state = _ActingState(
                h=torch.zeros(num_envs, self.size.gru_units),
                z=torch.zeros(num_envs, self.size.categoricals * self.size.classes),
                prev_action=torch.zeros(num_envs, self.act_dim),
                reset_after_next=np.zeros(num_envs, bool),
            )
            self._acting[num_envs] = state
        return state

    def reset_acting_state(self) -> None:
        """Forget every env's recurrent state (new episodes everywhere)."""
        self._acting.clear()

    def act(self, state: _ActingState, obs: np.ndarray, *, explore: bool) -> np.ndarray:
        """One step of acting: the model state from ``obs`` and ``state`` (updated in place), then an action."""
        import torch

        nets = self._nets()
        with torch.no_grad():
            x = torch.as_tensor(np.asarray(obs, np.float32).reshape(len(obs), self.obs_dim))
            h = nets.step_h(state.h, state.z, state.prev_action)
            z = nets.sample_latent(nets.posterior(torch.cat([h, nets.encoder(symlog(x))], -1)))
            unit, _, _ = nets.act(torch.cat([h, z], -1), explore=explore)
            if not torch.isfinite(unit).all():
                raise NonFiniteError("dreamer: an action is not finite (the actor diverged)")
            state.h, state.z, state.prev_action = h, z, unit
        return self._env_actions(unit.numpy())

    def _env_actions(self, unit: np.ndarray) -> np.ndarray:
        if self.discrete:
            return unit.argmax(-1).astype(np.int64)
        actions = self.act_mid + self.act_scale * np.clip(unit, -1.0, 1.0)
        return actions.astype(np.float32).reshape(len(unit), *self.act_shape)

    def unit_actions(self, actions: np.ndarray) -> np.ndarray:
        """Env actions as the dynamics take them: one-hot, or in [-1, 1]; ``[..., act_dim]``."""
        actions = np.asarray(actions)
        if self.discrete:
            return np.eye(self.num_actions, dtype=np.float32)[actions.astype(np.int64)]
        flat = actions.reshape(*actions.shape[: actions.ndim - len(self.act_shape)], self.act_dim)
        return np.clip((flat - self.act_mid) / self.act_scale, -1.0, 1.0).astype(np.float32)

    def compute_actions(self, obs: np.ndarray, *, explore: bool = True) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Actions for ``obs[B, ...]``, continuing the recurrent state of a batch of ``B`` envs (a caller that starts
        new episodes calls :meth:`reset_acting_state` first)."""
        return self.act(self.acting_state(len(obs)), obs, explore=explore), {}

    # -- learning --------------------------------------------------------------------------------------------------
    def learn_on_replay_batch(self, batch: Mapping[str, np.ndarray]) -> tuple[dict[str, float], np.ndarray]:
        """One update (world model, then actor and critic in imagination) on ``B`` replayed sequences of ``T``
        steps (:class:`~crossrl.core.replay.SequenceReplayBuffer`'s columns); no priorities (an empty array)."""
        stats = self._nets().update(batch)
        self.updates += 1
        return stats, np.zeros(0, np.float32)

    def loss(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, float]]:
        """The world model's loss (eq. 2) on a replayed ``[B, T]`` batch (the actor's and the critic's follow its
        step in :meth:`learn_on_replay_batch`)."""
        loss, stats, _ = self._nets().world_model_loss(batch)
        return loss, stats

    def learn_on_batch(self, batch: SampleBatch) -> dict[str, float]:
        raise NotImplementedError("dreamer trains on replayed sequences (sync_replay), not on sampled batches")

    def compute_gradients(self, batch: SampleBatch) -> tuple[list[np.ndarray], dict[str, float]]:
        raise NotImplementedError("dreamer trains on replayed sequences (sync_replay), not shipped gradients")

    def apply_gradients(self, grads: list[np.ndarray]) -> None:
        raise NotImplementedError("dreamer trains on replayed sequences (sync_replay), not shipped gradients")

    def update_target(self) -> None:
        """Nothing: the slow critic follows the critic after every update."""

    # -- weights and state -----------------------------------------------------------------------------------------
    def get_weights(self) -> dict[str, np.ndarray]:
        """Every network (world model, actor, critic, slow critic) and the return scale, numpy copies."""
        if self._torch is None and self._pending is not None:
            return {k: v.copy() for k, v in self._pending.items()}
        return self._nets().weights()

    def acting_weights(self) -> dict[str, np.ndarray]:
        """What acting needs: the encoder, the sequence model, the posterior and the actor."""
        return {k: v for k, v in self.get_weights().items() if k.split(".", 1)[0] in _ACTING_MODULES}

    def set_weights(self, weights: Mapping[str, np.ndarray]) -> None:
        if self._torch is None:
            self._pending = {**(self._pending or {}), **{k: np.array(v) for k, v in weights.items()}}
        else:
            self._torch.load(weights)

    def get_state(self) -> dict[str, Any]:
        """The weights, the three Adam optimizers' states, the random generators, the update count and the return
        scale."""
        import torch

        nets = self._nets()
        return {
            "weights": self.get_weights(),
            "optimizer": {name: opt.state_dict() for name, opt in nets.optimizers().items()},
            "rng": self.rng.bit_generator.state,
            "torch_rng": torch.get_rng_state(),
            "updates": self.updates,
            "return_scale": self.return_scale,
        }

    def set_state(self, state: Mapping[str, Any]) -> None:
        """Back to :meth:`get_state`'s state; the learning rates are this policy's hyperparameters'."""
        import torch

        self.set_weights(state["weights"])
        nets = self._nets()
        saved = state.get("optimizer") or {}
        for name, opt in nets.optimizers().items():
            if name in saved:
                opt.load_state_dict(saved[name])
            for group in opt.param_groups:
                group["lr"] = float(self.hp[f"{name}_lr"])
        self.rng.bit_generator.state = state["rng"]
        if state.get("torch_rng") is not None:
            torch.set_rng_state(state["torch_rng"])
        self.updates = int(state.get("updates", 0))
        self.return_scale = float(state.get("return_scale", 0.0))


_ACTING_MODULES: Final = ("encoder", "img_in", "gru", "posterior", "actor")


class RecurrentActor:
    """Acts for one fragment with the policy's recurrent state per env. The evaluator tells it which envs' episodes
    ended at each step (:meth:`ended`); with gymnasium's next-step autoreset the step after (whose action the env
    ignores) resets the env, so an ended env's state goes back to zeros after that step: its new episode's first
    observation meets a fresh state, as the world model's replayed ``is_first`` does."""

    def __init__(self, policy: DreamerPolicy, num_steps: int, num_envs: int) -> None:
        self.policy = policy
        self.state = policy.acting_state(num_envs)
        self.actions: np.ndarray | None = None
        self.num_steps = num_steps

    def __call__(self, obs: np.ndarray, t: int) -> np.ndarray:
        actions = self.policy.act(self.state, obs, explore=True)
        if self.actions is None:
            self.actions = np.empty((self.num_steps, *actions.shape), actions.dtype)
        self.actions[t] = actions
        reset = self.state.reset_after_next
        if reset.any():
            for tensor in (self.state.h, self.state.z, self.state.prev_action):
                tensor[reset] = 0.0
            reset[:] = False
        return actions

    def ended(self, done: np.ndarray) -> None:
        """``done[num_envs]``: which envs' episodes ended at the step just taken."""
        self.state.reset_after_next |= np.asarray(done, bool)

    def columns(self) -> dict[str, np.ndarray]:
        assert self.actions is not None
        return {sb.ACTIONS: self.actions}


def _mlp(in_dim: int, size: DreamerSize, out_dim: int | None, *, zero_out: bool = False) -> nn.Sequential:
    """``size.layers`` x (Linear, LayerNorm, SiLU) of ``size.units``, then a Linear to ``out_dim`` if given (its
    weights zero with ``zero_out``: the reward and critic heads start predicting 0)."""
    from torch import nn

    layers: list[nn.Module] = []
    prev = in_dim
    for _ in range(size.layers):
        layers += [nn.Linear(prev, size.units, bias=False), nn.LayerNorm(size.units), nn.SiLU()]
        prev = size.units
    if out_dim is not None:
        out = nn.Linear(prev, out_dim)
        if zero_out:
            nn.init.zeros_(out.weight)
            nn.init.zeros_(out.bias)
        layers.append(out)
    return nn.Sequential(*layers)


class _Nets:
    """The torch side of a :class:`DreamerPolicy`: the networks, the optimizers and one update."""

    def __init__(self, policy: DreamerPolicy) -> None:
        import torch
        from torch import nn

        self.p = policy
        torch.manual_seed(policy.seed)
        size = policy.size
        latent = size.categoricals * size.classes
        feat = size.gru_units + latent
        self.edges = bins()
        self.encoder = _mlp(policy.obs_dim, size, None)
        self.img_in = _mlp(latent + policy.act_dim, size, None)
        self.gru = nn.GRUCell(size.units, size.gru_units)
        self.prior = _mlp(size.gru_units, size, latent)
        self.posterior = _mlp(size.gru_units + size.units, size, latent)
        self.decoder = _mlp(feat, size, policy.obs_dim)
        self.reward = _mlp(feat, size, BINS, zero_out=True)
        self.cont = _mlp(feat, size, 1)
        self.actor = _mlp(feat, size, policy.act_dim if policy.discrete else 2 * policy.act_dim)
        self.critic = _mlp(feat, size, BINS, zero_out=True)
        self.slow_critic = copy.deepcopy(self.critic).requires_grad_(False)
        self.world_model = nn.ModuleList(
            [self.encoder, self.img_in, self.gru, self.prior, self.posterior, self.decoder, self.reward, self.cont]
        )
        self._optimizers: dict[str, torch.optim.Optimizer] | None = None

    def optimizers(self) -> dict[str, torch.optim.Optimizer]:
        """By the hyperparameter that names each one's learning rate (``<name>_lr``). Built on first use, so an
        evaluator's copy, which only acts, builds none: torch's first optimizer imports ``torch._dynamo``, seconds
        of a worker's first env step (long enough, on a loaded machine, to trip a tight ``budget.stall_seconds``)."""
        if self._optimizers is None:
            import torch

            hp = self.p.hp
            adam, eps = torch.optim.Adam, float(hp["actor_critic_adam_eps"])
            self._optimizers = {
                "world_model": adam(self.world_model.parameters(), lr=float(hp["world_model_lr"]),
                                    eps=float(hp["world_model_adam_eps"])),
                "actor": adam(self.actor.parameters(), lr=float(hp["actor_lr"]), eps=eps),
                "critic": adam(self.critic.parameters(), lr=float(hp["critic_lr"]), eps=eps),
            }  # fmt: skip
        return self._optimizers

    def modules(self) -> dict[str, nn.Module]:
        return {
            "encoder": self.encoder,
            "img_in": self.img_in,
            "gru": self.gru,
            "prior": self.prior,
            "posterior": self.posterior,
            "decoder": self.decoder,
            "reward": self.reward,
            "cont": self.cont,
            "actor": self.actor,
            "critic": self.critic,
            "slow_critic": self.slow_critic,
        }

    def weights(self) -> dict[str, np.ndarray]:
        from crossrl.core.models import module_weights

        out = module_weights(self.modules())
        out["return_scale"] = np.array(self.p.return_scale, np.float32)
        return out

    def load(self, weights: Mapping[str, np.ndarray]) -> None:
        from crossrl.core.models import load_module_weights

        load_module_weights(self.modules(), weights)  # a part of the weights (the acting modules') loads that part
        if "return_scale" in weights:
            self.p.return_scale = float(np.asarray(weights["return_scale"]))

    # -- the model's pieces ----------------------------------------------------------------------------------------
    def step_h(self, h: torch.Tensor, z: torch.Tensor, prev_action: torch.Tensor) -> torch.Tensor:
        import torch

        return self.gru(self.img_in(torch.cat([z, prev_action], -1)), h)

    def sample_latent(self, logits: torch.Tensor) -> torch.Tensor:
        """A one-hot sample per categorical with straight-through gradients, flattened: ``[..., cats x classes]``."""
        import torch

        size = self.p.size
        logits = logits.reshape(*logits.shape[:-1], size.categoricals, size.classes)
        probs = torch.exp(_unimix_log_probs(logits))
        idx = torch.multinomial(probs.reshape(-1, size.classes), 1).reshape(probs.shape[:-1])
        one_hot = torch.nn.functional.one_hot(idx, size.classes).to(probs.dtype)
        return (one_hot + probs - probs.detach()).reshape(*logits.shape[:-2], -1)

    def act(self, feat: torch.Tensor, *, explore: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """An action (one-hot, or in [-1, 1] with straight-through clipping), its log-probability and the
        distribution's entropy, from model states ``feat[N, ...]``."""
        import torch

        out = self.actor(feat)
        if self.p.discrete:
            log_probs = _unimix_log_probs(out)
            idx = torch.multinomial(torch.exp(log_probs), 1)[:, 0] if explore else log_probs.argmax(-1)
            one_hot = torch.nn.functional.one_hot(idx, self.p.num_actions).to(out.dtype)
            logp = (log_probs * one_hot).sum(-1)
            entropy = -(torch.exp(log_probs) * log_probs).sum(-1)
            return one_hot, logp, entropy
        n = self.p.act_dim
        mean = torch.tanh(out[:, :n])
        std = (MAX_STD - MIN_STD) * torch.sigmoid(out[:, n:] + 2.0) + MIN_STD
        dist = torch.distributions.Normal(mean, std)
        raw = dist.rsample() if explore else mean
        unit = raw + (raw.clamp(-1.0, 1.0) - raw).detach()
        return unit, dist.log_prob(raw.detach()).sum(-1), dist.entropy().sum(-1)

    # -- losses ----------------------------------------------------------------------------------------------------
    def tensors(self, batch: Mapping[str, Any]) -> dict[str, torch.Tensor]:
        import torch

        p = self.p

        def t(key: str) -> torch.Tensor:
            return torch.as_tensor(np.require(batch[key], np.float32, "W"))

        obs = t(sb.OBS)
        b, length = obs.shape[:2]
        first = t(IS_FIRST).reshape(b, length)
        first[:, 0] = 1.0  # every sequence starts from the initial state
        return {
            sb.OBS: obs.reshape(b, length, p.obs_dim),
            # as the env took them (one index, or in its bounds): one-hot or in [-1, 1] for the dynamics
            PREV_ACTIONS: torch.as_tensor(p.unit_actions(batch[PREV_ACTIONS])).reshape(b, length, p.act_dim),
            sb.REWARDS: t(sb.REWARDS).reshape(b, length),
            IS_FIRST: first,
            IS_TERMINAL: t(IS_TERMINAL).reshape(b, length),
        }

    def observe(self, batch: Mapping[str, torch.Tensor]) -> tuple[torch.Tensor, ...]:
        """The posterior pass over ``[B, T]``: model states ``h``, ``z`` and the prior's and posterior's logits, each
        ``[B, T, ...]``; the state resets to zeros at every ``is_first``."""
        import torch

        size = self.p.size
        obs = batch[sb.OBS]
        b, length = obs.shape[:2]
        embed = self.encoder(symlog(obs))
        h = obs.new_zeros(b, size.gru_units)
        z = obs.new_zeros(b, size.categoricals * size.classes)
        hs, zs, priors, posts = [], [], [], []
        for t in range(length):
            keep = (1.0 - batch[IS_FIRST][:, t]).unsqueeze(-1)
            h = self.step_h(h * keep, z * keep, batch[PREV_ACTIONS][:, t] * keep)
            prior = self.prior(h)
            post = self.posterior(torch.cat([h, embed[:, t]], -1))
            z = self.sample_latent(post)
            hs.append(h)
            zs.append(z)
            priors.append(prior)
            posts.append(post)
        shape = (b, length, size.categoricals, size.classes)
        return (
            torch.stack(hs, 1),
            torch.stack(zs, 1),
            torch.stack(priors, 1).reshape(shape),
            torch.stack(posts, 1).reshape(shape),
        )

    def world_model_loss(
        self, batch: Mapping[str, torch.Tensor]
    ) -> tuple[torch.Tensor, dict[str, float], tuple[torch.Tensor, torch.Tensor]]:
        """Eq. 2-5 on a ``[B, T]`` batch: the loss, its parts as stats, and the posterior states (``h``, ``z``)."""
        import torch

        h, z, prior, post = self.observe(batch)
        feat = torch.cat([h, z], -1)
        decoder = ((self.decoder(feat) - symlog(batch[sb.OBS])) ** 2).sum(-1)
        reward = two_hot_loss(self.reward(feat), batch[sb.REWARDS], self.edges)
        cont = torch.nn.functional.binary_cross_entropy_with_logits(
            self.cont(feat)[..., 0], 1.0 - batch[IS_TERMINAL], reduction="none"
        )
        kl = kl_categorical(post.detach(), prior)  # KL[q || p]: its value is the representation term's too
        dyn = kl.clamp(min=self.p.free_bits)
        rep = kl_categorical(post, prior.detach()).clamp(min=self.p.free_bits)
        loss = (PRED_SCALE * (decoder + reward + cont) + DYN_SCALE * dyn + REP_SCALE * rep).mean()
        if not torch.isfinite(loss):
            raise NonFiniteError(f"dreamer: the world model's loss is not finite after {self.p.updates} updates")
        stats = {
            M.DIAG_WORLD_MODEL_LOSS: float(loss.detach()),
            M.DIAG_DECODER_LOSS: float(decoder.detach().mean()),
            M.DIAG_REWARD_LOSS: float(reward.detach().mean()),
            M.DIAG_CONTINUE_LOSS: float(cont.detach().mean()),
            "diag.kl": float(kl.detach().mean()),
        }
        return loss, stats, (h.detach(), z.detach())

    def imagine(self, h: torch.Tensor, z: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """``horizon_H`` steps of the prior from states ``h[N]``, ``z[N]`` with the actor: model states ``[H + 1, N,
        ...]``, and per step the actions' log-probabilities and entropies ``[H, N]``."""
        import torch

        feats, logps, entropies = [torch.cat([h, z], -1)], [], []
        for _ in range(self.p.horizon):
            action, logp, entropy = self.act(feats[-1].detach(), explore=True)
            h = self.step_h(h, z, action)
            z = self.sample_latent(self.prior(h))
            feats.append(torch.cat([h, z], -1))
            logps.append(logp)
            entropies.append(entropy)
        return torch.stack(feats), torch.stack(logps), torch.stack(entropies)

    def update(self, replay: Mapping[str, np.ndarray]) -> dict[str, float]:
        import torch

        p, hp = self.p, self.p.hp
        batch = self.tensors(replay)
        wm_loss, stats, (h, z) = self.world_model_loss(batch)
        self.optimizers()["world_model"].zero_grad(set_to_none=True)
        wm_loss.backward()
        stats["diag.world_model_grad_norm"] = float(
            torch.nn.utils.clip_grad_norm_(self.world_model.parameters(), float(hp["world_model_grad_clip"]))
        )
        self.optimizers()["world_model"].step()

        # actor: imagine from every replayed state with the world model and the critic held fixed
        start_cont = (1.0 - batch[IS_TERMINAL]).reshape(-1)
        self.world_model.requires_grad_(False)
        self.critic.requires_grad_(False)
        try:
            feats, logps, entropies = self.imagine(h.reshape(-1, h.shape[-1]), z.reshape(-1, z.shape[-1]))
            rewards = two_hot_mean(self.reward(feats[1:]), self.edges)
            continues = torch.sigmoid(self.cont(feats[1:])[..., 0])
            values = two_hot_mean(self.critic(feats), self.edges)
            returns = lambda_returns(rewards, continues, values, gamma=p.gamma, lam=p.lam)
            with torch.no_grad():
                # each imagined step weighs by the chance the episode reached it: c_0, then gamma c_k per step
                weights = torch.cumprod(torch.cat([start_cont[None], p.gamma * continues[:-1]]), 0)
            decay = float(hp["return_norm_decay"])
            spread = percentile_range(returns)
            p.return_scale = spread if p.updates == 0 else decay * p.return_scale + (1.0 - decay) * spread
            scale = max(1.0, p.return_scale)
            if p.discrete:  # REINFORCE with the normalised advantage
                advantage = ((returns - values[:-1]) / scale).detach()
                objective = advantage * logps
            else:  # the returns backpropagated through the imagined dynamics
                objective = returns / scale
            actor_loss = -(weights * (objective + p.entropy_scale * entropies)).mean()
            self.optimizers()["actor"].zero_grad(set_to_none=True)
            actor_loss.backward()
        finally:
            self.world_model.requires_grad_(True)
            self.critic.requires_grad_(True)
        stats["diag.actor_grad_norm"] = float(
            torch.nn.utils.clip_grad_norm_(self.actor.parameters(), float(hp["actor_critic_grad_clip"]))
        )
        self.optimizers()["actor"].step()

        # critic: two-hot regression toward the returns, and toward the slow critic's values (its regularizer)
        states = feats[:-1].detach()
        logits = self.critic(states)
        with torch.no_grad():
            slow = two_hot_mean(self.slow_critic(states), self.edges)
        target = returns.detach()
        critic_loss = (
            weights * (two_hot_loss(logits, target, self.edges) + two_hot_loss(logits, slow, self.edges))
        ).mean()
        self.optimizers()["critic"].zero_grad(set_to_none=True)
        critic_loss.backward()
        stats["diag.critic_grad_norm"] = float(
            torch.nn.utils.clip_grad_norm_(self.critic.parameters(), float(hp["actor_critic_grad_clip"]))
        )
        self.optimizers()["critic"].step()
        with torch.no_grad():
            for slow_param, param in zip(self.slow_critic.parameters(), self.critic.parameters(), strict=True):
                slow_param.lerp_(param, 1.0 - float(hp["slow_critic_decay"]))
        if not (torch.isfinite(actor_loss) and torch.isfinite(critic_loss)):
            raise NonFiniteError(f"dreamer: the actor's or the critic's loss is not finite after {p.updates} updates")
        stats.update(
            {
                M.POLICY_LOSS: float(actor_loss.detach()),
                M.VALUE_LOSS: float(critic_loss.detach()),
                M.ENTROPY: float(entropies.detach().mean()),
                M.DIAG_RETURN_SCALE: p.return_scale,
                "diag.imagined_return": float(returns.detach().mean()),
            }
        )
        return stats
