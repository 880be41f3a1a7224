"""SampleBatch: a thin dict of numpy columns, plus the episodes that finished while it was sampled.

On the worker a batch is *time-major*: every column is ``[T, N, ...]`` (T vector steps x N envs), which
is what GAE, V-trace and n-step returns need. For SGD where order does not matter a batch is
flattened to ``[T*N, ...]`` (:meth:`SampleBatch.flatten`), dropping the rows that are not transitions.

Gymnasium 1.x vector envs autoreset on the *next* step after an episode ends: that step ignores the
action, returns the reset observation and a zero reward. Such rows have ``VALID == False``; they are
not env steps, never trained on and never counted.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Final

import numpy as np

OBS: Final = "obs"  # observation the action was chosen on
ACTIONS: Final = "actions"
REWARDS: Final = "rewards"
TERMINATEDS: Final = "terminateds"  # episode ended in a terminal state (no bootstrap)
TRUNCATEDS: Final = "truncateds"  # episode cut by a time limit (bootstrap from the final observation)
NEXT_OBS: Final = "next_obs"  # observation after the action (the final one when the episode ended)
VALID: Final = "valid"  # False on autoreset rows (not transitions)
LOGP: Final = "action_logp"  # log-probability of the action under the behaviour policy
VF_PREDS: Final = "vf_preds"  # V(obs) under the behaviour policy
ADVANTAGES: Final = "advantages"
VALUE_TARGETS: Final = "value_targets"
WEIGHTS: Final = "weights"  # importance-sampling weights (prioritized replay)
PRIORITIES: Final = "priorities"  # replay priorities computed on the worker (Ape-X)
N_STEP_RETURNS: Final = "n_step_returns"  # discounted sum of up to n rewards
N_STEP_DISCOUNTS: Final = "n_step_discounts"  # gamma**k, 0 when the episode terminated inside the window
N_STEP_NEXT_OBS: Final = "n_step_next_obs"  # observation to bootstrap the n-step return from


class SampleBatch(dict[str, np.ndarray]):
    """Columns of equal leading shape; ``episode_returns``/``episode_lengths`` of episodes completed in it.

    ``time_major`` tells whether columns are ``[T, N, ...]`` or flat ``[B, ...]``. A multi-agent evaluator's
    batch (:mod:`crossrl.core.multi_agent`) holds one sub-batch per policy as ``<policy id>/<column>`` columns
    beside an env-level VALID; its ``episode_returns`` are team returns (summed over agents) and
    ``agent_returns`` each agent's return in the same episodes.
    """

    def __init__(
        self,
        columns: Mapping[str, np.ndarray] | None = None,
        *,
        time_major: bool = False,
        episode_returns: Iterable[float] = (),
        episode_lengths: Iterable[int] = (),
        env_steps: int | None = None,
        agent_returns: Mapping[str, Iterable[float]] | None = None,
    ) -> None:
        super().__init__(columns or {})
        self.time_major = time_major
        self.episode_returns: list[float] = [float(r) for r in episode_returns]
        self.episode_lengths: list[int] = [int(n) for n in episode_lengths]
        self.agent_returns: dict[str, list[float]] = {
            a: [float(r) for r in v] for a, v in (agent_returns or {}).items()
        }
        self._env_steps = env_steps
        # the version of the weights the batch was sampled with (set by the evaluator; None: not known)
        self.weights_version: int | None = None
        # the evaluator that sampled it, (worker index, process id); None: not known. A sequence replay keeps one
        # stream per source and env (crossrl.core.sequence_replay)
        self.source: tuple[int, int] | None = None

    def __reduce__(self) -> tuple[Any, ...]:
        # dict subclasses would otherwise lose the attributes in Ray's object store.
        return (
            _rebuild,
            (
                dict(self),
                self.time_major,
                self.episode_returns,
                self.episode_lengths,
                self._env_steps,
                self.agent_returns,
                self.weights_version,
                self.source,
            ),
        )

    def num_env_steps(self) -> int:
        """Env steps (transitions) in the batch: valid rows, or the count fixed when columns were dropped."""
        if self._env_steps is not None:
            return self._env_steps
        if VALID in self:
            return int(np.count_nonzero(self[VALID]))
        if not self:
            return 0
        first = next(iter(self.values()))
        return int(first.shape[0] * first.shape[1]) if self.time_major else int(first.shape[0])

    def flatten(self) -> SampleBatch:
        """``[T, N, ...]`` -> ``[T*N', ...]`` keeping only valid rows (autoreset rows dropped)."""
        if not self.time_major:
            return self
        keep = self[VALID].reshape(-1) if VALID in self else None
        cols: dict[str, np.ndarray] = {}
        for k, v in self.items():
            flat = v.reshape((-1, *v.shape[2:]))
            cols[k] = flat[keep] if keep is not None else flat
        return SampleBatch(
            cols,
            time_major=False,
            episode_returns=self.episode_returns,
            episode_lengths=self.episode_lengths,
            agent_returns=self.agent_returns,
        )

    def stats_only(self) -> SampleBatch:
        """No columns, same env-step count and episodes (what an A3C worker sends back with its gradients)."""
        return SampleBatch(
            time_major=self.time_major,
            episode_returns=self.episode_returns,
            episode_lengths=self.episode_lengths,
            env_steps=self.num_env_steps(),
            agent_returns=self.agent_returns,
        )

    def minibatches(self, *, size: int, rng: np.random.Generator) -> Iterator[SampleBatch]:
        """Shuffled flat minibatches of ``size`` rows (the last one may be smaller, never empty)."""
        flat = self.flatten()
        n = len(next(iter(flat.values())))
        perm = rng.permutation(n)
        for start in range(0, n, size):
            idx = perm[start : start + size]
            yield SampleBatch({k: v[idx] for k, v in flat.items()})


def concat(batches: Iterable[SampleBatch], *, axis: int | None = None) -> SampleBatch:
    """Concatenate batches: flat ones along rows; time-major ones along the env axis (``axis=1``).

    Episode lists are joined; every batch must have the same columns.
    """
    batches = [b for b in batches if b or b.num_env_steps() or b.episode_returns or b.agent_returns]
    if not batches:
        return SampleBatch()
    time_major = batches[0].time_major
    if any(b.time_major != time_major for b in batches):
        raise ValueError("concat: cannot mix time-major and flat batches")
    keys = set(batches[0])
    for b in batches[1:]:
        if set(b) != keys:
            raise ValueError(f"concat: columns differ: {sorted(keys)} vs {sorted(b)}")
    ax = axis if axis is not None else (1 if time_major else 0)
    cols = {k: np.concatenate([b[k] for b in batches], axis=ax) for k in batches[0]}
    env_steps = None if keys else sum(b.num_env_steps() for b in batches)
    return SampleBatch(
        cols,
        time_major=time_major,
        episode_returns=[r for b in batches for r in b.episode_returns],
        episode_lengths=[n for b in batches for n in b.episode_lengths],
        env_steps=env_steps,
        agent_returns=join_agent_returns(b.agent_returns for b in batches),
    )


def join_agent_returns(parts: Iterable[Mapping[str, list[float]]]) -> dict[str, list[float]]:
    """Per-agent episode returns from several batches, each agent's lists joined in order."""
    out: dict[str, list[float]] = {}
    for part in parts:
        for agent, returns in part.items():
            out.setdefault(agent, []).extend(returns)
    return out


def _rebuild(
    cols: dict[str, np.ndarray],
    time_major: bool,
    returns: list[float],
    lengths: list[int],
    env_steps: int | None,
    agent_returns: dict[str, list[float]] | None = None,
    weights_version: int | None = None,
    source: tuple[int, int] | None = None,
) -> SampleBatch:
    batch = SampleBatch(
        cols,
        time_major=time_major,
        episode_returns=returns,
        episode_lengths=lengths,
        env_steps=env_steps,
        agent_returns=agent_returns,
    )
    batch.weights_version = weights_version
    batch.source = source
    return batch
