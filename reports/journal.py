"""Durable logging: what a run writes to the store goes first to a local journal, then to the store.

A journal is one `crossrl run`'s record of every store write, under ``<results dir>/journal/``:

- ``<id>.jsonl``: the writes, one JSON line each, numbered (``seq``) and appended, flushed and fsynced one
  by one. Runs are named by the journal (``@1``, ``@2``...) until the store has created them; a line that
  a crash cut short is ignored.
- ``<id>.files/``: artifact contents (spec, logs, tracebacks, metric history) copied at write time.
- ``<id>.sent``: how far the store has it (``{"through": seq}``) and which store run each journal run
  became (``{"ref": "@1", "run_id": ...}``).
- ``<id>.lock``: held by the process that sends the journal, so two senders never send one journal.

A :class:`Sender` thread sends the writes in order and retries each with backoff for as long as it takes,
so an unreachable store never stops, slows or fails a trial. Sending twice is harmless: a run is created
once (it carries its journal key and is looked up before it is created), metric points carry the time they
were journaled (MLflow keeps one row per key, step, timestamp and value), tags, params and artifacts
overwrite themselves. A journal the store has whole is removed; one it has not is sent later by
``crossrl sync`` (or the next command that opens the store).
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import queue
import shutil
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from filelock import FileLock, Timeout


class Store(Protocol):
    """What the sender needs of a store (ResultsStore.apply: one write op, run ids resolved)."""

    def apply(self, op: Mapping[str, Any], *, files: Path | None = None, key: str = "") -> str | None: ...


JOURNAL_DIR = "journal"
KEY_TAG = "crossrl.journal_key"  # on every run a journal created: "<journal id>/<ref>"
BACKOFF_S = (0.5, 1.0, 2.0, 5.0, 10.0)  # between attempts at one write; the last repeats


class JournalError(Exception):
    """The journal cannot be written (a full disk, a file-size limit, a read-only folder)."""


def is_ref(run: str) -> bool:
    return run.startswith("@")


@dataclass
class Progress:
    """How far the store has one journal."""

    through: int = 0  # every write up to this seq is in the store
    runs: dict[str, str] = field(default_factory=dict)  # journal ref -> store run id


class Journal:
    """One run's journal (see the module docstring). ``append`` is called from one thread only."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.id = path.name.removesuffix(".jsonl")
        self.files = path.with_name(f"{self.id}.files")
        self.sent_path = path.with_name(f"{self.id}.sent")
        self.lock_path = path.with_name(f"{self.id}.lock")
        self.lock = FileLock(str(self.lock_path), thread_local=False)  # taken by the runner, released by its sender
        self.seq = 0
        self._refs = 0

    @classmethod
    def create(cls, results_dir: Path) -> Journal:
        folder = results_dir / JOURNAL_DIR
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise JournalError(f"cannot create the journal folder {folder}: {e.strerror or e}") from None
        stamp = time.strftime("%Y%m%d-%H%M%S")
        return cls(folder / f"{stamp}-{socket.gethostname()}-{os.getpid()}.jsonl")

    def new_ref(self) -> str:
        self._refs += 1
        return f"@{self._refs}"

    def append(self, op: dict[str, Any]) -> dict[str, Any]:
        """Write ``op`` durably (artifact contents into the files folder first) and return it numbered.

        On a failed write (a full disk) the journal is cut back to its last whole line, so it stays
        readable, and :class:`JournalError` says what failed.
        """
        record = {"seq": self.seq + 1, **self._with_files(op)}
        line = (json.dumps(record, separators=(",", ":")) + "\n").encode()
        fd = -1
        size = 0
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            size = os.fstat(fd).st_size
            rest = memoryview(line)
            while rest:  # a short write is followed by one that says why (ENOSPC, EFBIG)
                written = os.write(fd, rest)
                if written <= 0:
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                rest = rest[written:]
            os.fsync(fd)
        except OSError as e:
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.ftruncate(fd, size)
            raise JournalError(f"cannot write the journal {self.path}: {e.strerror or e}") from None
        finally:
            if fd >= 0:
                os.close(fd)
        self.seq += 1
        return record

    def _with_files(self, op: dict[str, Any]) -> dict[str, Any]:
        """An artifact's contents (``text``, or a ``file`` outside the journal) moved into the files folder."""
        if op.get("op") != "artifact" or "journal_file" in op:
            return op
        out = {k: v for k, v in op.items() if k not in ("text", "file")}
        name = Path(op["name"]).name
        rel = f"{self.seq + 1}/{name}"
        dest = self.files / rel
        try:
            dest.parent.mkdir(parents=True, exist_ok=True)
            if "text" in op:
                dest.write_text(op["text"])
            else:
                shutil.copyfile(op["file"], dest)
            with open(dest, "rb") as f:
                os.fsync(f.fileno())
        except OSError as e:
            raise JournalError(
                f"cannot write the journal's copy of {name} under {self.files}: {e.strerror or e}"
            ) from None
        out["journal_file"] = rel
        return out

    # -- reading and progress ---------------------------------------------------------------------
    def records(self) -> list[dict[str, Any]]:
        """Every whole line; a last line a crash cut short is left out."""
        data = self.path.read_bytes()
        out = []
        for line in data.split(b"\n")[:-1] if not data.endswith(b"\n") else data.split(b"\n"):
            if line.strip():
                out.append(json.loads(line))
        return out

    def header(self) -> dict[str, Any]:
        records = self.records()
        return records[0] if records and records[0].get("op") == "header" else {}

    def progress(self) -> Progress:
        out = Progress()
        if not self.sent_path.exists():
            return out
        for line in self.sent_path.read_bytes().split(b"\n"):
            try:
                item = json.loads(line)
            except ValueError:
                continue  # empty, or cut short
            if "through" in item:
                out.through = max(out.through, int(item["through"]))
            elif "ref" in item:
                out.runs[str(item["ref"])] = str(item["run_id"])
        return out

    def mark(self, item: Mapping[str, Any]) -> None:
        with open(self.sent_path, "a") as f:
            f.write(json.dumps(dict(item)) + "\n")

    def remove(self) -> None:
        """The store has it all: the journal goes (called with its lock released)."""
        for p in (self.path, self.sent_path, self.lock_path):
            p.unlink(missing_ok=True)
        shutil.rmtree(self.files, ignore_errors=True)


def pending_journals(results_dir: Path) -> list[Journal]:
    """Journals under ``results_dir`` that the store does not have whole, oldest first."""
    folder = results_dir / JOURNAL_DIR
    if not folder.is_dir():
        return []
    out = []
    for path in sorted(folder.glob("*.jsonl")):
        journal = Journal(path)
        try:
            records = journal.records()
        except (OSError, ValueError):
            continue
        if records and records[-1]["seq"] > journal.progress().through:
            out.append(journal)
        elif records:
            with contextlib.suppress(Timeout):
                with journal.lock.acquire(timeout=0):
                    pass
                journal.remove()
    return out


def is_transient(e: BaseException) -> bool:
    """Worth trying again: the store unreachable or busy. A write the store refuses (4xx) is not."""
    from mlflow.exceptions import MlflowException

    if isinstance(e, MlflowException):
        status = e.get_http_status_code()
        return not 400 <= status < 500
    return isinstance(e, OSError | ConnectionError | TimeoutError) or type(e).__module__.startswith(
        ("sqlalchemy", "requests", "urllib3")
    )


def _quiet_mlflow_in(thread_name: str) -> None:
    """MLflow logs each failed attempt with its traceback; the sender's failures are its own to report
    (``last_error``, and at the end of the run one line), so MLflow's log leaves out that thread's records."""

    def other_threads(record: logging.LogRecord) -> bool:
        return record.threadName != thread_name

    for handler in logging.getLogger("mlflow").handlers:
        if not any(getattr(f, "__name__", "") == "other_threads" for f in handler.filters):
            handler.addFilter(other_threads)


def describe(e: BaseException) -> str:
    """One short line for a failed store write (MLflow's own message for a refused connection runs to pages)."""
    text = str(e)
    for needle, what in (
        ("Connection refused", "connection refused"),
        ("NewConnectionError", "connection refused"),
        ("timed out", "timed out"),
        ("database or disk is full", "database or disk is full"),
        ("database is locked", "database is locked"),
    ):
        if needle in text:
            return what
    first = text.splitlines()[0] if text else ""
    return f"{type(e).__name__}: {first}"[:200]


class Sender:
    """Sends journals to the store in order, in a daemon thread, retrying each write until the store takes it.

    The live journal of a running run is fed through :meth:`submit`; journals left by earlier runs are read
    from their files. ``warn`` hears about writes the store refused for good (they are acked and skipped,
    with a ``store_warning.*`` tag on the run where possible).
    """

    def __init__(self, store: Store, *, warn: Callable[[str], None] = lambda _msg: None) -> None:
        self.store = store
        self.warn = warn
        self.failures = 0  # attempts that failed (transient), over the sender's life
        self.last_error = ""
        self._queue: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self._live: Journal | None = None
        self._backlog: list[Journal] = []
        self._done = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._main, name="crossrl-store-sender", daemon=True)
        self._progress: dict[str, Progress] = {}
        self.skipped: set[str] = set()  # backlog journals another process was sending

    # -- feeding --------------------------------------------------------------------------------
    def start(self, *, live: Journal | None = None, backlog: Sequence[Journal] = ()) -> Sender:
        _quiet_mlflow_in(self._thread.name)
        self._live, self._backlog = live, list(backlog)
        if live is not None:
            live.lock.acquire()
        self._thread.start()
        return self

    def submit(self, record: dict[str, Any]) -> None:
        self._queue.put(record)

    def close(self, wait_s: float) -> bool:
        """No more writes; wait up to ``wait_s`` for the store to have them all. True when it does."""
        self._queue.put(None)
        self._done.wait(wait_s)
        if not self._done.is_set():
            self._stop.set()
            return False
        return True

    def join(self, timeout: float) -> bool:
        """Wait for the thread to end (after :meth:`close`); True when it has."""
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def run_id(self, journal: Journal, ref: str) -> str | None:
        """The store run a journal's run became, once sent."""
        progress = self._progress.get(journal.id)
        return progress.runs.get(ref) if progress else None

    def unsent(self, journal: Journal) -> int:
        return journal.seq - self._through(journal)

    def _through(self, journal: Journal) -> int:
        """Every write of ``journal`` up to this seq is in the store (as far as this sender knows)."""
        progress = self._progress.get(journal.id)
        return progress.through if progress else 0

    # -- sending --------------------------------------------------------------------------------
    def _main(self) -> None:
        try:
            for journal in self._backlog:
                try:
                    journal.lock.acquire(timeout=0)
                except Timeout:
                    self.skipped.add(journal.id)  # its own run (or a `crossrl sync`) is sending it
                    continue
                records = journal.records()
                try:
                    self._send(journal, iter(records))
                finally:
                    journal.lock.release()
                if self._through(journal) >= (records[-1]["seq"] if records else 0):
                    journal.remove()
            if self._live is not None:
                live = self._live
                try:
                    self._send(live, iter(self._queue.get, None))
                finally:
                    live.lock.release()
                if self._through(live) >= live.seq:
                    live.remove()
        except _Stopped:
            pass
        finally:
            self._done.set()

    def _send(self, journal: Journal, records: Iterator[dict[str, Any]]) -> None:
        progress = self._progress.setdefault(journal.id, journal.progress())
        base = journal.files
        for record in records:
            seq = int(record["seq"])
            if seq <= progress.through:
                continue
            if record.get("op") != "header":  # the header is for the journal's readers, not the store
                self._apply_until_done(journal, record, progress, base)
            progress.through = seq
            with contextlib.suppress(OSError):
                journal.mark({"through": seq})

    def _apply_until_done(self, journal: Journal, record: dict[str, Any], progress: Progress, base: Path) -> None:
        attempt = 0
        while True:
            if self._stop.is_set():
                raise _Stopped
            try:
                op = _resolved(record, progress.runs)
            except _Unresolved as e:
                self.warn(f"journal {journal.path.name}: write {record['seq']} ({record['op']}) skipped: {e}")
                return
            try:
                key = f"{journal.id}/{record['ref']}" if record["op"] == "create_run" else ""
                run_id = self.store.apply(op, files=base, key=key)
            except Exception as e:
                if not is_transient(e):
                    self._refused(record, progress, e)
                    return
                self.failures += 1
                self.last_error = describe(e)
                self._stop.wait(BACKOFF_S[min(attempt, len(BACKOFF_S) - 1)])
                attempt += 1
                continue
            if record["op"] == "create_run" and run_id is not None:
                progress.runs[record["ref"]] = run_id
                with contextlib.suppress(OSError):
                    journal.mark({"ref": record["ref"], "run_id": run_id})
            return

    def _refused(self, record: dict[str, Any], progress: Progress, e: Exception) -> None:
        what = record.get("what") or record["op"]
        message = f"{type(e).__name__}: {e}"[:4000]
        self.warn(f"the store refused a write ({what}): {message.splitlines()[0]}")
        run = progress.runs.get(record.get("run", ""), record.get("run", ""))
        if run and not is_ref(run):
            with contextlib.suppress(Exception):
                self.store.apply({"op": "batch", "run": run, "tags": {f"store_warning.{what}": message}})


class _Stopped(Exception):
    pass


def _resolved(record: Mapping[str, Any], runs: Mapping[str, str]) -> dict[str, Any]:
    """``record`` with its journal refs (its run, and tags naming runs) replaced by store run ids."""
    op = dict(record)
    run = str(op.get("run", ""))
    if is_ref(run):
        if run not in runs:
            raise _Unresolved(f"run {run} was never created in the store")
        op["run"] = runs[run]
    if op.get("ref_tags"):
        op["tags"] = {k: runs.get(v, v) if k in op["ref_tags"] else v for k, v in op["tags"].items()}
    return op


class _Unresolved(Exception):
    """A write names a journal run the store never created (its creation was refused)."""


def sync(
    store_for: Callable[[str], Store],
    results_dir: Path,
    *,
    wait_s: float,
    only_uri: str | None = None,
    warn: Callable[[str], None] = lambda _msg: None,
) -> tuple[int, int]:
    """Send every pending journal under ``results_dir`` (those written for ``only_uri``, if given) to the
    store it was written for. ``store_for(uri)`` opens a store. Returns (writes sent, writes still pending
    after ``wait_s``); journals another process is sending count as neither.
    """
    journals = pending_journals(results_dir)
    by_uri: dict[str, list[Journal]] = {}
    for journal in journals:
        uri = str(journal.header().get("uri", ""))
        if only_uri is None or uri == only_uri:
            by_uri.setdefault(uri, []).append(journal)
    sent = pending = 0
    deadline = time.monotonic() + wait_s
    for uri, group in by_uri.items():
        before = {j.id: _unsent(j) for j in group}
        sender = Sender(store_for(uri), warn=warn).start(backlog=group)
        sender.close(max(0.0, deadline - time.monotonic()))
        for j in group:
            if j.id in sender.skipped:
                continue
            left = _unsent(j) if j.path.exists() else 0
            sent += before[j.id] - left
            pending += left
    return sent, pending


def _unsent(journal: Journal) -> int:
    records = journal.records()
    last = records[-1]["seq"] if records else 0
    return max(0, last - journal.progress().through)
