"""TorchRL's DreamerV3 (Hafner et al. 2023) behind crossrl's learner protocol: :class:`DreamerLearner`.

Every network and loss is TorchRL 0.14.1's own, assembled as its example (``sota-implementations/dreamer_v3``) does,
with the settings that make them the paper's where TorchRL's defaults are not (docs/fairness.md, "DreamerV3"):

- **World model**: ``symlog`` and a ``DreamerV3MLP`` encoder; ``RSSMPriorV3(recurrent_model="block_gru",
  unimix=0.01)`` and ``RSSMPosteriorV3(use_rms_norm=True, unimix=0.01)`` rolled over a ``B x T`` window by
  ``RSSMRolloutV3``; a ``DreamerV3MLP`` decoder (symlog squared error), a two-hot reward head (``SymExpTwoHot``, its
  output layer zero) and a continue head; its loss ``DreamerV3ModelLoss(kl_mode="separate", lambda_dynamic=0.5,
  lambda_representation=0.1, lambda_continue=1.0, unimix=0.01, free_bits=)``.
- **Actor** in imagination (``DreamerEnv`` over the prior and the reward head, the continue head as its
  ``continuation_model``): ``DreamerV3DiscreteActor`` (one-hot, 1 % uniform) learning by REINFORCE for Discrete
  actions; for Box actions a Gaussian (``IndependentNormal``: a tanh mean, a standard deviation in [0.1, 1], the
  paper's and crossrl's core's, as TorchRL's own example builds it) learning by backpropagating the returns through
  the imagined dynamics. ``DreamerV3ActorLoss(use_reinforce=discrete, entropy_bonus=entropy_scale)`` with
  ``make_value_estimator(ValueEstimators.TDLambda, gamma=, lmbda=)``.
- **Critic**: a two-hot ``DreamerV3MLP`` (output layer zero), ``DreamerV3ValueLoss(value_loss="two_hot",
  slow_critic_regularization=1.0)``, its slow copy ``SoftUpdate(eps=slow_critic_decay)`` after every update.
- **Optimizers**: three ``torch.optim.Adam`` with the paper's learning rates and epsilons and global-norm gradient
  clips (``CROSSRL_SETTINGS["dreamer"]``), as crossrl's core and RLlib run them; not TorchRL's
  ``DreamerV3Optimizer`` (the later release's LaProp with per-parameter clipping, whose learning rates the spec's are
  not).
- **Replay**: a TorchRL ``ReplayBuffer`` over ``LazyTensorStorage(buffer_size)`` with a ``SliceSampler``
  (``fragmented=True``: each env's entries are one trajectory, ``init_key=None``) drawing ``B`` windows of ``T``
  consecutive entries. An entry is the paper's (and crossrl's core's, :mod:`crossrl.core.sequence_replay`): one
  observation with the action that led to it, the reward that came with it and whether it is an episode's first or a
  terminal one; an episode of ``n`` steps is ``n + 1`` entries. The world model starts every window from zeros and
  resets at each ``is_first`` inside it.
- **Acting**: the encoder, then ``RSSMStateEstimatorV3`` (the trained prior and posterior) and the actor, the
  recurrent state (``state``, ``belief``, ``previous_action``) carried by a ``TensorDictPrimer`` on the collector's
  env and reset at each episode's start (``InitTracker``'s ``is_init``): :attr:`DreamerLearner.env_transforms`.

The update: the world model's step, then the actor's on trajectories imagined from every replayed posterior state
(before that step, detached), then the critic's on the same trajectories, then the slow critic: crossrl's core's
order. It replays ``training_ratio`` env steps per sampled one (a fractional remainder carried), starting once
``B x T`` env steps were sampled.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.nn import (
    InteractionType,
    ProbabilisticTensorDictModule,
    ProbabilisticTensorDictSequential,
    TensorDictModule,
    TensorDictSequential,
)
from torch import nn
from torchrl.data import Composite, LazyTensorStorage, ReplayBuffer, Unbounded
from torchrl.data import OneHot as OneHotSpec
from torchrl.data.replay_buffers import SliceSampler
from torchrl.envs import InitTracker, TensorDictPrimer
from torchrl.envs.model_based.dreamer import DreamerEnv
from torchrl.envs.utils import ExplorationType, set_exploration_type
from torchrl.modules import (
    DreamerV3DiscreteActor,
    DreamerV3MLP,
    IndependentNormal,
    RSSMPosteriorV3,
    RSSMPriorV3,
    RSSMRolloutV3,
    RSSMStateEstimatorV3,
    SymExpTwoHot,
    WorldModelWrapper,
)
from torchrl.objectives import DreamerV3ActorLoss, DreamerV3ModelLoss, DreamerV3ValueLoss, SoftUpdate, ValueEstimators
from torchrl.objectives.dreamer_v3 import categorical_kl_terms, symlog

from crossrl.adapters.torchrl.algorithms import (
    REPLAY_DIR,
    check_algorithm,
    load_optimizer,
    native_kwargs,
    optimizer_lr,
    restore_with_replay,
    save_with_replay,
)
from crossrl.core.dreamer_policy import DREAMER_SIZES, MAX_STD, MIN_STD, UNIMIX, NonFiniteError
from crossrl.core.maths import mean_stats
from crossrl.core.models import count_params
from crossrl.scenarios import metrics as M
from crossrl.scenarios.catalog import CROSSRL_SETTINGS
from crossrl.scenarios.spec import Trial

STATE_FORMAT = 1
NUM_BINS = 255  # two-hot bins of the reward and critic heads (TorchRL's default, the paper's)
GRU_BLOCKS = 8  # the block GRU's groups (TorchRL's default, the paper's)
# the replay's entries (one per observation, crossrl's core's columns) and the keys that order them per env
ENTRY_KEYS = ("observation", "prev_action", "reward", "is_first", "is_terminal")
STREAM_KEY, STEP_KEY = "stream", "step"
# the acting policy's recurrent state, carried from step to step by the env's TensorDictPrimer
STATE, BELIEF, PREV_ACTION, IS_INIT = "state", "belief", "previous_action", "is_init"


def recurrent_transforms(*, state_dim: int, belief_dim: int, act_dim: int) -> list[Any]:
    """The transforms the acting policy needs on the collector's env: ``InitTracker`` (``is_init``: an episode's
    first observation) and a ``TensorDictPrimer`` of the recurrent state (zeros at every reset). Module-level, so a
    ``functools.partial`` of it reaches collector worker processes started with spawn."""
    primer = TensorDictPrimer(
        random=False,
        default_value=0.0,
        expand_specs=True,  # to the env's batch (the vector env's envs)
        **{STATE: Unbounded(state_dim), BELIEF: Unbounded(belief_dim), PREV_ACTION: Unbounded(act_dim)},
    )
    return [InitTracker(), primer]


class _ToEnv(nn.Module):
    """The actor's unit action as the env takes it (an index, or in the env's bounds) and as the dynamics take it
    (one-hot, or clipped to [-1, 1]): the next step's ``previous_action``."""

    def __init__(self, *, discrete: bool, low: Sequence[float] | None = None, high: Sequence[float] | None = None):
        super().__init__()
        self.discrete = discrete
        if not discrete:
            low_t, high_t = torch.as_tensor(low, dtype=torch.float32), torch.as_tensor(high, dtype=torch.float32)
            self.register_buffer("action_mid", (high_t + low_t) / 2.0)
            self.register_buffer("action_scale", (high_t - low_t) / 2.0)

    def forward(self, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.discrete:
            unit = action.float()
            return unit.argmax(-1), unit
        unit = action.clamp(-1.0, 1.0)
        mid, scale = self.get_buffer("action_mid"), self.get_buffer("action_scale")
        return mid + scale * unit, unit


class _GaussianHead(nn.Module):
    """The continuous actor's parameters from a ``DreamerV3MLP`` of ``2 x act_dim`` outputs: a tanh mean and a
    standard deviation ``(MAX - MIN) sigmoid(x + 2) + MIN`` (crossrl's core's, the paper's)."""

    def __init__(self, in_dim: int, act_dim: int, *, depth: int, units: int) -> None:
        super().__init__()
        self.net = DreamerV3MLP(in_dim, 2 * act_dim, depth=depth, num_cells=units, outscale=0.01)
        self.act_dim = act_dim

    def forward(self, state: torch.Tensor, belief: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.net(state, belief)
        loc, raw = out[..., : self.act_dim], out[..., self.act_dim :]
        return loc.tanh(), (MAX_STD - MIN_STD) * torch.sigmoid(raw + 2.0) + MIN_STD


def _finite(x: torch.Tensor) -> float:
    return float(x.detach())


class DreamerLearner:
    """DreamerV3 from TorchRL's modules and losses on flat observations and Discrete or bounded Box actions (see the
    module's docstring); the learner protocol of :mod:`crossrl.adapters.torchrl.algorithms`."""

    def __init__(
        self,
        *,
        trial: Trial,
        obs_shape: Sequence[int],
        n_actions: int | None = None,
        action_shape: Sequence[int] | None = None,
        action_low: Sequence[float] | None = None,
        action_high: Sequence[float] | None = None,
    ) -> None:
        if trial.model.conv or len(obs_shape) != 1:
            raise ValueError(
                f"torchrl: dreamer takes flat vector observations; {trial.env.id} observes shape {list(obs_shape)}"
                + (" and algorithm.model.conv is set" if trial.model.conv else "")
                + " (no engine runs dreamer on images yet)"
            )
        self.trial = trial
        self.algo = trial.algorithm
        self.discrete = n_actions is not None
        if self.discrete:
            self.dims: dict[str, Any] = {"obs_shape": list(obs_shape), "n_actions": int(n_actions or 0)}
            act_dim = int(n_actions or 0)
        else:
            if action_shape is None or action_low is None or action_high is None:
                raise ValueError(f"torchrl: dreamer needs Discrete or bounded Box actions; {trial.env.id} has neither")
            low, high = np.asarray(action_low, np.float64), np.asarray(action_high, np.float64)
            if not (np.all(np.isfinite(low)) and np.all(np.isfinite(high))):
                raise ValueError(f"torchrl: dreamer needs bounded Box actions; {trial.env.id}'s are unbounded")
            act_dim = math.prod(action_shape)
            if len(action_shape) != 1:
                raise ValueError(
                    f"torchrl: dreamer takes one-dimensional Box actions; {trial.env.id}'s are {list(action_shape)}"
                )
            self.dims = {"obs_shape": list(obs_shape), "action_shape": list(action_shape),
                         "action_low": low.tolist(), "action_high": high.tolist()}  # fmt: skip
        hp = trial.hyperparams
        self.settings = dict(CROSSRL_SETTINGS["dreamer"])
        self.size = DREAMER_SIZES[str(hp["model_size"])]
        size = self.size
        self.obs_dim, self.act_dim = int(obs_shape[0]), act_dim
        self.state_dim = size.categoricals * size.classes
        feat = self.state_dim + size.gru_units
        self.batch_size_B, self.batch_length_T = int(hp["batch_size_B"]), int(hp["batch_length_T"])
        self.horizon = int(hp["horizon_H"])
        self.gamma, self.lam = float(hp["gamma"]), float(hp["gae_lambda"])
        self.ratio = float(hp["training_ratio"])
        self.replayed = self.batch_size_B * self.batch_length_T
        self.learning_starts = self.replayed  # crossrl's core's and RLlib's: one batch's env steps first
        layers, units = size.layers, size.units

        # -- networks ------------------------------------------------------------------------------------------
        self.encoder_net = DreamerV3MLP(self.obs_dim, None, depth=layers, num_cells=units)
        self.prior_net = RSSMPriorV3(
            action_shape=(act_dim,), hidden_dim=units, rnn_hidden_dim=size.gru_units,
            num_categoricals=size.categoricals, num_classes=size.classes, action_dim=act_dim,
            recurrent_model="block_gru", num_blocks=GRU_BLOCKS, prior_num_layers=layers, unimix=UNIMIX,
        )  # fmt: skip
        self.posterior_net = RSSMPosteriorV3(
            hidden_dim=units, num_categoricals=size.categoricals, num_classes=size.classes,
            rnn_hidden_dim=size.gru_units, obs_embed_dim=units, use_rms_norm=True, num_layers=layers, unimix=UNIMIX,
        )  # fmt: skip
        self.decoder_net = DreamerV3MLP(feat, self.obs_dim, depth=layers, num_cells=units)
        self.reward_net = DreamerV3MLP(feat, NUM_BINS, depth=layers, num_cells=units, outscale=0.0)
        self.cont_net = DreamerV3MLP(feat, 1, depth=layers, num_cells=units)
        self.value_net = DreamerV3MLP(feat, NUM_BINS, depth=layers, num_cells=units, outscale=0.0)
        self.two_hot = SymExpTwoHot(NUM_BINS)

        nxt = functools.partial(lambda key: ("next", key))
        self.world_model = TensorDictSequential(
            TensorDictModule(symlog, in_keys=[nxt("observation")], out_keys=[nxt("symlog_observation")]),
            TensorDictModule(self.encoder_net, in_keys=[nxt("symlog_observation")], out_keys=[nxt("encoded_latents")]),
            RSSMRolloutV3(
                TensorDictModule(self.prior_net, in_keys=[STATE, BELIEF, "prev_action"],
                                 out_keys=[nxt("prior_logits"), nxt(STATE), nxt(BELIEF)]),
                TensorDictModule(self.posterior_net, in_keys=[nxt(BELIEF), nxt("encoded_latents")],
                                 out_keys=[nxt("posterior_logits"), nxt(STATE)]),
                reset_key="is_first",
                action_key="prev_action",
            ),
            TensorDictModule(self.decoder_net, in_keys=[nxt(STATE), nxt(BELIEF)], out_keys=[nxt("reco_observation")]),
            TensorDictModule(self.reward_net, in_keys=[nxt(STATE), nxt(BELIEF)], out_keys=[nxt("reward_logits")]),
            TensorDictModule(self.two_hot, in_keys=[nxt("reward_logits")], out_keys=[nxt("reward")]),
            TensorDictModule(self.cont_net, in_keys=[nxt(STATE), nxt(BELIEF)], out_keys=[nxt("continue_pred")]),
        )  # fmt: skip
        if self.discrete:
            self.actor = DreamerV3DiscreteActor(
                feat, act_dim, depth=layers, num_cells=units, unimix=UNIMIX, in_keys=[STATE, BELIEF]
            )
        else:
            self.actor = ProbabilisticTensorDictSequential(
                TensorDictModule(
                    _GaussianHead(feat, act_dim, depth=layers, units=units),
                    in_keys=[STATE, BELIEF],
                    out_keys=["loc", "scale"],
                ),
                ProbabilisticTensorDictModule(
                    in_keys=["loc", "scale"],
                    out_keys=["action"],
                    distribution_class=IndependentNormal,
                    default_interaction_type=InteractionType.RANDOM,
                    return_log_prob=True,
                    log_prob_key="action_log_prob",
                ),
            )
        self.value_model = TensorDictSequential(
            TensorDictModule(self.value_net, in_keys=[STATE, BELIEF], out_keys=["state_value_logits"]),
            TensorDictModule(self.two_hot, in_keys=["state_value_logits"], out_keys=["state_value"]),
        )
        self.imagination = self._imagination_env()
        self.continuation = TensorDictSequential(
            TensorDictModule(self.cont_net, in_keys=[STATE, BELIEF], out_keys=["continue_logits"]),
            TensorDictModule(nn.Sigmoid(), in_keys=["continue_logits"], out_keys=["continuation"]),
        )
        to_env = _ToEnv(discrete=self.discrete, low=self.dims.get("action_low"), high=self.dims.get("action_high"))
        self.policy = TensorDictSequential(
            TensorDictModule(symlog, in_keys=["observation"], out_keys=["symlog_observation"]),
            TensorDictModule(self.encoder_net, in_keys=["symlog_observation"], out_keys=["encoded_latents"]),
            RSSMStateEstimatorV3(
                self.prior_net,
                self.posterior_net,
                in_keys=[STATE, BELIEF, PREV_ACTION, "encoded_latents", IS_INIT],
                out_keys=[STATE, BELIEF],
            ),
            self.actor,
            TensorDictModule(to_env, in_keys=["action"], out_keys=["action", PREV_ACTION]),
        )
        self.env_transforms: Callable[[], list[Any]] = functools.partial(
            recurrent_transforms, state_dim=self.state_dim, belief_dim=size.gru_units, act_dim=act_dim
        )

        # -- losses -------------------------------------------------------------------------------------------
        self.model_loss_kwargs: dict[str, Any] = {
            "kl_mode": "separate",  # the paper's two KL terms (TorchRL's default: one balanced term)
            "lambda_dynamic": 0.5,  # the paper's beta_dyn (TorchRL's default 1.0)
            "lambda_representation": 0.1,
            "lambda_continue": 1.0,  # the continue head's loss (TorchRL's default 0: off)
            "unimix": UNIMIX,  # the KL's categoricals mixed as the latents are (TorchRL's default 0)
            "free_bits": float(hp["free_bits"]),
            "reco_symlog": False,  # the decoder predicts symlog(x) itself: the target is symlog(x), used as it is
            **native_kwargs(trial, "loss"),
        }
        self.model_loss = DreamerV3ModelLoss(self.world_model, **self.model_loss_kwargs)
        self.model_loss.set_keys(pixels="symlog_observation", reco_pixels="reco_observation")
        self.actor_loss_kwargs: dict[str, Any] = {
            "continuation_model": self.continuation,
            "imagination_horizon": self.horizon,
            "entropy_bonus": float(hp["entropy_scale"]),
            "use_reinforce": self.discrete,  # REINFORCE for Discrete, the returns' gradient for Box (crossrl's core)
            "return_normalization_rate": 1.0 - float(self.settings["return_norm_decay"]),
        }
        self.actor_loss = DreamerV3ActorLoss(self.actor, self.value_model, self.imagination, **self.actor_loss_kwargs)
        self.actor_loss.make_value_estimator(ValueEstimators.TDLambda, gamma=self.gamma, lmbda=self.lam)
        self.value_loss = DreamerV3ValueLoss(
            self.value_model, value_loss="two_hot", actor_loss=self.actor_loss, slow_critic_regularization=1.0
        )
        self.slow_critic = SoftUpdate(self.value_loss, eps=float(self.settings["slow_critic_decay"]))

        # -- optimizers (the paper's Adam and clips, as crossrl's core and RLlib run them) ---------------------
        wm_params = [p for m in self._world_model_modules().values() for p in m.parameters()]
        self.params = {
            "world_model": wm_params,
            "actor": list(self.actor.parameters()),
            "critic": list(self.value_net.parameters()),
        }
        eps = {"world_model": self.settings["world_model_adam_eps"], "actor": self.settings["actor_critic_adam_eps"],
               "critic": self.settings["actor_critic_adam_eps"]}  # fmt: skip
        self.clips = {"world_model": float(self.settings["world_model_grad_clip"]),
                      "actor": float(self.settings["actor_critic_grad_clip"]),
                      "critic": float(self.settings["actor_critic_grad_clip"])}  # fmt: skip
        self.optims = {  # the trial's native.torchrl.optimizer keyword arguments over crossrl's own
            name: torch.optim.Adam(
                params, **{"lr": float(hp[f"{name}_lr"]), "eps": float(eps[name]), **native_kwargs(trial, "optimizer")}
            )
            for name, params in self.params.items()
        }

        # -- replay -------------------------------------------------------------------------------------------
        self.buffer = ReplayBuffer(
            storage=LazyTensorStorage(int(hp["buffer_size"])),
            sampler=SliceSampler(
                slice_len=self.batch_length_T,
                traj_key=STREAM_KEY,
                step_key=STEP_KEY,
                fragmented=True,  # each env's entries, wherever they sit in the storage
                init_key=None,  # the entries' own is_first; the window's start is reset in :meth:`update`
                truncated_key=None,
                strict_length=True,
            ),
            batch_size=self.replayed,
        )
        self._stream_steps: dict[int, int] = {}  # env stream -> entries written so far (the next entry's step)
        self._held: dict[int, int] = {}  # env stream -> entries written since the replay was last empty
        self._sampled = 0
        self._owed = 0.0  # replayed env steps owed under training_ratio (a fractional remainder carried)
        self.updates = 0
        self.refill = 0  # after a restore without the replay: no update until it holds this many entries again
        self.always_sync = False
        self.point_env_steps = int(self.settings["steps_per_iteration"])

    def _imagination_env(self) -> DreamerEnv:
        """TorchRL's ``DreamerEnv`` over the prior (the transition) and the reward head, on the model state."""
        transition = TensorDictModule(
            self.prior_net, in_keys=[STATE, BELIEF, "action"], out_keys=["prior_logits", STATE, BELIEF]
        )
        reward = TensorDictSequential(
            TensorDictModule(self.reward_net, in_keys=[STATE, BELIEF], out_keys=["reward_logits"]),
            TensorDictModule(self.two_hot, in_keys=["reward_logits"], out_keys=["reward"]),
        )
        env = DreamerEnv(
            world_model=WorldModelWrapper(transition, reward),
            prior_shape=torch.Size([self.state_dim]),
            belief_shape=torch.Size([self.size.gru_units]),
        )
        state = Composite({STATE: Unbounded(self.state_dim), BELIEF: Unbounded(self.size.gru_units)})
        env.observation_spec = state.clone()
        env.state_spec = state.clone()
        env.action_spec = OneHotSpec(self.act_dim) if self.discrete else Unbounded(self.act_dim)
        env.reward_spec = Unbounded(1)
        return env

    def _world_model_modules(self) -> dict[str, nn.Module]:
        return {"encoder": self.encoder_net, "prior": self.prior_net, "posterior": self.posterior_net,
                "decoder": self.decoder_net, "reward": self.reward_net, "continue": self.cont_net}  # fmt: skip

    # -- replay ---------------------------------------------------------------------------------------------------
    def store(self, data: TensorDictBase) -> int:
        """The collected batch (``[..., T]``, time last) as replay entries, env by env; returns the entries written.

        Before each step that starts an episode (``is_init``), its first observation (no action, reward 0,
        ``is_first``); after every step, the next observation with the step's action (``previous_action``: the
        policy's unit action, one-hot or clipped to [-1, 1]), reward and termination."""
        length = data.shape[-1]
        flat = data.reshape(-1, length)
        written = 0
        for stream in range(flat.shape[0]):
            row = flat[stream]
            starts = row.get(IS_INIT).reshape(length).bool()
            n_first = int(starts.sum())
            total = length + n_first
            after = torch.arange(length) + torch.cumsum(starts.long(), 0)
            first = after[starts] - 1
            obs = torch.zeros(total, self.obs_dim)
            obs[after] = row.get(("next", "observation")).reshape(length, -1).float()
            obs[first] = row.get("observation").reshape(length, -1)[starts].float()
            prev = torch.zeros(total, self.act_dim)
            prev[after] = row.get(PREV_ACTION).reshape(length, -1).float()
            reward = torch.zeros(total, 1)
            reward[after] = row.get(("next", "reward")).reshape(length, 1).float()
            is_first = torch.zeros(total, 1, dtype=torch.bool)
            is_first[first] = True
            terminal = torch.zeros(total, 1, dtype=torch.bool)
            terminal[after] = row.get(("next", "terminated")).reshape(length, 1).bool()
            step0 = self._stream_steps.get(stream, 0)
            self._stream_steps[stream] = step0 + total
            self._held[stream] = self._held.get(stream, 0) + total
            entries = TensorDict(
                {
                    "observation": obs,
                    "prev_action": prev,
                    "reward": reward,
                    "is_first": is_first,
                    "is_terminal": terminal,
                    STREAM_KEY: torch.full((total,), stream, dtype=torch.int64),
                    STEP_KEY: torch.arange(step0, step0 + total, dtype=torch.int64),
                },
                batch_size=[total],
            )
            self.buffer.extend(entries)
            written += total
        return written

    def can_sample(self) -> bool:
        """Some env's stream holds a whole window of ``batch_length_T`` entries."""
        return any(n >= self.batch_length_T for n in self._held.values()) and len(self.buffer) >= self.refill

    def sample(self) -> TensorDictBase:
        """``B`` windows of ``T`` consecutive entries of one env each, as the world model's input ``[B, T]``: the
        entries under ``next`` (the loss's targets), the model state zero at every window's start."""
        batch = self.buffer.sample().reshape(self.batch_size_B, self.batch_length_T)
        b, t = batch.shape
        return TensorDict(
            {
                STATE: torch.zeros(b, t, self.state_dim),
                BELIEF: torch.zeros(b, t, self.size.gru_units),
                "prev_action": batch.get("prev_action"),
                "is_first": batch.get("is_first"),
                "next": {
                    "observation": batch.get("observation"),
                    "reward": batch.get("reward"),
                    "terminated": batch.get("is_terminal"),
                    "done": batch.get("is_terminal"),
                },
            },
            batch_size=[b, t],
        )

    # -- learning -------------------------------------------------------------------------------------------------
    def learn(self, data: TensorDictBase) -> tuple[int, dict[str, float]]:
        """Store the batch; once ``B x T`` env steps were sampled, one update of ``B x T`` replayed entries per
        ``B x T / training_ratio`` env steps sampled (a fractional remainder carried to the next batch)."""
        frames = data.numel()
        self._sampled += frames
        self.store(data)
        if self._sampled < self.learning_starts or not self.can_sample():
            return 0, self.diagnostics()
        self._owed += frames * self.ratio
        stats: list[dict[str, float]] = []
        while self._owed >= self.replayed:
            stats.append(self.update())
            self._owed -= self.replayed
        return len(stats) * self.replayed, {**mean_stats(stats), **self.diagnostics()}

    def _step(self, name: str, loss: torch.Tensor) -> float:
        optim = self.optims[name]
        optim.zero_grad(set_to_none=True)
        loss.backward()
        norm = float(torch.nn.utils.clip_grad_norm_(self.params[name], self.clips[name]))
        optim.step()
        return norm

    def update(self) -> dict[str, float]:
        """One DreamerV3 update on ``B`` replayed windows: world model, actor, critic, slow critic; its losses under
        crossrl's core's names."""
        batch = self.sample()
        model_out, model_td = self.model_loss(batch)
        parts = {k: v.sum() for k, v in model_out.items() if k.startswith("loss_")}
        wm_loss = sum(parts.values())
        if not torch.isfinite(wm_loss):
            raise NonFiniteError(f"dreamer: the world model's loss is not finite after {self.updates} updates")
        stats = {
            M.DIAG_WORLD_MODEL_LOSS: _finite(wm_loss),
            M.DIAG_DECODER_LOSS: _finite(parts["loss_model_reco"]),
            M.DIAG_REWARD_LOSS: _finite(parts["loss_model_reward"]),
            M.DIAG_CONTINUE_LOSS: _finite(parts.get("loss_model_continue", torch.zeros(()))),
        }
        with torch.no_grad():
            kl, _ = categorical_kl_terms(
                model_td.get(("next", "posterior_logits")), model_td.get(("next", "prior_logits")),
                free_nats=0.0, unimix=UNIMIX,
            )  # fmt: skip
        stats["diag.kl"] = float(kl)
        stats["diag.world_model_grad_norm"] = self._step("world_model", wm_loss)

        # imagination from every replayed posterior state (computed before the world model's step, detached)
        starts = TensorDict(
            {STATE: model_td.get(("next", STATE)).reshape(-1, self.state_dim),
             BELIEF: model_td.get(("next", BELIEF)).reshape(-1, self.size.gru_units)},
            batch_size=[self.replayed],
        )  # fmt: skip
        actor_out, fake = self.actor_loss(starts)
        actor_loss = actor_out["loss_actor"]
        stats["diag.actor_grad_norm"] = self._step("actor", actor_loss)
        value_out, _ = self.value_loss(fake)
        critic_loss = value_out["loss_value"]
        stats["diag.critic_grad_norm"] = self._step("critic", critic_loss)
        self.slow_critic.step()
        if not (torch.isfinite(actor_loss) and torch.isfinite(critic_loss)):
            raise NonFiniteError(
                f"dreamer: the actor's or the critic's loss is not finite after {self.updates} updates"
            )
        self.updates += 1
        stats.update(
            {
                M.POLICY_LOSS: _finite(actor_loss),
                M.VALUE_LOSS: _finite(critic_loss),
                M.ENTROPY: _finite(actor_out["actor_entropy"]),
                M.DIAG_RETURN_SCALE: _finite(actor_out["return_scale"]),
                "diag.imagined_return": _finite(fake.get("lambda_target").mean()),
            }
        )
        return stats

    def diagnostics(self) -> dict[str, float]:
        """Reported at every point, learning or not: the replay's entries and the updates so far."""
        return {M.DIAG_REPLAY_SIZE: float(len(self.buffer)), M.DIAG_UPDATES: float(self.updates)}

    # -- acting ---------------------------------------------------------------------------------------------------
    def act_fn(self, *, deterministic: bool) -> RecurrentAct:
        """The policy for ONE observation at a time, through the recurrent state (cleared by ``reset()``, which
        `crossrl evaluate` calls at each episode's start): the actor's mode (``deterministic``) or a sample."""
        return RecurrentAct(self, deterministic=deterministic)

    # -- checkpoints ----------------------------------------------------------------------------------------------
    def networks(self) -> dict[str, nn.Module]:
        return {**self._world_model_modules(), "actor": self.actor, "critic": self.value_net}

    def state_dict(self) -> dict[str, Any]:
        """Every network, the slow critic, the return normalisation's statistics, the three Adams' states, the
        counters and each env stream's next step; not the replay (:meth:`save`)."""
        return {
            "format": STATE_FORMAT,
            "algorithm": self.algo,
            "dims": self.dims,
            "networks": {name: net.state_dict() for name, net in self.networks().items()},
            "slow_critic": {k: v.detach().clone() for k, v in self.value_loss.target_value_model_params.items(True, True)},
            "return_norm": {k: v.detach().clone() for k, v in self.actor_loss.retnorm.state_dict().items()},
            "optim": {name: optim.state_dict() for name, optim in self.optims.items()},
            "counters": {"sampled": self._sampled, "owed": self._owed, "updates": self.updates,
                         "streams": {str(k): v for k, v in self._stream_steps.items()}},
        }  # fmt: skip

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        check_algorithm(state, self.algo)
        for name, net in self.networks().items():
            net.load_state_dict(state["networks"][name])
        with torch.no_grad():
            target = self.value_loss.target_value_model_params
            for key, value in state["slow_critic"].items():
                target.get(key).copy_(value)
        self.actor_loss.retnorm.load_state_dict(dict(state["return_norm"]))
        for name, optim in self.optims.items():  # each at the trial's own learning rate (<name>_lr)
            lr = optimizer_lr(self.trial, float(self.trial.hp(f"{name}_lr")))
            load_optimizer(optim, state["optim"][name], lr)
        c = state["counters"]
        self._sampled, self._owed, self.updates = int(c["sampled"]), float(c["owed"]), int(c["updates"])
        self._stream_steps = {int(k): int(v) for k, v in c.get("streams", {}).items()}
        self._held = dict(self._stream_steps)  # as the saved replay holds them (cleared when it is not restored)

    def save(self, folder: Path) -> dict[str, Any]:
        """:meth:`state_dict` and (``checkpoint.replay_buffer``) the replay (``ReplayBuffer.dumps``: the storage's
        entries and the writer's cursor)."""
        keep = self.trial.checkpoint.replay_buffer
        files = save_with_replay(folder, self.state_dict(), self.buffer, replay=keep)
        return {"learner": type(self).__name__, "algorithm": self.algo, "updates": self.updates,
                "replay_size": len(self.buffer) if keep else 0, "files": files}  # fmt: skip

    def restore(self, folder: Path, *, replay: bool = True) -> None:
        """Back to :meth:`save`'s state; without a saved replay, no update until it holds ``B x T`` entries again.
        The collector's episodes in flight (and so the acting recurrent state) start afresh."""
        restore_with_replay(self, folder, replay=replay)
        if not replay or not (Path(folder) / REPLAY_DIR).is_dir():
            self.refill = min(self.replayed, int(self.trial.hp("buffer_size")))
            self._held = {}

    def native(self) -> dict[str, Any]:
        size = self.size
        return {
            "world_model": {
                "encoder": "symlog -> DreamerV3MLP", "rollout": "RSSMRolloutV3(reset_key='is_first')",
                "prior": {"class": "RSSMPriorV3", "recurrent_model": "block_gru", "num_blocks": GRU_BLOCKS,
                          "hidden_dim": size.units, "rnn_hidden_dim": size.gru_units,
                          "num_categoricals": size.categoricals, "num_classes": size.classes, "unimix": UNIMIX,
                          "prior_num_layers": size.layers},
                "posterior": {"class": "RSSMPosteriorV3", "use_rms_norm": True, "unimix": UNIMIX,
                              "hidden_dim": size.units, "rnn_hidden_dim": size.gru_units,
                              "obs_embed_dim": size.units, "num_layers": size.layers,
                              "num_categoricals": size.categoricals, "num_classes": size.classes},
                "mlp": {"class": "DreamerV3MLP", "depth": size.layers, "num_cells": size.units,
                        "two_hot_bins": NUM_BINS},
                "heads": "DreamerV3MLP decoder (symlog target), reward SymExpTwoHot(255) (zero output layer), "
                         "continue (Bernoulli logit)",
                "params": sum(count_params(m) for m in self._world_model_modules().values()),
            },
            "model_loss": {"class": "DreamerV3ModelLoss",
                           "kwargs": {k: v for k, v in self.model_loss_kwargs.items()}},
            "actor": {"class": type(self.actor).__name__,
                      "distribution": "OneHotCategorical, 1 % uniform" if self.discrete
                      else "IndependentNormal(tanh mean, std in [0.1, 1]); the env's action: clipped to [-1, 1], "
                           "mapped to its bounds",
                      "params": count_params(self.actor)},
            "actor_loss": {"class": "DreamerV3ActorLoss",
                           "kwargs": {k: v for k, v in self.actor_loss_kwargs.items() if k != "continuation_model"}
                           | {"continuation_model": "the continue head (sigmoid)"},
                           "value_estimator": {"class": "TDLambdaEstimator", "gamma": self.gamma, "lmbda": self.lam}},
            "value_loss": {"class": "DreamerV3ValueLoss",
                           "kwargs": {"value_loss": "two_hot", "slow_critic_regularization": 1.0},
                           "slow_critic": {"class": "SoftUpdate", "eps": float(self.settings["slow_critic_decay"])},
                           "params": count_params(self.value_net)},
            "imagination": {"class": "DreamerEnv", "horizon": self.horizon},
            "optimizers": {name: {"class": "torch.optim.Adam", "lr": o.param_groups[0]["lr"],
                                  "eps": o.param_groups[0]["eps"], "grad_clip_norm": self.clips[name]}
                           for name, o in self.optims.items()},
            "replay_buffer": {"class": "ReplayBuffer", "storage": f"LazyTensorStorage({self.buffer._storage.max_size})",
                              "sampler": f"SliceSampler(slice_len={self.batch_length_T}, traj_key='{STREAM_KEY}', "
                                         f"step_key='{STEP_KEY}', fragmented=True, init_key=None, "
                                         "truncated_key=None, strict_length=True)",
                              "windows": self.batch_size_B, "entries": "one per observation (crossrl's core's)"},
            "training_ratio": self.ratio,
            "learning_starts_env_steps": self.learning_starts,
            "point_env_steps": self.point_env_steps,
            "acting": "symlog -> encoder -> RSSMStateEstimatorV3 -> actor; state, belief and previous_action "
                      "carried by TensorDictPrimer, reset at InitTracker's is_init",
            "update": "world model step, then the actor's on trajectories imagined from every replayed posterior "
                      "state, then the critic's on them, then SoftUpdate of the slow critic",
        }  # fmt: skip


class RecurrentAct:
    """A :class:`DreamerLearner`'s policy for one observation at a time, carrying its recurrent state between calls;
    :meth:`reset` starts a new episode (the next observation meets a fresh state, as ``is_init`` does)."""

    def __init__(self, learner: DreamerLearner, *, deterministic: bool) -> None:
        self.learner = learner
        self.mode = ExplorationType.DETERMINISTIC if deterministic else ExplorationType.RANDOM
        self.reset()

    def reset(self) -> None:
        lr = self.learner
        self.carry = TensorDict(
            {STATE: torch.zeros(1, lr.state_dim), BELIEF: torch.zeros(1, lr.size.gru_units),
             PREV_ACTION: torch.zeros(1, lr.act_dim), IS_INIT: torch.ones(1, 1, dtype=torch.bool)},
            batch_size=[1],
        )  # fmt: skip

    def __call__(self, obs: Any) -> Any:
        td = self.carry.clone()
        td.set("observation", torch.as_tensor(np.asarray(obs), dtype=torch.float32).reshape(1, -1))
        with torch.no_grad(), set_exploration_type(self.mode):
            out = self.learner.policy(td)
        self.carry = TensorDict(
            {STATE: out.get(STATE), BELIEF: out.get(BELIEF), PREV_ACTION: out.get(PREV_ACTION),
             IS_INIT: torch.zeros(1, 1, dtype=torch.bool)},
            batch_size=[1],
        )  # fmt: skip
        action = out.get("action")[0]
        return int(action) if self.learner.discrete else action.numpy()
