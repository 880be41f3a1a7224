"""The trial's TorchRL learner, whatever its algorithm: DreamerV3's (:mod:`crossrl.adapters.torchrl.dreamer`, which
builds on :mod:`crossrl.adapters.torchrl.algorithms`) or the model-free ones'. The adapter builds every learner here."""

from __future__ import annotations

from collections.abc import Sequence

from crossrl.adapters.torchrl import algorithms
from crossrl.adapters.torchrl.dreamer import DreamerLearner
from crossrl.scenarios.spec import Trial


def build_learner(
    *,
    trial: Trial,
    obs_shape: Sequence[int],
    n_actions: int | None = None,
    action_shape: Sequence[int] | None = None,
    action_low: Sequence[float] | None = None,
    action_high: Sequence[float] | None = None,
    nvec: Sequence[int] | None = None,
) -> algorithms.Learner | DreamerLearner:
    """:func:`crossrl.adapters.torchrl.algorithms.build_learner`, and for dreamer a :class:`DreamerLearner` (Discrete
    actions, or bounded Box within ``action_low`` / ``action_high``). The arguments are what a checkpoint's ``dims``
    holds."""
    if trial.algorithm != "dreamer":
        return algorithms.build_learner(
            trial=trial, obs_shape=obs_shape, n_actions=n_actions, action_shape=action_shape,
            action_low=action_low, action_high=action_high, nvec=nvec,
        )  # fmt: skip
    if nvec is not None:
        raise ValueError(
            f"torchrl: dreamer takes Discrete or Box actions; {trial.env.id} has MultiDiscrete({list(nvec)})"
        )
    return DreamerLearner(trial=trial, obs_shape=obs_shape, n_actions=n_actions, action_shape=action_shape,
                          action_low=action_low, action_high=action_high)  # fmt: skip
