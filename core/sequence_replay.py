"""DreamerV3's replay: every env's steps as one stream of entries, sampled as windows of ``length`` consecutive entries.

A world model learns from sequences, so transitions are not stored one by one (as
:class:`~crossrl.core.replay.ReplayBuffer` does) but in order, per env: an entry is one observation with the action
that led to it (``prev_actions``, as the env took it), the reward that came with it, and whether it is an episode's
first observation (``is_first``) or a terminal one (``is_terminal``). An episode of ``n`` transitions is ``n + 1``
entries: its first observation (no action, reward 0), then each next observation with its action and reward; a
truncated episode's last entry is not terminal (it continues, unseen). A window may cross from one episode into the
next: the world model resets its state at the ``is_first`` inside it, and at the window's first entry.

Sampled fragments arrive time-major (``[T, N, ...]``, :mod:`crossrl.core.sample_batch`), with gymnasium's next-step
autoreset rows marked invalid; :meth:`SequenceReplayBuffer.add_fragment` turns each env's valid rows into entries,
remembering per stream whether its next row starts an episode. A stream is keyed by the fragment's source (the
evaluator that sampled it, :attr:`~crossrl.core.sample_batch.SampleBatch.source`) and the env's index: a restarted
evaluator is a new source, so its first observation starts a new stream.

``capacity`` is in entries over every stream; each stream keeps its newest ``capacity / streams`` (at least
``length``). Pure numpy, every draw from the buffer's own ``numpy.random.Generator``.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from typing import Any, Final

import numpy as np

from crossrl.core import sample_batch as sb

PREV_ACTIONS: Final = "prev_actions"
IS_FIRST: Final = "is_first"
IS_TERMINAL: Final = "is_terminal"
COLUMNS: Final = (sb.OBS, PREV_ACTIONS, sb.REWARDS, IS_FIRST, IS_TERMINAL)

Columns = dict[str, np.ndarray]


class _Stream:
    """One env's entries in order, in arrays grown by doubling; ``[lo, hi)`` holds the live ones."""

    def __init__(self) -> None:
        self.cols: Columns = {}
        self.lo = 0
        self.hi = 0
        self.expect_first = True  # the stream's next valid row starts an episode

    def __len__(self) -> int:
        return self.hi - self.lo

    def append(self, entries: Mapping[str, np.ndarray]) -> None:
        n = len(entries[sb.OBS])
        if not self.cols:
            self.cols = {k: np.zeros((max(64, 2 * n), *v.shape[1:]), v.dtype) for k, v in entries.items()}
        size = len(self.cols[sb.OBS])
        if self.hi + n > size:
            live = len(self)
            grown = max(size, 2 * (live + n)) if live + n > size // 2 else size
            for k, v in self.cols.items():
                fresh = np.zeros((grown, *v.shape[1:]), v.dtype)
                fresh[:live] = v[self.lo : self.hi]
                self.cols[k] = fresh
            self.lo, self.hi = 0, live
        for k, v in entries.items():
            self.cols[k][self.hi : self.hi + n] = v
        self.hi += n

    def trim(self, keep: int) -> None:
        self.lo = max(self.lo, self.hi - keep)

    def window(self, start: int, length: int) -> Columns:
        a = self.lo + start
        return {k: v[a : a + length] for k, v in self.cols.items()}

    def __getstate__(self) -> dict[str, Any]:
        """Pickled with its live entries only."""
        return {
            "cols": {k: v[self.lo : self.hi].copy() for k, v in self.cols.items()},
            "lo": 0,
            "hi": len(self),
            "expect_first": self.expect_first,
        }


class SequenceReplayBuffer:
    """Streams of DreamerV3 entries, one per (source, env); :meth:`sample` draws windows uniformly over positions."""

    def __init__(self, capacity: int, *, length: int, rng: np.random.Generator) -> None:
        if capacity < length or length < 1:
            raise ValueError(f"capacity {capacity} must hold at least one sequence of length {length} >= 1")
        self.capacity = capacity
        self.length = length
        self.rng = rng
        self.streams: dict[Hashable, _Stream] = {}
        self.num_added = 0  # env steps (transitions) ever added

    def __len__(self) -> int:
        """Entries held (an episode's first observation is one too)."""
        return sum(len(s) for s in self.streams.values())

    def add_fragment(self, batch: Mapping[str, np.ndarray], *, source: Hashable) -> int:
        """A time-major fragment's valid rows as entries of its envs' streams; returns the transitions added."""
        valid = np.asarray(batch[sb.VALID], bool)
        ended = np.asarray(batch[sb.TERMINATEDS], bool) | np.asarray(batch[sb.TRUNCATEDS], bool)
        added = 0
        for i in range(valid.shape[1]):
            rows = np.flatnonzero(valid[:, i])
            if not len(rows):
                continue
            stream = self.streams.setdefault((source, i), _Stream())
            starts = np.empty(len(rows), bool)
            starts[0] = stream.expect_first
            starts[1:] = ended[rows[:-1], i]
            stream.append(_entries(batch, i, rows, starts))
            stream.expect_first = bool(ended[rows[-1], i])
            added += len(rows)
        self.num_added += added
        keep = max(self.length, self.capacity // max(1, len(self.streams)))
        for stream in self.streams.values():
            stream.trim(keep)
        return added

    def can_sample(self) -> bool:
        """Some stream holds a whole window."""
        return any(len(s) >= self.length for s in self.streams.values())

    def sample(self, num_steps: int) -> Columns:
        """``num_steps // length`` windows of ``length`` consecutive entries, each ``[B, length, ...]`` (copies)."""
        count = max(1, num_steps // self.length)
        streams = [s for s in self.streams.values() if len(s) >= self.length]
        if not streams:
            raise ValueError(f"no stream holds a sequence of {self.length} entries yet")
        starts = np.array([len(s) - self.length + 1 for s in streams], np.float64)
        picks = self.rng.choice(len(streams), size=count, p=starts / starts.sum())
        windows = [streams[k].window(int(self.rng.integers(0, starts[k])), self.length) for k in picks]
        return {col: np.stack([w[col] for w in windows]) for col in COLUMNS}


def _entries(batch: Mapping[str, np.ndarray], i: int, rows: np.ndarray, starts: np.ndarray) -> Columns:
    """Env ``i``'s valid ``rows`` as entries: before each row that starts an episode, its first observation; after
    every row, the next observation with the row's action, reward and termination."""
    n = len(rows)
    total = n + int(starts.sum())
    # each row's "next" entry comes after every first-observation entry inserted up to it
    after = np.arange(n) + np.cumsum(starts)
    first = after[starts] - 1
    obs, actions = np.asarray(batch[sb.OBS]), np.asarray(batch[sb.ACTIONS])
    out: Columns = {
        sb.OBS: np.zeros((total, *obs.shape[2:]), obs.dtype),
        PREV_ACTIONS: np.zeros((total, *actions.shape[2:]), actions.dtype),
        sb.REWARDS: np.zeros(total, np.float32),
        IS_FIRST: np.zeros(total, bool),
        IS_TERMINAL: np.zeros(total, bool),
    }
    out[sb.OBS][after] = np.asarray(batch[sb.NEXT_OBS])[rows, i]
    out[PREV_ACTIONS][after] = actions[rows, i]
    out[sb.REWARDS][after] = np.asarray(batch[sb.REWARDS])[rows, i]
    out[IS_TERMINAL][after] = np.asarray(batch[sb.TERMINATEDS])[rows, i]
    out[sb.OBS][first] = obs[rows[starts], i]
    out[IS_FIRST][first] = True
    return out
