"""Reading RLlib 2.60's ``train()`` results: nested keys, finite numbers, and the learner's loss keys (shared by
:mod:`crossrl.adapters.rllib.adapter` and :mod:`crossrl.adapters.rllib.multi_agent`)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Final

from crossrl.scenarios import metrics as M


def result_get(result: Mapping[str, Any], *path: str) -> Any:
    node: Any = result
    for key in path:
        if not isinstance(node, Mapping) or key not in node:
            return None
        node = node[key]
    return node


def number(value: Any) -> float | None:
    """``value`` as a float, NaN and infinities kept (a non-finite loss is how the sink sees training diverge)."""
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def finite(value: Any) -> float | None:
    try:
        v = float(value)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


# Common metric -> RLlib learner keys under learners/default_policy, first present wins. IMPALA logs
# batch sums as pi_loss/vf_loss and per-row means as mean_*; DQN's TD loss is qf_loss.
LOSS_KEYS: Final[dict[str, tuple[str, ...]]] = {
    M.POLICY_LOSS: ("mean_pi_loss", "policy_loss"),
    M.VALUE_LOSS: ("mean_vf_loss", "vf_loss", "qf_loss"),
    M.ENTROPY: ("entropy",),
}


def first_number(stats: Mapping[str, Any], keys: tuple[str, ...]) -> float | None:
    for key in keys:
        if key in stats:
            return number(stats[key])
    return None


def env_steps_sampled(result: Mapping[str, Any]) -> int:
    """Env steps sampled so far (lifetime) in a ``train()`` result."""
    sampled = result_get(result, "env_runners", "num_env_steps_sampled_lifetime")
    if sampled is None:
        sampled = result_get(result, "num_env_steps_sampled_lifetime")
    return int(sampled or 0)


def timing_values(result: Mapping[str, Any]) -> dict[str, float | None]:
    """Sample, learn and weight-sync seconds and env-runner restarts of a ``train()`` result. RLlib's timers/* are
    smoothed (EMA) per-call averages, not the seconds spent in this iteration; for PPO/DQN (one sample and one
    update call per iteration) they are close."""
    return {
        M.TIME_SAMPLE_S: finite(result_get(result, "timers", "env_runner_sampling_timer")),
        M.TIME_LEARN_S: finite(result_get(result, "timers", "learner_update_timer")),
        M.TIME_SYNC_WEIGHTS_S: finite(result_get(result, "timers", "synch_weights")),
        M.WORKER_RESTARTS: finite(result_get(result, "fault_tolerance", "num_remote_worker_restarts")),
    }
