"""Ending a process tree we started: the runner's trial processes and the bench's measurement processes.

Both start their child in its own session, and the child may start a Ray cluster (raylet, GCS, worker
processes) under it, so ending it means ending everything below it too.
"""

from __future__ import annotations

import signal
from collections.abc import Iterable

import psutil

REAP_TIMEOUT_S = 10.0  # how long to wait for SIGKILLed processes to be gone


def process_tree(pid: int) -> list[psutil.Process]:
    """``pid``'s process and all its descendants, or [] when it is gone."""
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.Error:
        return []


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
