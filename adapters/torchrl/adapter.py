"""TorchRL 0.14 engine: TorchRL's envs, collectors, losses and value estimators behind crossrl's Adapter.

Each worker steps ``envs_per_worker`` copies of :func:`crossrl.core.envs.make_env` (the very same
gymnasium env, step latency included) in one batched env (:func:`make_torchrl_env`): by default gymnasium's
``SyncVectorEnv`` in ``GymWrapper`` (autoreset disabled; TorchRL resets the envs that ended), one process per
worker stepping its envs one after another, as crossrl's core and RLlib's env runners do; the spec's
``execution.layout.torchrl.env`` may name TorchRL's ``SerialEnv`` (one ``GymWrapper`` per env, 2.7x slower on
CartPole: docs/layouts.md) or gymnasium's ``AsyncVectorEnv`` (a process per env) instead.
``StepCounter`` and ``RewardSum`` transforms give each finished episode's length and return.

Collectors: ``Collector`` (one worker, in this process), ``MultiSyncCollector`` (several local
workers; PPO, A2C, DQN, SAC), ``MultiAsyncCollector`` (A3C-style and IMPALA: workers keep sampling with
stale weights while the learner trains), ``RayCollector`` when the trial names a Ray cluster. The
learners (losses, estimators, replay) live in :mod:`crossrl.adapters.torchrl.algorithms`.

Checkpoints (:func:`train_loop`): the learner's whole state (``learner.save(folder)``: networks, target networks,
Adam, counters, epsilon, SAC's temperature, DQN's and SAC's replay buffers). A resumed trial restores it, pushes the
weights to the collector and counts on from the checkpoint's env steps; its collector's envs start from reset
(episodes in flight at the checkpoint are not saved) and are seeded anew (:func:`collector_seed`); SAC's collector
acts uniformly at random only for what is left of ``learning_starts`` (:func:`init_random_frames`).
:func:`load_policy` rebuilds a saved policy without envs or collector.
"""

from __future__ import annotations

import functools
import math
import signal
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import torch
import torchrl
from tensordict import TensorDictBase
from torchrl.data import Bounded as BoundedSpec
from torchrl.data import Categorical as CategoricalSpec
from torchrl.data import MultiCategorical as MultiCategoricalSpec
from torchrl.data import Unbounded as UnboundedSpec
from torchrl.envs import (
    Compose,
    DoubleToFloat,
    EnvBase,
    GymWrapper,
    RewardSum,
    SerialEnv,
    StepCounter,
    Transform,
    TransformedEnv,
)

from crossrl.adapters.base import MetricSink, send_clip
from crossrl.adapters.checkpoints import ENGINE_DIR, Resumed
from crossrl.adapters.checkpoints import resume_seed as collector_seed
from crossrl.adapters.torchrl.algorithms import check_algorithm, native_kwargs, read_state
from crossrl.adapters.torchrl.learners import build_learner
from crossrl.core.envs import make_env
from crossrl.core.maths import mean_stats
from crossrl.scenarios import metrics as M
from crossrl.scenarios.catalog import HYPERPARAM_DEFAULTS
from crossrl.scenarios.spec import BEST, DEFAULT_TORCHRL_ENV, TORCHRL_ENVS, EnvSpec, Trial

ON_POLICY_SYNC = ("ppo", "a2c")
ASYNC = ("a3c", "impala")
UNBOUNDED_FRAMES = 10**15  # RayCollector's total_frames for a trial budgeted in time only
WEIGHT_SYNC_TIMEOUT_S = 300  # RayCollector's weight-sync process group (TorchRL 0.14: 60 s), see below


@dataclass(frozen=True)
class HpMapping:
    """One shared hyperparameter as TorchRL sees it, for the algorithms listed."""

    shared: str
    algorithms: tuple[str, ...]
    torchrl: str  # where the value goes in TorchRL (class(argument=)), or "-" when nothing takes it
    meaning: str
    difference: str = ""  # what cannot be equalized, if anything


_PG = ("ppo", "a2c", "a3c", "impala")
_ALL = (*_PG, "dqn")

HYPERPARAM_MAP: tuple[HpMapping, ...] = (
    HpMapping("lr", _ALL, "torch.optim.Adam(lr=)", "learning rate", "Adam eps is torch's default 1e-8"),
    HpMapping("gamma", _PG, "GAE(gamma=) / VTrace(gamma=)", "discount"),
    HpMapping("gamma", ("dqn",), "TD0Estimator(gamma=), MultiStep(gamma=)", "discount"),
    HpMapping("gamma", ("sac",), "SACLoss.make_value_estimator(ValueEstimators.TD0, gamma=)", "discount"),
    HpMapping("gae_lambda", ("ppo", "a2c", "a3c"), "GAE(lmbda=)", "GAE lambda"),
    HpMapping("gae_lambda", ("impala",), "-", "unused", "TorchRL's VTrace has no lambda (acts as lambda = 1)"),
    HpMapping("clip", ("ppo",), "ClipPPOLoss(clip_epsilon=)", "PPO ratio clip"),
    HpMapping(
        "vf_clip",
        ("ppo",),
        "ClipPPOLoss(clip_value=)",
        "value clip",
        "TorchRL clips the new value to old value +- clip_value (PPO2 style); RLlib clips the value loss itself",
    ),
    HpMapping(
        "train_batch",
        ON_POLICY_SYNC,
        "collector frames_per_batch (total over workers)",
        "env steps per update phase",
        "rounded up to a multiple of workers x envs_per_worker",
    ),
    HpMapping(
        "train_batch",
        ("a3c",),
        "MultiAsyncCollector frames_per_batch (one worker's batch)",
        "env steps per gradient step; each worker batch is one A2C step",
        "TorchRL has no asynchronous gradients: workers send samples with stale weights (A3C-style), "
        "the driver computes the gradient",
    ),
    HpMapping("train_batch", ("impala",), "adapter: worker batches concatenated until >= train_batch", "learner batch"),
    HpMapping("train_batch", ("dqn", "sac"), "ReplayBuffer(batch_size=)", "replayed transitions per gradient step"),
    HpMapping("minibatch", ("ppo",), "adapter: shuffled split of the batch", "SGD minibatch (env steps)"),
    HpMapping("epochs", ("ppo",), "adapter: passes over each batch", "SGD epochs per batch"),
    HpMapping("entropy_coeff", _PG, "ClipPPOLoss / A2CLoss(entropy_coeff=)", "entropy bonus coefficient"),
    HpMapping(
        "vf_coeff",
        _PG,
        "ClipPPOLoss / A2CLoss(critic_coeff=), loss_critic_type='l2'",
        "value loss coefficient",
        "A2CLoss/ClipPPOLoss default to smooth_l1; set to l2 (squared error) to match",
    ),
    HpMapping("grad_clip", _ALL, "torch.nn.utils.clip_grad_norm_(max_norm=)", "global gradient norm clip"),
    HpMapping(
        "rollout_fragment",
        (*ON_POLICY_SYNC, "a3c"),
        "- (implied: frames_per_batch / (workers x envs_per_worker) steps per env)",
        "env steps per env per sample call",
        "TorchRL collectors size a batch by total frames, so the fragment follows from train_batch",
    ),
    HpMapping(
        "rollout_fragment",
        ("impala",),
        "MultiAsyncCollector frames_per_batch / envs_per_worker",
        "env steps per env per worker batch",
    ),  # fmt: skip
    HpMapping(
        "rollout_fragment",
        ("dqn", "sac"),
        "collector frames_per_batch / (workers x envs_per_worker)",
        "env steps per env between learner calls",
        "sac: one reported point per collector batch (crossrl's core: one per steps_per_iteration env steps)",
    ),  # fmt: skip
    HpMapping("buffer_size", ("dqn", "sac"), "LazyTensorStorage(max_size=)", "replay capacity (transitions)"),
    HpMapping(
        "learning_starts",
        ("dqn",),
        "adapter: no gradient step before this many env steps",
        "warm-up env steps",
        "TorchRL's init_random_frames would act uniformly at random instead; not used",
    ),
    HpMapping(
        "learning_starts",
        ("sac",),
        "collector init_random_frames (what is left of it on resume) + adapter: no update before",
        "env steps of uniformly random actions, with no update",
        "rounded up to whole collector batches, as crossrl's core rounds to whole sample rounds",
    ),
    HpMapping("target_update", ("dqn",), "HardUpdate, stepped every target_update env steps", "target net sync"),
    HpMapping("n_step", ("dqn",), "MultiStep(n_steps=) applied to each batch before replay", "n-step return"),
    HpMapping(
        "n_step",
        ("sac",),
        "- (must be 1)",
        "n-step return",
        "TorchRL 0.14.1's MultiStep looks ahead within one collector batch only and keeps the first step's "
        "terminated flag (bootstraps through terminations): n_step > 1 is refused",
    ),
    HpMapping("epsilon_initial", ("dqn",), "EGreedyModule(eps_init=)", "initial exploration epsilon"),
    HpMapping("epsilon_final", ("dqn",), "EGreedyModule(eps_end=)", "final exploration epsilon"),
    HpMapping(
        "epsilon_timesteps",
        ("dqn",),
        "EGreedyModule(annealing_num_steps=), .step(frames) per batch",
        "env steps of linear epsilon decay",
        "one epsilon for all workers, updated once per batch (weights sync)",
    ),
    HpMapping(
        "replay_ratio",
        ("dqn",),
        "adapter: frames x ratio / train_batch gradient steps per batch",
        "trained / sampled transitions",
    ),  # fmt: skip
    HpMapping("double_q", ("dqn",), "DQNLoss(double_dqn=)", "double Q-learning target"),
    HpMapping(
        "prioritized_replay",
        ("dqn",),
        "- (must be false)",
        "prioritized replay",
        "TorchRL's PrioritizedSampler needs its C++ extension, which does not load with torch 2.13: error",
    ),
    HpMapping("priority_alpha", ("dqn",), "-", "unused", "no prioritized replay on torchrl"),
    HpMapping("priority_beta", ("dqn",), "-", "unused", "no prioritized replay on torchrl"),
    HpMapping("vtrace_clip_rho", ("impala",), "VTrace(rho_thresh=)", "V-trace rho-bar"),
    HpMapping("vtrace_clip_c", ("impala",), "VTrace(c_thresh=)", "V-trace c-bar"),
    HpMapping(
        "actor_lr",
        ("sac",),
        "torch.optim.Adam(lr=) over SACLoss.actor_network_params",
        "the policy's learning rate",
        "the actor's loss is taken on the critics before this update's critic step (one summed backward of "
        "SACLoss's three losses); crossrl's core steps the critics first. Adam eps 1e-8 for all three",
    ),
    HpMapping("critic_lr", ("sac",), "torch.optim.Adam(lr=) over SACLoss.qvalue_network_params", "Q networks' lr"),
    HpMapping("alpha_lr", ("sac",), "torch.optim.Adam(lr=) over SACLoss.log_alpha", "temperature's learning rate"),
    HpMapping("tau", ("sac",), "SoftUpdate(loss, tau=), stepped after every update", "Polyak step of the targets"),
    HpMapping(
        "updates_per_step",
        ("sac",),
        "adapter: updates_per_step x new env steps updates per collected batch (fractions carried)",
        "gradient updates per env step",
    ),
    HpMapping(
        "target_entropy",
        ("sac",),
        "SACLoss(target_entropy=)",
        "the temperature's entropy target; 'auto': -(action dims), from the actor's spec",
    ),
    HpMapping("initial_alpha", ("sac",), "SACLoss(alpha_init=)", "the temperature at the start"),
    # DreamerV3 (adapters/torchrl/dreamer.py): TorchRL's modules and losses, the paper's settings where TorchRL's
    # defaults are not (docs/fairness.md, "DreamerV3")
    HpMapping(
        "model_size",
        ("dreamer",),
        "DREAMER_SIZES[model_size] -> DreamerV3MLP(num_cells=, depth=), RSSMPriorV3(hidden_dim=, rnn_hidden_dim=, "
        "num_categoricals=, num_classes=, prior_num_layers=), RSSMPosteriorV3(num_layers=)",
        "the networks' widths (crossrl's core's table)",
        "TorchRL's layers: RMSNorm (not LayerNorm), a block GRU of 8 groups (not a GRU cell)",
    ),
    HpMapping(
        "training_ratio",
        ("dreamer",),
        "adapter: one update of B x T per B x T / training_ratio env steps (fractions carried); collector "
        "frames_per_batch = round(B x T / training_ratio / envs) x envs x workers",
        "replayed env steps per sampled env step",
    ),
    HpMapping(
        "batch_size_B", ("dreamer",), "SliceSampler windows: ReplayBuffer(batch_size=B x T)", "windows per update"
    ),
    HpMapping("batch_length_T", ("dreamer",), "SliceSampler(slice_len=)", "entries per window"),
    HpMapping("horizon_H", ("dreamer",), "DreamerV3ActorLoss(imagination_horizon=)", "imagined steps"),
    HpMapping("gamma", ("dreamer",), "DreamerV3ActorLoss.make_value_estimator(TDLambda, gamma=)", "discount"),
    HpMapping(
        "gae_lambda",
        ("dreamer",),
        "DreamerV3ActorLoss.make_value_estimator(TDLambda, lmbda=)",
        "the imagined returns' lambda (the paper's eq. 7)",
    ),
    HpMapping(
        "world_model_lr",
        ("dreamer",),
        "torch.optim.Adam(lr=) over the encoder, RSSM, decoder, reward and continue heads",
        "world model's learning rate",
        "Adam eps 1e-8 and a global-norm clip of 1000, as crossrl's core and RLlib; not TorchRL's DreamerV3Optimizer",
    ),
    HpMapping("actor_lr", ("dreamer",), "torch.optim.Adam(lr=) over the actor", "actor's lr", "eps 1e-5, clip 100"),
    HpMapping("critic_lr", ("dreamer",), "torch.optim.Adam(lr=) over the critic", "critic's lr", "eps 1e-5, clip 100"),
    HpMapping("entropy_scale", ("dreamer",), "DreamerV3ActorLoss(entropy_bonus=)", "the actor's entropy bonus"),
    HpMapping(
        "buffer_size", ("dreamer",), "LazyTensorStorage(max_size=)", "replay capacity (entries, one per observation)"
    ),
    HpMapping("free_bits", ("dreamer",), "DreamerV3ModelLoss(free_bits=)", "both KL terms clamped below it"),
)


def mapping_for(algorithm: str) -> dict[str, HpMapping]:
    """Shared name -> mapping, for one algorithm."""
    return {m.shared: m for m in HYPERPARAM_MAP if algorithm in m.algorithms}


def unmapped(algorithm: str) -> list[str]:
    """Shared hyperparameters the algorithm has a default for that the table does not cover (should be [])."""
    return sorted(set(HYPERPARAM_DEFAULTS[algorithm]) - set(mapping_for(algorithm)))


def mapping_markdown() -> str:
    """The table for the README's fairness section."""
    rows = ["| crossrl name | algorithms | TorchRL 0.14 | meaning | difference that cannot be equalized |",
            "|---|---|---|---|---|"]  # fmt: skip
    for m in HYPERPARAM_MAP:
        rows.append(f"| `{m.shared}` | {', '.join(m.algorithms)} | {m.torchrl} | {m.meaning} | {m.difference} |")
    return "\n".join(rows)


def batched_env(layout: Mapping[str, Any]) -> str:
    """The batched env a trial's layout names (``execution.layout.torchrl.env``), the default when it names none."""
    chosen = str(layout.get("env") or DEFAULT_TORCHRL_ENV)
    if chosen == BEST:
        raise ValueError("torchrl: execution.layout.torchrl.env 'best' reached the engine unresolved (`crossrl run` "
                         "resolves it from the stored layout sweeps)")  # fmt: skip
    return chosen


def collector_class(trial: Trial) -> str:
    """The collector class :func:`build_collector` builds for ``trial``: RayCollector on a named cluster, Collector
    for one synchronous worker, else MultiSyncCollector or MultiAsyncCollector (the algorithm says which)."""
    sync = trial.algorithm not in ASYNC
    if trial.ray_address:
        return "RayCollector"
    if trial.workers == 1 and sync:
        return "Collector"
    return "MultiSyncCollector" if sync else "MultiAsyncCollector"


# Keyword arguments crossrl passes itself as the objects it builds (networks, parameters, envs, the policy): a spec's
# native.torchrl cannot give them.
_BUILT_BY_CROSSRL: dict[str, frozenset[str]] = {
    "loss": frozenset({"actor_network", "critic_network", "value_network", "qvalue_network", "actor", "critic",
                       "action_space", "action_spec", "functional", "world_model"}),
    "optimizer": frozenset({"params"}),
    "collector": frozenset({"create_env_fn", "policy", "policy_factory", "create_env_kwargs", "num_workers",
                            "collector_class", "init_fn", "postproc", "replay_buffer", "weight_updater"}),
}  # fmt: skip


def native_classes(trial: Trial) -> dict[str, type]:
    """Section of ``native.torchrl`` -> the TorchRL (or torch) class its keyword arguments go to for ``trial``."""
    from torchrl import collectors
    from torchrl.objectives import A2CLoss, ClipPPOLoss, DQNLoss, DreamerV3ModelLoss, SACLoss

    # dreamer: native.torchrl.loss goes to its world model's loss (the actor's and the critic's take none)
    losses = {"ppo": ClipPPOLoss, "dqn": DQNLoss, "sac": SACLoss, "dreamer": DreamerV3ModelLoss}
    collector = collector_class(trial)
    return {
        "loss": losses.get(trial.algorithm, A2CLoss),
        "optimizer": torch.optim.Adam,
        # RayCollector hands the collector keyword arguments to each of its Collectors
        "collector": getattr(collectors, "Collector" if collector == "RayCollector" else collector),
    }


def native_problems(trial: Trial) -> list[str]:
    """What TorchRL's classes for ``trial`` do not take of its ``native.torchrl`` (section -> keyword arguments), by
    their real signatures, one line each naming the key and how to fix it."""
    from crossrl.adapters.base import signature_keywords
    from crossrl.scenarios.spec import suggest

    classes = native_classes(trial)
    problems = []
    for section, kwargs in trial.native.items():
        cls = classes.get(section)
        if cls is None:
            continue  # the spec's own check names the sections
        where = f"native.torchrl.{section}"
        keywords = [k for k in signature_keywords(cls) if k not in _BUILT_BY_CROSSRL[section]]
        for key in kwargs:
            if key in _BUILT_BY_CROSSRL[section]:
                problems.append(f"{where}.{key}: crossrl builds {key} of {cls.__name__} itself; remove it")
            elif key not in keywords:
                hint = suggest(key, keywords)
                owner = "torch's" if cls.__module__.startswith("torch.") else "TorchRL's"
                which = f"{trial.algorithm}'s {section}"
                if section == "collector":  # the class follows the worker count
                    which = f"the collector at {trial.workers} worker{'s' if trial.workers != 1 else ''}"
                problems.append(
                    f"{where}.{key}: {owner} {cls.__name__} ({which}) takes no keyword {key!r}"
                    + (f"; {hint}" if hint else f"; it takes: {', '.join(keywords)}")
                )
    return problems


def layout_label(trial: Trial, collector: str, env: str | None = None) -> str:
    """The trial's layout on one line, e.g. ``MultiSync 2 x gym Sync(4)`` or ``Collector SerialEnv(1)`` (the ``layout``
    tag, the report's trial table; as ``crossrl bench sampling --sweep`` names layouts)."""
    batched = env or batched_env(trial.layout)
    name = {"gym_sync": "gym Sync", "gym_async": "gym Async"}.get(batched, batched)
    short = collector.removesuffix("Collector") or "Collector"
    where = short if short == "Collector" else f"{short} {trial.workers} x"
    return f"{where} {name}({trial.envs_per_worker})"


ENV_DESCRIPTIONS: dict[str, str] = {
    "gym_sync": "TransformedEnv(GymWrapper(gymnasium SyncVectorEnv({n} x make_env({id}), autoreset disabled)), "
    "Compose(StepCounter(), RewardSum()))",
    "gym_async": "TransformedEnv(GymWrapper(gymnasium AsyncVectorEnv({n} x make_env({id}), autoreset disabled)), "
    "Compose(StepCounter(), RewardSum()))",
    "SerialEnv": "TransformedEnv(SerialEnv({n} x GymWrapper(make_env({id}))), Compose(StepCounter(), RewardSum()))",
}
"""What each batched env is, for a trial's native config."""


def allow_slow_weight_sync() -> None:
    """Give RayCollector's weight-sync rendezvous :data:`WEIGHT_SYNC_TIMEOUT_S` instead of TorchRL 0.14's 60 s.

    The learner (rank 0) and each remote collector join a gloo process group through a TCPStore, both with
    ``torchrl.weight_update._ray._DIST_TIMEOUT`` (60 s), read when they join. On a loaded 2-core host the remote
    collectors' actors started more than 60 s after the learner, and the trial failed with ``DistStoreError: wait
    timeout after 60000ms, keys: /weight-sync/...`` (a Tune search's trial, measured on CI). Called in the learner
    before RayCollector is built and in each collector process as its env is made (before it joins).
    An env that does not build never gets here: the spec's checks build it before any trial starts
    (``crossrl.core.envs.env_problems``); one that breaks while stepping fails on the env guard's checks, as before.
    """
    from datetime import timedelta

    from torchrl.weight_update import _ray

    _ray._DIST_TIMEOUT = timedelta(seconds=WEIGHT_SYNC_TIMEOUT_S)


def make_torchrl_env(
    env_spec: EnvSpec,
    num_envs: int,
    *,
    batched: str = DEFAULT_TORCHRL_ENV,
    worker_process: bool = False,
    transforms: Callable[[], list[Transform]] | None = None,
) -> EnvBase:
    """``num_envs`` copies of ``make_env(spec)`` in one batched env, with episode length/return counters.

    ``batched`` (``execution.layout.torchrl.env``): ``gym_sync`` / ``gym_async``, gymnasium's ``SyncVectorEnv`` /
    ``AsyncVectorEnv`` in ``GymWrapper`` with autoreset disabled (TorchRL resets the envs that ended through the
    vector env's ``reset_mask``, as it resets a ``SerialEnv``'s); ``SerialEnv``, one ``GymWrapper`` per env stepped
    in turn through TorchRL's tensordicts (2.7x slower on CartPole, docs/layouts.md). The same envs either way.
    ``transforms()``: the learner's own transforms, appended last (a recurrent policy's ``InitTracker`` and
    ``TensorDictPrimer``: ``learner.env_transforms``), built anew in each process.
    Module-level (not a closure) so collector worker processes started with spawn can unpickle it.
    """
    if worker_process:
        torch.set_num_threads(1)
        allow_slow_weight_sync()
    if batched == "SerialEnv":
        base = SerialEnv(num_envs, functools.partial(_gym_env, env_spec), serial_for_single=True, mp_start_method=None)
        return TransformedEnv(base, Compose(StepCounter(), RewardSum(), *(transforms() if transforms else ())))
    if batched not in ("gym_sync", "gym_async"):
        raise ValueError(f"torchrl: batched env {batched!r} is not one of {', '.join(TORCHRL_ENVS)}")
    import gymnasium as gym

    fns = [functools.partial(make_env, env_spec)] * num_envs
    mode = gym.vector.AutoresetMode.DISABLED
    vec = (gym.vector.SyncVectorEnv(fns, autoreset_mode=mode) if batched == "gym_sync"
           else gym.vector.AsyncVectorEnv(fns, autoreset_mode=mode))  # fmt: skip
    env = GymWrapper(vec, categorical_action_encoding=True)
    extra = transforms() if transforms else ()
    return TransformedEnv(
        env, Compose(*_float32_transforms(env), *_clip_transforms(env), StepCounter(), RewardSum(), *extra)
    )


def _gym_env(env_spec: EnvSpec) -> EnvBase:
    """The spec's env in TorchRL's ``GymWrapper``; float64 observations (MuJoCo's) as float32 (``DoubleToFloat``), as
    every engine's networks take them (crossrl's core and RLlib cast them likewise); continuous actions clipped to
    the env's bounds (:class:`ClipActions`)."""
    env = GymWrapper(make_env(env_spec), categorical_action_encoding=True)
    transforms = [*_float32_transforms(env), *_clip_transforms(env)]
    return TransformedEnv(env, Compose(*transforms)) if transforms else env


class ClipActions(Transform):
    """The env stepped with the action clipped to its bounds (per dimension, as crossrl's evaluators ``np.clip`` a
    Box action); the collected ``action`` stays the one the policy sampled (an inverse transform works on a copy),
    so the learner's log-probabilities are those of the sampled actions, as crossrl's core's are."""

    def __init__(self, low: torch.Tensor, high: torch.Tensor) -> None:
        super().__init__(in_keys=[], out_keys=[], in_keys_inv=["action"], out_keys_inv=["action"])
        self.register_buffer("low", low.clone())
        self.register_buffer("high", high.clone())

    def _inv_apply_transform(self, action: torch.Tensor) -> torch.Tensor:
        return torch.maximum(torch.minimum(action, self.high), self.low)


def _clip_transforms(env: EnvBase) -> list[Any]:
    """:class:`ClipActions` to ``env``'s bounds when its actions are continuous and bounded (else nothing)."""
    spec = env.action_spec
    if isinstance(spec, BoundedSpec) and spec.dtype.is_floating_point:
        return [ClipActions(spec.space.low, spec.space.high)]
    return []


def _float32_transforms(env: EnvBase) -> list[Any]:
    """``DoubleToFloat`` over ``env``'s float64 observations, if it has any (else nothing)."""
    doubles = [key for key, spec in env.observation_spec.items(True, True) if spec.dtype == torch.float64]
    return [DoubleToFloat(in_keys=doubles)] if doubles else []


def learner_dims(env_spec: EnvSpec) -> dict[str, Any]:
    """What a learner is built for (:func:`~crossrl.adapters.torchrl.algorithms.build_learner`'s keyword arguments),
    from the spec's env as TorchRL sees it: ``obs_shape`` and either ``n_actions`` (discrete actions), ``nvec``
    (MultiDiscrete actions: the categories per dimension) or ``action_shape`` with the bounds ``action_low`` /
    ``action_high`` (continuous actions; sac's must be [-1, 1]: ``env.actions: unit``, its default).

    ``GymWrapper`` maps a MultiDiscrete space to a ``MultiCategorical`` spec when its ``nvec`` entries differ and to
    a ``Categorical`` of shape ``[len(nvec)]`` when they are all equal; either way the env takes an int64 vector of
    ``len(nvec)`` entries, the action :class:`~crossrl.adapters.torchrl.algorithms.FactoredCategorical` samples."""
    probe = _gym_env(env_spec)
    try:
        obs_shape = tuple(int(n) for n in probe.observation_spec["observation"].shape)
        spec = probe.action_spec
        if isinstance(spec, MultiCategoricalSpec) and spec.nvec.dim() == 1:
            return {"obs_shape": obs_shape, "nvec": [int(n) for n in spec.nvec]}
        if isinstance(spec, CategoricalSpec) and len(spec.shape) == 1:
            return {"obs_shape": obs_shape, "nvec": [int(spec.space.n)] * int(spec.shape[0])}
        if isinstance(spec, CategoricalSpec) and not spec.shape:
            return {"obs_shape": obs_shape, "n_actions": int(spec.space.n)}
        if isinstance(spec, BoundedSpec) and spec.dtype.is_floating_point:
            return {"obs_shape": obs_shape, "action_shape": tuple(int(n) for n in spec.shape),
                    "action_low": spec.space.low.reshape(-1).tolist(),
                    "action_high": spec.space.high.reshape(-1).tolist()}  # fmt: skip
        if isinstance(spec, UnboundedSpec) and spec.dtype.is_floating_point:
            return {"obs_shape": obs_shape, "action_shape": tuple(int(n) for n in spec.shape)}
        raise ValueError(
            f"torchrl: {env_spec.id}'s actions are {type(spec).__name__} of shape {list(spec.shape)}; "
            "TorchRL's learners take Discrete, one-dimensional MultiDiscrete or continuous (Box) actions"
        )
    finally:
        probe.close()


def env_dims(env_spec: EnvSpec) -> tuple[tuple[int, ...], int]:
    """(observation shape, number of discrete actions) of the spec's env as TorchRL sees it."""
    dims = learner_dims(env_spec)
    if "nvec" in dims:
        raise ValueError(f"torchrl: {env_spec.id} has MultiDiscrete actions ({dims['nvec']} categories)")
    if "n_actions" not in dims:
        raise ValueError(f"torchrl: {env_spec.id} has continuous actions of shape {list(dims['action_shape'])}")
    return dims["obs_shape"], dims["n_actions"]


def worker_init() -> None:
    """One torch intra-op thread in this process (collector workers; a driver that steps the envs itself)."""
    torch.set_num_threads(1)


def ceil_to(x: int, k: int) -> int:
    return -(-x // k) * k


def frames_per_batch(trial: Trial) -> int:
    """The collector's frames_per_batch: total over workers (sync) or per worker batch (async)."""
    envs, workers = trial.envs_per_worker, trial.workers
    algo = trial.algorithm
    if algo in ON_POLICY_SYNC:
        return ceil_to(int(trial.hp("train_batch")), envs * workers)
    if algo == "a3c":
        return ceil_to(int(trial.hp("train_batch")), envs)
    if algo == "impala":
        return int(trial.hp("rollout_fragment")) * envs
    if algo == "dreamer":  # crossrl's core's fragment: one update of B x T per B x T / training_ratio env steps
        replayed = int(trial.hp("batch_size_B")) * int(trial.hp("batch_length_T"))
        return max(1, round(replayed / float(trial.hp("training_ratio")) / envs)) * envs * workers
    return int(trial.hp("rollout_fragment")) * envs * workers  # dqn, sac


def init_random_frames(trial: Trial, resumed: Resumed | None) -> int | None:
    """SAC: the env steps the collector still acts uniformly at random for (over the action spec, without calling
    the policy): ``learning_starts`` less what a resumed trial sampled already (the collector counts its own frames),
    rounded up to whole batches (TorchRL would round, and warn). None for the other algorithms."""
    if trial.algorithm != "sac":
        return None
    left = int(trial.hp("learning_starts")) - (resumed.env_steps_sampled if resumed else 0)
    return ceil_to(max(0, left), frames_per_batch(trial))


def build_collector(
    *,
    trial: Trial,
    policy: Any,
    random_frames: int | None = None,
    env_transforms: Callable[[], list[Transform]] | None = None,
) -> tuple[Any, dict[str, Any]]:
    """The collector for the trial and a JSON-able description of how it was built; ``random_frames``: its
    ``init_random_frames`` (:func:`init_random_frames`), when not None; ``env_transforms``: the learner's own env
    transforms (:func:`make_torchrl_env`'s ``transforms``), when not None."""
    from torchrl.collectors import Collector

    fpb = frames_per_batch(trial)
    sync = trial.algorithm not in ASYNC
    if trial.ray_address:
        from torchrl.collectors.distributed import RayCollector

        from crossrl.core.cluster import available_cpus

        allow_slow_weight_sync()
        cpus = min(1.0, available_cpus() / trial.workers)  # never ask for more than the cluster has
        remote = {"num_cpus": cpus, "num_gpus": 0}
        env_fn = functools.partial(
            make_torchrl_env, trial.env, trial.envs_per_worker, batched=batched_env(trial.layout), worker_process=True,
            transforms=env_transforms,
        )  # fmt: skip
        # RayCollector treats total_frames=-1 as "nothing to collect" (it stops at once, measured), so give it
        # enough frames to reach the budget; the adapter still stops at sink.exhausted.
        steps = trial.budget.env_steps or UNBOUNDED_FRAMES  # a time budget: the sink says when to stop
        total = ceil_to(steps, fpb) + fpb * trial.workers
        ray_kwargs = {
            "frames_per_batch": fpb, "total_frames": total,
            "num_collectors": trial.workers, "sync": sync, "collector_class": Collector,
            "collector_kwargs": {"auto_register_policy_transforms": False, **native_kwargs(trial, "collector")},
            "remote_configs": remote,
        }  # fmt: skip
        if random_frames is not None:  # RayCollector hands each collector its share
            ray_kwargs["init_random_frames"] = random_frames
        collector = RayCollector([env_fn] * trial.workers, policy, **ray_kwargs)  # type: ignore[arg-type]
        return collector, {"class": "RayCollector", "kwargs": ray_kwargs, "ray_address": trial.ray_address}
    return local_collector(
        trial.env,
        workers=trial.workers,
        envs_per_worker=trial.envs_per_worker,
        policy=policy,
        frames_per_batch=fpb,
        sync=sync,
        random_frames=random_frames,
        batched=batched_env(trial.layout),
        native=native_kwargs(trial, "collector"),
        env_transforms=env_transforms,
    )


def local_collector(
    env_spec: EnvSpec,
    *,
    workers: int,
    envs_per_worker: int,
    policy: Any,
    frames_per_batch: int,
    sync: bool = True,
    random_frames: int | None = None,
    batched: str = DEFAULT_TORCHRL_ENV,
    native: Mapping[str, Any] | None = None,
    env_transforms: Callable[[], list[Transform]] | None = None,
) -> tuple[Any, dict[str, Any]]:
    """A collector on this machine and a JSON-able description of how it was built; ``native``: the trial's
    ``native.torchrl.collector`` keyword arguments, over crossrl's own.

    ``Collector`` (one worker, sync: the envs are stepped in this process), else ``MultiSyncCollector``
    (sync, batches stacked) or ``MultiAsyncCollector`` over ``workers`` processes of one torch thread
    each, every one stepping :func:`make_torchrl_env` of ``envs_per_worker`` envs in the ``batched`` env.
    ``random_frames``: the collector's ``init_random_frames`` (counted over all workers' batches), when not None.
    ``env_transforms``: appended to each worker's env (:func:`make_torchrl_env`).
    """
    from torchrl.collectors import Collector, MultiAsyncCollector, MultiSyncCollector

    common: dict[str, Any] = {
        "frames_per_batch": frames_per_batch,
        "total_frames": -1,
        "auto_register_policy_transforms": False,
    }
    if random_frames is not None:
        common["init_random_frames"] = random_frames
    if workers == 1 and sync:
        env = make_torchrl_env(env_spec, envs_per_worker, batched=batched, transforms=env_transforms)
        common |= native or {}
        collector = Collector(env, policy, **common)
        return collector, {"class": "Collector", "kwargs": common}
    cls = MultiSyncCollector if sync else MultiAsyncCollector
    env_fn = functools.partial(
        make_torchrl_env, env_spec, envs_per_worker, batched=batched, worker_process=True, transforms=env_transforms
    )
    multi: dict[str, Any] = {**common, "num_threads": 1, "num_sub_threads": 1}
    if sync:
        multi["cat_results"] = "stack"
    multi |= native or {}
    collector = cls([env_fn] * workers, policy, init_fn=worker_init, **multi)
    return collector, {"class": cls.__name__, "kwargs": {**multi, "num_workers": workers}}


def completed_episodes(data: TensorDictBase) -> tuple[list[float], list[int]]:
    """Returns and lengths of the episodes that ended inside ``data`` (RewardSum / StepCounter at done)."""
    done = data["next", "done"].squeeze(-1)
    returns = data["next", "episode_reward"].squeeze(-1)[done]
    lengths = data["next", "step_count"].squeeze(-1)[done]
    return [float(r) for r in returns], [int(n) for n in lengths]


class CollectorWorkerDied(RuntimeError):
    """A collector worker process ended mid-trial: TorchRL 0.14 neither restarts it nor goes on without it."""


def check_workers(collector: Any) -> None:
    """Raise :class:`CollectorWorkerDied` naming every collector worker process that has ended.

    Only multi-process collectors have workers (``procs``); a worker TorchRL itself closed after
    another one died is skipped (its state can no longer be read).
    """
    dead = []
    for i, proc in enumerate(getattr(collector, "procs", None) or ()):
        try:
            code = proc.exitcode
        except ValueError:  # closed by TorchRL
            continue
        if code is not None:
            dead.append(f"worker {i} (pid {proc.pid}) {_exit_text(code)}")
    if dead:
        raise CollectorWorkerDied(
            f"torchrl: collector {', '.join(dead)} mid-trial; TorchRL 0.14 does not restart collector workers"
        )


def _exit_text(code: int) -> str:
    if code >= 0:
        return f"exited with code {code}"
    try:
        return f"killed by {signal.Signals(-code).name}"
    except ValueError:  # a signal without a name (real-time signals)
        return f"killed by signal {-code}"


def sync_weights(collector: Any) -> None:
    """``collector.update_policy_weights_()``, raising :class:`CollectorWorkerDied` rather than hanging.

    TorchRL 0.14 waits for every worker's acknowledgement of new weights without a timeout
    (``SharedMemWeightSyncScheme._wait_for_ack``): a worker killed while the learner trains made the
    trial hang forever (measured). For multi-process collectors the update runs in a daemon thread
    while this thread watches the worker processes; it returns as soon as the update does (the thread
    adds ~0.1 ms to ``time_sync_weights_s``, measured).
    """
    if not getattr(collector, "procs", None):
        collector.update_policy_weights_()
        return
    check_workers(collector)
    failure: list[BaseException] = []

    def update() -> None:
        try:
            collector.update_policy_weights_()
        except BaseException as e:  # handed to the calling thread
            failure.append(e)

    thread = threading.Thread(target=update, name="crossrl-weight-sync", daemon=True)
    thread.start()
    while True:
        thread.join(0.2)
        if not thread.is_alive():
            break
        check_workers(collector)
    if failure:
        raise failure[0]


class TorchrlAdapter:
    """TorchRL 0.14: collectors, losses and value estimators."""

    engine: ClassVar[str] = "torchrl"

    def run(self, trial: Trial, sink: MetricSink) -> None:
        # The networks are tiny: intra-op threads only spin against the samplers for the 2 cores
        # (measured: a PPO minibatch step took 20 ms with 1 thread, 490 ms with 2, on a loaded machine).
        torch.set_num_threads(1)
        torch.manual_seed(trial.seed)
        tags: dict[str, str] = {}
        if trial.ray_address:
            from crossrl.core.cluster import connect

            tags = connect(trial.ray_address)
        if trial.env.multi_agent:
            raise ValueError(
                f"{trial.name}: a multi-agent env (env.agents); TorchRL runs it through "
                "crossrl.adapters.torchrl.multi_agent.TorchrlMultiAgentAdapter (the registry's multi_agent_target)"
            )
        learner = build_learner(trial=trial, **learner_dims(trial.env))
        random_frames = init_random_frames(trial, sink.resumed())
        collector, collector_desc = build_collector(
            trial=trial,
            policy=learner.policy,
            random_frames=random_frames,
            env_transforms=getattr(learner, "env_transforms", None),  # a recurrent policy's state on the env
        )
        try:
            collector.set_seed(collector_seed(trial, sink.resumed()))
            layout = layout_label(trial, collector_desc["class"])
            sink.tags(engine_version=torchrl.__version__, collector=collector_desc["class"], layout=layout, **tags)
            sink.native_config(
                {
                    "engine": "torchrl",
                    "torchrl_version": torchrl.__version__,
                    "collector": collector_desc,
                    "env": ENV_DESCRIPTIONS[batched_env(trial.layout)].format(n=trial.envs_per_worker, id=trial.env.id),
                    "layout": {"env": batched_env(trial.layout)},
                    "reward_clip": "sign(next.reward) after the episode returns are read, before the learner"
                    if trial.env.resolved_reward_clip else None,
                    **learner.native(),
                    "hyperparams": {k: {"value": v, "torchrl": mapping_for(trial.algorithm)[k].torchrl}
                                    for k, v in trial.hyperparams.items() if k in mapping_for(trial.algorithm)},
                    "seed": trial.seed,
                    "torch_num_threads": {"learner": torch.get_num_threads(), "collector_workers": 1},
                }
            )  # fmt: skip
            train_loop(collector=collector, learner=learner, sink=sink, reward_clip=trial.env.resolved_reward_clip)
            send_clip(sink, lambda: greedy_act(learner))
        finally:
            collector.shutdown()


def greedy_act(learner: Any) -> Callable[[Any], Any]:
    """The learner's final policy, deterministic, for one observation: the argmax of its policy network's logits
    (PPO, A2C, A3C, IMPALA on discrete actions; each dimension's argmax on MultiDiscrete ones) or of its Q-network's
    values (DQN), without TorchRL's sampling or epsilon-greedy; the Gaussian's mean clipped to the env's bounds (PPO,
    A2C, A3C, IMPALA on continuous actions); SAC's mean action ``tanh(loc)``."""
    if not hasattr(learner, "qnet"):
        return learner.act_fn(deterministic=True)
    net = learner.qnet

    def act(obs: Any) -> int:
        with torch.no_grad():
            return int(torch.argmax(net(torch.as_tensor(obs)[None])[0]))

    return act


def sample_act(learner: Any) -> Callable[[Any], Any]:
    """As :func:`greedy_act`, but a sample from the categorical over the policy's logits or from its Gaussian (clipped
    to the bounds); DQN: still the argmax; SAC: a sample of its squashed Gaussian."""
    if hasattr(learner, "qnet"):
        return greedy_act(learner)
    return learner.act_fn(deterministic=False)


def load_policy(trial: Trial, folder: Path, *, greedy: bool = True) -> Callable[[Any], Any]:
    """The policy a checkpoint holds, for ONE single-agent observation: ``act(obs) -> action``.

    ``folder``: the checkpoint's folder or its engine folder. The learner's networks are rebuilt from the trial (no
    envs, no collector: the observation shape and number of actions, or SAC's action shape, are read from the
    checkpoint) and loaded from it. ``greedy``: the argmax of the policy's logits or the Q-values, a Gaussian
    policy's mean clipped to the env's bounds, SAC's mean action ``tanh(loc)`` (:func:`greedy_act`); else a sample
    from the categorical over the logits or from the (squashed) Gaussian (DQN acts greedily either way). A continuous
    action is a float32 array (SAC's in [-1, 1]). Multi-agent trials: ValueError.
    """
    if trial.env.multi_agent:
        raise ValueError(
            f"{trial.name}: load_policy acts for one single-agent observation; a multi-agent trial's checkpoint holds "
            "one policy per group (crossrl.adapters.torchrl.multi_agent.MultiAgentLearner.restore)"
        )
    folder = Path(folder)
    if (folder / ENGINE_DIR).is_dir():
        folder = folder / ENGINE_DIR
    state = read_state(folder)
    check_algorithm(state, trial.algorithm)
    learner = build_learner(trial=trial, **state["dims"])
    learner.load_state_dict(state)
    for net in (getattr(learner, "qnet", None), getattr(learner, "actor_net", None)):
        if net is not None:
            net.eval()
    return greedy_act(learner) if greedy else sample_act(learner)


def export_policy(trial: Trial, folder: Path) -> Any:
    """The checkpoint's greedy policy as a pure torch module (:class:`~crossrl.adapters.exported.GreedyPolicy`) for
    `crossrl export`, as :func:`greedy_act` acts: the argmax of the policy network's logits (Discrete actions) or of
    the Q-network's values (DQN); a Gaussian's mean clipped to the env's bounds; SAC's ``tanh(loc)`` (the first half
    of its actor network's outputs), in [-1, 1]."""
    from crossrl.adapters.exported import GreedyPolicy, exportable_folder

    if trial.algorithm == "dreamer":
        raise ValueError(f"{trial.name}: export writes feed-forward policies; a dreamer policy acts through its world "
                         "model's recurrent state (crossrl evaluate runs it)")  # fmt: skip
    folder = exportable_folder(trial, folder, multi_agent="a multi-agent trial's checkpoint holds one policy per group")
    state = read_state(folder)
    check_algorithm(state, trial.algorithm)
    learner: Any = build_learner(trial=trial, **state["dims"])
    learner.load_state_dict(state)
    if hasattr(learner, "qnet"):
        return GreedyPolicy(learner.qnet.eval())
    net = learner.actor_net.eval()
    dims = state["dims"]
    if "nvec" in dims:
        raise ValueError(f"{trial.name}: export takes Discrete or Box actions; {trial.algorithm} here acts on "
                         f"MultiDiscrete({dims['nvec']})")  # fmt: skip
    if "n_actions" in dims:
        return GreedyPolicy(net)
    act_dim = int(math.prod(dims["action_shape"]))
    if trial.algorithm == "sac":
        return GreedyPolicy(net, act_dim=act_dim, squash=True)
    return GreedyPolicy(net, act_dim=act_dim, low=dims["action_low"], high=dims["action_high"])


Episodes = Callable[[TensorDictBase], tuple[list[float], list[int], dict[str, float]]]


def single_agent_episodes(data: TensorDictBase) -> tuple[list[float], list[int], dict[str, float]]:
    """:func:`completed_episodes`, with no values beside them."""
    returns, lengths = completed_episodes(data)
    return returns, lengths, {}


def clip_rewards_(data: TensorDictBase) -> TensorDictBase:
    """``data``'s rewards (``("next", "reward")``) replaced by their sign, in place: what the learner then sees.
    The env's ``RewardSum`` has already counted the raw ones into ``episode_reward``."""
    reward = data.get(("next", "reward"))
    data.set(("next", "reward"), reward.sign())
    return data


@dataclass
class _Pending:
    """The batches since the last point: their env steps, the episodes that ended in them, the seconds spent (summed)
    and the learner's values (averaged over the batches that reported each; counts as they stand at the point)."""

    env_steps: int = 0
    returns: list[float] = field(default_factory=list)
    lengths: list[int] = field(default_factory=list)
    times: dict[str, float] = field(default_factory=dict)
    stats: list[dict[str, float]] = field(default_factory=list)

    def add(
        self,
        *,
        env_steps: int,
        returns: list[float],
        lengths: list[int],
        times: dict[str, float],
        values: dict[str, float],
    ) -> None:
        self.env_steps += env_steps
        self.returns += returns
        self.lengths += lengths
        for k, v in times.items():
            self.times[k] = self.times.get(k, 0.0) + v
        self.stats.append(values)

    def values(self) -> dict[str, float]:
        out = {**self.times, **mean_stats(self.stats)}
        for key in _AT_THE_POINT:  # counts and sizes: as they stand at the point, not averaged
            last = next((stats[key] for stats in reversed(self.stats) if key in stats), None)
            if last is not None:
                out[key] = last
        return out


_AT_THE_POINT = (M.DIAG_UPDATES, M.DIAG_REPLAY_SIZE)


def train_loop(
    *,
    collector: Any,
    learner: Any,
    sink: MetricSink,
    episodes: Episodes = single_agent_episodes,
    reward_clip: bool = False,
) -> None:
    """Sample, learn, sync weights, report; until the sink's budget is spent. ``episodes(data)``: the returns and
    lengths of the episodes that ended in a batch, and values to report beside them (a multi-agent env's
    per-agent returns). ``reward_clip``: the learner gets the batch's rewards as their sign, once the episodes'
    raw returns are read.

    Starts the sink's clock; before it, a resumed trial's learner is restored from its checkpoint
    (``learner.restore``), the weights pushed to the collector, and the env-step counters continued. A checkpoint
    (``learner.save``) when the sink says one is due after a point, and a final one after the loop.
    """
    sampled = trained = 0
    resumed = sink.resumed()
    if resumed is not None:
        learner.restore(resumed.path)
        sync_weights(collector)
        sampled, trained = resumed.env_steps_sampled, resumed.env_steps_trained
    sink.start_clock()
    batches = iter(collector)
    # a point per collector batch, or, where batches are a few env steps (SAC's one step per batch), per
    # ``learner.point_env_steps`` env steps at the least, as crossrl's replay optimizers report theirs
    every = int(getattr(learner, "point_env_steps", 0))
    pending = _Pending()
    while not sink.exhausted:
        t0 = time.perf_counter()
        try:
            data = next(batches)
        except Exception:
            check_workers(collector)  # TorchRL's own "At least one process failed": say which and how
            raise
        t1 = time.perf_counter()
        returns, lengths, episode_values = episodes(data)
        if reward_clip:
            clip_rewards_(data)
        n_sampled = data.numel()
        sampled += n_sampled
        n_trained, losses = learner.learn(data)
        trained += n_trained
        t2 = time.perf_counter()
        if n_trained or learner.always_sync:
            sync_weights(collector)
        t3 = time.perf_counter()
        pending.add(
            env_steps=n_sampled,
            returns=returns,
            lengths=lengths,
            times={M.TIME_SAMPLE_S: t1 - t0, M.TIME_LEARN_S: t2 - t1, M.TIME_SYNC_WEIGHTS_S: t3 - t2},
            values={**losses, **episode_values},
        )
        if every and pending.env_steps < every:
            budget = sink.trial.budget.env_steps
            if budget is None or sampled < budget:
                continue
        sink.point(
            env_steps_sampled=sampled,
            env_steps_trained=trained,
            episode_returns=pending.returns,
            episode_lengths=pending.lengths,
            values=pending.values(),
        )
        pending = _Pending()
        sink.checkpoint_if_due(learner.save)
    sink.final_checkpoint(learner.save)
