"""A trial's watcher: reads the env guard's folder (``crossrl.core.envguard``) and decides when a trial must end.

The same for every engine, from outside the engine: the runner polls it for a trial in a child process, a sweep's
host for a trial fanned out over a cluster. Two verdicts:

- **env fault**: the user's env raised, returned a non-finite value or an observation outside its space, in any of
  the trial's processes. The trial ends FAILED with the guard's message at once, whatever the engine would have
  done next (RLlib restarts an env runner whose sample raised, and would hit the same bug until the wall budget).
- **stall**: once set-up is done (:meth:`TrialWatch.arm`), no env step anywhere in the trial for
  ``budget.stall_seconds``. The processes that step envs are asked for their Python stacks first (SIGUSR1, which
  the guard hands to ``faulthandler``), so the artifact shows where they hang.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from crossrl.core.envguard import WATCH_DIR_ENV

STACKS_WAIT_S = 2.0  # how long to wait for the processes' stacks after asking for them


@dataclass
class Verdict:
    """Why a trial must end: its reason (one line) and what to store beside it (``artifact`` named ``name``)."""

    reason: str
    detail: str
    name: str  # the artifact's file name
    env_step: int | None = None
    at: float | None = None  # when it happened (unix time): the fault, or the last env step before a stall


class TrialWatch:
    """The watch folder of one trial (made here; removed by :meth:`close`)."""

    def __init__(self, directory: Path, *, stall_seconds: float, require_beat: bool = False) -> None:
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)
        self.stall_seconds = stall_seconds
        self.require_beat = require_beat  # no stall verdict before an env stepped where this folder is seen
        self.armed_at: float | None = None
        self._seen_warnings: set[str] = set()

    def env(self) -> dict[str, str]:
        """The environment variable that points the trial's processes (and those they start) at the folder."""
        return {WATCH_DIR_ENV: str(self.dir)}

    def arm(self) -> None:
        """Set-up is done: from now on the trial must step its envs at least every ``stall_seconds``."""
        if self.armed_at is None:
            self.armed_at = time.time()

    def fault(self) -> Verdict | None:
        """The first env fault any of the trial's processes reported, or None."""
        records = []
        for path in self.dir.glob("fault-*.json"):
            with contextlib.suppress(OSError, ValueError):
                records.append(json.loads(path.read_text()))
        if not records:
            return None
        first = min(records, key=lambda r: float(r.get("time", 0.0)))
        return Verdict(
            reason=str(first.get("message", "the env broke")),
            detail=str(first.get("traceback", "")),
            name="traceback.txt",
            env_step=first.get("env_step"),
            at=float(first["time"]) if "time" in first else None,
        )

    def last_step_at(self) -> float | None:
        """When an env of the trial last stepped (the newest beat), or None before any."""
        newest = None
        for path in self.dir.glob("beat-*"):
            with contextlib.suppress(OSError):
                t = path.stat().st_mtime
                newest = t if newest is None else max(newest, t)
        return newest

    def stalled(self, now: float | None = None) -> Verdict | None:
        """A stall verdict when armed and no env stepped for ``stall_seconds`` (the stacks collected), or None."""
        if self.armed_at is None:
            return None
        now = time.time() if now is None else now
        stepped = self.last_step_at()
        if stepped is None and self.require_beat:
            return None
        last = max(self.armed_at, stepped or 0.0)
        idle = now - last
        if idle < self.stall_seconds:
            return None
        return Verdict(
            reason=f"no env step for {idle:.0f} s (budget.stall_seconds: {self.stall_seconds:g}); the stuck "
            "processes' Python stacks are in the trial's stacks.txt",
            detail=self.stacks(),
            name="stacks.txt",
            at=last,
        )

    def check(self) -> Verdict | None:
        """:meth:`fault`, else :meth:`stalled`."""
        return self.fault() or self.stalled()

    def warnings(self) -> list[str]:
        """Warnings not returned before (a non-finite value let through under ``env.nonfinite: warn``)."""
        out = []
        for path in sorted(self.dir.glob("warn-*.json")):
            if path.name in self._seen_warnings:
                continue
            with contextlib.suppress(OSError, ValueError):
                out.append(str(json.loads(path.read_text())["message"]))
                self._seen_warnings.add(path.name)
        return out

    def stacks(self, wait_s: float = STACKS_WAIT_S) -> str:
        """Every Python thread's stack of each live process that registered for it (the env guard does, in every
        process that steps envs; so does the trial's driver), asked for with SIGUSR1."""
        files = {}
        for path in self.dir.glob("stacks-*.txt"):
            with contextlib.suppress(ValueError):
                files[int(path.stem.removeprefix("stacks-"))] = path
        asked = {}
        for pid, path in files.items():
            try:
                size = path.stat().st_size
                os.kill(pid, signal.SIGUSR1)
                asked[pid] = (path, size)
            except (OSError, ProcessLookupError):
                continue
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and any(p.stat().st_size <= s for p, s in asked.values()):
            time.sleep(0.1)
        time.sleep(0.2)  # the last lines of a dump
        parts = []
        for pid, (path, size) in sorted(asked.items()):
            with contextlib.suppress(OSError), open(path) as f:
                f.seek(size)
                parts.append(f"== process {pid} ==\n{f.read().strip() or '(no answer)'}\n")
        return "\n".join(parts) or "(no process of the trial registered for stack dumps)\n"

    def close(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)
