"""TorchRL learners: what happens to each collected batch (losses, value estimators, optimiser steps).

One learner per algorithm family. Each takes the batch a TorchRL collector yields (time is the last
batch dimension), trains on it, and returns how many env steps it trained on plus the losses under
crossrl's common names. The adapter (:mod:`crossrl.adapters.torchrl`) owns envs, collectors, timing
and the metric sink; this module owns only the maths that TorchRL provides.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from tensordict import TensorDictBase
from tensordict.nn import TensorDictModule, TensorDictSequential
from torch import nn
from torchrl.data import Categorical as CategoricalSpec
from torchrl.data import LazyTensorStorage, ReplayBuffer
from torchrl.data.postprocs import MultiStep
from torchrl.data.replay_buffers import RandomSampler
from torchrl.modules import ConvNet, EGreedyModule, ProbabilisticActor, QValueActor, ValueOperator
from torchrl.objectives import A2CLoss, ClipPPOLoss, DQNLoss, HardUpdate, ValueEstimators
from torchrl.objectives.value import GAE, VTrace

from crossrl.core.maths import mean_stats
from crossrl.core.models import (
    FramesIn,
    activation_class,
    build_mlp,
    conv_flat_dim,
    count_params,
    image_shape,
    init_convs_,
)
from crossrl.scenarios import metrics as M
from crossrl.scenarios.spec import ModelSpec, Trial

OBS_KEY = "observation"

PRIORITIZED_REPLAY_UNAVAILABLE = (
    "torchrl: prioritized_replay is not available: TorchRL's PrioritizedSampler needs its C++ "
    "extension (SumSegmentTreeFp32), which does not load with torch 2.13. Set prioritized_replay: false "
    "for dqn on torchrl, or run it on crossrl (apex/prioritized replay is not offered on torchrl)."
)


def build_net(*, obs_shape: tuple[int, ...], out_dim: int, model: ModelSpec, out_gain: float = 1.0) -> nn.Module:
    """The spec's network as TorchRL builds it: crossrl's MLP (``build_mlp``, the same initialisation), after
    TorchRL's ``ConvNet`` when the spec has a conv stack.

    The conv stack: uint8 frames ``[..., H, W, C]`` to float ``[..., C, H, W]`` / 255 (``FramesIn``, so frames
    stay uint8 in the collectors and replay), ``ConvNet`` (no padding, the spec's activation after every
    layer, ``SquashDims`` flattening; initialised as crossrl's), then the MLP.
    """
    if not model.conv:
        return build_mlp(in_dim=math.prod(obs_shape), out_dim=out_dim, model=model, out_gain=out_gain)
    _, _, channels = image_shape(obs_shape, model)
    conv = ConvNet(
        in_features=channels,
        num_cells=[f for f, _, _ in model.conv],
        kernel_sizes=[k for _, k, _ in model.conv],
        strides=[s for _, _, s in model.conv],
        paddings=0,
        activation_class=activation_class(model.activation),
    )
    mlp = build_mlp(in_dim=conv_flat_dim(obs_shape, model), out_dim=out_dim, model=model, out_gain=out_gain)
    return nn.Sequential(FramesIn(), init_convs_(conv), mlp)


def build_actor_net(*, obs_shape: tuple[int, ...], n_actions: int, model: ModelSpec) -> nn.Module:
    """The policy's network: ``n_actions`` logits, the last layer scaled by 0.01 (a near-uniform first policy)."""
    return build_net(obs_shape=obs_shape, out_dim=n_actions, model=model, out_gain=0.01)


def build_critic_net(*, obs_shape: tuple[int, ...], model: ModelSpec) -> nn.Module:
    """The value function's network (separate from the policy's, the same layers)."""
    return build_net(obs_shape=obs_shape, out_dim=1, model=model)


def build_actor(*, net: nn.Module, n_actions: int) -> ProbabilisticActor:
    """Categorical policy over ``n_actions`` whose logits come from ``net``."""
    module = TensorDictModule(net, in_keys=[OBS_KEY], out_keys=["logits"])
    return ProbabilisticActor(
        module,
        in_keys=["logits"],
        out_keys=["action"],
        spec=CategoricalSpec(n_actions),
        distribution_class=torch.distributions.Categorical,
        return_log_prob=True,  # behaviour log-probs: PPO's ratio and V-trace's rho need them
    )


def clip_and_step(optim: torch.optim.Optimizer, params: list[nn.Parameter], grad_clip: float) -> float:
    """Clip, step, zero; returns the global gradient norm before clipping."""
    norm = torch.nn.utils.clip_grad_norm_(params, grad_clip)
    optim.step()
    optim.zero_grad(set_to_none=True)
    return float(norm)


def as_float(x: torch.Tensor | None) -> float:
    return float(x.detach().mean()) if x is not None else math.nan


def loss_step(
    loss: Any,
    batch: TensorDictBase,
    *,
    optim: torch.optim.Optimizer,
    params: list[nn.Parameter],
    grad_clip: float,
    vf_coeff: float,
) -> dict[str, float]:
    """One gradient step of an actor-critic loss (``ClipPPOLoss`` / ``A2CLoss``) on ``batch``; its stats."""
    out = loss(batch)
    total = out["loss_objective"] + out["loss_critic"] + out.get("loss_entropy", torch.zeros(()))
    total.backward()
    grad_norm = clip_and_step(optim, params, grad_clip)
    # TorchRL's loss_critic is already scaled by critic_coeff; report the raw squared error.
    stats = {M.POLICY_LOSS: as_float(out["loss_objective"]), M.ENTROPY: as_float(out.get("entropy"))}
    if vf_coeff > 0:  # a NaN here is training that diverged (the sink fails the trial), not a missing value
        stats[M.VALUE_LOSS] = as_float(out["loss_critic"]) / vf_coeff
    stats[M.DIAG_GRAD_NORM] = grad_norm
    # ClipPPOLoss's own diagnostics: kl_approx is the mean of log(pi_old / pi_new) (crossrl's core
    # reports the k3 estimate, RLlib its mean KL); clip_fraction as crossrl's.
    for name, key in ((M.DIAG_APPROX_KL, "kl_approx"), (M.DIAG_CLIP_FRAC, "clip_fraction")):
        if key in out.keys():  # noqa: SIM118 - TensorDict refuses `key in td`
            stats[name] = as_float(out[key])
    return stats


class OnPolicyLearner:
    """PPO (ClipPPOLoss + GAE, epochs x minibatches), A2C/A3C (A2CLoss + GAE, one step per batch), or
    IMPALA (A2CLoss with the VTrace estimator, one step per ``train_batch`` env steps accumulated)."""

    def __init__(self, *, trial: Trial, obs_shape: tuple[int, ...], n_actions: int) -> None:
        self.trial = trial
        self.algo = trial.algorithm
        self.actor_net = build_actor_net(obs_shape=obs_shape, n_actions=n_actions, model=trial.model)
        self.critic_net = build_critic_net(obs_shape=obs_shape, model=trial.model)
        self.actor = build_actor(net=self.actor_net, n_actions=n_actions)
        self.critic = ValueOperator(self.critic_net, in_keys=[OBS_KEY])
        self.policy: TensorDictModule | TensorDictSequential = self.actor
        self.vf_coeff = float(trial.hp("vf_coeff"))
        common: dict[str, Any] = {
            "entropy_bonus": True,
            "entropy_coeff": float(trial.hp("entropy_coeff")),
            "critic_coeff": self.vf_coeff,
            # squared error, as RLlib and crossrl's core (TorchRL defaults to smooth_l1)
            "loss_critic_type": "l2",
        }
        if self.algo == "ppo":
            self.loss_kwargs = {
                **common,
                "clip_epsilon": float(trial.hp("clip")),
                "clip_value": float(trial.hp("vf_clip")),
                "normalize_advantage": True,
            }
            self.loss: ClipPPOLoss | A2CLoss = ClipPPOLoss(self.actor, self.critic, **self.loss_kwargs)
        else:
            self.loss_kwargs = common
            self.loss = A2CLoss(self.actor, self.critic, **self.loss_kwargs)
        gamma = float(trial.hp("gamma"))
        self.estimator: GAE | VTrace
        if self.algo == "impala":
            self.estimator_kwargs = {
                "gamma": gamma,
                "rho_thresh": float(trial.hp("vtrace_clip_rho")),
                "c_thresh": float(trial.hp("vtrace_clip_c")),
            }
            self.estimator = VTrace(value_network=self.critic, actor_network=self.actor, **self.estimator_kwargs)
        else:
            self.estimator_kwargs = {"gamma": gamma, "lmbda": float(trial.hp("gae_lambda"))}
            self.estimator = GAE(value_network=self.critic, **self.estimator_kwargs)
        self.params = list(self.loss.parameters())
        self.optim = torch.optim.Adam(self.params, lr=float(trial.hp("lr")))
        self.grad_clip = float(trial.hp("grad_clip"))
        self.train_batch = int(trial.hp("train_batch"))
        self._pending: list[TensorDictBase] = []
        self._pending_frames = 0
        self.always_sync = False

    def learn(self, data: TensorDictBase) -> tuple[int, dict[str, float]]:
        """Train on one collected batch; returns (env steps trained, common-name losses)."""
        if self.algo == "impala":
            # IMPALA's learner batch is train_batch env steps from several (stale) worker batches.
            self._pending.append(data)
            self._pending_frames += data.numel()
            if self._pending_frames < self.train_batch:
                return 0, {}
            data = torch.cat([d.reshape(-1, d.shape[-1]) for d in self._pending], 0)
            self._pending, self._pending_frames = [], 0
        with torch.no_grad():
            data = self.estimator(data)
        flat = data.reshape(-1)
        if self.algo != "ppo":
            return flat.numel(), self._step(flat)
        minibatch = int(self.trial.hp("minibatch"))
        stats: list[dict[str, float]] = []
        for _ in range(int(self.trial.hp("epochs"))):
            for idx in torch.randperm(flat.numel()).split(minibatch):
                stats.append(self._step(flat[idx]))
        return flat.numel(), mean_stats(stats)

    def _step(self, batch: TensorDictBase) -> dict[str, float]:
        return loss_step(self.loss, batch, optim=self.optim, params=self.params, grad_clip=self.grad_clip,
                         vf_coeff=self.vf_coeff)  # fmt: skip

    def native(self) -> dict[str, Any]:
        return {
            "loss": {"class": type(self.loss).__name__, "kwargs": self.loss_kwargs},
            "value_estimator": {"class": type(self.estimator).__name__, "kwargs": self.estimator_kwargs},
            "optimizer": {"class": "torch.optim.Adam", "lr": self.optim.defaults["lr"], "eps": self.optim.defaults["eps"]},
            "grad_clip_norm": self.grad_clip,
            "update": self._update_description(),
            "networks": {"actor": repr(self.actor_net), "critic": repr(self.critic_net),
                         "actor_params": count_params(self.actor), "critic_params": count_params(self.critic)},
        }  # fmt: skip

    def _update_description(self) -> str:
        if self.algo == "ppo":
            return (f"GAE over the whole batch, then {self.trial.hp('epochs')} epochs of shuffled minibatches "
                    f"of {self.trial.hp('minibatch')} env steps; advantages normalised per minibatch")  # fmt: skip
        if self.algo == "impala":
            return f"one Adam step per >= {self.train_batch} env steps of accumulated worker batches (V-trace)"
        return "one Adam step per collected batch (GAE over the batch)"


class DQNLearner:
    """DQNLoss (double DQN when double_q) + uniform ReplayBuffer + HardUpdate target + epsilon-greedy."""

    def __init__(self, *, trial: Trial, obs_shape: tuple[int, ...], n_actions: int) -> None:
        if trial.hp("prioritized_replay"):
            raise NotImplementedError(PRIORITIZED_REPLAY_UNAVAILABLE)
        self.trial = trial
        spec = CategoricalSpec(n_actions)
        self.qnet = build_net(obs_shape=obs_shape, out_dim=n_actions, model=trial.model)
        self.qvalue = QValueActor(self.qnet, in_keys=[OBS_KEY], spec=spec)
        self.greedy_kwargs = {
            "eps_init": float(trial.hp("epsilon_initial")),
            "eps_end": float(trial.hp("epsilon_final")),
            "annealing_num_steps": int(trial.hp("epsilon_timesteps")),
        }
        self.greedy = EGreedyModule(spec, **self.greedy_kwargs)
        self.policy = TensorDictSequential(self.qvalue, self.greedy)
        self.loss_kwargs = {
            "loss_function": "smooth_l1",  # Huber, as Nature DQN and RLlib (TorchRL defaults to l2)
            "delay_value": True,
            "double_dqn": bool(trial.hp("double_q")),
        }
        self.loss = DQNLoss(self.qvalue, action_space=spec, **self.loss_kwargs)
        self.gamma = float(trial.hp("gamma"))
        self.loss.make_value_estimator(ValueEstimators.TD0, gamma=self.gamma)
        # Copy on every call: crossrl's target_update counts env steps, so the adapter decides when.
        self.target = HardUpdate(self.loss, value_network_update_interval=1)
        self.n_step = int(trial.hp("n_step"))
        self.multistep = MultiStep(gamma=self.gamma, n_steps=self.n_step) if self.n_step > 1 else None
        self.batch_size = int(trial.hp("train_batch"))
        self.buffer = ReplayBuffer(
            storage=LazyTensorStorage(int(trial.hp("buffer_size"))),
            sampler=RandomSampler(),
            batch_size=self.batch_size,
        )
        self.params = list(self.loss.value_network_params.values(True, True))
        self.optim = torch.optim.Adam(self.params, lr=float(trial.hp("lr")))
        self.grad_clip = float(trial.hp("grad_clip"))
        self.learning_starts = int(trial.hp("learning_starts"))
        self.target_update = int(trial.hp("target_update"))
        self.replay_ratio = float(trial.hp("replay_ratio"))
        self._sampled = 0
        self._last_target = 0
        self._owed = 0.0  # replayed transitions owed to reach replay_ratio (carried across batches)
        self.always_sync = True  # epsilon anneals every batch, so workers need it even before learning

    def learn(self, data: TensorDictBase) -> tuple[int, dict[str, float]]:
        """Store the batch, anneal epsilon, then ``replay_ratio`` x its size in replayed transitions."""
        frames = data.numel()
        self._sampled += frames
        self.greedy.step(frames)
        if self.multistep is not None:
            data = self.multistep(data)
        self.buffer.extend(data.reshape(-1))
        if self._sampled < self.learning_starts:
            return 0, self.diagnostics()
        self._owed += frames * self.replay_ratio
        steps: list[dict[str, float]] = []
        while self._owed >= self.batch_size:
            out = self.loss(self.buffer.sample())
            out["loss"].backward()
            grad_norm = clip_and_step(self.optim, self.params, self.grad_clip)
            steps.append({M.VALUE_LOSS: as_float(out["loss"]), M.DIAG_GRAD_NORM: grad_norm})
            self._owed -= self.batch_size
        if self._sampled - self._last_target >= self.target_update:
            self.target.step()
            self._last_target = self._sampled
        return len(steps) * self.batch_size, {**mean_stats(steps), **self.diagnostics()}

    def diagnostics(self) -> dict[str, float]:
        """Exploration epsilon and replay size now (reported at every point, learning or not)."""
        return {M.DIAG_EPSILON: float(self.greedy.eps), M.DIAG_REPLAY_SIZE: float(len(self.buffer))}

    def native(self) -> dict[str, Any]:
        return {
            "loss": {"class": "DQNLoss", "kwargs": self.loss_kwargs},
            "value_estimator": {"class": "TD0Estimator", "kwargs": {"gamma": self.gamma},
                                "n_step_postproc": f"MultiStep(n_steps={self.n_step})" if self.multistep else None},
            "exploration": {"class": "EGreedyModule", "kwargs": self.greedy_kwargs,
                            "annealed_by": "env steps sampled (EGreedyModule.step(frames) per batch)"},
            "target_network": {"class": "HardUpdate", "copy_every_env_steps": self.target_update},
            "replay_buffer": {"class": "ReplayBuffer", "storage": f"LazyTensorStorage({self.buffer._storage.max_size})",
                              "sampler": "RandomSampler (uniform, with replacement)", "batch_size": self.batch_size},
            "learning_starts_env_steps": self.learning_starts,
            "replay_ratio": self.replay_ratio,
            "optimizer": {"class": "torch.optim.Adam", "lr": self.optim.defaults["lr"], "eps": self.optim.defaults["eps"]},
            "grad_clip_norm": self.grad_clip,
            "networks": {"q": repr(self.qnet), "q_params": count_params(self.qvalue)},
        }  # fmt: skip


def build_learner(*, trial: Trial, obs_shape: tuple[int, ...], n_actions: int) -> OnPolicyLearner | DQNLearner:
    if trial.algorithm == "dqn":
        return DQNLearner(trial=trial, obs_shape=obs_shape, n_actions=n_actions)
    if trial.algorithm in ("ppo", "a2c", "a3c", "impala"):
        return OnPolicyLearner(trial=trial, obs_shape=obs_shape, n_actions=n_actions)
    raise ValueError(f"torchrl: no {trial.algorithm!r} (see adapters/registry.py for why)")
