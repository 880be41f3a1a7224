"""The suite's vocabulary as plain data (no heavy imports: the spec validator reads it).

The algorithms, the built-in engine ids, crossrl's policy optimizers and every default: the shared
hyperparameters every engine maps (``HYPERPARAM_DEFAULTS``) and the settings only crossrl's core
has (``CROSSRL_SETTINGS``). An algorithm is a loss plus a default policy optimizer; the RLlib
paper's point is that the same loss runs under several execution strategies, so each algorithm
lists every optimizer it accepts.
"""

from __future__ import annotations

import math
from typing import Any, Final, Literal, get_args

AlgorithmName = Literal["ppo", "a2c", "a3c", "impala", "dqn", "apex", "sac", "dreamer"]
ALGORITHMS: Final[tuple[str, ...]] = get_args(AlgorithmName)

# The built-in engines, in the order reports show them (the adapters' registry describes each).
ENGINES: Final[tuple[str, ...]] = ("crossrl", "rllib", "torchrl")

OPTIMIZERS: Final = {
    "sync_samples": "synchronous sampling: broadcast weights, gather samples, SGD on the driver",
    "async_gradients": "asynchronous gradients (A3C): workers compute gradients, the driver applies each",
    "async_samples": "asynchronous sampling (IMPALA): stale-weight samples, learner thread, V-trace",
    "sync_replay": "synchronous replay (DQN, SAC): replay buffer on the driver, target networks",
    "async_replay": "distributed replay (Ape-X): replay shard actors, learner thread (prioritized for DQN)",
}

DEFAULT_OPTIMIZER: Final = {
    "ppo": "sync_samples",
    "a2c": "sync_samples",
    "a3c": "async_gradients",
    "impala": "async_samples",
    "dqn": "sync_replay",
    "apex": "async_replay",
    "sac": "sync_replay",
    # DreamerV3 samples and trains synchronously from an episode replay buffer (RLlib's runs no other way)
    "dreamer": "sync_replay",
}

VALID_OPTIMIZERS: Final = {
    "ppo": ("sync_samples", "async_gradients"),
    "a2c": ("sync_samples", "async_gradients"),
    "a3c": ("async_gradients", "sync_samples"),
    "impala": ("async_samples", "sync_samples"),
    "dqn": ("sync_replay", "async_replay"),
    "apex": ("async_replay", "sync_replay"),
    "sac": ("sync_replay", "async_replay"),
    "dreamer": ("sync_replay",),
}

# Hyperparameter defaults per algorithm, filled in where a spec is silent. Names are crossrl's
# shared names; each engine adapter maps them name by name (README, "Fairness").
_ON_POLICY: dict[str, Any] = {
    "lr": 3.0e-4,
    "gamma": 0.99,
    "gae_lambda": 0.95,
    "entropy_coeff": 0.0,
    "vf_coeff": 0.5,
    "grad_clip": 0.5,
    "rollout_fragment": 64,
}
_REPLAY: dict[str, Any] = {
    "lr": 5.0e-4,
    "gamma": 0.99,
    "train_batch": 32,
    "buffer_size": 50_000,
    "learning_starts": 1_000,
    "target_update": 500,
    "n_step": 3,
    "epsilon_initial": 1.0,
    "epsilon_final": 0.02,
    "epsilon_timesteps": 10_000,
    "grad_clip": 10.0,
    "rollout_fragment": 4,
    # measured (crossrl core, CartPole): at 1.0 DQN stayed at return ~10 for 150k env steps; at 8 it learns
    "replay_ratio": 8.0,
    "double_q": True,
    "prioritized_replay": False,
    "priority_alpha": 0.6,
    "priority_beta": 0.4,
}

# Soft actor-critic (Haarnoja et al. 2018, the automatic-temperature version), at CleanRL's MuJoCo settings
# (sac_continuous_action.py): one gradient update per env step on batches of 256, the temperature learned toward
# -|A| nats, a uniformly random policy for the first learning_starts env steps.
_SAC: dict[str, Any] = {
    "actor_lr": 3.0e-4,
    "critic_lr": 1.0e-3,
    "alpha_lr": 1.0e-3,
    "gamma": 0.99,
    "tau": 0.005,
    "train_batch": 256,
    "buffer_size": 1_000_000,
    "learning_starts": 5_000,
    "updates_per_step": 1.0,
    "n_step": 1,
    "target_entropy": "auto",
    "initial_alpha": 1.0,
    "rollout_fragment": 1,
}

# DreamerV3 (Hafner et al. 2023) at RLlib 2.60's DreamerV3Config defaults, which are the paper's (its Table W and
# eq. 7/11: gamma 0.997, lambda 0.95, entropy scale 3e-4, Adam 1e-4 for the world model and 3e-5 for actor and
# critic, batches of 16 sequences of 64 steps, imagination horizon 15, training ratio 1024), except the model size:
# "nano", RLlib's smallest (the paper's smallest is "XS"), the one that trains at a useful rate on two CPU cores.
_DREAMER: dict[str, Any] = {
    "model_size": "nano",
    "training_ratio": 1024.0,
    "batch_size_B": 16,
    "batch_length_T": 64,
    "horizon_H": 15,
    "gamma": 0.997,
    "gae_lambda": 0.95,
    "world_model_lr": 1.0e-4,
    "actor_lr": 3.0e-5,
    "critic_lr": 3.0e-5,
    "entropy_scale": 3.0e-4,
    "free_bits": 1.0,
    "buffer_size": 1_000_000,
}

HYPERPARAM_DEFAULTS: Final[dict[str, dict[str, Any]]] = {
    "ppo": {**_ON_POLICY, "clip": 0.2, "train_batch": 4000, "minibatch": 128, "epochs": 10, "vf_clip": 10.0},
    "a2c": {**_ON_POLICY, "lr": 7.0e-4, "gae_lambda": 1.0, "train_batch": 500, "entropy_coeff": 0.01},
    "a3c": {**_ON_POLICY, "lr": 7.0e-4, "gae_lambda": 1.0, "train_batch": 100, "entropy_coeff": 0.01},
    "impala": {
        **_ON_POLICY,
        "lr": 5.0e-4,
        "train_batch": 500,
        "entropy_coeff": 0.01,
        "vtrace_clip_rho": 1.0,
        "vtrace_clip_c": 1.0,
        "grad_clip": 40.0,
        "rollout_fragment": 50,
    },
    "dqn": dict(_REPLAY),
    "apex": {**_REPLAY, "n_step": 3, "prioritized_replay": True, "num_replay_shards": 2, "learning_starts": 2_000},
    "sac": dict(_SAC),
    "dreamer": dict(_DREAMER),
}

# What crossrl's core needs beyond the shared defaults: settings with no shared name (nothing to map on
# RLlib or TorchRL, so a spec cannot set them), and crossrl's value for a shared name an algorithm has no
# shared default for (A2C's single SGD pass). The crossrl engine overlays the trial's hyperparameters on
# them ({**CROSSRL_SETTINGS[alg], **hp}: a spec always wins) and records the result in its native config;
# the core indexes every name (no default anywhere else; tests/unit/test_defaults.py checks both).
_CROSSRL_ON_POLICY: dict[str, Any] = {
    "adam_eps": 1.0e-5,
    "normalize_advantages": False,  # per minibatch, as TorchRL's and crossrl's PPO do
    # async_samples / async_gradients: env steps sampled per reported point (at least train_batch)
    "iteration_env_steps": 1000,
    # async_samples: sample batches the learner queue holds per worker before sampling waits
    "queue_per_worker": 2,
}
_CROSSRL_REPLAY: dict[str, Any] = {
    "adam_eps": 1.0e-8,
    # env steps sampled per optimizer step() (one reported point); RLlib's DQN reports every 1000 too
    "steps_per_iteration": 1000,
    # async_replay: learner SGD steps between weight publications (Ape-X: actors refresh every 400 frames)
    "weights_every": 8,
    # async_replay: the driver holds sampling back while the learner is this many transitions short of
    # replay_ratio (None: never)
    "max_replay_lag": None,
}
# One SGD step per train batch for the non-PPO policy-gradient algorithms: one pass (epochs), the whole
# batch (minibatch None). PPO's shared defaults set both; a spec may set them for any of these.
_ONE_PASS: dict[str, Any] = {"epochs": 1, "minibatch": None}
CROSSRL_SETTINGS: Final[dict[str, dict[str, Any]]] = {
    "ppo": {**_CROSSRL_ON_POLICY, "normalize_advantages": True},
    "a2c": {**_CROSSRL_ON_POLICY, **_ONE_PASS},
    "a3c": {**_CROSSRL_ON_POLICY, **_ONE_PASS},
    "impala": {**_CROSSRL_ON_POLICY, **_ONE_PASS},
    # one replay shard when a dqn spec runs under async_replay (apex's shared defaults set num_replay_shards)
    "dqn": {**_CROSSRL_REPLAY, "num_replay_shards": 1},
    "apex": {**_CROSSRL_REPLAY, "max_replay_lag": 2_000},
    # SAC: Adam's default eps (as CleanRL and TorchRL use it); the actor's log std clamped to [log_std_min,
    # log_std_max], RLlib's fixed bounds (its TorchSquashedGaussian) and CleanRL's range; one replay shard under
    # async_replay, uniform sampling.
    "sac": {
        **_CROSSRL_REPLAY,
        "log_std_min": -5.0,
        "log_std_max": 2.0,
        "num_replay_shards": 1,
        "max_replay_lag": 4_096,  # transitions trained (16 updates of 256) behind replay_ratio
    },
    # DreamerV3: the paper's optimizer settings (its Table W, as RLlib's DreamerV3Config has them): Adam's epsilon 1e-8
    # for the world model and 1e-5 for actor and critic, global-norm gradient clips 1000 and 100, the returns' scale a
    # moving average of decay 0.99 (eq. 12), the slow critic one of 0.98 per update; a point per 500 env steps.
    "dreamer": {
        "world_model_adam_eps": 1.0e-8,
        "actor_critic_adam_eps": 1.0e-5,
        "world_model_grad_clip": 1000.0,
        "actor_critic_grad_clip": 100.0,
        "return_norm_decay": 0.99,
        "slow_critic_decay": 0.98,
        "steps_per_iteration": 500,
    },
}

# The suite's standard conv models per pixel preprocessing (EnvSpec.resolved_preprocessing), as ModelSpec
# fields: what `crossrl bench sampling --env <a pixel env>` samples with when no scenario names a model, and
# what the built-in pixel scenarios set (tests/bench/test_pixel_bench.py checks that they agree).
PIXEL_MODELS: Final[dict[str, dict[str, Any]]] = {
    # The MinAtar paper's network (Young & Tian 2019): one 3x3 conv of 16 filters, a 128-unit layer.
    "minatar": {"conv": [[16, 3, 1]], "hidden": [128], "activation": "relu"},
    # The Nature CNN (Mnih et al. 2015): three convs, a 512-unit layer.
    "atari": {"conv": [[32, 8, 4], [64, 4, 2], [64, 3, 1]], "hidden": [512], "activation": "relu"},
}


# How an algorithm's batch behaves as workers grow (execution.scaling): "strong", the train batch held fixed and split
# over the workers; "weak", a batch per worker held fixed, so the train batch grows with them. Each algorithm's own
# (what execution.scaling null means, and what its hyperparameters have always meant): PPO's and A2C's train_batch is
# one synchronous batch split over the workers, IMPALA's the learner's batch of fixed-length fragments; A3C's
# train_batch is each worker's batch per gradient, and the replay algorithms' rollout_fragment each worker's share of
# a sampling round. docs/fairness.md says how each engine's knobs take the rewritten values.
BatchScaling = Literal["strong", "weak"]
NATURAL_SCALING: Final[dict[str, BatchScaling]] = {
    "ppo": "strong",
    "a2c": "strong",
    "impala": "strong",
    "a3c": "weak",
    "dqn": "weak",
    "apex": "weak",
    "sac": "weak",
    # the training ratio (replayed per sampled env step) and the B x T batch are held whatever the workers (the spec
    # refuses any other execution.scaling)
    "dreamer": "weak",
}


def scaled_hyperparams(algorithm: str, hp: dict[str, Any], scaling: BatchScaling, workers: int) -> dict[str, Any]:
    """``hp`` as a trial of ``workers`` workers runs them under ``scaling``: unchanged where that is the algorithm's
    own; else the batch the algorithm's hyperparameter names held per worker (weak: PPO's, A2C's and IMPALA's
    ``train_batch`` x workers) or split over the workers (strong: A3C's per-gradient ``train_batch`` and the replay
    algorithms' ``rollout_fragment`` / workers, rounded up, at least 1)."""
    if scaling == NATURAL_SCALING[algorithm]:
        return hp
    if algorithm in ("ppo", "a2c", "impala"):
        return {**hp, "train_batch": int(hp["train_batch"]) * workers}
    key = "train_batch" if algorithm == "a3c" else "rollout_fragment"
    return {**hp, key: max(1, math.ceil(int(hp[key]) / workers))}


def batch_per_worker_key(algorithm: str) -> str:
    """The hyperparameter that sizes what scaling holds fixed or splits: ``rollout_fragment`` for the replay
    algorithms, ``train_batch`` for the others."""
    if algorithm == "dreamer":
        return "batch_size_B"  # DreamerV3's replay batch, B sequences of batch_length_T, whatever the workers
    return "rollout_fragment" if algorithm in ("dqn", "apex", "sac") else "train_batch"
