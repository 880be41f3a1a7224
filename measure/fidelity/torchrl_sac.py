"""TorchRL's own SAC loop: the structure of TorchRL's reference script (``sota-implementations/sac/sac.py`` and its
``utils.py``) with the settings crossrl's TorchRL adapter stored for the same trial; nothing of crossrl's adapter. Run
by :class:`~crossrl.measure.fidelity.torchrl_loop.TorchrlNativeLoop` for a ``sac`` trial.

What the reference does: a ``SyncDataCollector`` (TorchRL 0.14: ``Collector``) over the train env whose first
``init_random_frames`` env steps are uniformly random actions (the collector draws them from the action spec, without
the policy); per collected batch, the batch flattened into a replay buffer (``extend(tensordict.reshape(-1))``); once
``collected_frames >= init_random_frames``, ``frames_per_batch * utd_ratio`` updates, each on a fresh
``replay_buffer.sample()``: ``SACLoss`` (``loss_actor + loss_qvalue + loss_alpha``, one ``backward()``), one step of
the three Adams grouped into one (``group_optimizers``: actor, critics, temperature), ``SoftUpdate.step()`` of the
target critics. The actor: ``ProbabilisticActor`` with a ``TanhNormal`` (``low`` / ``high`` the action spec's bounds,
``tanh_loc=False``, ``InteractionType.RANDOM``) over an ``MLP`` giving ``loc`` and ``scale``; the critics:
``ValueOperator`` over an ``MLP`` of ``[observation, action]``; ``SACLoss(num_qvalue_nets=2, delay_actor=False,
delay_qvalue=True)`` with its default TD(0) value estimator.

Taken from the stored native config (``crossrl.measure.fidelity.stored_config``): the collector (its class,
``Collector`` or ``MultiSyncCollector``, its kwargs with ``frames_per_batch`` and ``init_random_frames``, the number
of workers), ``SACLoss``'s kwargs (twin critics, l2, the initial and learned temperature, the target entropy),
``TD0Estimator``'s gamma, ``SoftUpdate``'s tau, the three Adams' lr and eps, the replay buffer (its capacity, batch
size and the keys it stores), ``updates_per_step`` and the actor's log-std bounds. From the trial: the env id and
kwargs, envs per worker, ``env.actions``, the MLPs' hidden sizes and activation and the seed. Built with TorchRL's own
calls: per worker a ``SerialEnv`` of ``GymEnv`` (gymnasium) with ``ActionScaling`` (unit actions), ``DoubleToFloat``,
``RewardSum`` and ``StepCounter``; the networks initialised as the adapter's (``init_as_spec``).

Known differences from the reference script, kept on purpose:

- Actions: the policy acts in [-1, 1] and TorchRL's ``ActionScaling`` transform maps them affinely to the env's bounds
  (``a * (high - low) / 2 + (high + low) / 2``: gymnasium's ``RescaleAction``, which crossrl's ``env.actions:
  unit`` puts on the adapter's env). The reference keeps the env's bounds and gives them to ``TanhNormal`` (``low``,
  ``high``): the same actions in the env, but the critics would see and the replay would hold env-scale actions and
  the log-probabilities (so the entropy the temperature is tuned against) would shift by ``log((high - low) / 2)`` per
  action dimension (-0.69 nats on Pendulum), a different problem from the adapter's.
- The actor's scale is ``exp(clamp(log_std, min, max))`` at the stored bounds (the adapter's network), not the
  reference's ``NormalParamExtractor(scale_mapping="biased_softplus_1.0", scale_lb=0.1)``: TorchRL's mappings have no
  clamped exponential, and the scale mapping is part of the network, which both sides must share (the adapter's
  ``LogStdScale`` module itself).
- Two critics built separately and handed to ``SACLoss`` as a list, where the reference hands it one critic that
  ``SACLoss`` copies (re-sampling both copies' weights uniformly between the module's min and max: the spec's
  orthogonal initialisation would be lost). The critics take ``[observation, action]`` (the adapter's order; the
  reference's is ``[action, observation]``). The ``MLP`` input sizes are given, not lazy.
- Updates per batch: ``updates_per_step`` per new env step with the fractional remainder carried to the next batch (as
  the adapter counts them); the reference's ``int(frames_per_batch * utd_ratio)`` per batch is the same count whenever
  that product is whole, and would never update with, say, one env step per batch and a ratio below 1.
- The replay buffer: a ``ReplayBuffer`` of the stored keys (what ``SACLoss`` reads) with a uniform ``RandomSampler``
  in a ``LazyTensorStorage`` (memory), no prefetching thread; the reference's ``TensorDictReplayBuffer`` stores every
  key of the batch and prefetches 3 samples in a thread (samples drawn before the latest ``extend``). No prioritized
  replay (TorchRL's ``PrioritizedSampler`` needs its C++ extension, which does not load with torch 2.13; the adapter
  has none either).
- ``collector.update_policy_weights_()`` after a batch's updates, as the adapter (and TorchRL's PPO and IMPALA
  references) does it; the reference calls it right after collecting, before the updates, so a multi-process
  collector's workers would act one batch behind. With the in-process ``Collector`` (one worker) the policy is the
  learner's own module and the placement changes nothing.
- No ``InitTracker`` (no recurrent state to reset), no ``StepCounter(max_episode_steps)`` truncation (gymnasium's own
  ``TimeLimit`` ends the episodes, as in the adapter's env), no periodic deterministic evaluation, no compilation.
- Points: one per ``steps_per_iteration`` env steps at the least (crossrl's replay reporting interval, 1000; and at
  the budget), with the episodes finished since the last point, as the adapter reports SAC (a point per collector
  batch of one env step would make each point's mean return one episode's). The reference logs per batch.

Known differences from crossrl's adapter (``adapters/torchrl/adapter.py``, ``adapters/torchrl/algorithms.py``): the
envs (``GymEnv`` in ``SerialEnv`` with ``ActionScaling``; the adapter's are crossrl's ``make_env`` with gymnasium's
``RescaleAction`` behind its env guard, in gymnasium's ``SyncVectorEnv`` by default); the networks are TorchRL's
``MLP`` initialised as crossrl's (``init_as_spec``: the same scheme, not the same draws); the three Adams stepped as
one grouped Adam (the same per-group steps); no first-critic Q diagnostic, no exploration epsilon diagnostic and no
check that the policy's actions are finite (the sink still fails the trial on a NaN loss).
"""

from __future__ import annotations

import functools
import re
import time
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from crossrl.adapters.base import MetricSink
from crossrl.adapters.torchrl.algorithms import LogStdScale  # the adapter's actor scale: the same network on both sides
from crossrl.measure.fidelity import beat
from crossrl.measure.fidelity.torchrl_common import (
    ACTIVATIONS,
    episodes,
    gym_env,
    init_as_spec,
    needed,
    stored_sync_collector,
    sync_collector,
)
from crossrl.scenarios import metrics as M
from crossrl.scenarios.catalog import CROSSRL_SETTINGS
from crossrl.scenarios.spec import Trial

"""The collector classes a SAC trial's stored config may name (the adapter's local, synchronous ones)."""
LOSS = "SACLoss"
VALUE_ESTIMATOR = "TD0Estimator"
TARGET = "SoftUpdate"
OPTIMIZER = "torch.optim.Adam"
REPLAY = "ReplayBuffer"
OPTIMIZERS = ("actor", "critic", "alpha")
"""The stored Adams, in the order they are grouped (the reference's ``group_optimizers(actor, critic, alpha)``)."""
DISTRIBUTION = "TanhNormal(low=-1, high=1)"
"""The adapter's actor distribution, the only one this loop builds (actions in [-1, 1])."""
SCALE = re.compile(r"exp\(clamp\(log_std, (?P<low>-?[0-9.eE+-]+), (?P<high>-?[0-9.eE+-]+)\)\)")
"""The stored actor scale (``exp(clamp(log_std, -5.0, 2.0))``): its log-std bounds."""
STORAGE = re.compile(r"LazyTensorStorage\((?P<size>[0-9]+)\)")
INIT_SAC = (
    "the spec's (init_as_spec): orthogonal, gain sqrt(2) hidden, 0.01 on the actor's output, 1.0 on each critic's, "
    "zero biases"
)
POINT_ENV_STEPS = int(CROSSRL_SETTINGS["sac"]["steps_per_iteration"])
"""A point per this many env steps at the least: crossrl's replay reporting interval, the adapter's for SAC."""

FIX = "store the config crossrl's TorchRL adapter reports for a local sac trial (`crossrl fidelity` does)"


def _need(stored: Mapping[str, Any], where: str, *keys: str) -> Any:
    """``stored_value`` with the file and the remedy in its one line."""
    return needed(stored, where, FIX, *keys)


def _refuse(what: str, where: str) -> ValueError:
    """The one-line error for a stored config this loop cannot run as stored."""
    return ValueError(f"torchrl-native: sac {what} ({where}): {FIX}")


def settings(trial: Trial, stored: Mapping[str, Any], where: str) -> dict[str, Any]:
    """Every setting of the loop from the stored native config, checked; a ValueError in one line otherwise."""
    collector = stored_sync_collector(trial, stored, where, algorithm="sac", fix=FIX)
    random_frames = int(_need(stored, where, "collector", "kwargs", "init_random_frames"))
    for keys, cls_name in (
        (("loss", "class"), LOSS),
        (("value_estimator", "class"), VALUE_ESTIMATOR),
        (("target_network", "class"), TARGET),
        (("replay_buffer", "class"), REPLAY),
        (("actor", "distribution"), DISTRIBUTION),
        *((("optimizers", name, "class"), OPTIMIZER) for name in OPTIMIZERS),
    ):
        found = _need(stored, where, *keys)
        if found != cls_name:
            raise _refuse(f"needs the stored {'.'.join(keys)} {cls_name}, not {found!r}", where)
    sampler = str(_need(stored, where, "replay_buffer", "sampler"))
    if not sampler.startswith("RandomSampler"):
        raise _refuse(f"samples its replay uniformly (RandomSampler), not by the stored {sampler!r}", where)
    storage = STORAGE.fullmatch(str(_need(stored, where, "replay_buffer", "storage")))
    scale = SCALE.fullmatch(str(_need(stored, where, "actor", "scale")))
    if storage is None or scale is None:
        raise _refuse("cannot read the stored replay_buffer.storage or actor.scale", where)
    clip = _need(stored, where, "grad_clip_norm")
    if clip is not None:
        raise _refuse(f"clips no gradients (the adapter's SAC does not), the stored grad_clip_norm is {clip!r}", where)
    return {
        **collector,
        "init_random_frames": random_frames,
        "loss_kwargs": dict(_need(stored, where, "loss", "kwargs")),
        "value_kwargs": dict(_need(stored, where, "value_estimator", "kwargs")),
        "tau": float(_need(stored, where, "target_network", "kwargs", "tau")),
        "optimizers": {
            name: {
                "lr": float(_need(stored, where, "optimizers", name, "lr")),
                "eps": float(_need(stored, where, "optimizers", name, "eps")),
            }
            for name in OPTIMIZERS
        },
        "buffer_size": int(storage["size"]),
        "batch_size": int(_need(stored, where, "replay_buffer", "batch_size")),
        "replay_keys": [tuple(k) if isinstance(k, list) else k for k in _need(stored, where, "replay_buffer", "keys")],
        "updates_per_step": float(_need(stored, where, "updates_per_step")),
        "log_std": (float(scale["low"]), float(scale["high"])),
    }


def make_sac_env(env_id: str, kwargs: Mapping[str, Any], num_envs: int, unit_actions: bool) -> Any:
    """``num_envs`` gymnasium envs stepped serially, the policy's actions in [-1, 1] mapped to the env's bounds by
    TorchRL's ``ActionScaling`` (``unit_actions``: the trial's ``env.actions: unit``), float64 observations as float32
    (``DoubleToFloat``, MuJoCo's; the reference's transform), episode return and length counters (module-level: a
    collector worker started with spawn unpickles it)."""
    from torchrl.envs import ActionScaling, Compose, DoubleToFloat, RewardSum, SerialEnv, StepCounter, TransformedEnv

    torch.set_num_threads(1)
    base = SerialEnv(num_envs, functools.partial(gym_env, env_id, dict(kwargs)), serial_for_single=True)
    scaling = [ActionScaling()] if unit_actions else []
    return TransformedEnv(base, Compose(*scaling, DoubleToFloat(), RewardSum(), StepCounter()))


def actor_critics(trial: Trial, log_std: tuple[float, float]) -> tuple[Any, list[Any], Any, list[Any]]:
    """The actor and the two critics as the reference's ``make_sac_agent`` builds them from a proof env's specs, of
    the trial's hidden sizes and activation: a ``ProbabilisticActor`` with a ``TanhNormal`` over the action spec's
    bounds (``tanh_loc=False``, random interaction) over an ``MLP`` to ``2 x action dims`` whose second half is the
    log std, clamped to ``log_std`` and exponentiated; each critic a ``ValueOperator`` over an ``MLP`` of
    ``[observation, action]``. Initialised as the adapter's networks (``init_as_spec``: orthogonal, gain sqrt(2) on
    hidden layers, 0.01 on the actor's output, 1.0 on the critics', zero biases), in the adapter's order (actor, then
    each critic), after seeding torch with the trial's seed. Returns ``(actor, critics, actor_mlp, critic_mlps)``."""
    from tensordict.nn import InteractionType, TensorDictModule
    from torchrl.data import Bounded as BoundedSpec
    from torchrl.modules import MLP, ProbabilisticActor, TanhNormal, ValueOperator

    torch.set_num_threads(1)
    torch.manual_seed(trial.seed)
    proof = make_sac_env(trial.env.id, trial.env.kwargs, 1, trial.env.actions == "unit")
    try:
        action_spec = proof.full_action_spec_unbatched["action"].clone()
        obs_spec = proof.observation_spec_unbatched.get("observation", None)
    finally:
        proof.close(raise_if_closed=False)  # a SerialEnv never stepped was never started
    unit = (
        isinstance(action_spec, BoundedSpec)
        and len(action_spec.shape) == 1
        and bool((action_spec.space.low == -1).all() and (action_spec.space.high == 1).all())
    )
    if not unit or obs_spec is None or len(obs_spec.shape) != 1:
        raise ValueError(
            f"torchrl-native: sac runs continuous actions in [-1, 1] (env.actions: unit) with vector observations; "
            f"{trial.env.id} gives the policy {type(action_spec).__name__} actions of shape {list(action_spec.shape)} "
            f"and observations {None if obs_spec is None else list(obs_spec.shape)}"
        )
    n_obs, n_act = int(obs_spec.shape[-1]), int(action_spec.shape[-1])

    activation = getattr(nn, ACTIVATIONS[trial.model.activation])
    hidden = list(trial.model.hidden)
    actor_mlp = MLP(in_features=n_obs, out_features=2 * n_act, num_cells=hidden, activation_class=activation)
    init_as_spec(actor_mlp, out_gain=0.01)
    critic_mlps = []
    for _ in range(2):
        mlp = MLP(in_features=n_obs + n_act, out_features=1, num_cells=hidden, activation_class=activation)
        critic_mlps.append(init_as_spec(mlp, out_gain=1.0))
    actor = ProbabilisticActor(
        TensorDictModule(nn.Sequential(actor_mlp, LogStdScale(*log_std)), in_keys=["observation"],
                         out_keys=["loc", "scale"]),
        in_keys=["loc", "scale"],
        spec=action_spec,
        distribution_class=TanhNormal,
        distribution_kwargs={"low": action_spec.space.low, "high": action_spec.space.high, "tanh_loc": False},
        default_interaction_type=InteractionType.RANDOM,
        return_log_prob=False,
    )  # fmt: skip
    critics = [ValueOperator(mlp, in_keys=["observation", "action"]) for mlp in critic_mlps]  # MLP concatenates them
    return actor, critics, actor_mlp, critic_mlps


def run_sac(trial: Trial, sink: MetricSink, stored: Mapping[str, Any], where: str) -> None:
    """TorchRL's SAC loop on the stored settings, reported through ``sink`` a point per ``POINT_ENV_STEPS`` env
    steps at the least (and at the budget)."""
    s = settings(trial, stored, where)

    import torchrl
    from torchrl.data import LazyTensorStorage, ReplayBuffer
    from torchrl.data.replay_buffers import RandomSampler
    from torchrl.objectives import SACLoss, SoftUpdate, ValueEstimators, group_optimizers

    actor, critics, actor_mlp, critic_mlps = actor_critics(trial, s["log_std"])
    loss_module = SACLoss(actor, critics, **s["loss_kwargs"])
    loss_module.make_value_estimator(ValueEstimators.TD0, **s["value_kwargs"])
    target_updater = SoftUpdate(loss_module, tau=s["tau"])
    opts = s["optimizers"]
    optimizer = group_optimizers(
        torch.optim.Adam(list(loss_module.actor_network_params.flatten_keys().values()), **opts["actor"]),
        torch.optim.Adam(list(loss_module.qvalue_network_params.flatten_keys().values()), **opts["critic"]),
        torch.optim.Adam([loss_module.log_alpha], **opts["alpha"]),
    )
    batch_size, keys = s["batch_size"], s["replay_keys"]
    buffer = ReplayBuffer(storage=LazyTensorStorage(s["buffer_size"]), sampler=RandomSampler(), batch_size=batch_size)

    def update() -> Any:
        """One SAC update on a replay sample, as the reference's ``update``: the three losses, one backward, the
        grouped Adam's step, the target critics' soft update. Its losses, detached."""
        out = loss_module(buffer.sample())
        (out["loss_actor"] + out["loss_qvalue"] + out["loss_alpha"]).sum().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        target_updater.step()
        parts = (out["loss_qvalue"], out["loss_actor"], out["entropy"], out["alpha"], out["loss_alpha"])
        return torch.stack([p.detach().mean() for p in parts])

    workers, collector_kwargs, fpb = s["workers"], s["collector_kwargs"], s["fpb"]
    unit = trial.env.actions == "unit"
    env_fn = functools.partial(make_sac_env, trial.env.id, dict(trial.env.kwargs), trial.envs_per_worker, unit)
    collector = sync_collector(s["collector_cls"], env_fn, actor, workers=workers, kwargs=collector_kwargs)
    try:
        collector.set_seed(trial.seed)
        sink.tags(engine_version=torchrl.__version__, collector=s["collector_cls"],
                  native_loop="torchrl: the SAC reference loop (sota-implementations/sac)")  # fmt: skip
        sink.native_config(
            {
                "engine": "torchrl-native",
                "torchrl_version": torchrl.__version__,
                "stored_config": where,
                "collector": {"class": s["collector_cls"], "kwargs": collector_kwargs, "num_workers": workers},
                "env": f"TransformedEnv(SerialEnv({trial.envs_per_worker} x GymEnv({trial.env.id!r}, "
                f"categorical_action_encoding=True, **{dict(trial.env.kwargs)})), Compose("
                + ("ActionScaling(), " if unit else "") + "DoubleToFloat(), RewardSum(), StepCounter()))",
                "actor": {"class": "ProbabilisticActor", "distribution": DISTRIBUTION, "tanh_loc": False,
                          "scale": f"exp(clamp(log_std, {s['log_std'][0]}, {s['log_std'][1]}))",
                          "network": repr(actor_mlp)},
                "critics": {"class": "ValueOperator", "in_keys": ["observation", "action"], "count": len(critics),
                            "network": repr(critic_mlps[0]), "handed_to_loss": "as a list (each keeps its init)"},
                "init": INIT_SAC,
                "loss": {"class": LOSS, "kwargs": s["loss_kwargs"],
                         "target_entropy": float(loss_module.target_entropy)},
                "value_estimator": {"class": VALUE_ESTIMATOR, "kwargs": s["value_kwargs"]},
                "target_network": {"class": TARGET, "kwargs": {"tau": s["tau"]}, "stepped": "after every update"},
                "optimizers": {name: {"class": OPTIMIZER, **opts[name]} for name in OPTIMIZERS},
                "optimizer_step": "group_optimizers(actor, critic, alpha): one Adam step of the three param groups",
                "grad_clip_norm": None,
                "replay_buffer": {"class": REPLAY, "storage": f"LazyTensorStorage({s['buffer_size']})",
                                  "sampler": "RandomSampler", "batch_size": batch_size,
                                  "keys": [list(k) if isinstance(k, tuple) else k for k in keys]},
                "init_random_frames": s["init_random_frames"],
                "updates_per_step": s["updates_per_step"],
                "updates": "updates_per_step x new env steps per batch (fractions carried), once collected frames "
                           ">= init_random_frames",
                "weights": "collector.update_policy_weights_() after a batch's updates",
                "point_env_steps": POINT_ENV_STEPS,
                "seed": trial.seed,
                "torch_num_threads": torch.get_num_threads(),
            }
        )  # fmt: skip
        sink.start_clock()
        budget = trial.budget.env_steps
        sampled = trained = updates = 0
        owed = 0.0  # replayed transitions owed under updates_per_step x batch_size per env step (carried)
        pending_steps, returns, lengths, stats = 0, [], [], []
        times = [0.0, 0.0, 0.0]
        t0 = time.perf_counter()
        for data in collector:
            t1 = time.perf_counter()
            frames = data.numel()
            if frames != fpb:
                raise ValueError(f"torchrl-native: a collector batch of {frames} env steps, not {fpb} ({where})")
            sampled += frames
            buffer.extend(data.reshape(-1).select(*keys))
            n_updates = 0
            if sampled >= s["init_random_frames"]:
                owed += frames * s["updates_per_step"] * batch_size
                while owed >= batch_size:
                    stats.append(update())
                    owed -= batch_size
                    n_updates += 1
            updates += n_updates
            trained += n_updates * batch_size
            t2 = time.perf_counter()
            if n_updates:
                collector.update_policy_weights_()
            t3 = time.perf_counter()
            done_returns, done_lengths = episodes(data)
            returns += done_returns
            lengths += done_lengths
            pending_steps += frames
            times = [times[0] + t1 - t0, times[1] + t2 - t1, times[2] + t3 - t2]
            if pending_steps < POINT_ENV_STEPS and (budget is None or sampled < budget):
                t0 = time.perf_counter()
                continue
            values = {M.TIME_SAMPLE_S: times[0], M.TIME_LEARN_S: times[1], M.TIME_SYNC_WEIGHTS_S: times[2]}
            if stats:  # the critics' loss first, as the adapter orders them: the sink names a diverged critic
                q_loss, actor_loss, entropy, alpha, alpha_loss = (float(x) for x in torch.stack(stats).mean(0))
                values |= {M.VALUE_LOSS: q_loss, M.POLICY_LOSS: actor_loss, M.ENTROPY: entropy,
                           M.DIAG_ALPHA: alpha, M.DIAG_ALPHA_LOSS: alpha_loss}  # fmt: skip
            values |= {M.DIAG_REPLAY_SIZE: float(len(buffer)), M.DIAG_UPDATES: float(updates)}
            sink.point(
                env_steps_sampled=sampled,
                env_steps_trained=trained,
                episode_returns=returns,
                episode_lengths=lengths,
                values=values,
            )
            beat()
            if sink.exhausted:
                break
            pending_steps, returns, lengths, stats = 0, [], [], []
            times = [0.0, 0.0, 0.0]
            t0 = time.perf_counter()
    finally:
        collector.shutdown()
