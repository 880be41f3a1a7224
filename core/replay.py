"""Experience replay for DQN and Ape-X: a uniform buffer and a prioritized one over a sum tree.

n-step returns are a pure function in :mod:`crossrl.core.maths` (tested here too, against hand cases).

Pure numpy, every random draw from an explicit ``numpy.random.Generator``. Transitions are stored
column by column (a flat ``[B, ...]`` array per column name), allocated on the first ``add``.

Prioritized replay follows Schaul et al. (2016), proportional variant: slot ``i`` is drawn with
probability ``p_i**alpha / sum_j p_j**alpha`` (stratified over ``batch_size`` equal segments of the
total mass), and its importance weight is ``(N * P(i))**-beta``, normalized by the largest possible
weight (that of the lowest-priority slot) so weights only ever scale updates down.

Every stored transition has an insertion id (a cumulative counter); ``slot = id % capacity``. A
sample returns ids, and a priority update for an id whose slot has since been overwritten is dropped:
with Ape-X the learner's update arrives after new samples may have replaced the ones it trained on.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

Columns = dict[str, np.ndarray]


class SumTree:
    """A binary tree over ``capacity`` leaves holding their sums (and minima) at the inner nodes.

    Leaves are at ``[size, 2 * size)`` of a flat array, ``size`` the next power of two; node ``i`` has
    children ``2i`` and ``2i+1``, the root is node 1. Updates and prefix searches are vectorized over
    a batch, O(batch x log capacity) numpy work.
    """

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self._size = 1 << max(0, (capacity - 1).bit_length())
        self._sum = np.zeros(2 * self._size, dtype=np.float64)
        # Empty leaves hold +inf in the min tree so they never win the minimum.
        self._min = np.full(2 * self._size, np.inf, dtype=np.float64)

    @property
    def total(self) -> float:
        """Sum over every leaf."""
        return float(self._sum[1])

    @property
    def min(self) -> float:
        """Smallest value among the leaves set so far (``inf`` when none is)."""
        return float(self._min[1])

    def __getitem__(self, indices: np.ndarray | int) -> np.ndarray:
        return self._sum[self._size + np.asarray(indices)]

    def update(self, indices: np.ndarray, values: np.ndarray) -> None:
        """Set leaves ``indices`` (``0 <= i < capacity``) to ``values`` (>= 0) and repair their ancestors.

        With repeated indices the last value wins, as with sequential assignment.
        """
        indices = np.asarray(indices, dtype=np.int64).ravel()
        values = np.asarray(values, dtype=np.float64).ravel()
        if indices.shape != values.shape:
            raise ValueError(f"{indices.shape[0]} indices but {values.shape[0]} values")
        if indices.size == 0:
            return
        if indices.min() < 0 or indices.max() >= self.capacity:
            raise IndexError(f"leaf index out of range [0, {self.capacity})")
        if not np.all(np.isfinite(values)) or values.min() < 0:
            raise ValueError("values must be finite and >= 0")
        nodes = indices + self._size
        self._sum[nodes] = values
        self._min[nodes] = values
        nodes = np.unique(nodes // 2)
        while nodes[0] >= 1:
            left, right = 2 * nodes, 2 * nodes + 1
            self._sum[nodes] = self._sum[left] + self._sum[right]
            self._min[nodes] = np.minimum(self._min[left], self._min[right])
            if nodes[0] == 1:
                break
            nodes = np.unique(nodes // 2)

    def find_prefix(self, mass: np.ndarray) -> np.ndarray:
        """For each ``m`` in ``mass`` (``0 <= m < total``), the leaf ``i`` with ``sum(leaves[:i]) <= m < sum(leaves[:i+1])``.

        Zero-valued leaves are never returned (a mass at or beyond the total, from rounding, lands
        on the last non-zero leaf).
        """
        mass = np.array(mass, dtype=np.float64).ravel()
        nodes = np.ones(mass.shape, dtype=np.int64)
        for _ in range(self._size.bit_length() - 1):  # tree depth: every node descends in lockstep
            left = 2 * nodes
            left_sum = self._sum[left]
            go_right = (mass >= left_sum) & (self._sum[left + 1] > 0)
            mass = np.where(go_right, mass - left_sum, mass)
            nodes = np.where(go_right, left + 1, left)
        return nodes - self._size


class ReplayBuffer:
    """A ring buffer of transitions, sampled uniformly with replacement.

    ``capacity`` is in transitions; the oldest are overwritten first.
    """

    def __init__(self, capacity: int, *, rng: np.random.Generator) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self.rng = rng
        self._columns: Columns = {}
        self.num_added = 0  # cumulative transitions ever added (the next insertion id)

    def __len__(self) -> int:
        return min(self.num_added, self.capacity)

    def __getstate__(self) -> dict[str, Any]:
        """Pickled with its filled rows only: the columns are allocated for the whole capacity at the first add, so a
        checkpoint of a buffer a few per cent full would write all of it (HalfCheetah's at a capacity of 1M: 293 MB
        at 30,000 transitions)."""
        state = self.__dict__.copy()
        state["_columns"] = {k: v[: len(self)] for k, v in self._columns.items()}
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        columns: Columns = state.pop("_columns")
        self.__dict__.update(state)
        self._columns = {}
        for k, v in columns.items():
            self._columns[k] = np.zeros((self.capacity, *v.shape[1:]), dtype=v.dtype)
            self._columns[k][: len(v)] = v

    def add(self, batch: Mapping[str, np.ndarray]) -> np.ndarray:
        """Append a flat batch (every column ``[B, ...]``); returns the ``B`` slots written."""
        sizes = {k: len(v) for k, v in batch.items()}
        if len(set(sizes.values())) != 1:
            raise ValueError(f"columns differ in length: {sizes}")
        n = next(iter(sizes.values()))
        if not self._columns:
            self._columns = {
                k: np.zeros((self.capacity, *np.shape(v)[1:]), dtype=np.asarray(v).dtype) for k, v in batch.items()
            }
        elif set(batch) != set(self._columns):
            raise ValueError(f"columns {sorted(batch)} differ from the buffer's {sorted(self._columns)}")
        if n == 0:
            return np.zeros(0, dtype=np.int64)
        # When one batch exceeds the capacity only its newest ``capacity`` rows can survive.
        skip = max(0, n - self.capacity)
        ids = np.arange(self.num_added + skip, self.num_added + n, dtype=np.int64)
        slots = ids % self.capacity
        for k, v in batch.items():
            self._columns[k][slots] = np.asarray(v)[skip:]
        self.num_added += n
        return slots

    def can_sample(self) -> bool:
        return len(self) > 0

    def _gather(self, slots: np.ndarray) -> Columns:
        return {k: v[slots] for k, v in self._columns.items()}

    def sample(self, batch_size: int) -> Columns:
        """``batch_size`` transitions drawn uniformly with replacement (copies)."""
        if len(self) == 0:
            raise ValueError("cannot sample from an empty replay buffer")
        return self._gather(self.rng.integers(0, len(self), size=batch_size))


class PrioritizedReplayBuffer(ReplayBuffer):
    """Proportional prioritized replay (Schaul et al. 2016) over a :class:`SumTree`.

    ``alpha`` shapes priorities (0: uniform); ``eps`` keeps zero-error transitions drawable. New
    transitions without a priority get the largest priority seen so far, so each is likely replayed
    at least once (Ape-X instead computes initial priorities on the workers and passes them in).
    """

    def __init__(self, capacity: int, *, alpha: float, rng: np.random.Generator, eps: float = 1e-6) -> None:
        super().__init__(capacity, rng=rng)
        if alpha < 0:
            raise ValueError(f"alpha must be >= 0, got {alpha}")
        self.alpha = alpha
        self.eps = eps
        self._tree = SumTree(capacity)
        self._max_priority = 1.0

    def add(self, batch: Mapping[str, np.ndarray], *, priorities: np.ndarray | None = None) -> np.ndarray:
        """Append a flat batch with raw priorities (e.g. ``|TD error|``) or, when ``None``, the max seen."""
        n = len(next(iter(batch.values()))) if batch else 0
        if priorities is None:
            priorities = np.full(n, self._max_priority)
        priorities = np.asarray(priorities, dtype=np.float64).ravel()
        if priorities.shape[0] != n:
            raise ValueError(f"{priorities.shape[0]} priorities for {n} transitions")
        slots = super().add(batch)
        self._set(slots, priorities[n - len(slots) :])
        return slots

    def _set(self, slots: np.ndarray, priorities: np.ndarray) -> None:
        p = np.abs(priorities) + self.eps
        if p.size:
            self._max_priority = max(self._max_priority, float(p.max()))
        self._tree.update(slots, p**self.alpha)

    def probabilities(self, slots: np.ndarray) -> np.ndarray:
        """Sampling probability of each slot, ``p_i**alpha / total``."""
        return self._tree[slots] / self._tree.total

    def sample_prioritized(self, batch_size: int, *, beta: float) -> tuple[Columns, np.ndarray, np.ndarray]:
        """Draw ``batch_size`` transitions by priority.

        Returns ``(columns, ids, weights)``: the insertion ids to pass back to
        :meth:`update_priorities`, and importance weights ``(N * P(i))**-beta / max_j (N * P(j))**-beta``
        (float32, in ``(0, 1]``).
        """
        if len(self) == 0:
            raise ValueError("cannot sample from an empty replay buffer")
        total = self._tree.total
        # Stratified: one uniform draw in each of ``batch_size`` equal segments of the mass.
        bounds = (np.arange(batch_size) + self.rng.random(batch_size)) * (total / batch_size)
        slots = self._tree.find_prefix(bounds)
        n = len(self)
        probs = self._tree[slots] / total
        max_weight = (n * self._tree.min / total) ** (-beta)
        weights = ((n * probs) ** (-beta) / max_weight).astype(np.float32)
        # The id last written into a slot: the newest id congruent to the slot.
        newest = self.num_added - 1
        ids = newest - ((newest - slots) % self.capacity)
        return self._gather(slots), ids, weights

    def update_priorities(self, ids: np.ndarray, priorities: np.ndarray) -> int:
        """Set raw priorities for sampled ``ids``; ids whose slot was overwritten since are skipped.

        Returns how many priorities were applied.
        """
        ids = np.asarray(ids, dtype=np.int64).ravel()
        priorities = np.asarray(priorities, dtype=np.float64).ravel()
        if ids.shape != priorities.shape:
            raise ValueError(f"{ids.shape[0]} ids but {priorities.shape[0]} priorities")
        live = ids >= self.num_added - self.capacity
        self._set(ids[live] % self.capacity, priorities[live])
        return int(live.sum())
