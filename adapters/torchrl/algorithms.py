"""TorchRL learners: what happens to each collected batch (losses, value estimators, optimiser steps).

One learner per algorithm family (on-policy actor-critics, DQN, SAC; DreamerV3's in
:mod:`crossrl.adapters.torchrl.dreamer`, and :mod:`crossrl.adapters.torchrl.learners` builds either). Each takes the batch a TorchRL collector
yields (time is the last batch dimension), trains on it, and returns how many env steps it trained on plus the losses
under crossrl's common names. The adapter (:mod:`crossrl.adapters.torchrl.adapter`) owns envs, collectors, timing
and the metric sink; this module owns only the maths that TorchRL provides.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.nn import AddStateIndependentNormalScale, InteractionType, TensorDictModule, TensorDictSequential
from torch import nn
from torchrl.data import Bounded as BoundedSpec
from torchrl.data import Categorical as CategoricalSpec
from torchrl.data import LazyTensorStorage, ReplayBuffer
from torchrl.data import MultiCategorical as MultiCategoricalSpec
from torchrl.data import Unbounded as UnboundedSpec
from torchrl.data.postprocs import MultiStep
from torchrl.data.replay_buffers import RandomSampler
from torchrl.envs.utils import ExplorationType, set_exploration_type
from torchrl.modules import (
    ConvNet,
    EGreedyModule,
    IndependentNormal,
    ProbabilisticActor,
    QValueActor,
    TanhNormal,
    ValueOperator,
)
from torchrl.objectives import A2CLoss, ClipPPOLoss, DQNLoss, HardUpdate, SACLoss, SoftUpdate, ValueEstimators
from torchrl.objectives.value import GAE, VTrace
from torchrl.objectives.value.functional import vtrace_advantage_estimate

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
from crossrl.core.sac_policy import NonFiniteError
from crossrl.scenarios import metrics as M
from crossrl.scenarios.catalog import CROSSRL_SETTINGS
from crossrl.scenarios.spec import ModelSpec, Trial

OBS_KEY = "observation"
ACTION_KEY = "action"  # where build_actor writes the action

PRIORITIZED_REPLAY_UNAVAILABLE = (
    "torchrl: prioritized_replay is not available: TorchRL's PrioritizedSampler needs its C++ "
    "extension (SumSegmentTreeFp32), which does not load with torch 2.13. Set prioritized_replay: false "
    "for dqn on torchrl, or run it on crossrl (apex/prioritized replay is not offered on torchrl)."
)


# -- checkpoints ---------------------------------------------------------------------------------------------------
#
# A learner's checkpoint is one ``torch.save`` file (LEARNER_FILE: networks, target networks, optimiser, counters;
# only tensors, numbers and strings, so it loads with ``weights_only=True``) and, for DQN and SAC, the replay buffer as
# TorchRL's ``ReplayBuffer.dumps`` writes it (REPLAY_DIR: the storage memory-mapped, one file per key, and the
# writer's cursor). The loss modules' hyperparameter buffers (entropy_coeff, clip_epsilon, critic_coeff, gamma,
# SAC's target entropy ...) are not restored: they come from the trial, which Population Based Training may have
# changed between a save and a restore; so do the learning rates, re-applied to every param group after the
# optimisers' states are loaded.

LEARNER_FILE = "learner.pt"
REPLAY_DIR = "replay"
STATE_FORMAT = 1


def learned_state(loss: nn.Module) -> dict[str, torch.Tensor]:
    """The loss module's trained tensors: its networks' parameters (``*_network_params``) and their target copies
    (``target_*_network_params``), by ``state_dict`` name; not its hyperparameter buffers."""
    return {k: v for k, v in loss.state_dict().items() if k.split(".", 1)[0].endswith("_network_params")}


def common_state(learner: Any) -> dict[str, Any]:
    """What every learner's checkpoint starts with: the format, the algorithm, the dimensions its networks are built
    for (``learner.dims``: :func:`build_learner`'s keyword arguments, so ``load_policy`` needs no env) and the loss
    module's trained tensors."""
    return {
        "format": STATE_FORMAT,
        "algorithm": learner.algo,
        "dims": learner.dims,
        "loss": learned_state(learner.loss),
    }


def load_learned_state(loss: nn.Module, state: Mapping[str, torch.Tensor]) -> None:
    """Copies ``state`` (from :func:`learned_state`) into ``loss`` in place (the optimiser and the collector's
    policy keep the same tensors); a checkpoint of other networks is an error, not a partial load."""
    want = set(learned_state(loss))
    if set(state) != want:
        missing, extra = sorted(want - set(state)), sorted(set(state) - want)
        raise ValueError(
            f"torchrl checkpoint: the loss's networks differ (missing {missing[:3]}, unexpected {extra[:3]})"
        )
    loss.load_state_dict(dict(state), strict=False)


def native_kwargs(trial: Trial, section: str) -> dict[str, Any]:
    """The trial's engine-native keyword arguments for ``section`` (``native.torchrl.loss``, ``optimizer``,
    ``collector``): merged over crossrl's own, so they win."""
    return dict(trial.native.get(section, {}))


def adam(params: Any, *, trial: Trial, lr: float) -> torch.optim.Adam:
    """``torch.optim.Adam`` at ``lr`` with the trial's ``native.torchrl.optimizer`` keyword arguments over it."""
    return torch.optim.Adam(params, **{"lr": lr, **native_kwargs(trial, "optimizer")})


def optimizer_lr(trial: Trial, lr: float) -> float:
    """The learning rate the trial's optimizers run at: ``native.torchrl.optimizer.lr`` when given, else ``lr``."""
    return float(native_kwargs(trial, "optimizer").get("lr", lr))


def load_optimizer(optim: torch.optim.Optimizer, state: Mapping[str, Any], lr: float) -> None:
    """The optimiser's saved state (Adam's moments and step counts), then the trial's ``lr`` on every param group."""
    optim.load_state_dict(dict(state))
    for group in optim.param_groups:
        group["lr"] = lr


def save_state(folder: Path, state: Mapping[str, Any]) -> None:
    torch.save(dict(state), folder / LEARNER_FILE)


def save_with_replay(folder: Path, state: Mapping[str, Any], buffer: ReplayBuffer, *, replay: bool = True) -> list[str]:
    """A replay learner's checkpoint: ``state`` (:data:`LEARNER_FILE`) and (``replay``: ``checkpoint.replay_buffer``)
    its replay buffer (``ReplayBuffer.dumps`` into :data:`REPLAY_DIR`: the pre-allocated storage, memory-mapped, and
    the writer's cursor); the files written."""
    save_state(folder, state)
    files = [LEARNER_FILE]
    if replay and len(buffer):  # TorchRL cannot dump a storage that holds nothing yet
        buffer.dumps(folder / REPLAY_DIR)
        files.append(REPLAY_DIR)
    return files


def restore_with_replay(learner: Any, folder: Path, *, replay: bool = True) -> None:
    """Back to what :func:`save_with_replay` wrote: the learner's state, then (``replay``) its buffer when saved."""
    learner.load_state_dict(read_state(folder))
    if replay and (Path(folder) / REPLAY_DIR).is_dir():
        learner.buffer.loads(Path(folder) / REPLAY_DIR)


def read_state(folder: Path) -> dict[str, Any]:
    """A learner's saved state (:data:`LEARNER_FILE` in ``folder``, the checkpoint's engine folder)."""
    path = Path(folder) / LEARNER_FILE
    if not path.is_file():
        raise FileNotFoundError(f"torchrl checkpoint: no {LEARNER_FILE} in {folder}")
    state = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
        raise ValueError(f"torchrl checkpoint: {path} is not a learner state of format {STATE_FORMAT}")
    return state


def check_algorithm(state: Mapping[str, Any], algorithm: str) -> None:
    if state.get("algorithm") != algorithm:
        raise ValueError(f"torchrl checkpoint: a {state.get('algorithm')!r} learner's, not {algorithm!r}'s")


def _td_to_state(td: TensorDictBase) -> dict[str, Any]:
    return {"data": td.to_dict(), "batch_size": list(td.batch_size)}


def _td_from_state(state: Mapping[str, Any]) -> TensorDictBase:
    return TensorDict(state["data"], batch_size=state["batch_size"])


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
        out_keys=[ACTION_KEY],
        spec=CategoricalSpec(n_actions),
        distribution_class=torch.distributions.Categorical,
        return_log_prob=True,  # behaviour log-probs: PPO's ratio and V-trace's rho need them
    )


class FactoredCategorical(torch.distributions.Distribution):
    """MultiDiscrete actions as crossrl's core and RLlib factor them: one categorical per dimension over its slice of
    one logits vector of ``sum(nvec)`` entries (``nvec``: the categories per dimension). An action is an integer
    vector of ``len(nvec)`` entries; its log-probability and the entropy are summed over the dimensions; the
    deterministic action (``mode``, ``deterministic_sample``) is each dimension's argmax. A ``torch.distributions``
    distribution, so ``ProbabilisticActor(distribution_class=FactoredCategorical, distribution_kwargs={"nvec": ...})``
    feeds TorchRL's ClipPPOLoss, A2CLoss and V-trace unchanged."""

    arg_constraints: dict[str, Any] = {}
    has_rsample = False

    def __init__(self, logits: torch.Tensor, nvec: Sequence[int], validate_args: bool | None = None) -> None:
        self.nvec = tuple(int(n) for n in nvec)
        if logits.shape[-1] != sum(self.nvec):
            raise ValueError(f"FactoredCategorical: {logits.shape[-1]} logits for nvec {list(self.nvec)} "
                             f"(needs {sum(self.nvec)})")  # fmt: skip
        self.logits = logits
        self.parts = [torch.distributions.Categorical(logits=part) for part in logits.split(self.nvec, dim=-1)]
        super().__init__(logits.shape[:-1], torch.Size([len(self.nvec)]), validate_args=False)

    def sample(self, sample_shape: torch.Size | Sequence[int] = torch.Size()) -> torch.Tensor:
        with torch.no_grad():
            return torch.stack([d.sample(torch.Size(sample_shape)) for d in self.parts], dim=-1)

    def log_prob(self, value: torch.Tensor) -> torch.Tensor:
        value = value.long()
        return torch.stack([d.log_prob(value[..., i]) for i, d in enumerate(self.parts)], dim=-1).sum(-1)

    def entropy(self) -> torch.Tensor:
        return torch.stack([d.entropy() for d in self.parts], dim=-1).sum(-1)

    @property
    def mode(self) -> torch.Tensor:
        return torch.stack([part.argmax(-1) for part in self.logits.split(self.nvec, dim=-1)], dim=-1)

    @property
    def deterministic_sample(self) -> torch.Tensor:
        return self.mode


def build_multi_actor(*, net: nn.Module, nvec: Sequence[int]) -> ProbabilisticActor:
    """Factored categorical policy over MultiDiscrete(``nvec``) actions (:class:`FactoredCategorical`) whose
    ``sum(nvec)`` logits come from ``net``: the parameters of crossrl's core's policy head."""
    module = TensorDictModule(net, in_keys=[OBS_KEY], out_keys=["logits"])
    return ProbabilisticActor(
        module,
        in_keys=["logits"],
        out_keys=[ACTION_KEY],
        spec=MultiCategoricalSpec([int(n) for n in nvec]),
        distribution_class=FactoredCategorical,
        distribution_kwargs={"nvec": tuple(int(n) for n in nvec)},
        return_log_prob=True,
    )


def build_gaussian_actor(*, net: nn.Module, act_dim: int) -> ProbabilisticActor:
    """Diagonal Gaussian policy over ``act_dim`` continuous actions, crossrl's core's rule: the mean from ``net``
    (its last layer scaled by 0.01), a state-independent log std per action dimension starting at 0
    (``AddStateIndependentNormalScale``, ``exp`` mapping), no squashing; the log-probability is that of the sampled,
    unclipped action (the env is stepped with it clipped to its bounds: the adapter's ``ClipActions``)."""
    head = nn.Sequential(net, AddStateIndependentNormalScale(act_dim, scale_mapping="exp", scale_lb=0.0))
    module = TensorDictModule(head, in_keys=[OBS_KEY], out_keys=["loc", "scale"])
    return ProbabilisticActor(
        module,
        in_keys=["loc", "scale"],
        out_keys=[ACTION_KEY],
        spec=UnboundedSpec(shape=(act_dim,)),
        distribution_class=IndependentNormal,
        return_log_prob=True,
    )


def vtrace_taken_actions(estimator: VTrace, data: TensorDictBase) -> TensorDictBase:
    """V-trace advantages and value targets into ``data`` (``[*B, T]``), by TorchRL's own
    ``vtrace_advantage_estimate`` with ``estimator``'s gamma, thresholds, critic and actor, the importance weights
    ``pi(a) / mu(a)`` taken on the actions the workers took (the IMPALA paper's V-trace).

    ``VTrace.forward`` in TorchRL 0.14.1 takes ``log pi`` of an action it draws anew from the learner's policy (its
    mode, or a fresh sample, by the actor's interaction type: ``_call_actor_net``), not of the action in the batch,
    so its ``rho`` compares two different actions (measured: docs/fidelity.md, "TorchRL's V-trace")."""
    keys = estimator.tensor_keys
    actor, critic = estimator.actor_network, estimator.value_network
    with torch.no_grad():
        value = critic(data.select(*critic.in_keys).copy()).get(keys.value)
        next_value = critic(data["next"].select(*critic.in_keys).copy()).get(keys.value)
        log_pi = actor.get_dist(data.select(*actor.in_keys, strict=False)).log_prob(data.get(ACTION_KEY))
        adv, target = vtrace_advantage_estimate(
            estimator.gamma,
            log_pi.view_as(value),
            data.get(keys.sample_log_prob).view_as(value),
            value,
            next_value,
            data.get(("next", keys.reward)),
            data.get(("next", keys.done)),
            data.get(("next", keys.terminated)),
            rho_thresh=estimator.rho_thresh,
            c_thresh=estimator.c_thresh,
        )
    data.set(keys.advantage, adv)
    data.set(keys.value_target, target)
    return data


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

    def __init__(
        self,
        *,
        trial: Trial,
        obs_shape: tuple[int, ...],
        n_actions: int | None = None,
        action_shape: Sequence[int] | None = None,
        action_low: Sequence[float] | None = None,
        action_high: Sequence[float] | None = None,
        nvec: Sequence[int] | None = None,
    ) -> None:
        """Discrete actions (``n_actions``: a categorical over logits), MultiDiscrete ones (``nvec``: a factored
        categorical, :func:`build_multi_actor`) or continuous ones (``action_shape``, one dimension, with the env's
        bounds ``action_low`` / ``action_high``: :func:`build_gaussian_actor`)."""
        self.trial = trial
        self.algo = trial.algorithm
        self.dims: dict[str, Any]
        self.obs_shape, self.n_actions = tuple(obs_shape), n_actions
        self.nvec = None if nvec is None else tuple(int(n) for n in nvec)
        self.continuous = n_actions is None and self.nvec is None
        if self.nvec is not None:
            self.dims = {"obs_shape": list(obs_shape), "nvec": list(self.nvec)}
            self.actor_net = build_actor_net(obs_shape=obs_shape, n_actions=sum(self.nvec), model=trial.model)
            self.critic_net = build_critic_net(obs_shape=obs_shape, model=trial.model)
            self.actor = build_multi_actor(net=self.actor_net, nvec=self.nvec)
        elif self.continuous:
            if action_shape is None or len(action_shape) != 1:
                raise ValueError(
                    f"torchrl: {self.algo} takes discrete actions or a flat vector of continuous ones; "
                    f"{trial.env.id} has actions of shape {list(action_shape or ())}"
                )
            act_dim = int(action_shape[0])
            low = [-math.inf] * act_dim if action_low is None else [float(x) for x in action_low]
            high = [math.inf] * act_dim if action_high is None else [float(x) for x in action_high]
            self.action_low, self.action_high = np.asarray(low, np.float32), np.asarray(high, np.float32)
            self.dims = {"obs_shape": list(obs_shape), "action_shape": [act_dim],
                                         "action_low": low, "action_high": high}  # fmt: skip
            self.actor_net = build_actor_net(obs_shape=obs_shape, n_actions=act_dim, model=trial.model)
            self.critic_net = build_critic_net(obs_shape=obs_shape, model=trial.model)
            self.actor = build_gaussian_actor(net=self.actor_net, act_dim=act_dim)
        else:
            assert n_actions is not None
            self.dims = {"obs_shape": list(obs_shape), "n_actions": n_actions}
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
            self.loss_kwargs |= native_kwargs(trial, "loss")
            self.loss: ClipPPOLoss | A2CLoss = ClipPPOLoss(self.actor, self.critic, **self.loss_kwargs)
        else:
            self.loss_kwargs = {**common, **native_kwargs(trial, "loss")}
            self.loss = A2CLoss(self.actor, self.critic, **self.loss_kwargs)
        # the raw critic loss is reported as loss_critic / critic_coeff: a native critic_coeff is the one applied
        self.vf_coeff = float(self.loss_kwargs.get("critic_coeff") or self.vf_coeff)
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
        self.optim = adam(self.params, trial=trial, lr=float(trial.hp("lr")))
        self.grad_clip = float(trial.hp("grad_clip"))
        self.train_batch = int(trial.hp("train_batch"))
        self._pending: list[TensorDictBase] = []
        self._pending_frames = 0
        self.grad_steps = 0
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
            data = vtrace_taken_actions(self.estimator, data) if self.algo == "impala" else self.estimator(data)
        flat = data.reshape(-1)
        if self.algo != "ppo":
            return flat.numel(), self._step(flat)
        minibatch = int(self.trial.hp("minibatch"))
        stats: list[dict[str, float]] = []
        for _ in range(int(self.trial.hp("epochs"))):
            for idx in torch.randperm(flat.numel()).split(minibatch):
                stats.append(self._step(flat[idx]))
        return flat.numel(), mean_stats(stats)

    def log_std(self) -> torch.Tensor:
        """The Gaussian policy's state-independent log std (continuous actions only)."""
        return next(m for m in self.actor.modules() if isinstance(m, AddStateIndependentNormalScale)).get_parameter(
            "state_independent_scale"
        )

    def act_fn(self, *, deterministic: bool) -> Callable[[Any], Any]:
        """The policy for ONE observation, as the env is stepped with it: discrete, the argmax of the logits
        (``deterministic``) or a sample of the categorical; MultiDiscrete, each dimension's argmax or a sample of the
        factored categorical (an int64 array of ``len(nvec)``); continuous, the mean (``deterministic``) or a sample of
        the Gaussian, clipped to the env's bounds (a float32 array)."""
        net = self.actor_net
        if self.nvec is not None:
            nvec = self.nvec

            def act_multi(obs: Any) -> np.ndarray:
                with torch.no_grad():
                    dist = FactoredCategorical(net(torch.as_tensor(obs)[None])[0], nvec)
                    return (dist.mode if deterministic else dist.sample()).numpy()

            return act_multi
        if not self.continuous:

            def act_discrete(obs: Any) -> int:
                with torch.no_grad():
                    logits = net(torch.as_tensor(obs)[None])[0]
                    if deterministic:
                        return int(torch.argmax(logits))
                    return int(torch.distributions.Categorical(logits=logits).sample())

            return act_discrete
        std = self.log_std().detach().exp()

        def act_continuous(obs: Any) -> np.ndarray:
            with torch.no_grad():
                mean = net(torch.as_tensor(obs, dtype=torch.float32)[None])[0]
                a = mean if deterministic else mean + std * torch.randn_like(mean)
            return np.clip(a.numpy().astype(np.float32), self.action_low, self.action_high)

        return act_continuous

    def _step(self, batch: TensorDictBase) -> dict[str, float]:
        self.grad_steps += 1
        return loss_step(self.loss, batch, optim=self.optim, params=self.params, grad_clip=self.grad_clip,
                         vf_coeff=self.vf_coeff)  # fmt: skip

    # -- checkpoints (see LEARNER_FILE) ---------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Actor and critic weights, Adam's state, the gradient-step count and IMPALA's batches not yet learned."""
        return {
            **common_state(self),
            "optim": self.optim.state_dict(),
            "counters": {"grad_steps": self.grad_steps, "pending_frames": self._pending_frames},
            "pending": [_td_to_state(td) for td in self._pending],
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        check_algorithm(state, self.algo)
        load_learned_state(self.loss, state["loss"])
        load_optimizer(self.optim, state["optim"], optimizer_lr(self.trial, float(self.trial.hp("lr"))))
        self.grad_steps = int(state["counters"]["grad_steps"])
        self._pending = [_td_from_state(p) for p in state["pending"]]
        self._pending_frames = int(state["counters"]["pending_frames"])

    def save(self, folder: Path) -> dict[str, Any]:
        """The learner's whole state into ``folder`` (a checkpoint's engine folder); a description of it."""
        save_state(folder, self.state_dict())
        return {"learner": type(self).__name__, "algorithm": self.algo, "grad_steps": self.grad_steps,
                "pending_frames": self._pending_frames, "files": [LEARNER_FILE]}  # fmt: skip

    def restore(self, folder: Path) -> None:
        self.load_state_dict(read_state(folder))

    def native(self) -> dict[str, Any]:
        return {
            "loss": {"class": type(self.loss).__name__, "kwargs": self.loss_kwargs},
            "value_estimator": {"class": type(self.estimator).__name__, "kwargs": self.estimator_kwargs,
                                **self._vtrace_note()},
            "optimizer": {"class": "torch.optim.Adam", "lr": self.optim.defaults["lr"], "eps": self.optim.defaults["eps"]},
            "grad_clip_norm": self.grad_clip,
            "update": self._update_description(),
            "networks": {"actor": repr(self.actor_net), "critic": repr(self.critic_net),
                         "actor_params": count_params(self.actor), "critic_params": count_params(self.critic)},
            "actor": self._actor_description(),
        }  # fmt: skip

    def _actor_description(self) -> dict[str, Any]:
        if self.nvec is not None:
            return {"class": "ProbabilisticActor",
                    "distribution": f"FactoredCategorical(logits, nvec={list(self.nvec)}): one Categorical per "
                                    "dimension over its slice of the logits",
                    "log_prob": "summed over the dimensions", "entropy": "summed over the dimensions",
                    "deterministic_action": "each dimension's argmax"}  # fmt: skip
        if not self.continuous:
            return {"class": "ProbabilisticActor", "distribution": "Categorical(logits)",
                    "deterministic_action": "argmax of the logits"}  # fmt: skip
        return {"class": "ProbabilisticActor", "distribution": "IndependentNormal(loc, scale) (no squashing)",
                "scale": "exp(log_std), state-independent (AddStateIndependentNormalScale), log_std starting at 0",
                "log_prob": "of the sampled action, unclipped",
                "env_action": f"clipped to [{self.action_low.tolist()}, {self.action_high.tolist()}] (ClipActions)",
                "deterministic_action": "loc, clipped to the bounds"}  # fmt: skip

    def _vtrace_note(self) -> dict[str, str]:
        if self.algo != "impala":
            return {}
        return {"computed_by": "crossrl's vtrace_taken_actions: TorchRL's vtrace_advantage_estimate with log pi of the "
                "actions taken (TorchRL 0.14.1's VTrace.forward takes log pi of a newly drawn action)"}  # fmt: skip

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
        self.algo = trial.algorithm
        self.obs_shape, self.n_actions = tuple(obs_shape), n_actions
        self.dims: dict[str, Any] = {"obs_shape": list(obs_shape), "n_actions": n_actions}
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
            **native_kwargs(trial, "loss"),
        }
        self.loss = DQNLoss(self.qvalue, action_space=spec, **self.loss_kwargs)
        self.gamma = float(trial.hp("gamma"))
        self.loss.make_value_estimator(ValueEstimators.TD0, gamma=self.gamma)
        # Copy on every call: crossrl's target_update counts env steps, so the adapter decides when. TorchRL 0.14's
        # HardUpdate copies when its call counter equals the interval and only then resets it, so interval 1
        # copied on every other call (measured); 0 copies on every one.
        self.target = HardUpdate(self.loss, value_network_update_interval=0)
        self.n_step = int(trial.hp("n_step"))
        self.multistep = MultiStep(gamma=self.gamma, n_steps=self.n_step) if self.n_step > 1 else None
        self.batch_size = int(trial.hp("train_batch"))
        self.buffer = ReplayBuffer(
            storage=LazyTensorStorage(int(trial.hp("buffer_size"))),
            sampler=RandomSampler(),
            batch_size=self.batch_size,
        )
        self.params = list(self.loss.value_network_params.values(True, True))
        self.optim = adam(self.params, trial=trial, lr=float(trial.hp("lr")))
        self.grad_clip = float(trial.hp("grad_clip"))
        self.learning_starts = int(trial.hp("learning_starts"))
        self.target_update = int(trial.hp("target_update"))
        self.replay_ratio = float(trial.hp("replay_ratio"))
        self._sampled = 0
        self._last_target = 0
        self._owed = 0.0  # replayed transitions owed to reach replay_ratio (carried across batches)
        self.grad_steps = 0
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
            self.grad_steps += 1
        if self._sampled - self._last_target >= self.target_update:
            self.target.step()
            self._last_target = self._sampled
        return len(steps) * self.batch_size, {**mean_stats(steps), **self.diagnostics()}

    # -- checkpoints (see LEARNER_FILE) ---------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Q-network and target weights, Adam's state, epsilon, the counters; not the replay buffer (:meth:`save`)."""
        return {
            **common_state(self),
            "optim": self.optim.state_dict(),
            "epsilon": self.greedy.eps.detach().clone(),
            "counters": {
                "sampled": self._sampled,
                "last_target": self._last_target,
                "owed": self._owed,
                "grad_steps": self.grad_steps,
                "target_update_calls": int(self.target.counter),
            },
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        check_algorithm(state, self.algo)
        load_learned_state(self.loss, state["loss"])
        load_optimizer(self.optim, state["optim"], optimizer_lr(self.trial, float(self.trial.hp("lr"))))
        # eps_init / eps_end / annealing_num_steps stay the trial's; epsilon itself continues where it was
        self.greedy.eps.copy_(state["epsilon"])
        c = state["counters"]
        self._sampled, self._last_target, self._owed = int(c["sampled"]), int(c["last_target"]), float(c["owed"])
        self.grad_steps = int(c["grad_steps"])
        self.target.counter = int(c["target_update_calls"])

    def save(self, folder: Path) -> dict[str, Any]:
        """The learner's whole state into ``folder``: :meth:`state_dict` and the replay buffer
        (``ReplayBuffer.dumps``: the whole pre-allocated storage, memory-mapped, and the writer's cursor)."""
        files = save_with_replay(folder, self.state_dict(), self.buffer)
        return {"learner": type(self).__name__, "algorithm": self.algo, "grad_steps": self.grad_steps,
                "replay_size": len(self.buffer), "epsilon": float(self.greedy.eps), "files": files}  # fmt: skip

    def restore(self, folder: Path, *, replay: bool = True) -> None:
        restore_with_replay(self, folder, replay=replay)

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


# -- SAC ------------------------------------------------------------------------------------------------------------

SAC_REPLAY_KEYS: tuple[str | tuple[str, str], ...] = (
    OBS_KEY,
    ACTION_KEY,
    ("next", OBS_KEY),
    ("next", "reward"),
    ("next", "done"),
    ("next", "terminated"),
)
"""What SACLoss reads of a transition (its in_keys), all a SAC replay buffer stores: smaller rows make ``extend``,
``sample`` and the checkpoint's ``dumps`` (which writes the whole pre-allocated capacity) cheaper."""

Q_KEY = "state_action_value"  # where a critic (ValueOperator) writes Q(s, a)

SAC_N_STEP_UNAVAILABLE = (
    "torchrl: sac runs with n_step 1 only. TorchRL 0.14.1's MultiStep looks ahead within one collector batch (with "
    "sac's rollout_fragment 1, not at all: n_step would be silently 1) and keeps the first step's terminated flag, "
    "so a window that reaches a termination bootstraps from the terminal state. Set n_step: 1 for sac on torchrl."
)


class LogStdScale(nn.Module):
    """The actor MLP's output as ``(loc, scale)``: its first half the Gaussian's mean, its second the log std, clamped
    to ``[log_std_min, log_std_max]`` and exponentiated, as crossrl's SACPolicy does. (TorchRL's own
    ``NormalParamExtractor`` maps the scale by a biased softplus with a lower bound only.)"""

    def __init__(self, log_std_min: float, log_std_max: float) -> None:
        super().__init__()
        self.log_std_min, self.log_std_max = log_std_min, log_std_max

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        loc, log_std = x.chunk(2, dim=-1)
        return loc, log_std.clamp(self.log_std_min, self.log_std_max).exp()

    def extra_repr(self) -> str:
        return f"log_std_min={self.log_std_min}, log_std_max={self.log_std_max}"


class ConcatInputs(nn.Module):
    """``net`` on its inputs concatenated along the last dimension: a critic's ``[observation, action]``
    (a ``TensorDictModule`` passes one tensor per in_key; crossrl's MLP takes one)."""

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        return self.net(torch.cat(inputs, dim=-1))


class FiniteActions(nn.Module):
    """The policy's actions, unchanged; a NaN or infinite one raises :class:`NonFiniteError` before the env is
    stepped with it (nothing in TorchRL's collection checks actions)."""

    def forward(self, action: torch.Tensor) -> torch.Tensor:
        bad = ~torch.isfinite(action)
        if bool(bad.any()):
            at = tuple(int(i) for i in bad.nonzero()[0])
            raise NonFiniteError(
                f"torchrl sac: the policy's action is not finite ({float(action[at])} at index {list(at)}): the actor "
                "diverged"
            )
        return action


def build_sac_actor(*, net: nn.Module, action_shape: tuple[int, ...]) -> ProbabilisticActor:
    """Squashed Gaussian policy over actions in [-1, 1] (TanhNormal, low -1, high 1: no affine map), ``loc`` and
    ``scale`` from ``net`` through :class:`LogStdScale` at crossrl's ``log_std_min`` / ``log_std_max``. It samples
    ``tanh(loc + scale * noise)`` (ExplorationType.RANDOM, its default and the collector's); under
    ExplorationType.DETERMINISTIC it gives ``tanh(loc)`` (TanhNormal has no analytic mode: MODE raises)."""
    settings = CROSSRL_SETTINGS["sac"]
    scale = LogStdScale(float(settings["log_std_min"]), float(settings["log_std_max"]))
    module = TensorDictModule(nn.Sequential(net, scale), in_keys=[OBS_KEY], out_keys=["loc", "scale"])
    return ProbabilisticActor(
        module,
        in_keys=["loc", "scale"],
        out_keys=[ACTION_KEY],
        spec=BoundedSpec(low=-1.0, high=1.0, shape=action_shape),
        distribution_class=TanhNormal,
        distribution_kwargs={"low": -1.0, "high": 1.0},
        default_interaction_type=InteractionType.RANDOM,
    )


class SACLearner:
    """Soft actor-critic: ``SACLoss`` v2 (twin Q critics, no state-value network) with the TD(0) estimator,
    ``SoftUpdate`` target critics, the learned temperature, three Adams (actor_lr, critic_lr, alpha_lr; eps 1e-8, no
    gradient clipping) and a uniform ``ReplayBuffer`` of :data:`SAC_REPLAY_KEYS`. Actions in [-1, 1] (``env.actions:
    unit``); the collector acts uniformly at random until ``learning_starts`` env steps (its init_random_frames, set
    by the adapter), then with :attr:`policy`.

    The networks are crossrl's SACPolicy's (``build_mlp``: the same sizes, initialisation and build order, so the same
    seed gives the same initial weights): the actor ``obs -> hidden -> 2 x action dims`` (out_gain 0.01), each critic
    ``[obs, action] -> hidden -> 1`` (out_gain 1). The two critics are built separately and handed to SACLoss as a
    list: given one module, SACLoss re-samples both copies' weights uniformly between the module's min and max
    (``LossModule.convert_to_functional``), losing the orthogonal initialisation. The actor's parameters in the loss
    are the policy's own tensors, so the in-process collector acts with every update at once.

    One update (:meth:`update`): SACLoss's three losses from one forward pass on the same pre-update parameters (the
    actor's on detached critics, the critics' target under no_grad, the temperature's on the detached log-probability),
    one summed backward (each parameter group gets exactly its own loss's gradient), the three Adam steps, then
    ``SoftUpdate.step()``. crossrl's core steps the critics first and takes the actor's loss on the updated critics."""

    def __init__(self, *, trial: Trial, obs_shape: Sequence[int], action_shape: Sequence[int]) -> None:
        if int(trial.hp("n_step")) != 1:
            raise NotImplementedError(SAC_N_STEP_UNAVAILABLE)
        if trial.model.conv or len(obs_shape) != 1:
            raise ValueError(
                f"torchrl: sac takes flat observations and MLP models only; {trial.env.id} observes shape "
                f"{list(obs_shape)}" + (" and algorithm.model.conv is set" if trial.model.conv else "")
            )
        self.trial = trial
        self.algo = trial.algorithm
        self.obs_shape, self.action_shape = tuple(obs_shape), tuple(action_shape)
        self.dims: dict[str, Any] = {"obs_shape": list(obs_shape), "action_shape": list(action_shape)}
        obs_dim, act_dim = self.obs_shape[0], math.prod(self.action_shape)
        model = trial.model
        self.actor_net = build_mlp(in_dim=obs_dim, out_dim=2 * act_dim, model=model, out_gain=0.01)
        self.critic_nets = [build_mlp(in_dim=obs_dim + act_dim, out_dim=1, model=model, out_gain=1.0) for _ in range(2)]
        self.actor = build_sac_actor(net=self.actor_net, action_shape=self.action_shape)
        critics = [
            ValueOperator(ConcatInputs(net), in_keys=[OBS_KEY, ACTION_KEY], out_keys=[Q_KEY])
            for net in self.critic_nets
        ]
        self.policy = TensorDictSequential(
            self.actor, TensorDictModule(FiniteActions(), in_keys=[ACTION_KEY], out_keys=[ACTION_KEY])
        )
        self.loss_kwargs: dict[str, Any] = {
            "num_qvalue_nets": 2,
            "loss_function": "l2",  # squared error, summed over the two critics (TorchRL defaults to smooth_l1)
            "alpha_init": float(trial.hp("initial_alpha")),
            "fixed_alpha": False,
            "target_entropy": trial.hp("target_entropy"),  # 'auto': -(action dims), from the actor's spec
            "delay_actor": False,
            "delay_qvalue": True,
            **native_kwargs(trial, "loss"),
        }
        self.loss = SACLoss(self.actor, critics, **self.loss_kwargs)
        self.gamma = float(trial.hp("gamma"))
        self.loss.make_value_estimator(ValueEstimators.TD0, gamma=self.gamma)
        self.tau = float(trial.hp("tau"))
        self.target = SoftUpdate(self.loss, tau=self.tau)
        self.optims = {
            "actor": adam(
                list(self.loss.actor_network_params.values(True, True)), trial=trial, lr=float(trial.hp("actor_lr"))
            ),
            "critic": adam(
                list(self.loss.qvalue_network_params.values(True, True)), trial=trial, lr=float(trial.hp("critic_lr"))
            ),
            "alpha": adam([self.loss.log_alpha], trial=trial, lr=float(trial.hp("alpha_lr"))),
        }
        self.batch_size = int(trial.hp("train_batch"))
        self.buffer = ReplayBuffer(
            storage=LazyTensorStorage(int(trial.hp("buffer_size"))),
            sampler=RandomSampler(),
            batch_size=self.batch_size,
        )
        self.learning_starts = int(trial.hp("learning_starts"))
        self.updates_per_step = float(trial.hp("updates_per_step"))
        self._sampled = 0
        self._owed = 0.0  # replayed transitions owed under updates_per_step x train_batch per env step (carried)
        self.updates = 0
        # after a restore without the replay buffer: no update until it holds this many transitions again
        self.refill = 0
        self.always_sync = False  # the policy changes only when it trains
        # batches of a few env steps: a point per this many env steps at the least (crossrl's replay optimizers' 1000)
        self.point_env_steps = int(CROSSRL_SETTINGS["sac"]["steps_per_iteration"])

    def learn(self, data: TensorDictBase) -> tuple[int, dict[str, float]]:
        """Store the batch; once ``learning_starts`` env steps were sampled, ``updates_per_step`` updates per new env
        step (a fractional remainder carries over to the next batch), as crossrl's sync_replay counts them."""
        frames = data.numel()
        self._sampled += frames
        self.buffer.extend(data.reshape(-1).select(*SAC_REPLAY_KEYS))
        if self._sampled < self.learning_starts or len(self.buffer) < self.refill:
            return 0, self.diagnostics()
        self._owed += frames * self.updates_per_step * self.batch_size
        stats: list[dict[str, float]] = []
        while self._owed >= self.batch_size:
            stats.append(self.update())
            self._owed -= self.batch_size
        return len(stats) * self.batch_size, {**mean_stats(stats), **self.diagnostics()}

    def update(self) -> dict[str, float]:
        """One SAC update on a ``train_batch`` replay sample; its losses under crossrl's names (``value_loss``: the
        two critics' mean squared errors summed, as crossrl's core) and the first critic's mean Q of the replayed
        pairs before the update."""
        batch = self.buffer.sample()
        q = self.first_critic_q(batch)
        out = self.loss(batch)
        (out["loss_actor"] + out["loss_qvalue"] + out["loss_alpha"]).backward()
        for optim in self.optims.values():
            optim.step()
            optim.zero_grad(set_to_none=True)
        self.target.step()
        self.updates += 1
        # the critics' values first, as crossrl's core orders them: a diverged critic is named by the sink as such
        return {
            M.VALUE_LOSS: as_float(out["loss_qvalue"]),
            M.DIAG_Q_MEAN: as_float(q),
            M.POLICY_LOSS: as_float(out["loss_actor"]),
            M.ENTROPY: as_float(out["entropy"]),
            M.DIAG_ALPHA: as_float(out["alpha"]),  # the temperature this update's losses used
            M.DIAG_ALPHA_LOSS: as_float(out["loss_alpha"]),
        }

    def first_critic_q(self, batch: TensorDictBase) -> torch.Tensor:
        """Q of the first critic (SACLoss's stacked parameters, index 0) on the batch's (observation, action) pairs:
        SACLoss computes it but returns only the losses."""
        critic = self.loss.qvalue_network
        with torch.no_grad(), self.loss.qvalue_network_params[0].to_module(critic):
            return critic(batch.select(OBS_KEY, ACTION_KEY)).get(Q_KEY)

    def diagnostics(self) -> dict[str, float]:
        """Reported at every point, learning or not: the exploration epsilon as crossrl's core reports it for sac (1:
        the collector's next batch is uniformly random, 0: the policy acts), replay size, updates so far."""
        return {
            M.DIAG_EPSILON: 1.0 if self._sampled < self.learning_starts else 0.0,
            M.DIAG_REPLAY_SIZE: float(len(self.buffer)),
            M.DIAG_UPDATES: float(self.updates),
        }

    def act_fn(self, *, deterministic: bool) -> Callable[[Any], np.ndarray]:
        """The policy for ONE observation: ``tanh(loc)`` (``deterministic``: ExplorationType.DETERMINISTIC) or a
        sample of the squashed Gaussian, as a float32 array of the action's shape (in [-1, 1])."""
        mode = ExplorationType.DETERMINISTIC if deterministic else ExplorationType.RANDOM

        def act(obs: Any) -> np.ndarray:
            td = TensorDict({OBS_KEY: torch.as_tensor(obs, dtype=torch.float32)[None]}, batch_size=[1])
            with torch.no_grad(), set_exploration_type(mode):
                return self.policy(td).get(ACTION_KEY)[0].numpy()

        return act

    # -- checkpoints (see LEARNER_FILE) ---------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Actor, critics, target critics, ``log_alpha``, the three Adams' states and the counters; not the replay
        buffer (:meth:`save`)."""
        return {
            **common_state(self),
            "log_alpha": self.loss.log_alpha.detach().clone(),
            "optim": {name: optim.state_dict() for name, optim in self.optims.items()},
            "counters": {"sampled": self._sampled, "owed": self._owed, "updates": self.updates},
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        check_algorithm(state, self.algo)
        load_learned_state(self.loss, state["loss"])
        with torch.no_grad():
            self.loss.log_alpha.copy_(state["log_alpha"])
        for name, optim in self.optims.items():  # each at the trial's own learning rate (<name>_lr)
            load_optimizer(optim, state["optim"][name], optimizer_lr(self.trial, float(self.trial.hp(f"{name}_lr"))))
        c = state["counters"]
        self._sampled, self._owed, self.updates = int(c["sampled"]), float(c["owed"]), int(c["updates"])

    def save(self, folder: Path) -> dict[str, Any]:
        """The learner's whole state into ``folder``: :meth:`state_dict` and the replay buffer, saved too
        (``ReplayBuffer.dumps``: :data:`SAC_REPLAY_KEYS` over the whole pre-allocated capacity, memory-mapped, and
        the writer's cursor), so a resumed trial trains on the transitions it had; without the buffer when
        ``checkpoint.replay_buffer`` is false."""
        keep = self.trial.checkpoint.replay_buffer
        files = save_with_replay(folder, self.state_dict(), self.buffer, replay=keep)
        return {"learner": type(self).__name__, "algorithm": self.algo, "updates": self.updates,
                "replay_size": len(self.buffer) if keep else 0,
                "alpha": float(self.loss.log_alpha.detach().exp()), "files": files}  # fmt: skip

    def restore(self, folder: Path, *, replay: bool = True) -> None:
        """Back to :meth:`save`'s state; a checkpoint saved without the buffer leaves it empty, and no update is made
        until it holds ``learning_starts`` transitions again (sampled with the restored policy)."""
        restore_with_replay(self, folder, replay=replay)
        if replay and not (Path(folder) / REPLAY_DIR).is_dir():
            self.refill = min(self.learning_starts, int(self.trial.hp("buffer_size")))

    def native(self) -> dict[str, Any]:
        settings = CROSSRL_SETTINGS["sac"]
        return {
            "loss": {"class": "SACLoss", "kwargs": self.loss_kwargs, "version": "v2 (no state-value network)",
                     "target_entropy": float(self.loss.target_entropy)},
            "value_estimator": {"class": "TD0Estimator", "kwargs": {"gamma": self.gamma},
                                "bootstraps_on": "next.terminated (a truncated episode bootstraps)"},
            "target_network": {"class": "SoftUpdate", "kwargs": {"tau": self.tau}, "stepped": "after every update"},
            "actor": {"class": "ProbabilisticActor", "distribution": "TanhNormal(low=-1, high=1)",
                      "scale": f"exp(clamp(log_std, {settings['log_std_min']}, {settings['log_std_max']}))",
                      "deterministic_action": "tanh(loc) (ExplorationType.DETERMINISTIC)"},
            "replay_buffer": {"class": "ReplayBuffer", "storage": f"LazyTensorStorage({self.buffer._storage.max_size})",
                              "sampler": "RandomSampler (uniform, with replacement)", "batch_size": self.batch_size,
                              "keys": [list(k) if isinstance(k, tuple) else k for k in SAC_REPLAY_KEYS]},
            "learning_starts_env_steps": self.learning_starts,
            "random_actions": "uniform over the action spec until learning_starts env steps (collector "
                              "init_random_frames, rounded up to whole batches)",
            "updates_per_step": self.updates_per_step,
            "optimizers": {name: {"class": "torch.optim.Adam", "lr": o.defaults["lr"], "eps": o.defaults["eps"]}
                           for name, o in self.optims.items()},
            "grad_clip_norm": None,
            "update": "SACLoss's actor, critic and temperature losses from one forward pass on the pre-update "
                      "parameters, one summed backward, three Adam steps, SoftUpdate.step()",
            "networks": {"actor": repr(self.actor_net), "critic": repr(self.critic_nets[0]), "critics": 2,
                         "actor_params": count_params(self.actor_net),
                         "critic_params": [count_params(net) for net in self.critic_nets]},
        }  # fmt: skip


Learner = OnPolicyLearner | DQNLearner | SACLearner


def build_learner(
    *,
    trial: Trial,
    obs_shape: Sequence[int],
    n_actions: int | None = None,
    action_shape: Sequence[int] | None = None,
    action_low: Sequence[float] | None = None,
    action_high: Sequence[float] | None = None,
    nvec: Sequence[int] | None = None,
) -> Learner:
    """The trial's learner, for observations of ``obs_shape`` and either ``n_actions`` discrete actions (PPO, A2C,
    A3C, IMPALA, DQN), MultiDiscrete actions of ``nvec`` categories per dimension (PPO, A2C, A3C, IMPALA) or
    continuous actions of ``action_shape`` (PPO, A2C, A3C, IMPALA: within ``action_low`` / ``action_high``; SAC: in
    [-1, 1]). The arguments are what a checkpoint's ``dims`` holds."""
    algo = trial.algorithm
    if algo not in ("ppo", "a2c", "a3c", "impala", "dqn", "sac"):
        raise ValueError(f"torchrl: no {algo!r} (see adapters/registry.py for why)")
    if algo == "sac":
        if action_shape is None:
            raise ValueError(
                f"torchrl: sac needs continuous (Box) actions; {trial.env.id} has {n_actions} discrete ones"
            )
        bounds = [*(action_low or [-1.0]), *(action_high or [1.0])]
        if any(abs(b) != 1.0 for b in bounds):
            raise ValueError(
                f"torchrl: sac takes continuous actions in [-1, 1]; {trial.env.id}'s are in [{list(action_low or ())}, "
                f"{list(action_high or ())}] (set env.actions: unit, sac's default)"
            )
        return SACLearner(trial=trial, obs_shape=obs_shape, action_shape=action_shape)
    if nvec is not None:
        if algo == "dqn":
            raise ValueError(
                f"torchrl: dqn takes single Discrete actions; {trial.env.id} has MultiDiscrete({list(nvec)})"
            )
        return OnPolicyLearner(trial=trial, obs_shape=tuple(obs_shape), nvec=nvec)
    if algo == "dqn":
        if n_actions is None:
            raise ValueError(
                f"torchrl: dqn needs discrete actions; {trial.env.id} has continuous actions of shape "
                f"{list(action_shape or ())}"
            )
        return DQNLearner(trial=trial, obs_shape=tuple(obs_shape), n_actions=n_actions)
    if n_actions is None:
        return OnPolicyLearner(trial=trial, obs_shape=tuple(obs_shape), action_shape=action_shape,
                               action_low=action_low, action_high=action_high)  # fmt: skip
    return OnPolicyLearner(trial=trial, obs_shape=tuple(obs_shape), n_actions=n_actions)
