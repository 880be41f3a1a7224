"""Ray RLlib 2.60 (new API stack) driven through its AlgorithmConfig: PPO, IMPALA, DQN, SAC, DreamerV3.

Fairness: every shared hyperparameter is mapped by name in :data:`HYPERPARAM_MAP` (crossrl name ->
RLlib setting), and those RLlib cannot take are explained in :data:`NOT_EQUALIZABLE`; a trial that
carries a name in neither is refused, so a new shared hyperparameter cannot be silently ignored.
The env is built by :func:`crossrl.core.envs.make_env` inside RLlib's env runners; the network is
the spec's MLP for the policy and, separately, for the value function (``vf_share_layers=False``).

Episode statistics come from an ``on_episode_end`` callback that logs each finished episode's raw
(return, length) as an ``item_series`` (no reduction; RLlib clears it at every ``train()``), because
``env_runners/episode_return_mean`` is a smoothed window over past iterations.

SAC: :mod:`crossrl.adapters.rllib.sac` (critics as plain MLPs on ``[observation, action]``, uniformly random actions
until learning starts, the temperature carried through checkpoints, the mean action ``tanh(mean)``).

Multi-agent envs (``env.agents`` set, PPO only): :mod:`crossrl.adapters.rllib.multi_agent` (ParallelPettingZooEnv, one
RLModule per policy id, team and per-agent returns, per-policy losses).

Checkpoints (:func:`save_engine`, :func:`restore`): RLlib's own ``Algorithm.save_to_path`` (learner: RLModule weights
with DQN's target network, Adam's moments and step counts; the local env runner's connector states; the metrics
logger with RLlib's lifetime counters; the training iteration), plus DQN's replay buffer, which the new API stack
does not save. A resumed trial restores them with ``restore_from_path``, then pushes the learner's weights and the
connector states to every remote env runner and waits for them (RLlib 2.60 sends its own sync fire-and-forget, and
drops it when a ``set_state`` request is still in flight: measured, a remote runner kept its fresh weights), and
re-applies the trial's ``lr`` (Adam's ``load_state_dict`` brings back the saved one). Env steps count on from the
checkpoint's (:class:`StepOffsets`). Not restored: episodes in flight (the envs start from reset), the env runners'
random states (a resumed trial's runners are seeded from the trial's seed and the checkpoint's env step,
:func:`resume_seed`), IMPALA's batches in flight. :func:`load_policy` reloads a checkpoint's RLModule without Ray.
"""

from __future__ import annotations

import functools
import json
import math
import os
import pickle
import re
import sys
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Final

from crossrl.adapters.base import MetricSink, send_clip, signature_keywords
from crossrl.adapters.checkpoints import ENGINE_DIR, META, Resumed, resume_seed
from crossrl.adapters.rllib.results import (
    LOSS_KEYS,
    env_steps_sampled,
    finite,
    first_number,
    number,
    result_get,
    timing_values,
)
from crossrl.scenarios import metrics as M
from crossrl.scenarios.spec import EnvSpec, ModelSpec, Trial

ENGINE_ID: Final = "rllib"

# crossrl name -> RLlib AlgorithmConfig setting (attribute; ``[...]`` indexes into it). Read by the
# tests and printed in the README's fairness table.
_COMMON: Final[dict[str, str]] = {
    "lr": "lr",
    "gamma": "gamma",
    "grad_clip": "grad_clip",
    "rollout_fragment": "rollout_fragment_length",
    "train_batch": "train_batch_size_per_learner",
}
HYPERPARAM_MAP: Final[dict[str, dict[str, str]]] = {
    "ppo": {
        **_COMMON,
        "gae_lambda": "lambda_",
        "clip": "clip_param",
        "vf_clip": "vf_clip_param",
        "minibatch": "minibatch_size",
        "epochs": "num_epochs",
        "entropy_coeff": "entropy_coeff",
        "vf_coeff": "vf_loss_coeff",
    },
    "impala": {
        **_COMMON,
        "entropy_coeff": "entropy_coeff",
        "vf_coeff": "vf_loss_coeff",
        "minibatch": "minibatch_size",
        "epochs": "num_epochs",
        "vtrace_clip_rho": "vtrace_clip_rho_threshold",
    },
    "dqn": {
        **_COMMON,
        "buffer_size": "replay_buffer_config['capacity']",
        "learning_starts": "num_steps_sampled_before_learning_starts",
        "target_update": "target_network_update_freq",
        "n_step": "n_step",
        "epsilon_initial": "epsilon[0][1]",
        "epsilon_final": "epsilon[1][1]",
        "epsilon_timesteps": "epsilon[1][0]",
        "replay_ratio": "training_intensity",
        "double_q": "double_q",
        "prioritized_replay": "replay_buffer_config['type']",
        "priority_alpha": "replay_buffer_config['alpha']",
        "priority_beta": "replay_buffer_config['beta']",
    },
    "sac": {
        "actor_lr": "actor_lr",
        "critic_lr": "critic_lr",
        "alpha_lr": "alpha_lr",
        "gamma": "gamma",
        "tau": "tau",
        "train_batch": "train_batch_size_per_learner",
        "buffer_size": "replay_buffer_config['capacity']",
        "learning_starts": "num_steps_sampled_before_learning_starts",
        "updates_per_step": "training_intensity",
        "n_step": "n_step",
        "target_entropy": "target_entropy",
        "initial_alpha": "initial_alpha",
        "rollout_fragment": "rollout_fragment_length",
    },
    # DreamerV3Config.training() takes these by the same names (RLlib 2.60), the lambda as gae_lambda
    "dreamer": {
        "model_size": "model_size",
        "training_ratio": "training_ratio",
        "batch_size_B": "batch_size_B",
        "batch_length_T": "batch_length_T",
        "horizon_H": "horizon_H",
        "gamma": "gamma",
        "gae_lambda": "gae_lambda",
        "world_model_lr": "world_model_lr",
        "actor_lr": "actor_lr",
        "critic_lr": "critic_lr",
        "entropy_scale": "entropy_scale",
        "buffer_size": "replay_buffer_config['capacity']",
    },
}

# Mapped names whose value RLlib receives transformed (everything else is passed unchanged).
TRANSFORMED: Final[dict[str, str]] = {
    "prioritized_replay": "True -> PrioritizedEpisodeReplayBuffer, False -> EpisodeReplayBuffer",
    "replay_ratio": (
        "x max(runners,1)/(runners+1): RLlib's natural ratio counts the local env runner, which does "
        "not sample when remote runners exist; RLlib then rounds to whole sample/update rounds"
    ),
    "vtrace_clip_rho": "also sets vtrace_clip_pg_rho_threshold (one rho-bar for value and policy targets)",
    "training_ratio": (
        "also sets rollout_fragment_length = max(1, round(B x T / training_ratio / envs_per_worker)): RLlib 2.60's "
        "DreamerV3 makes at least one B x T update per sample call and reads its own trained-steps counter where "
        "the learner never writes it (measured: one update per env step at any training_ratio <= 1024 with the "
        "default fragment of 1), so the env steps per sample call set the real ratio"
    ),
    "updates_per_step": (
        "x train_batch x max(runners,1)/(runners+1) (replayed rows per env step, the DQN conversion); RLlib then "
        "rounds to whole sample/update rounds"
    ),
}

# Shared names RLlib has no setting for: algorithm -> name -> (the value RLlib behaves as, why).
# A trial whose value differs from RLlib's fixed one is refused (value None: any value, noted only).
NOT_EQUALIZABLE: Final[dict[str, dict[str, tuple[float | None, str]]]] = {
    "ppo": {},
    "impala": {
        "gae_lambda": (None, "RLlib's IMPALA has no GAE: V-trace targets (lambda = 1 with c-bar clipping)"),
        "vtrace_clip_c": (1.0, "RLlib's V-trace hard-codes c-bar = 1.0 (vtrace_torch_v2.py)"),
    },
    "dqn": {},
    "sac": {},
    "dreamer": {
        "free_bits": (1.0, "RLlib's DreamerV3 clamps its KL losses at 1 nat (dreamerv3_torch_learner.py, min=1.0)"),
    },
}

# Fixed RLlib settings that make the network and loss match the spec/crossrl (audit: native config).
_FIXED_TRAINING: Final[dict[str, dict[str, Any]]] = {
    "ppo": {"use_kl_loss": False, "use_gae": True, "use_critic": True},
    "impala": {"vtrace": True},
    "dqn": {"dueling": False, "num_atoms": 1, "noisy": False, "tau": 1.0},
    # twin critics; a Polyak step after every update; no gradient clipping (crossrl's core and TorchRL clip none)
    "sac": {"twin_q": True, "target_network_update_freq": 0, "grad_clip": None},
    # the paper's DreamerV3: both actor and critic trained (RLlib refuses any use_curiosity given, even False)
    "dreamer": {"train_actor": True, "train_critic": True},
}


def mapping_rows() -> list[tuple[str, str, str, str]]:
    """(algorithm, crossrl name, RLlib setting, note) for every shared name, for printing/README."""
    rows = [
        (algo, name, path, TRANSFORMED.get(name, ""))
        for algo, names in HYPERPARAM_MAP.items()
        for name, path in names.items()
    ]
    rows += [(algo, name, "(none)", why) for algo, names in NOT_EQUALIZABLE.items() for name, (_, why) in names.items()]
    return rows


_ITEM_KEY: Final = "crossrl_episodes"  # (return, length) per finished episode, in env_runners/
MIN_CPU_SHARE: Final = 1 / 16  # below this share per env runner we refuse (CPU starvation, not latency)


@dataclass(frozen=True)
class ResourcePlan:
    """How many Ray CPUs the env runners and learners get (Ray CPUs, may be fractional)."""

    num_env_runners: int
    cpus_per_env_runner: float
    num_learners: int  # 0: one local learner in this (driver) process
    note: str


def plan_resources(*, algorithm: str, workers: int, available_cpus: float) -> ResourcePlan:
    """Fit env runners and learners into the CPUs Ray has free, or raise saying why and how to fix.

    Env runners get one CPU each while they fit, otherwise an equal share (fine for envs whose cost
    is ``step_latency_ms``: they sleep). Learning happens in the driver (``num_learners=0``), as in
    crossrl's synchronous optimizers, except for IMPALA when a whole CPU is left after the runners:
    then it gets RLlib's default of one remote learner. Without this, IMPALA with 2 runners on a
    2-CPU Ray asks for a third CPU and waits for it forever (measured on Ray 2.60).
    """
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    # Rounded down to Ray's resource precision (1e-4), so that the shares never add up to more.
    share = min(1.0, math.floor(available_cpus / workers * 1e4) / 1e4)
    if share < MIN_CPU_SHARE:
        raise RuntimeError(
            f"rllib: {workers} env runners cannot fit in the {available_cpus:g} CPUs Ray has free "
            f"(each would get {share:.3f} CPU, the minimum is {MIN_CPU_SHARE:g}); RLlib would wait for "
            "resources forever. Fix: lower execution.workers, free the cluster's CPUs, or join a bigger "
            "cluster with --ray-address."
        )
    left = available_cpus - workers * share
    if algorithm == "impala" and left >= 1.0:
        return ResourcePlan(workers, share, 1, "IMPALA: 1 remote learner on the CPU left by the runners")
    note = "local learner in the driver" + ("" if share == 1.0 else f"; runners share CPUs ({share:.3f} each)")
    return ResourcePlan(workers, share, 0, note)


def _resolve(obj: Any, path: str) -> Any:
    """The value at an RLlib setting path such as ``epsilon[1][0]`` or ``replay_buffer_config['alpha']``."""
    m = re.fullmatch(r"(\w+)((?:\[[^\]]+\])*)", path)
    if m is None:
        raise ValueError(f"bad RLlib setting path {path!r}")
    value = obj[m.group(1)] if isinstance(obj, Mapping) else getattr(obj, m.group(1))
    for index in re.findall(r"\[([^\]]+)\]", m.group(2)):
        value = value[index.strip("'\"")] if index[0] in "'\"" else value[int(index)]
    return value


def check_covered(trial: Trial) -> None:
    """Refuse a trial with a hyperparameter RLlib would ignore silently, or a value it cannot take."""
    mapped = HYPERPARAM_MAP[trial.algorithm]
    fixed = NOT_EQUALIZABLE[trial.algorithm]
    unknown = sorted(set(trial.hyperparams) - set(mapped) - set(fixed))
    if unknown:
        raise ValueError(
            f"rllib: hyperparameter(s) {', '.join(unknown)} of {trial.algorithm} have no RLlib mapping; "
            "add them to crossrl.adapters.rllib.adapter.HYPERPARAM_MAP or NOT_EQUALIZABLE"
        )
    for name, (rllib_value, why) in fixed.items():
        given = trial.hyperparams.get(name)
        if rllib_value is not None and given is not None and not math.isclose(given, rllib_value):
            raise ValueError(f"rllib: {trial.algorithm} {name}={given} cannot be set ({why}); use {rllib_value}")


def training_settings(trial: Trial, *, num_env_runners: int) -> dict[str, Any]:
    """RLlib settings (AlgorithmConfig attribute -> value) for the trial's shared hyperparameters."""
    check_covered(trial)
    hp = trial.hyperparams
    out: dict[str, Any] = dict(_FIXED_TRAINING[trial.algorithm])
    for name, path in HYPERPARAM_MAP[trial.algorithm].items():
        if name in hp and re.fullmatch(r"\w+", path):
            out[path] = hp[name]
    if trial.algorithm == "impala" and "vtrace_clip_rho" in hp:
        out["vtrace_clip_pg_rho_threshold"] = hp["vtrace_clip_rho"]
    if trial.algorithm == "dqn":
        out["epsilon"] = [(0, hp["epsilon_initial"]), (hp["epsilon_timesteps"], hp["epsilon_final"])]
        buffer: dict[str, Any] = {"capacity": hp["buffer_size"]}
        if hp["prioritized_replay"]:
            buffer |= {"type": "PrioritizedEpisodeReplayBuffer", "alpha": hp["priority_alpha"]}
            buffer["beta"] = hp["priority_beta"]
        else:
            buffer["type"] = "EpisodeReplayBuffer"
        out["replay_buffer_config"] = buffer
        out["training_intensity"] = hp["replay_ratio"] * max(num_env_runners, 1) / (num_env_runners + 1)
    if trial.algorithm == "sac":
        out["replay_buffer_config"] = {"type": "EpisodeReplayBuffer", "capacity": hp["buffer_size"]}
        rows_per_step = hp["updates_per_step"] * hp["train_batch"]
        out["training_intensity"] = rows_per_step * max(num_env_runners, 1) / (num_env_runners + 1)
    if trial.algorithm == "dreamer":
        out["replay_buffer_config"] = {"type": "EpisodeReplayBuffer", "capacity": hp["buffer_size"]}
        out["rollout_fragment_length"] = dreamer_fragment(hp, envs_per_worker=trial.envs_per_worker)
    return out


def dreamer_fragment(hp: Mapping[str, Any], *, envs_per_worker: int) -> int:
    """The env steps per env and sample call that make RLlib 2.60's DreamerV3 replay ``training_ratio`` env steps per
    env step sampled. Its ``training_step`` samples ``rollout_fragment_length x num_envs_per_env_runner`` env steps
    (across the env runners) and then makes ``ceil(training_ratio x sampled / (B x T))`` updates of B x T steps, at
    least one (its own check of the lifetime ratio reads a counter its learner never writes, so it never holds
    sampling back): a call of ``B x T / training_ratio`` env steps gives exactly one update per call. Rounded, at
    least one env step per env."""
    replayed = int(hp["batch_size_B"]) * int(hp["batch_length_T"])
    return max(1, round(replayed / float(hp["training_ratio"]) / max(envs_per_worker, 1)))


def env_creator(env_config: Mapping[str, Any]) -> Any:
    """RLlib's env creator: the spec's env via crossrl's make_env (latency wrapper included), or for a
    multi-agent spec its PettingZoo parallel env via make_parallel_env, in RLlib's ParallelPettingZooEnv
    (:func:`crossrl.adapters.rllib.multi_agent.parallel_env`).

    Register it under the name given to :func:`sampler_config` (``ray.tune.registry.register_env``).
    """
    from crossrl.core.envs import SignRewardKeepScore, make_env

    if getattr(env_config, "worker_index", 0) > 0:
        import torch

        torch.set_num_threads(1)  # env runner processes: one thread each, the CPUs are the runners'
    spec = EnvSpec.model_validate(env_config["env_spec"])
    if spec.multi_agent:  # a PettingZoo parallel env (make_parallel_env) in RLlib's ParallelPettingZooEnv
        from crossrl.adapters.rllib.multi_agent import parallel_env

        return parallel_env(spec)
    # Reward clipping (env.reward_clip): RLlib's new API stack has no learner-side setting for it (the old stack's
    # clip_rewards is not read), so the env runners' episodes carry sign(reward) and the raw scores ride along in
    # the infos, which _on_episode_end sums for the returns crossrl reports.
    return SignRewardKeepScore(make_env(spec)) if spec.resolved_reward_clip else make_env(spec)


def vector_env_creator(env_config: Any) -> Any:
    """RLlib's env creator for ``gym_env_vectorize_mode="vector_entry_point"`` (``execution.layout.rllib.vectorize:
    VECTOR_ENTRY_POINT``): with ``num_envs`` in the config, crossrl's :func:`~crossrl.core.envs.make_vector_env` (the
    env's own vector class where it has one, what crossrl's core steps); else one env (:func:`env_creator`)."""
    from crossrl.core.envs import make_vector_env

    if "num_envs" not in env_config:
        return env_creator(env_config)
    import ray

    if ray.is_initialized() and ray.get_runtime_context().get_actor_id() is not None:
        import torch

        torch.set_num_threads(1)  # env runner actors: one thread each, as env_creator sets for them
    return make_vector_env(EnvSpec.model_validate(env_config["env_spec"]), int(env_config["num_envs"]))


def vectorize_mode(trial: Trial) -> str:
    """The trial's ``execution.layout.rllib.vectorize`` (SYNC when it names none); VECTOR_ENTRY_POINT refused with
    reward clipping (the env's own vector class has no clipping wrapper)."""
    mode = str(trial.layout.get("vectorize") or "SYNC")
    if mode == "best":
        raise ValueError("rllib: execution.layout.rllib.vectorize 'best' reached the engine unresolved (`crossrl run` "
                         "resolves it from the stored layout sweeps)")  # fmt: skip
    if mode == "VECTOR_ENTRY_POINT" and trial.env.resolved_reward_clip:
        raise ValueError(
            "rllib: execution.layout.rllib.vectorize VECTOR_ENTRY_POINT steps the env's own vector class, which "
            "cannot clip rewards (env.reward_clip); use SYNC or ASYNC"
        )
    return mode


def layout_label(trial: Trial) -> str:
    """The trial's layout on one line, e.g. ``2 runners x 4 SYNC`` (the ``layout`` tag, the report's trial table)."""
    if trial.env.multi_agent:
        return f"{trial.workers} runner{'s' if trial.workers != 1 else ''} x {trial.envs_per_worker} multi-agent"
    mode = {"VECTOR_ENTRY_POINT": "native vector"}.get(vectorize_mode(trial), vectorize_mode(trial))
    return f"{trial.workers} runner{'s' if trial.workers != 1 else ''} x {trial.envs_per_worker} {mode}"


def _on_episode_end(*, episode: Any, prev_episode_chunks: Any = None, metrics_logger: Any = None, **_: Any) -> None:
    """Log the finished episode's whole return and length (earlier chunks included), unreduced. With reward
    clipping the return is the raw score, from the infos (:func:`chunk_score`)."""
    chunks = [*(prev_episode_chunks or []), episode]
    ret = float(sum(chunk_score(c) for c in chunks))
    length = int(sum(len(c) for c in chunks))
    metrics_logger.log_value(_ITEM_KEY, (ret, length), reduce="item_series")


def chunk_score(chunk: Any) -> float:
    """The raw score of one episode chunk: its rewards' sum, or where the env clips them (``SignRewardKeepScore``)
    the raw rewards its step infos kept. ``get_infos()`` has one more item than the chunk has steps: the first
    is the reset's info, or in a later chunk the previous chunk's last step, counted there."""
    from crossrl.core.envs import SCORE_KEY

    infos = chunk.get_infos()
    if len(infos) > 1 and SCORE_KEY in infos[-1]:
        return float(sum(info[SCORE_KEY] for info in infos[1:]))
    return float(chunk.get_return())


def sampler_config(
    config: Any,
    *,
    env_spec: EnvSpec,
    env_name: str,
    model: ModelSpec,
    num_env_runners: int,
    envs_per_env_runner: int,
    cpus_per_env_runner: float,
    rollout_fragment: int | str,
    seed: int,
) -> Any:
    """``config`` (a fresh AlgorithmConfig such as ``PPOConfig()``) set up to sample the spec's env with its model.

    New API stack on torch; env runners make their envs with :func:`env_creator`, registered by the
    caller as ``env_name``; policy and value function each get the network of ``model``
    (:func:`model_config`); a multi-agent env gets one such RLModule per policy
    (:func:`crossrl.adapters.rllib.multi_agent.multi_agent_config`), sampled and counted in env steps.
    :func:`build_config` adds the trial's learners, training settings and callbacks on top; the sampling
    benchmark (``crossrl bench sampling``) samples with this alone.
    """
    config = (
        config.api_stack(enable_rl_module_and_learner=True, enable_env_runner_and_connector_v2=True)
        .framework("torch")
        .environment(env=env_name, env_config={"env_spec": env_spec.model_dump(mode="json")})
        .env_runners(
            num_env_runners=num_env_runners,
            num_envs_per_env_runner=envs_per_env_runner,
            num_cpus_per_env_runner=cpus_per_env_runner,
            rollout_fragment_length=rollout_fragment,
        )
        .rl_module(model_config=model_config(model))
        .debugging(seed=seed)
    )
    if env_spec.multi_agent:
        # One RLModule per crossrl policy id, every agent mapped to its policy; batches count env steps.
        from crossrl.adapters.rllib.multi_agent import multi_agent_config

        return multi_agent_config(config, env_spec=env_spec, model=model)
    if model.conv:
        from ray.rllib.core.rl_module.rl_module import RLModuleSpec

        from crossrl.adapters.rllib.frames import frames_module_class

        default = config.get_default_rl_module_spec().module_class
        config.rl_module(rl_module_spec=RLModuleSpec(module_class=frames_module_class(default)))
    return config


def model_config(model: ModelSpec) -> Any:
    """RLlib's ``DefaultModelConfig`` for the spec's network.

    An MLP: the encoder is the MLP (``fcnet_hiddens``) and the heads are linear. A conv model: RLlib
    builds a CNN encoder for image observations (its ``fcnet_hiddens`` are then unused), so the conv
    stack goes to ``conv_filters`` with padding ``"valid"`` (RLlib's default is ``"same"``; crossrl and
    TorchRL pad nothing) and the hidden layers to the heads (``head_fcnet_hiddens``). Either way
    ``vf_share_layers=False``: the value function gets its own network of the same layers (the
    dataclass default True would override PPO's own False). The uint8 frames are scaled by
    :mod:`crossrl.adapters.rllib.frames`' RLModules. RLlib's CNN flattens its output channels-last
    (H, W, C), crossrl and TorchRL channels-first: the first head layer's weights are a permutation of
    each other's, the same function class and parameter count.
    """
    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig

    if not model.conv:
        return DefaultModelConfig(
            fcnet_hiddens=list(model.hidden),
            fcnet_activation=model.activation,
            head_fcnet_hiddens=[],
            vf_share_layers=False,
        )
    # DefaultModelConfig's type says [filters, kernel, stride]; its TorchCNN also reads a fourth item, the padding.
    conv_filters: Any = [[filters, kernel, stride, "valid"] for filters, kernel, stride in model.conv]
    return DefaultModelConfig(
        conv_filters=conv_filters,
        conv_activation=model.activation,
        head_fcnet_hiddens=list(model.hidden),
        head_fcnet_activation=model.activation,
        vf_share_layers=False,
    )


def config_classes() -> dict[str, Any]:
    """Algorithm -> the RLlib AlgorithmConfig class crossrl builds for it."""
    from ray.rllib.algorithms.dqn import DQNConfig
    from ray.rllib.algorithms.dreamerv3 import DreamerV3Config
    from ray.rllib.algorithms.impala import IMPALAConfig
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.rllib.algorithms.sac import SACConfig

    return {"ppo": PPOConfig, "impala": IMPALAConfig, "dqn": DQNConfig, "sac": SACConfig, "dreamer": DreamerV3Config}


# The AlgorithmConfig methods a spec's ``native.rllib`` may call, each with its keyword arguments. api_stack, framework
# and callbacks stay crossrl's: the new API stack on torch, and the episode callback the returns are read from.
NATIVE_METHODS: Final[tuple[str, ...]] = (
    "training",
    "env_runners",
    "environment",
    "learners",
    "rl_module",
    "resources",
    "reporting",
    "debugging",
    "fault_tolerance",
    "evaluation",
    "multi_agent",
    "checkpointing",
    "offline_data",
    "python_environment",
)


def native_problems(algorithm: str, native: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """What RLlib's AlgorithmConfig for ``algorithm`` cannot take of a spec's ``native.rllib`` (method -> keyword
    arguments), one line each naming the key and how to fix it."""
    from crossrl.scenarios.spec import suggest

    cls = config_classes().get(algorithm)
    if cls is None:
        return []  # the registry refuses the algorithm on rllib
    problems = []
    for method, kwargs in native.items():
        where = f"native.rllib.{method}"
        if method not in NATIVE_METHODS:
            hint = suggest(method, NATIVE_METHODS)
            what = "is no setting method that native.rllib may call" if hasattr(cls, method) else "is no method"
            problems.append(
                f"{where}: {method!r} of RLlib's {cls.__name__} {what}; native.rllib takes "
                f"{', '.join(NATIVE_METHODS)}" + (f"; {hint}" if hint else "")
            )
            continue
        keywords = signature_keywords(cls, method)
        for key in kwargs:
            if key not in keywords:
                hint = suggest(key, keywords)
                problems.append(
                    f"{where}.{key}: RLlib's {cls.__name__}.{method}() takes no keyword {key!r}"
                    + (f"; {hint}" if hint else f"; see the keywords of {cls.__name__}.{method}() in RLlib 2.60")
                )
    return problems


def build_config(trial: Trial, *, plan: ResourcePlan, env_name: str) -> Any:
    """The trial's AlgorithmConfig (not built); pure apart from importing RLlib. The spec's ``native.rllib`` methods
    are called last, so their values win over crossrl's."""
    classes = config_classes()
    if trial.algorithm not in classes:
        raise ValueError(f"rllib cannot run {trial.algorithm}; it runs {', '.join(classes)}")
    on_episode_end: Any = _on_episode_end
    if trial.env.multi_agent:
        from crossrl.adapters.rllib.multi_agent import episode_callback, policy_layout

        if trial.algorithm != "ppo":
            raise ValueError(f"rllib runs multi-agent envs (env.agents) with ppo only, not {trial.algorithm}")
        on_episode_end = episode_callback(policy_layout(trial.env)[0])
    if trial.algorithm == "dreamer" and trial.model.conv:
        raise ValueError("rllib runs dreamer on flat observations only yet (DreamerV3's own CNN encoder takes 64x64 "
                         "frames, not algorithm.model.conv)")  # fmt: skip
    settings = training_settings(trial, num_env_runners=plan.num_env_runners)
    fragment = settings.pop("rollout_fragment_length", "auto")
    if trial.env.multi_agent:
        # train_batch / (runners x envs) env steps per env and iteration, as crossrl's sync_samples and TorchRL's
        # collectors sample PPO; the catalog's default fragment (64) with ma-smoke's train_batch 400 on 2 envs
        # is refused by RLlib's 10% check (400 is not near a multiple of 128).
        fragment = "auto"
    config: Any = (
        sampler_config(
            classes[trial.algorithm](),
            env_spec=trial.env,
            env_name=env_name,
            model=trial.model,
            num_env_runners=plan.num_env_runners,
            envs_per_env_runner=trial.envs_per_worker,
            cpus_per_env_runner=plan.cpus_per_env_runner,
            rollout_fragment=fragment,
            seed=trial.seed,
        )
        # Learning runs in this process when num_learners=0; Ray only accounts the main process's
        # CPU under Tune, which crossrl does not use, so 1 here reserves nothing on a 2-CPU machine.
        .resources(num_cpus_for_main_process=1)
        .learners(num_learners=plan.num_learners, num_cpus_per_learner=1 if plan.num_learners else "auto")
        .training(**settings)
        .callbacks(on_episode_end=on_episode_end)
        # RLlib's default, set here so the native config states it: Ray restarts a dead env runner
        # (SIGKILL, OOM), RLlib samples from the others meanwhile and counts the restart; at most
        # budget.max_worker_restarts times (RLlib's own bound is 1000). An env that raises is no lost worker:
        # crossrl's env guard reports it and the runner ends the trial (crossrl.orchestration.watch).
        .fault_tolerance(restart_failed_env_runners=True, max_num_env_runner_restarts=trial.budget.max_worker_restarts)
    )
    mode = vectorize_mode(trial)
    if mode != "SYNC":
        config.env_runners(gym_env_vectorize_mode=mode.lower())  # gymnasium.VectorizeMode's values
    if trial.algorithm == "impala":
        # RLlib's default of >= 10 s per train() gives few, coarse points on short budgets.
        config.reporting(min_time_s_per_iteration=1)
        # With a 0 s timeout the driver polls its env runners in a busy loop, taking a whole core
        # from them on a 2-core machine; waiting up to 50 ms blocks in ray.wait instead.
        config.training(timeout_s_sampler_manager=0.05)
    if trial.algorithm == "sac":
        from ray.rllib.algorithms.sac.torch.default_sac_torch_rl_module import DefaultSACTorchRLModule
        from ray.rllib.core.rl_module.rl_module import RLModuleSpec

        from crossrl.adapters.rllib.sac import ConcatQCatalog, SACUniformWarmup

        config.rl_module(
            rl_module_spec=RLModuleSpec(module_class=DefaultSACTorchRLModule, catalog_class=ConcatQCatalog)
        )
        config.algo_class = SACUniformWarmup
        # a point per 1000 env steps at the least, as crossrl's replay optimizers report (RLlib's SAC: 100)
        config.reporting(min_sample_timesteps_per_iteration=1000)
    if trial.algorithm == "dreamer":
        # DreamerV3 builds its own world model, actor and critic from model_size (its catalog reads no fcnet_hiddens);
        # a point per 1000 env steps at the least, as for the other replay algorithms (RLlib's default: one
        # training_step, a single env step per env runner and env)
        config.reporting(min_sample_timesteps_per_iteration=1000)
    for method, kwargs in trial.native.items():  # engine-native settings (native.rllib), as written: they win
        getattr(config, method)(**kwargs)
    return config


def native_config(config: Any) -> dict[str, Any]:
    """``config.to_dict()`` with the model config the RLModule really receives.

    ``to_dict()`` shows ``_model_config`` as a dataclass repr without the algorithm's auto-included
    keys, and ``model`` is the old API stack's model dict (fcnet_hiddens [256, 256]), which the new
    stack ignores; it is kept under a name that says so, so nobody audits the wrong network.
    """
    out = dict(config.to_dict())
    out["_model_config"] = dict(config.model_config)
    out["model (old API stack, unused)"] = out.pop("model", None)
    return out


# Diagnostics RLlib reports -> crossrl's diag.* names (a path under the train() result; absent keys are skipped).
# RLlib's PPO reports the mean KL between the sampling and the updated policy, not crossrl's k3 estimate
# nor a clip fraction; its off-policyness is counted in gradient updates, not weight versions.
DIAG_PATHS: Final[dict[str, tuple[str, ...]]] = {
    M.DIAG_APPROX_KL: ("learners", "default_policy", "mean_kl_loss"),
    M.DIAG_POLICY_LAG: ("learners", "default_policy", "diff_num_grad_updates_vs_sampler_policy"),
    M.DIAG_GRAD_NORM: ("learners", "default_policy", "gradients_default_optimizer_global_norm"),
    M.DIAG_REPLAY_SIZE: ("replay_buffer", "num_env_steps_stored"),
}


def _episode_pairs(items: Any) -> list[tuple[float, int]]:
    """(return, length) pairs from the ``crossrl_episodes`` item series.

    RLlib merges the env runners' series by chaining them; once in a 150k-step DQN run (seed 1 of
    cartpole-dqn, measured) pairs arrived flattened into consecutive scalars, so both shapes are read.
    """
    if not isinstance(items, list | tuple):
        return []
    out: list[tuple[float, int]] = []
    pending: list[float] = []
    for item in items:
        if isinstance(item, list | tuple) and len(item) == 2:
            out.append((float(item[0]), int(item[1])))
        elif isinstance(item, int | float) or hasattr(item, "__float__"):
            pending.append(float(item))
            if len(pending) == 2:
                out.append((pending[0], int(pending[1])))
                pending = []
    return out


def trained_steps(result: Mapping[str, Any], *, algorithm: str, epochs: int = 1) -> int | None:
    """The env steps trained so far (lifetime) a ``train()`` result reports: None for PPO (it trains on every sampled
    step), else the rows the learner consumed divided by the passes made over each batch (see
    :func:`result_to_point`)."""
    if algorithm == "ppo":
        return None
    rows = finite(result_get(result, "learners", "default_policy", "num_module_steps_trained_lifetime"))
    return int(rows / max(epochs, 1)) if rows is not None else None


def result_to_point(result: Mapping[str, Any], *, algorithm: str, epochs: int = 1) -> dict[str, Any]:
    """One ``train()`` result -> the keyword arguments of :meth:`MetricSink.point`.

    ``epochs`` is RLlib's ``num_epochs`` (passes over each train batch).
    """
    # RLlib's learners/__all_modules__/num_env_steps_trained counts the whole train batch once per
    # minibatch update (4842 for one 512-step PPO batch in 9 minibatches, measured), so it is not
    # used. PPO trains on every sampled step (None: the sink takes env_steps_sampled); IMPALA and
    # DQN report the rows their learner consumed, divided by the passes made over each batch.
    trained = trained_steps(result, algorithm=algorithm, epochs=epochs)
    episodes = _episode_pairs(result_get(result, "env_runners", _ITEM_KEY))
    policy = result_get(result, "learners", "default_policy") or {}
    # A non-finite loss or gradient norm is training that diverged (the sink fails the trial), except in an
    # iteration that made no update, whose learner stats RLlib reduces to NaN: IMPALA's asynchronous learner
    # (measured: tiny CartPole at iteration 10, atari-untuned at 14) and any learner restored from a checkpoint (SAC
    # refilling a buffer left out of it: its rows trained this iteration are NaN too). Those are left out as missing.
    rows = policy.get("num_module_steps_trained", 1)  # absent: nothing says no update was made
    idle = not (finite(rows) or 0) > 0
    keep: Callable[[Any], float | None] = finite if algorithm == "impala" or idle else number
    values: dict[str, float | None] = {
        **{name: keep(first_number(policy, LOSS_KEYS[name])) for name in (M.POLICY_LOSS, M.VALUE_LOSS, M.ENTROPY)},
        **timing_values(result),
        **{name: keep(result_get(result, *path)) for name, path in DIAG_PATHS.items()},
    }
    if algorithm == "sac":
        values |= sac_values(policy, keep=keep)
    if algorithm == "dreamer":
        values |= dreamer_values(policy, updates=result.get("num_grad_updates_lifetime"), keep=keep)
    return {
        "env_steps_sampled": env_steps_sampled(result),
        "env_steps_trained": trained,
        "episode_returns": [float(r) for r, _ in episodes],
        "episode_lengths": [int(n) for _, n in episodes],
        "values": {k: v for k, v in values.items() if v is not None},
    }


def sac_values(policy: Mapping[str, Any], *, keep: Callable[[Any], float | None] = number) -> dict[str, float | None]:
    """SAC's losses and diagnostics under crossrl's names from RLlib's ``learners/default_policy`` stats (each the
    iteration's last update's): the critics' loss as the sum of the two (as crossrl's core and TorchRL report it), the
    entropy as minus the mean log-probability, the temperature, its loss, the first critic's mean Q value, and the
    gradient updates so far (rows trained / train batch). ``keep``: how a loss or Q value is read (``number``: NaN
    kept, for the sink to fail the trial; ``finite``: an iteration without updates, NaN left out)."""
    qf, twin = keep(policy.get("qf_loss")), keep(policy.get("qf_twin_loss"))
    logp = keep(policy.get("logps"))
    rows, batch = (
        finite(policy.get("num_module_steps_trained_lifetime")),
        finite(policy.get("module_train_batch_size_mean")),
    )
    return {
        M.VALUE_LOSS: qf + twin if qf is not None and twin is not None else qf,
        M.ENTROPY: -logp if logp is not None else None,
        M.DIAG_ALPHA: finite(policy.get("alpha_value")),
        M.DIAG_ALPHA_LOSS: finite(policy.get("alpha_loss")),
        M.DIAG_Q_MEAN: keep(policy.get("qf_mean")),
        M.DIAG_UPDATES: rows / batch if rows is not None and batch else None,
    }


def dreamer_values(
    policy: Mapping[str, Any], *, updates: Any = None, keep: Callable[[Any], float | None] = number
) -> dict[str, float | None]:
    """DreamerV3's losses under crossrl's names from RLlib's ``learners/default_policy`` stats: the actor's and the
    critic's total losses, the actor's action entropy (of the imagined steps), the world model's total loss, its
    decoder, reward and continue terms and its gradient norm, the returns' scale (the moving 95th less 5th
    percentile, before RLlib's floor of 1e-8), and the gradient updates so far (the algorithm's
    ``num_grad_updates_lifetime``): the diagnostics crossrl's core and TorchRL's adapter report by the same names."""
    high, low = finite(policy.get("ACTOR_value_targets_pct95_ema")), finite(policy.get("ACTOR_value_targets_pct5_ema"))
    return {
        M.POLICY_LOSS: keep(policy.get("ACTOR_L_total")),
        M.VALUE_LOSS: keep(policy.get("CRITIC_L_total")),
        M.ENTROPY: keep(policy.get("ACTOR_action_entropy")),
        M.DIAG_WORLD_MODEL_LOSS: keep(policy.get("WORLD_MODEL_L_total")),
        M.DIAG_DECODER_LOSS: keep(policy.get("WORLD_MODEL_L_decoder")),
        M.DIAG_REWARD_LOSS: keep(policy.get("WORLD_MODEL_L_reward")),
        M.DIAG_CONTINUE_LOSS: keep(policy.get("WORLD_MODEL_L_continue")),
        M.DIAG_RETURN_SCALE: None if high is None or low is None else high - low,
        M.DIAG_GRAD_NORM: finite(policy.get("WORLD_MODEL_gradients_global_norm")),
        M.DIAG_UPDATES: finite(updates),
    }


def obs_batch(obs: Any) -> Any:
    """One observation as a batch of one for an RLModule: float64 (MuJoCo's) as float32, as the env runners'
    connectors give it; other dtypes (uint8 frames) as they are."""
    import numpy as np
    import torch

    arr = np.asarray(obs)
    return torch.as_tensor(arr.astype(np.float32) if arr.dtype == np.float64 else arr)[None]


def greedy_act(algo: Any, *, sac: bool = False) -> Callable[[Any], Any]:
    """The final policy's deterministic action for one observation: the learner's weights in the RLModule that
    ``algo.get_module()`` returns, its ``forward_inference`` (DQN: the argmax of the Q-values; PPO and IMPALA: the
    argmax of the logits; ``sac``: the squashed Gaussian's ``tanh(mean)``)."""
    import torch
    from ray.rllib.core import DEFAULT_MODULE_ID

    module = algo.get_module()
    module.set_state(algo.learner_group.get_weights([DEFAULT_MODULE_ID])[DEFAULT_MODULE_ID])
    module.eval()

    def act(obs: Any) -> Any:
        with torch.no_grad():
            out = module.forward_inference({"obs": obs_batch(obs)})
        if "actions" in out:
            return int(out["actions"][0])
        if sac:
            from crossrl.adapters.rllib.sac import mean_action

            return mean_action(out["action_dist_inputs"])[0].numpy()  # the env's [-1, 1] (env.actions 'unit')
        return int(torch.argmax(out["action_dist_inputs"][0]))

    return act


# -- checkpoints ----------------------------------------------------------------------------------

NO_POLICY: Final[dict[str, str]] = {
    "dreamer": "rllib: a dreamer policy acts through its world model's recurrent state (DreamerV3's env runner); "
    "crossrl evaluate and export do not run it yet",
}

REPLAY_FILE: Final = "replay_buffer.pkl"
"""DQN's, SAC's and DreamerV3's replay buffer (``get_state()``), beside RLlib's own files: ``Algorithm.save_to_path``
leaves it out."""


def replay_buffer_of(algo: Any, algorithm: str) -> Any:
    """The replay buffer the algorithm trains from, None for PPO and IMPALA: DQN's and SAC's ``local_replay_buffer``;
    DreamerV3's own ``replay_buffer`` (RLlib 2.60's DreamerV3 builds a ``local_replay_buffer`` too, from its config,
    and reads only its metrics: the episodes it replays are in ``replay_buffer``)."""
    if algorithm == "dreamer":
        return algo.replay_buffer
    return getattr(algo, "local_replay_buffer", None)


ALPHA_FILE: Final = "sac_log_alpha.json"
"""SAC's temperature (module id -> ``log alpha``), which ``save_to_path`` leaves out too (:mod:`.sac`)."""


def _peek(algo: Any, *path: str) -> float | None:
    """A value of the algorithm's metrics logger (e.g. a lifetime counter), None while it has none (RLlib 2.60's
    ``peek`` raises KeyError for a missing key even with a default)."""
    try:
        return finite(algo.metrics.peek(path))
    except (KeyError, IndexError, TypeError, ValueError):
        return None


def engine_counters(algo: Any, *, algorithm: str, epochs: int = 1) -> tuple[int, int | None]:
    """(env steps sampled, env steps trained) as RLlib's metrics logger holds them now, in the units
    :func:`result_to_point` reports them (trained None for PPO and multi-agent PPO)."""
    from ray.rllib.utils.metrics import ENV_RUNNER_RESULTS, NUM_ENV_STEPS_SAMPLED_LIFETIME

    sampled = _peek(algo, ENV_RUNNER_RESULTS, NUM_ENV_STEPS_SAMPLED_LIFETIME)
    rows = _peek(algo, "learners", "default_policy", "num_module_steps_trained_lifetime")
    result: dict[str, Any] = {
        "env_runners": {"num_env_steps_sampled_lifetime": sampled},
        "learners": {"default_policy": {"num_module_steps_trained_lifetime": rows}},
    }
    return env_steps_sampled(result), trained_steps(result, algorithm=algorithm, epochs=epochs)


@dataclass(frozen=True)
class StepOffsets:
    """What a resumed trial adds to RLlib's env-step counters so that they go on from the checkpoint's, never from 0
    and never counted twice: the checkpoint's counters minus those RLlib's restored metrics hold. RLlib 2.60 restores
    its lifetime counters with the metrics logger (measured: 768 sampled at the save, 768 after restore_from_path,
    1024 after one more 256-step PPO iteration), so both are 0 there; they are not if a version stops doing so."""

    sampled: int = 0
    trained: int = 0

    @classmethod
    def at_restore(cls, resumed: Resumed, *, engine_sampled: int, engine_trained: int | None) -> StepOffsets:
        """``engine_*``: RLlib's counters right after the restore (:func:`engine_counters`). A trained count RLlib
        has none of while its sampled count came back is one it had none of at the save either (DQN before
        learning starts; PPO, whose points carry none): its points then count as an unbroken run's would."""
        if engine_trained is None:
            trained = 0 if engine_sampled else resumed.env_steps_trained
        else:
            trained = resumed.env_steps_trained - engine_trained
        return cls(resumed.env_steps_sampled - engine_sampled, trained)

    def apply(self, point: dict[str, Any]) -> dict[str, Any]:
        """``point`` (the keyword arguments of :meth:`MetricSink.point`) with its counters moved on."""
        out = {**point, "env_steps_sampled": int(point["env_steps_sampled"]) + self.sampled}
        if point.get("env_steps_trained") is not None:
            out["env_steps_trained"] = int(point["env_steps_trained"]) + self.trained
        return out


def save_engine(algo: Any, folder: Path, *, algorithm: str = "", replay: bool = True) -> dict[str, Any]:
    """The algorithm's whole training state into ``folder`` (the sink's ``save``): RLlib's ``save_to_path``
    (``learner_group/``: the RLModules, target networks included, and the optimizers' state; ``env_runner/``: the
    connector states; ``algorithm_state.pkl``: the metrics logger with the lifetime counters, the training
    iteration), DQN's, SAC's and DreamerV3's replay buffer (:data:`REPLAY_FILE`; not when ``replay`` is False:
    ``checkpoint.replay_buffer: false``) and SAC's temperature (:data:`ALPHA_FILE`). Returns what it holds.

    DreamerV3's recurrent acting state (the env runner's per-episode ``h``, ``z`` and previous action) is not saved:
    a resumed trial's envs start new episodes, whose state starts at zeros as every episode's does; the steps of the
    episode in flight at the save stay in the saved replay buffer."""
    from ray.rllib.utils.metrics import ENV_RUNNER_RESULTS, NUM_ENV_STEPS_SAMPLED_LIFETIME

    folder = Path(folder).resolve()  # pyarrow (RLlib's file system layer) refuses relative paths
    algo.save_to_path(folder)
    described: dict[str, Any] = {
        "rllib": "Algorithm.save_to_path",
        "components": sorted(name for name, _ in algo.get_checkpointable_components()),
        "rllib_env_steps_sampled": _peek(algo, ENV_RUNNER_RESULTS, NUM_ENV_STEPS_SAMPLED_LIFETIME),
        "rllib_training_iteration": int(algo.iteration),
    }
    buffer = replay_buffer_of(algo, algorithm)
    if buffer is not None and replay:
        with open(folder / REPLAY_FILE, "wb") as f:
            pickle.dump(buffer.get_state(), f, protocol=pickle.HIGHEST_PROTOCOL)
        described |= {"replay_buffer": REPLAY_FILE, "replay_env_steps": int(buffer.get_num_timesteps())}
    if algorithm == "sac":
        from crossrl.adapters.rllib.sac import log_alpha

        values = log_alpha(algo)
        (folder / ALPHA_FILE).write_text(json.dumps(values))
        described |= {"log_alpha": values}
    return described


def _set_runner_state(runner: Any, *, state: dict[str, Any]) -> None:
    runner.set_state(state)


def _learning_rates(learner: Any) -> list[float]:
    return [
        float(group["lr"])
        for module_id, _ in learner.module.items()
        for _name, optimizer in learner.get_optimizers_for_module(module_id)
        for group in optimizer.param_groups
    ]


def _set_learning_rate(learner: Any, *, lr: float | Mapping[str, float]) -> list[float]:
    """Every optimizer of the learner at ``lr``, or each at ``lr[its name]`` (SAC's "policy", "qf", "qf_twin",
    "alpha"); returns the param groups' learning rates."""
    for module_id, _ in learner.module.items():
        for name, optimizer in learner.get_optimizers_for_module(module_id):
            for group in optimizer.param_groups:
                group["lr"] = lr[name] if isinstance(lr, Mapping) else lr
    return _learning_rates(learner)


def learning_rates(algo: Any) -> list[float]:
    """The learning rates of every param group of every optimizer of every learner."""
    return [lr for result in algo.learner_group.foreach_learner(_learning_rates) for lr in result.get()]


def push_to_env_runners(algo: Any) -> int:
    """Every env runner (remote and local) gets the learner's weights (inference-only, with the learner's weights
    sequence number), the connector states the local env runner restored and RLlib's lifetime env-step count, and
    this waits until they have them. RLlib 2.60's restore_from_path sends the weights fire-and-forget under the tag
    ``set_state`` and drops the request when one is still in flight (``max_requests_in_flight_per_env_runner``
    is 1): measured, a remote runner kept its fresh weights (sequence number 0 against the learner's 3). Returns
    how many env runners were updated."""
    import ray
    from ray.rllib.core import (
        COMPONENT_ENV_TO_MODULE_CONNECTOR,
        COMPONENT_LEARNER,
        COMPONENT_MODULE_TO_ENV_CONNECTOR,
        COMPONENT_RL_MODULE,
    )
    from ray.rllib.utils.metrics import ENV_RUNNER_RESULTS, NUM_ENV_STEPS_SAMPLED_LIFETIME, WEIGHTS_SEQ_NO

    learner = algo.learner_group.get_state(
        components=f"{COMPONENT_LEARNER}/{COMPONENT_RL_MODULE}", inference_only=True
    )[COMPONENT_LEARNER]
    state: dict[str, Any] = {}
    if algo.env_runner is not None:
        state |= algo.env_runner.get_state(not_components=[COMPONENT_RL_MODULE])
    else:
        state[COMPONENT_ENV_TO_MODULE_CONNECTOR] = algo.env_to_module_connector.get_state()
        state[COMPONENT_MODULE_TO_ENV_CONNECTOR] = algo.module_to_env_connector.get_state()
    sampled = _peek(algo, ENV_RUNNER_RESULTS, NUM_ENV_STEPS_SAMPLED_LIFETIME)
    if sampled is not None:
        state[NUM_ENV_STEPS_SAMPLED_LIFETIME] = int(sampled)
    # The weights go to the object store once; a runner's set_state fetches them (ray.get of an ObjectRef).
    state[COMPONENT_RL_MODULE] = ray.put(learner[COMPONENT_RL_MODULE])
    state[WEIGHTS_SEQ_NO] = int(learner.get(WEIGHTS_SEQ_NO, 0))  # 0: forced; else newer than a fresh runner's 0
    done = algo.env_runner_group.foreach_env_runner(
        functools.partial(_set_runner_state, state=state), local_env_runner=True
    )
    return len(done)


def restore(algo: Any, path: Path, *, lr: float | Mapping[str, float] | None, algorithm: str = "") -> dict[str, Any]:
    """Restores ``algo`` (built from the trial's config, not trained yet) from an engine folder :func:`save_engine`
    wrote: RLlib's ``restore_from_path``, DQN's, SAC's and DreamerV3's replay buffer, SAC's temperature, the learning
    rate ``lr`` (one for every optimizer, or one per optimizer name) re-applied to every optimizer
    (``torch.optim.Optimizer.load_state_dict`` restores the saved one, and RLlib's scheduler sets the config's only
    after the next update: Population Based Training changes ``lr`` between a save and a restore), then
    :func:`push_to_env_runners`. Returns what it did."""
    path = Path(path).resolve()
    algo.restore_from_path(path)
    done: dict[str, Any] = {"restored_from": str(path)}
    buffer = replay_buffer_of(algo, algorithm)
    if buffer is not None and (path / REPLAY_FILE).is_file():
        with open(path / REPLAY_FILE, "rb") as f:
            buffer.set_state(pickle.load(f))
        done["replay_env_steps"] = int(buffer.get_num_timesteps())
    elif buffer is not None and hasattr(algo, "refill"):  # SAC saved without its buffer: refill it first
        done["refill_env_steps"] = algo.refill()
    if (path / ALPHA_FILE).is_file():
        from crossrl.adapters.rllib.sac import set_log_alpha

        done["log_alpha"] = set_log_alpha(algo, json.loads((path / ALPHA_FILE).read_text()))
    if lr is not None:
        results = algo.learner_group.foreach_learner(_set_learning_rate, lr=lr)
        done["lr"] = sorted({x for result in results for x in result.get()})
    done["env_runners_synced"] = push_to_env_runners(algo)
    return done


DREAMER_OPTIMIZERS: Final = ("world_model", "actor", "critic")  # DreamerV3TorchLearner's optimizer names (2.60)


def trial_learning_rates(trial: Trial) -> float | dict[str, float]:
    """The learning rate a restored trial's optimizers continue with: its ``lr``, or SAC's per optimizer name."""
    native = trial.native.get("training", {})  # a native learning rate (native.rllib.training) wins, as it did
    if trial.algorithm == "sac":
        from crossrl.adapters.rllib.sac import OPTIMIZER_LR

        return {name: float(native.get(key, trial.hp(key))) for name, key in OPTIMIZER_LR.items()}
    if trial.algorithm == "dreamer":  # RLlib's DreamerV3 learner names its three optimizers so
        return {name: float(native.get(f"{name}_lr", trial.hp(f"{name}_lr"))) for name in DREAMER_OPTIMIZERS}
    return float(native.get("lr", trial.hp("lr")))


def _checkpoint_env_step(folder: Path) -> int | None:
    """The env step a checkpoint's engine folder was written at, from the ``crossrl.json`` beside it."""
    try:
        return int(json.loads((folder.parent / META).read_text())["env_steps_sampled"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def load_policy(trial: Trial, folder: Path, *, greedy: bool = True) -> Callable[[Any], Any]:
    """The policy a checkpoint holds, for ONE single-agent observation: ``act(obs) -> action``, without Ray, env
    runners or training.

    ``folder``: the checkpoint's folder or its engine folder (:func:`save_engine`); the learner's RLModule is rebuilt
    with ``RLModule.from_checkpoint`` from ``learner_group/learner/rl_module/default_policy``. ``greedy``: the
    deterministic action (the argmax of the logits or of the Q-values, as :func:`greedy_act`; a Gaussian's mean);
    else RLlib's exploration: a sample from the action distribution, or for DQN epsilon-greedy at the epsilon its
    schedule had reached at the checkpoint's env step; SAC's mean action is ``tanh(mean)``. A Box action goes through RLlib's ``normalize_actions`` /
    ``clip_actions`` as the env runners send it to the env. Multi-agent trials: ValueError.
    """
    if trial.algorithm in NO_POLICY:
        raise ValueError(f"{trial.name}: {NO_POLICY[trial.algorithm]}")
    if trial.env.multi_agent:
        raise ValueError(
            f"{trial.name}: load_policy acts for one single-agent observation; an RLlib multi-agent checkpoint holds "
            "one RLModule per policy id under learner_group/learner/rl_module/<policy id>"
        )
    import torch
    from gymnasium import spaces
    from ray.rllib.core import (
        COMPONENT_LEARNER,
        COMPONENT_LEARNER_GROUP,
        COMPONENT_RL_MODULE,
        DEFAULT_MODULE_ID,
    )
    from ray.rllib.core.rl_module.rl_module import RLModule
    from ray.rllib.utils.spaces.space_utils import clip_action, unsquash_action

    folder = Path(folder)
    if (folder / ENGINE_DIR).is_dir():
        folder = folder / ENGINE_DIR
    module_dir = folder / COMPONENT_LEARNER_GROUP / COMPONENT_LEARNER / COMPONENT_RL_MODULE / DEFAULT_MODULE_ID
    if not module_dir.is_dir():
        raise ValueError(
            f"{folder} holds no RLlib RLModule at {module_dir.relative_to(folder)} (not an rllib checkpoint?)"
        )
    module: Any = RLModule.from_checkpoint(module_dir.resolve())  # a TorchRLModule (an nn.Module)
    module.eval()
    space = module.action_space
    config = build_config(trial, plan=ResourcePlan(1, 1.0, 0, ""), env_name="unused")
    t = _checkpoint_env_step(folder)
    if t is None:
        t = int(trial.hyperparams.get("epsilon_timesteps", 0))  # DQN: its final epsilon

    def act(obs: Any) -> Any:
        batch = {"obs": obs_batch(obs)}
        with torch.no_grad():
            out = module.forward_inference(batch) if greedy else module.forward_exploration(batch, t=t)
            if "actions" in out:
                action = out["actions"]
            elif greedy and trial.algorithm == "sac":  # RLlib's to_deterministic() would give the unsquashed mean
                from crossrl.adapters.rllib.sac import mean_action

                action = mean_action(out["action_dist_inputs"])
            else:
                dist_cls = (
                    module.get_inference_action_dist_cls() if greedy else module.get_exploration_action_dist_cls()
                )
                dist = dist_cls.from_logits(out["action_dist_inputs"])
                action = (dist.to_deterministic() if greedy else dist).sample()
        a = action[0].numpy()
        if isinstance(space, spaces.Discrete):
            return int(a)
        if isinstance(space, spaces.Box):
            if config.normalize_actions:
                return unsquash_action(a, space)
            if config.clip_actions:
                return clip_action(a, space)
        return a

    return act


def export_policy(trial: Trial, folder: Path) -> Any:
    """The checkpoint's greedy policy as a pure torch module (:class:`~crossrl.adapters.exported.GreedyPolicy`) for
    `crossrl export`, as :func:`load_policy` acts greedily: the RLModule's ``forward_inference`` and then the argmax of
    its ``action_dist_inputs`` (PPO, IMPALA on Discrete actions), its ``actions`` (DQN: the argmax of the Q-values),
    a Gaussian's mean (the first half of the inputs) or SAC's ``tanh(mean)``, a Box action then through
    ``normalize_actions`` (``low + (a + 1) (high - low) / 2``, clipped to the bounds) or ``clip_actions``."""
    from gymnasium import spaces
    from ray.rllib.core import COMPONENT_LEARNER, COMPONENT_LEARNER_GROUP, COMPONENT_RL_MODULE, DEFAULT_MODULE_ID
    from ray.rllib.core.rl_module.rl_module import RLModule

    from crossrl.adapters.exported import DictOutput, GreedyPolicy, exportable_folder

    if trial.algorithm in NO_POLICY:
        raise ValueError(f"{trial.name}: {NO_POLICY[trial.algorithm]}")
    folder = exportable_folder(
        trial, folder, multi_agent="an RLlib multi-agent checkpoint holds one RLModule per policy id"
    )
    module_dir = folder / COMPONENT_LEARNER_GROUP / COMPONENT_LEARNER / COMPONENT_RL_MODULE / DEFAULT_MODULE_ID
    if not module_dir.is_dir():
        raise ValueError(f"{folder} holds no RLlib RLModule at {module_dir.relative_to(folder)} (not an rllib "
                         "checkpoint?)")  # fmt: skip
    module: Any = RLModule.from_checkpoint(module_dir.resolve())
    module.eval()
    space = module.action_space
    if trial.algorithm == "dqn" and isinstance(space, spaces.Discrete):
        return DictOutput(module, "actions")  # the RLModule's argmax of its Q-values already
    net = DictOutput(module, "action_dist_inputs")
    if isinstance(space, spaces.Discrete):
        return GreedyPolicy(net)
    if not isinstance(space, spaces.Box) or len(space.shape) != 1:
        raise ValueError(f"{trial.name}: export takes Discrete or flat Box actions; this trial acts on {space}")
    config = build_config(trial, plan=ResourcePlan(1, 1.0, 0, ""), env_name="unused")
    low, high = space.low.astype(float), space.high.astype(float)
    squash = trial.algorithm == "sac"
    act_dim = int(space.shape[0])
    if config.normalize_actions:
        return GreedyPolicy(net, act_dim=act_dim, squash=squash, mid=(low + high) / 2, scale=(high - low) / 2,
                            low=low, high=high)  # fmt: skip
    if config.clip_actions:
        return GreedyPolicy(net, act_dim=act_dim, squash=squash, low=low, high=high)
    return GreedyPolicy(net, act_dim=act_dim, squash=squash)


class RllibAdapter:
    """Ray RLlib 2.60, new API stack: PPO, IMPALA, DQN, SAC, DreamerV3 through AlgorithmConfig."""

    engine: ClassVar[str] = ENGINE_ID

    def __init__(self, *, on_iteration: Callable[[int, Any], None] | None = None) -> None:
        """``on_iteration(i, algo)`` runs after each point (tests use it to kill an env runner)."""
        self.on_iteration = on_iteration

    def run(self, trial: Trial, sink: MetricSink) -> None:
        """Train ``trial`` on RLlib until ``sink.exhausted``, one point per ``algo.train()``."""
        from crossrl.core.cluster import LOCAL_RAY_ENV, connect, disconnect, free_cpus

        check_covered(trial)
        # Before `import ray`: Ray reads RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER at import time, and only
        # with it set to 0 does a local cluster listen on 127.0.0.1 rather than on every interface
        # (measured: connect() setting it after ray was imported is too late).
        for key, value in LOCAL_RAY_ENV.items():
            os.environ.setdefault(key, value)
        import ray
        from ray.tune.registry import register_env

        was_initialized = ray.is_initialized()
        cluster = connect(trial.ray_address)
        algo = None
        try:
            available = free_cpus()  # a sweep's trial: what its placement group has free
            plan = plan_resources(algorithm=trial.algorithm, workers=trial.workers, available_cpus=available)
            env_name = f"crossrl-{trial.fingerprint}-{uuid.uuid4().hex[:8]}"
            vector = vectorize_mode(trial) == "VECTOR_ENTRY_POINT"
            register_env(env_name, vector_env_creator if vector else env_creator)
            config = build_config(trial, plan=plan, env_name=env_name)
            resumed = sink.resumed()
            if resumed is not None:  # the runners' envs and sampling from fresh seeds (resume_seed)
                config.debugging(seed=resume_seed(trial, resumed))
            algo = config.build_algo()
            native = native_config(config)
            if trial.env.resolved_reward_clip:  # clip_rewards above is the old stack's, unread by the new one
                native["crossrl_reward_clip"] = "SignRewardKeepScore around the env; returns from info crossrl_score"
            to_point: Callable[[Any], dict[str, Any]]
            if trial.env.multi_agent:
                from crossrl.adapters.rllib import multi_agent as rllib_multi

                agents, groups, _ = rllib_multi.policy_layout(trial.env)
                # policy id -> the agents it acts for, as crossrl's native config has it
                native |= {
                    "policies": {pid: list(members) for pid, members in groups.items()},
                    "episode_end": rllib_multi.EPISODE_END,
                    "minibatches": rllib_multi.MINIBATCHES,
                }
                to_point = functools.partial(rllib_multi.result_to_point, agents=agents, policies=list(groups))
            else:
                epochs = int(config.num_epochs)
                to_point = functools.partial(result_to_point, algorithm=trial.algorithm, epochs=epochs)
            offsets = StepOffsets()
            if resumed is not None:
                restored = restore(algo, resumed.path, lr=trial_learning_rates(trial), algorithm=trial.algorithm)
                sampled, trained = engine_counters(algo, algorithm=trial.algorithm, epochs=int(config.num_epochs))
                offsets = StepOffsets.at_restore(resumed, engine_sampled=sampled, engine_trained=trained)
                restored |= {"rllib_env_steps_sampled": sampled, "step_offsets": [offsets.sampled, offsets.trained]}
                print(f"rllib: restored {json.dumps(restored)}", file=sys.stderr, flush=True)
            sink.start_clock()
            sink.tags(engine_version=ray.__version__, rllib_resources=plan.note, layout=layout_label(trial), **cluster)
            sink.native_config(native)
            built = algo
            save = functools.partial(
                save_engine, built, algorithm=trial.algorithm, replay=trial.checkpoint.replay_buffer
            )
            iteration = 0
            while not sink.exhausted:
                sink.point(**offsets.apply(to_point(algo.train())))
                sink.checkpoint_if_due(save)
                if self.on_iteration is not None:
                    self.on_iteration(iteration, algo)
                iteration += 1
            sink.final_checkpoint(save)
            send_clip(sink, lambda: greedy_act(built, sac=trial.algorithm == "sac"))
        finally:
            if algo is not None:
                algo.stop()
            # Ray was started or joined here: shutdown stops a local cluster we started, or only
            # disconnects from a cluster we joined (which keeps running).
            if not was_initialized:
                disconnect()
