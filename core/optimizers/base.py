"""Policy optimizers (RLlib paper, section 4): the execution strategy, separate from the algorithm's maths.

An optimizer owns the distributed part of training over an :class:`EvaluatorSet`: ``step()`` runs one
iteration (sample, learn, sync weights; in whatever order and concurrency it implements) and returns a
:class:`StepStats`. One optimizer per module; :func:`load_optimizer` imports one lazily by name.
"""

from __future__ import annotations

import abc
import importlib
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from crossrl.core.evaluator import EvaluatorSet
from crossrl.core.sample_batch import SampleBatch
from crossrl.scenarios import metrics as M
from crossrl.scenarios.catalog import OPTIMIZERS


@dataclass
class StepStats:
    """What one ``step()`` did. Counts are for this step only (the adapter accumulates them).

    ``values`` uses the common metric names (:mod:`crossrl.scenarios.metrics`) for timings (seconds) and
    losses, and ``diag.*`` names for diagnostics; other keys are kept for logs but not reported as metrics.
    """

    env_steps_sampled: int = 0
    env_steps_trained: int = 0
    episode_returns: list[float] = field(default_factory=list)
    episode_lengths: list[int] = field(default_factory=list)
    values: dict[str, float] = field(default_factory=dict)
    agent_returns: dict[str, list[float]] = field(default_factory=dict)  # multi-agent: per agent, same episodes

    def add_episodes(self, batch: SampleBatch) -> None:
        """Count a batch's env steps as sampled and take its completed episodes."""
        self.env_steps_sampled += batch.num_env_steps()
        self.episode_returns.extend(batch.episode_returns)
        self.episode_lengths.extend(batch.episode_lengths)
        for agent, returns in batch.agent_returns.items():
            self.agent_returns.setdefault(agent, []).extend(returns)

    def common_values(self) -> dict[str, float]:
        """Only the entries an engine reports: common point metrics, ``diag.*`` diagnostics, per-policy losses,
        and per-agent mean returns of the step's episodes (multi-agent)."""
        out = {k: v for k, v in self.values.items() if M.is_point_metric(k)}
        out.update(M.agent_return_values(self.agent_returns))
        return out


class PolicyOptimizer(abc.ABC):
    """Base: keeps the evaluator set, hyperparameters, cumulative counters and per-step timers."""

    name: str = "base"

    def __init__(self, evaluators: EvaluatorSet, *, hyperparams: Mapping[str, Any]) -> None:
        self.evaluators = evaluators
        self.hp: dict[str, Any] = dict(hyperparams)
        self.num_steps_sampled = 0
        self.num_steps_trained = 0
        self._timers: dict[str, float] = {}

    @abc.abstractmethod
    def step(self) -> StepStats:
        """One training iteration; returns what it sampled, trained, timed and which episodes completed."""

    def stop(self) -> None:
        """Stop background threads and in-flight work (the evaluator set is stopped by its owner)."""

    def get_state(self, *, replay: bool = True) -> dict[str, Any]:
        """What training continues from after a restart (a checkpoint; called between steps): the counters, the
        learning policy's state (:meth:`~crossrl.core.policy.Policy.get_state`) and the optimizer's own
        (:meth:`_own_state`: a replay buffer, a target-sync counter), taken together under :meth:`_paused`.
        ``replay=False``: the replay buffer left out (None in its place; ``checkpoint.replay_buffer: false``)."""
        with self._paused():
            return {
                "optimizer": self.name,
                "num_steps_sampled": self.num_steps_sampled,
                "num_steps_trained": self.num_steps_trained,
                "policy": self.evaluators.local.policy.get_state(),
                **self._own_state(replay=replay),
            }

    def set_state(self, state: Mapping[str, Any]) -> None:
        """Back to :meth:`get_state`'s state, before the first :meth:`step`. The evaluators keep their own envs,
        which start their episodes from reset: episodes in flight at the checkpoint are not part of it."""
        if state.get("optimizer") != self.name:
            raise ValueError(f"a checkpoint of optimizer {state.get('optimizer')!r} cannot restore {self.name}")
        with self._paused():
            self.num_steps_sampled = int(state["num_steps_sampled"])
            self.num_steps_trained = int(state["num_steps_trained"])
            self.evaluators.local.policy.set_state(state["policy"])
            self._set_own_state(state)

    @contextmanager
    def _paused(self) -> Iterator[None]:
        """Holds a background learner (if any) between its updates."""
        yield

    def _own_state(self, *, replay: bool = True) -> dict[str, Any]:  # noqa: ARG002 - a replay optimizer's switch
        return {}

    def _set_own_state(self, state: Mapping[str, Any]) -> None:
        """The part :meth:`_own_state` saved."""

    @contextmanager
    def timer(self, key: str) -> Iterator[None]:
        """Accumulate wall seconds under ``key`` (e.g. ``metrics.TIME_SAMPLE_S``) until :meth:`pop_timers`."""
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self._timers[key] = self._timers.get(key, 0.0) + time.perf_counter() - t0

    def pop_timers(self) -> dict[str, float]:
        out, self._timers = self._timers, {}
        return out

    def _account(self, stats: StepStats) -> StepStats:
        """Add the step's counts to the cumulative counters and its timers to ``values``."""
        self.num_steps_sampled += stats.env_steps_sampled
        self.num_steps_trained += stats.env_steps_trained
        stats.values.update(self.pop_timers())
        stats.values[M.WORKER_RESTARTS] = float(self.evaluators.worker_restarts)
        return stats


def load_optimizer(name: str) -> type[PolicyOptimizer]:
    """The optimizer class in ``crossrl.core.optimizers.<name>`` (its module-level ``OPTIMIZER``)."""
    if name not in OPTIMIZERS:
        raise KeyError(f"unknown optimizer {name!r}; known: {', '.join(OPTIMIZERS)}")
    module = importlib.import_module(f"crossrl.core.optimizers.{name}")
    return module.OPTIMIZER  # type: ignore[no-any-return]
