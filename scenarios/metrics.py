"""The common metric names, one place, with units.

Every engine's native names are translated into these (see each adapter's mapping table). Points
are logged against ``ENV_STEPS_SAMPLED`` (the x-axis is always env steps sampled, never iterations).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Final

# Per point (one per training iteration), logged with step = env_steps_sampled.
ENV_STEPS_SAMPLED: Final = "env_steps_sampled"  # env steps, cumulative
ENV_STEPS_TRAINED: Final = "env_steps_trained"  # env steps, cumulative
WALL_TIME_S: Final = "wall_time_s"  # seconds since the trial's training started
EPISODE_RETURN_MEAN: Final = "episode_return_mean"  # mean return of episodes completed since the last point
EPISODE_LEN_MEAN: Final = "episode_len_mean"  # env steps, same episodes as the return
EPISODES_TOTAL: Final = "episodes_total"  # episodes completed, cumulative
SAMPLE_THROUGHPUT: Final = "sample_throughput"  # env steps sampled / s over the interval since the last point
TRAIN_THROUGHPUT: Final = "train_throughput"  # env steps trained / s over the interval
TIME_SAMPLE_S: Final = "time_sample_s"  # seconds spent sampling in the interval
TIME_LEARN_S: Final = "time_learn_s"  # seconds spent learning in the interval
TIME_SYNC_WEIGHTS_S: Final = "time_sync_weights_s"  # seconds spent broadcasting weights in the interval
POLICY_LOSS: Final = "policy_loss"
VALUE_LOSS: Final = "value_loss"
ENTROPY: Final = "entropy"  # nats
WORKER_RESTARTS: Final = "worker_restarts"  # cumulative count of restarted workers

POINT_METRICS: Final = (
    ENV_STEPS_SAMPLED,
    ENV_STEPS_TRAINED,
    WALL_TIME_S,
    EPISODE_RETURN_MEAN,
    EPISODE_LEN_MEAN,
    EPISODES_TOTAL,
    SAMPLE_THROUGHPUT,
    TRAIN_THROUGHPUT,
    TIME_SAMPLE_S,
    TIME_LEARN_S,
    TIME_SYNC_WEIGHTS_S,
    POLICY_LOSS,
    VALUE_LOSS,
    ENTROPY,
    WORKER_RESTARTS,
)

# Diagnostics: an engine's own view of its learning, logged per point under ``diag.`` when the engine reports
# it (stored, plotted in the MLflow UI; never compared by `crossrl regress`, since engines compute them
# differently). Point metrics alongside POINT_METRICS; any other ``diag.<name>`` an engine reports is kept too.
DIAG_PREFIX: Final = "diag."
DIAG_APPROX_KL: Final = "diag.approx_kl"  # PPO: KL(old || new) estimate over the SGD phase, nats
DIAG_CLIP_FRAC: Final = "diag.clip_frac"  # PPO: fraction of samples whose ratio was clipped
DIAG_MEAN_RHO: Final = "diag.mean_rho"  # IMPALA: mean importance ratio pi/mu of the trained samples
DIAG_POLICY_LAG: Final = "diag.policy_lag"  # asynchronous engines: learner updates behind the sampling policy
DIAG_EPSILON: Final = "diag.epsilon"  # DQN: exploration epsilon at the point
DIAG_REPLAY_SIZE: Final = "diag.replay_size"  # replay algorithms: transitions held in replay
DIAG_GRAD_NORM: Final = "diag.grad_norm"  # global gradient norm before clipping, mean over the point's updates
DIAG_Q_MEAN: Final = "diag.q_mean"  # SAC: mean Q value of the replayed (state, action) pairs, first critic
DIAG_ALPHA: Final = "diag.alpha"  # SAC: the entropy temperature
DIAG_ALPHA_LOSS: Final = "diag.alpha_loss"  # SAC: the temperature's loss
DIAG_UPDATES: Final = "diag.updates"  # replay algorithms: gradient updates, cumulative
DIAG_WORLD_MODEL_LOSS: Final = "diag.world_model_loss"  # DreamerV3: the world model's total loss
DIAG_DECODER_LOSS: Final = "diag.decoder_loss"  # DreamerV3: the world model's observation (decoder) term
DIAG_REWARD_LOSS: Final = "diag.reward_loss"  # DreamerV3: the reward head's two-hot loss (uniform over 255: 5.54)
DIAG_CONTINUE_LOSS: Final = "diag.continue_loss"  # DreamerV3: the continue head's loss
DIAG_RETURN_SCALE: Final = "diag.return_scale"  # DreamerV3: moving 95th - 5th percentile of the imagined returns


# Multi-agent envs: ``episode_return_mean`` is the team return (the sum of every agent's return per episode);
# beside it, per point, each agent's mean return over the same episodes and, when there are several
# policies, each policy's losses (the headline losses are then their mean over policies).
AGENT_PREFIX: Final = "agent."  # agent.<agent id>.episode_return_mean
POLICY_PREFIX: Final = "policy."  # policy.<policy id>.<policy_loss | value_loss | entropy | diag.*>


def agent_metric(agent: str, name: str = EPISODE_RETURN_MEAN) -> str:
    """The point metric ``name`` of one agent, e.g. ``agent.agent_0.episode_return_mean``."""
    return f"{AGENT_PREFIX}{agent}.{name}"


def policy_metric(policy: str, name: str) -> str:
    """The point metric ``name`` (a loss, entropy or diagnostic) of one policy, e.g. ``policy.good.policy_loss``."""
    return f"{POLICY_PREFIX}{policy}.{name}"


def agent_return_values(agent_returns: Mapping[str, Sequence[float]]) -> dict[str, float]:
    """Each agent's mean return over the episodes in ``agent_returns`` (agents without episodes left out)."""
    return {agent_metric(a): sum(r) / len(r) for a, r in agent_returns.items() if len(r)}


def is_diag(name: str) -> bool:
    """True for a diagnostic metric (``diag.<name>``)."""
    return name.startswith(DIAG_PREFIX)


def is_point_metric(name: str) -> bool:
    """A name an engine may report at a point: a common point metric, a diagnostic, or a multi-agent env's
    per-agent (``agent.<id>.*``) or per-policy (``policy.<id>.*``) metric."""
    return name in POINT_METRICS or is_diag(name) or name.startswith((AGENT_PREFIX, POLICY_PREFIX))


# Metrics every engine must report at every point (the contract test checks these).
REQUIRED_POINT_METRICS: Final = (
    ENV_STEPS_SAMPLED,
    WALL_TIME_S,
    EPISODE_RETURN_MEAN,
    EPISODES_TOTAL,
    SAMPLE_THROUGHPUT,
)

# Per trial summary, computed by the runner from the points and the process tree (engine-independent).
STEPS_TO_TARGET: Final = "steps_to_target"  # env steps at the first point whose return >= target
WALL_S_TO_TARGET: Final = "wall_s_to_target"  # seconds, same point
FINAL_RETURN_MEAN: Final = "final_return_mean"  # mean of the last points' returns (see runner)
PEAK_RSS_MB: Final = "peak_rss_mb"  # MiB, the trial's whole process tree, sampled
CPU_SECONDS: Final = "cpu_seconds"  # CPU seconds of the trial's whole process tree

SUMMARY_METRICS: Final = (STEPS_TO_TARGET, WALL_S_TO_TARGET, FINAL_RETURN_MEAN, PEAK_RSS_MB, CPU_SECONDS)

# Per `crossrl run` (parent run): the raw gymnasium speed of the scenario's env, random actions, one
# process, envs_per_worker copies; logged at step 0 (before the trials) and 1 (after).
RAW_ENV_STEPS_PER_S: Final = "raw_env_steps_per_s"  # env steps / s, the env without its simulated step latency

# Episodes completed at a point (the weight of its episode_return_mean in means over points).
EPISODES_THIS_POINT: Final = "episodes_this_point"

# Trial statuses: a trial ends in exactly one (the store's `status` tag keeps it; MLflow's own run status is coarser).
FINISHED: Final = "FINISHED"  # ran its whole budget (or stopped at its target)
FAILED: Final = "FAILED"  # the engine raised or its process died; the reason is stored
KILLED: Final = "KILLED"  # interrupted (Ctrl-C, a signal); partial metrics kept
TIMEOUT: Final = "TIMEOUT"  # hit budget.wall_seconds
SKIPPED: Final = "SKIPPED"  # the engine cannot run the algorithm; the reason is stored
STATUSES: Final = (FINISHED, FAILED, KILLED, TIMEOUT, SKIPPED)
