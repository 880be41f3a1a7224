"""Ending a process tree we started: the runner's trial processes and the bench's measurement processes.

Both start their child in its own session, and the child may start a Ray cluster (raylet, GCS, worker
processes) under it, so ending it means ending everything below it too.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterable, Sequence

import psutil

from crossrl.orchestration.signals import deliver, held_signals, stop_on_signals

REAP_TIMEOUT_S = 10.0  # how long to wait for SIGKILLed processes to be gone


def process_tree(pid: int) -> list[psutil.Process]:
    """``pid``'s process and all its descendants, or [] when it is gone."""
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.Error:
        return []


class UsageMeter:
    """Peak RSS (summed over the processes of one sample) and CPU seconds (per process, latest reading) of a
    set of processes sampled now and then: a trial's processes."""

    def __init__(self) -> None:
        self.peak_rss = 0
        self._cpu: dict[int, float] = {}
        self.known: dict[int, psutil.Process] = {}

    def measure(self, procs: Iterable[psutil.Process]) -> None:
        """One sample of ``procs``."""
        rss = 0
        for p in procs:
            try:
                with p.oneshot():
                    rss += p.memory_info().rss
                    t = p.cpu_times()
                    self._cpu[p.pid] = t.user + t.system
                self.known[p.pid] = p
            except psutil.Error:
                continue
        self.peak_rss = max(self.peak_rss, rss)

    @property
    def cpu_seconds(self) -> float:
        return sum(self._cpu.values())


def kill_procs(procs: Iterable[psutil.Process], *, grace_s: float) -> None:
    """SIGTERM ``procs``, then SIGKILL those still running after ``grace_s`` seconds; ``grace_s=0``: SIGKILL at once.

    Processes that have already ended are skipped; returns when all are gone or after
    :data:`REAP_TIMEOUT_S` more seconds.
    """
    left = [p for p in procs if p.is_running()]
    steps = (
        ((signal.SIGTERM, grace_s), (signal.SIGKILL, REAP_TIMEOUT_S))
        if grace_s > 0
        else ((signal.SIGKILL, REAP_TIMEOUT_S),)
    )
    for sig, wait_s in steps:
        for p in left:
            try:
                p.send_signal(sig)
            except psutil.Error:
                pass
        _, left = psutil.wait_procs(left, timeout=wait_s)
        if not left:
            return


def kill_tree(pid: int, *, grace_s: float) -> None:
    """:func:`kill_procs` over ``pid`` and everything under it."""
    kill_procs(process_tree(pid), grace_s=grace_s)


def group_and_tree(pgid: int) -> list[psutil.Process]:
    """Every process of process group ``pgid`` (re-parented ones too) and all their descendants."""
    procs = {p.pid: p for p in process_tree(pgid)}
    for p in psutil.process_iter():
        try:
            if p.pid not in procs and os.getpgid(p.pid) == pgid:
                procs.update((q.pid, q) for q in process_tree(p.pid))
        except (OSError, psutil.Error):
            continue
    return list(procs.values())


def run_until_stopped(cmd: Sequence[str], *, grace_s: float = 10.0) -> int:
    """Run ``cmd`` in its own session until it ends or a stop signal comes (Ctrl-C, SIGTERM, SIGHUP).

    Either way, everything it started goes with it: its process group and its tree get SIGTERM, then
    SIGKILL after ``grace_s`` seconds. Returns its exit code; 0 when a stop signal ended it.
    """
    with stop_on_signals():
        with held_signals() as early:  # a stop asked while it starts is taken below, where it can be cleaned up
            proc = subprocess.Popen(list(cmd), start_new_session=True)
        try:
            deliver(early)
            return proc.wait()
        except KeyboardInterrupt:
            return 0
        finally:
            with held_signals():
                kill_procs(group_and_tree(proc.pid), grace_s=grace_s)
                proc.poll()  # reaped
