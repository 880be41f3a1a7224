"""Stop signals: Ctrl-C (SIGINT), SIGTERM and SIGHUP all stop a `crossrl run` the same way.

Python raises ``KeyboardInterrupt`` on Ctrl-C; :func:`stop_on_signals` makes SIGTERM and SIGHUP raise
:class:`Interrupted` (a ``KeyboardInterrupt``) too, so one ``except KeyboardInterrupt`` path stops the
work cleanly whichever signal came. :func:`held_signals` and :func:`deferred_signals` keep a stop
signal from cutting a block short (a store write half-done can leave the embedded sqlite store locked
for the writes that follow).
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Interrupted(KeyboardInterrupt):
    """A stop asked by a signal; ``result``: what the interrupted piece of work recorded, if anything."""

    def __init__(self, signum: int = signal.SIGINT, result: Any = None) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = int(signum)
        self.result = result

    @property
    def label(self) -> str:
        """How a person names the stop: ``Ctrl-C``, ``SIGTERM``, ``SIGHUP``."""
        return "Ctrl-C" if self.signum == signal.SIGINT else signal.Signals(self.signum).name

    @property
    def exit_code(self) -> int:
        """The shell's code for a process ended by this signal: 128 + its number (130, 143, 129)."""
        return 128 + self.signum

    @classmethod
    def of(cls, exc: BaseException) -> Interrupted:
        """``exc`` itself when it is one; a plain ``KeyboardInterrupt`` as the stop signal raised moments ago when there
        was one (a library on the way up, Ray's ``ray.get`` among them, raises a plain ``KeyboardInterrupt`` of its own
        in place of ours), else as Ctrl-C's (Python's own, on SIGINT)."""
        if isinstance(exc, Interrupted):
            return exc
        signum, when = _LAST_STOP
        return cls(signum if signum and time.monotonic() - when < RECENT_S else signal.SIGINT)


RECENT_S = 60.0  # a plain KeyboardInterrupt this soon after a stop signal was raised is that stop
_LAST_STOP: list[Any] = [0, 0.0]  # the last stop signal raised as Interrupted, and when


def stop_since(started: float) -> int | None:
    """The stop signal raised as :class:`Interrupted` since ``started`` (``time.monotonic()``), if any: a library that
    caught the ``KeyboardInterrupt`` on its way up (Ray Tune's loop ends early on one) does not lose the stop."""
    signum, when = _LAST_STOP
    return int(signum) if signum and when >= started else None


@contextlib.contextmanager
def ctrl_c_as_interrupted() -> Iterator[None]:
    """While the block runs, Ctrl-C (SIGINT) raises :class:`Interrupted` and is remembered (:func:`stop_since`), as
    the stop signals are under :func:`stop_on_signals`."""
    if not _in_main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, _raise_interrupted)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _raise_interrupted(signum: int, _frame: Any) -> None:
    _LAST_STOP[:] = [signum, time.monotonic()]
    raise Interrupted(signum)


def _in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


@contextlib.contextmanager
def stop_on_signals(signals: Sequence[int] = (signal.SIGTERM, signal.SIGHUP)) -> Iterator[None]:
    """While the block runs, each of ``signals`` raises :class:`Interrupted` as Ctrl-C raises KeyboardInterrupt.

    Only from the main thread (the only one Python delivers signals to), and only for a signal still at its
    default action: one that is ignored (``nohup`` ignores SIGHUP) or already handled stays as it is. The
    previous handlers are back when the block ends.
    """
    installed: dict[int, Any] = {}
    if _in_main_thread():
        for signum in signals:
            if signal.getsignal(signum) == signal.SIG_DFL:
                installed[signum] = signal.signal(signum, _raise_interrupted)
    try:
        yield
    finally:
        for signum, previous in installed.items():
            signal.signal(signum, previous)


@contextlib.contextmanager
def held_signals() -> Iterator[list[int]]:
    """Hold the stop signals that have a Python handler until the block is done; yields the list they land in.

    Nothing is delivered: the caller decides (see :func:`deliver`). Signals that are ignored, at their
    default action, or arrive off the main thread are not ours to hold.
    """
    caught: list[int] = []
    if not _in_main_thread():
        yield caught
        return
    previous = {s: signal.getsignal(s) for s in STOP_SIGNALS}
    held = {s: handler for s, handler in previous.items() if callable(handler)}
    for signum in held:
        signal.signal(signum, lambda s, _frame: caught.append(s))
    try:
        yield caught
    finally:
        for signum, handler in held.items():
            signal.signal(signum, handler)


def deliver(caught: Sequence[int]) -> None:
    """Hand the first held signal to the handler now in place (Ctrl-C's and :func:`stop_on_signals`' raise)."""
    if caught:
        handler = signal.getsignal(caught[0])
        if callable(handler):
            handler(caught[0], None)


@contextlib.contextmanager
def deferred_signals() -> Iterator[None]:
    """Hold a stop signal until the block is done (raised or not), then hand it to the handler it was meant for."""
    caught: list[int] = []
    try:
        with held_signals() as caught:
            yield
    finally:
        deliver(caught)
