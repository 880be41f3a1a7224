"""How sample batches and weights travel between the driver and its evaluator actors.

Two transports, chosen per :class:`~crossrl.core.evaluator.EvaluatorSet` (``execution.transport`` in a spec):

- ``calls``: one Ray actor call per fragment (``sample_packed``), the weights inside the call when they change.
- ``stream``: Ray starts and restarts the evaluators (the control plane); each evaluator then keeps a socket to
  the driver (a Unix socket on the driver's node, TCP with an HMAC handshake from other nodes) and samples on
  *credits*: the driver grants fragments (with new weights when they changed, as a versioned payload the
  evaluator picks up between fragments) and the evaluator sends each finished fragment back without a call.
  ``sync_samples`` grants one fragment per evaluator per iteration (lock-step, on-policy); ``async_samples``
  keeps two granted, so an evaluator samples its next fragment while the last one travels.

Measured per 48 KB fragment on one node, CPU of the actor / driver (``crossrl bench transport``): a Ray call
with the weights ~325 / 400 us, a Ray streaming generator's item ~75 / 100 us, this socket 25 / 25 us
(docs/performance.md, "The sample transport").

A batch crosses the socket as a pickle (protocol 5) whose numpy buffers travel out of band: a header message with
the sizes, then the pickle and the buffers written straight from the arrays with ``writev`` (never joined into
one bytes object). The receiver reads them with ``readv`` into one ``bytearray`` and unpickles onto it: the
columns it gets are writable, and each byte is copied once on each side, by the kernel.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import queue
import shutil
import socket
import struct
import tempfile
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Client, Connection, Listener, wait
from typing import Any, Final

from ray.exceptions import RayActorError

from crossrl.scenarios.spec import DEFAULT_TRANSPORT, TRANSPORTS, Transport

log = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_TRANSPORT", "TRANSPORTS", "EvaluatorFailed", "Grant", "RemoteFailure", "StreamHub", "Transport",
    "connect", "serve_fragments",
]  # fmt: skip

IOV_MAX: Final = 512  # buffers per writev call (Linux allows 1024)
CONNECT_TIMEOUT_S: Final = 120.0


@dataclass(frozen=True)
class Grant:
    """Driver -> evaluator: sample ``credits`` more fragments of ``num_steps``; set ``weights`` (packed bytes,
    version ``version``) and ``epsilon`` first when given."""

    num_steps: int
    credits: int = 1
    version: int | None = None
    weights: bytes | None = None
    epsilon: float | None = None


@dataclass(frozen=True)
class RemoteFailure:
    """Evaluator -> driver, instead of a fragment: sampling raised (the env or the policy failed)."""

    worker_index: int
    error: str  # "Type: message"
    traceback: str


class EvaluatorFailed(RuntimeError):
    """An evaluator's sampling raised; the message carries its error and its traceback (as Ray's task errors do)."""


# ---- framing -----------------------------------------------------------------------------------------


def send_object(conn: Connection, obj: Any) -> None:
    """Send ``obj`` as a pickle with its buffers out of band (see the module docstring)."""
    buffers: list[pickle.PickleBuffer] = []
    head = pickle.dumps(obj, protocol=5, buffer_callback=buffers.append)
    parts = [memoryview(head), *(b.raw() for b in buffers)]
    sizes = [p.nbytes for p in parts]
    conn.send_bytes(struct.pack(f"<I{len(sizes)}Q", len(sizes), *sizes))
    _write_all(conn.fileno(), parts)


def recv_object(conn: Connection) -> Any:
    """The object :func:`send_object` sent; raises ``EOFError``/``OSError`` when the peer is gone."""
    header = conn.recv_bytes()
    (n,) = struct.unpack_from("<I", header)
    sizes = struct.unpack_from(f"<{n}Q", header, 4)
    buf = bytearray(sum(sizes))
    view = memoryview(buf)
    _read_into(conn.fileno(), view)
    parts, start = [], 0
    for size in sizes:
        parts.append(view[start : start + size])
        start += size
    return pickle.loads(parts[0], buffers=parts[1:])


def _write_all(fd: int, parts: list[memoryview]) -> None:
    """Every byte of ``parts`` to ``fd`` in as few ``writev`` calls as the socket takes (no joined copy)."""
    views = [p for p in parts if p.nbytes]
    while views:
        n = os.writev(fd, views[:IOV_MAX])
        while views and n >= views[0].nbytes:
            n -= views[0].nbytes
            views.pop(0)
        if n:
            views[0] = views[0][n:]


def _read_into(fd: int, view: memoryview) -> None:
    """Fill ``view`` from ``fd`` (the kernel copies straight into it); ``EOFError`` if the peer closes first."""
    got = 0
    while got < view.nbytes:
        n = os.readv(fd, [view[got:]])
        if n == 0:
            raise EOFError("the stream ended inside a message")
        got += n


class Outbox:
    """What the driver sends one evaluator (grants, the final ``None``), never blocking the driver.

    Each message is written at once as far as the socket takes it (``MSG_DONTWAIT``); a rest (a grant bigger than
    the socket's buffer: conv weights, while the evaluator samples or writes a batch) is written by a thread of this
    outbox, in order. So the driver goes on reading batches while an evaluator is blocked writing one, and an
    evaluator can read its grants between fragments on its sampling thread (no reader thread: one thread wake-up
    less per fragment on the critical path of a synchronous round; docs/performance.md). The framing is
    ``multiprocessing.connection``'s: the evaluator reads with ``Connection.recv``.
    """

    def __init__(self, conn: Connection) -> None:
        self._sock = socket.socket(fileno=os.dup(conn.fileno()))  # its own descriptor: closed by this outbox
        self._lock = threading.Lock()
        self._queue: deque[memoryview] = deque()
        self._writer: threading.Thread | None = None
        self._closing = False
        self.broken = False  # a write failed: the evaluator is gone

    def send(self, obj: Any) -> None:
        """Queue ``obj`` for the evaluator; ``OSError`` when an earlier write found the connection gone."""
        payload = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
        data = memoryview(struct.pack("!i", len(payload)) + payload)  # < 2 GiB: Connection's short header
        with self._lock:
            if self.broken or self._closing:
                raise BrokenPipeError("the evaluator's connection is gone")
            if not self._queue:
                try:
                    data = data[self._sock.send(data, socket.MSG_DONTWAIT) :]
                except BlockingIOError:
                    pass
                except OSError:
                    self.broken = True
                    raise
                if not data.nbytes:
                    return
            self._queue.append(data)
            if self._writer is None:
                self._writer = threading.Thread(target=self._write_queued, name="crossrl-stream-outbox", daemon=True)
                self._writer.start()

    def _write_queued(self) -> None:
        while True:
            with self._lock:
                if not self._queue or self.broken:
                    self._writer = None
                    if self._closing:
                        self._sock.close()
                    return
                data = self._queue[0]
            try:
                self._sock.sendall(data)  # blocking: this thread only
            except OSError:
                with self._lock:
                    self.broken = True
                    self._queue.clear()
                continue
            with self._lock:
                self._queue.popleft()

    def close(self) -> None:
        """Close this outbox's descriptor once what is queued is written (or the connection broke)."""
        with self._lock:
            self._closing = True
            if self._writer is None:
                self._sock.close()


# ---- driver side ---------------------------------------------------------------------------------------


class StreamHub:
    """The driver's end of the ``stream`` transport: listens, accepts one connection per evaluator incarnation,
    grants fragments and collects them.

    ``start(i, actor)`` asks remote ``i`` (a fresh actor) to connect and waits for it. A connection that ends
    (the evaluator's process died) makes :meth:`ready` report ``(i, None)``; the owner restarts the actor and
    calls ``start`` again. Fragments granted to an incarnation that died are dropped, never re-sent.
    """

    def __init__(self, num_remote: int, *, node_ip: str | None = None, node_id: str | None = None) -> None:
        self._authkey = os.urandom(32)
        self._dir = tempfile.mkdtemp(prefix="crossrl-stream-")
        # Every evaluator connects at once and the accept thread takes one at a time, handshake included: the listen
        # queue holds the others (multiprocessing's default backlog of 1 dropped their TCP SYNs, each retried after
        # 1, 2, 4, ... s, and at 16 workers over two nodes some missed CONNECT_TIMEOUT_S: measured).
        backlog = max(16, num_remote + 1)
        self._listeners = [
            Listener(os.path.join(self._dir, "hub"), family="AF_UNIX", backlog=backlog, authkey=self._authkey)
        ]
        # what an evaluator needs to connect (sent to it in its stream call, over Ray)
        self.address: dict[str, Any] = {
            "unix": self._listeners[0].address, "tcp": None, "node_id": node_id, "authkey": self._authkey,
        }  # fmt: skip
        if node_ip is not None:  # evaluators on other nodes connect here
            tcp = Listener((node_ip, 0), family="AF_INET", backlog=backlog, authkey=self._authkey)
            self._listeners.append(tcp)
            self.address["tcp"] = tcp.address
        self._arrivals: queue.Queue[tuple[tuple[int, int, int], Connection]] = queue.Queue()
        self._closed = threading.Event()
        for listener in self._listeners:
            threading.Thread(target=self._accept, args=(listener,), name="crossrl-stream-accept", daemon=True).start()
        self.conns: list[Connection | None] = [None] * num_remote
        self.outboxes: list[Outbox | None] = [None] * num_remote
        self.incarnation = [0] * num_remote
        self.outstanding = [0] * num_remote  # fragments granted and not yet received
        self.pids: list[int | None] = [None] * num_remote  # each connected evaluator's process, from its hello

    def _accept(self, listener: Listener) -> None:
        while not self._closed.is_set():
            try:
                conn = listener.accept()
                hello = conn.recv()
            except Exception:  # noqa: BLE001 - a failed handshake or a closed listener
                if self._closed.is_set():
                    return
                log.warning("stream transport: a connection failed its handshake; ignored")
                continue
            self._arrivals.put((hello, conn))

    def start(self, actors: Sequence[tuple[int, Any]]) -> list[int]:
        """Start each ``(i, actor)``'s stream (remote ``i``, worker index ``i + 1``, a fresh actor: its ``stream``
        call, which lasts as long as the stream) and wait for it to connect.

        Returns the ``i`` whose actor died before it connected (its stream call ended with ``RayActorError``): the
        owner restarts those. Any other error of a stream call before it connected is raised.
        """
        import ray

        refs = {}
        for i, actor in actors:
            self._drop(i)
            self.incarnation[i] += 1
            refs[i] = actor.stream.remote(self.address, self.incarnation[i])
        failed, waiting = [], set(refs)
        deadline = time.monotonic() + CONNECT_TIMEOUT_S
        while waiting:
            try:
                (index, incarnation, pid), conn = self._arrivals.get(timeout=0.2)
            except queue.Empty:
                ended, _ = ray.wait([refs[i] for i in waiting], num_returns=len(waiting), timeout=0)
                for i in [i for i in waiting if refs[i] in ended]:
                    waiting.discard(i)
                    try:
                        ray.get(refs[i])  # another error of the call is raised as it is
                    except RayActorError:  # died before it connected: reported, restarted by the owner
                        failed.append(i)
                    else:
                        raise RuntimeError(f"stream transport: evaluator {i + 1} ended its stream before it connected")
                if waiting and time.monotonic() > deadline:
                    raise TimeoutError(
                        f"stream transport: evaluators {sorted(w + 1 for w in waiting)} did not connect to the "
                        f"driver within {CONNECT_TIMEOUT_S:.0f} s (address {self.address['unix']} / "
                        f"{self.address['tcp']})"
                    ) from None
                continue
            i = index - 1
            if i in waiting and incarnation == self.incarnation[i]:
                self.conns[i] = conn
                self.outboxes[i] = Outbox(conn)
                self.pids[i] = pid
                waiting.discard(i)
            else:
                conn.close()  # a stale incarnation
        return failed

    def grant(self, i: int, grant: Grant) -> bool:
        """Send ``grant`` to evaluator ``i``; False when its connection is gone (then it has to be restarted)."""
        outbox = self.outboxes[i]
        if outbox is None:
            return False
        try:
            outbox.send(grant)
        except OSError:
            self._drop(i)
            return False
        self.outstanding[i] += grant.credits
        return True

    def ready(self, timeout: float | None = None) -> list[tuple[int, Any]]:
        """Every fragment waiting now (at least one unless ``timeout`` passes): ``(i, batch)``, or ``(i, None)``
        once for an evaluator whose connection ended (its outstanding fragments are dropped)."""
        live = {c: i for i, c in enumerate(self.conns) if c is not None and self.outstanding[i] > 0}
        if not live:
            return []
        out: list[tuple[int, Any]] = []
        for conn in wait(list(live), timeout):
            i = live[conn]  # type: ignore[index]
            try:
                batch = recv_object(conn)  # type: ignore[arg-type]
            except (OSError, EOFError):
                self._drop(i)
                out.append((i, None))
                continue
            if isinstance(batch, RemoteFailure):
                self._drop(i)
                raise EvaluatorFailed(
                    f"evaluator {batch.worker_index} failed: {batch.error}\n\nits traceback:\n{batch.traceback}"
                )
            self.outstanding[i] -= 1
            out.append((i, batch))
        return out

    def forget(self, i: int) -> None:
        """Close evaluator ``i``'s connection (it was replaced); its outstanding fragments are dropped."""
        self._drop(i)

    def _drop(self, i: int) -> None:
        conn, self.conns[i] = self.conns[i], None
        outbox, self.outboxes[i] = self.outboxes[i], None
        self.outstanding[i] = 0
        self.pids[i] = None
        if outbox is not None:
            outbox.close()
        if conn is not None:
            conn.close()

    def close(self) -> None:
        """Tell every evaluator to stop streaming, close every connection and the listeners."""
        self._closed.set()
        for i, outbox in enumerate(self.outboxes):
            if outbox is not None:
                with contextlib.suppress(OSError):
                    outbox.send(None)
            self._drop(i)
        for listener in self._listeners:
            listener.close()
        shutil.rmtree(self._dir, ignore_errors=True)


# ---- evaluator side ------------------------------------------------------------------------------------


def connect(address: dict[str, Any], *, node_id: str | None, hello: tuple[int, int, int]) -> Connection:
    """The evaluator's connection to the hub (its Unix socket on the same node, else its TCP address), with
    ``hello`` = (worker index, incarnation, process id) sent."""
    if address["tcp"] is None or node_id == address["node_id"]:
        conn = Client(address["unix"], family="AF_UNIX", authkey=address["authkey"])
    else:
        conn = Client(tuple(address["tcp"]), family="AF_INET", authkey=address["authkey"])
    conn.send(hello)
    return conn


def serve_fragments(
    conn: Connection,
    sample: Callable[[Grant | None, int], Any],
    stopped: threading.Event,
    *,
    worker_index: int = 0,
) -> None:
    """The evaluator's streaming loop: take every grant waiting (wait for one while out of credits), sample a
    fragment, send it. ``sample(newest_grant_or_None, num_steps)`` applies a grant's weights and epsilon (when
    it carries them) and returns the batch. Ends when the driver sends ``None`` or goes away, or after sending a
    :class:`RemoteFailure` when ``sample`` raised."""
    # Grants are read here, between fragments (waiting for one when out of credits): the driver never blocks on a
    # grant (:class:`Outbox`), so this loop may block writing a batch without reading grants meanwhile.
    credits, num_steps = 0, 0
    try:
        while not stopped.is_set():
            newest: Grant | None = None
            while credits == 0 or conn.poll(0):
                msg = conn.recv()
                if msg is None:
                    return
                credits += msg.credits
                num_steps = msg.num_steps
                if msg.weights is not None or msg.epsilon is not None:
                    newest = _merge(newest, msg)
            try:
                batch = sample(newest, num_steps)
            except Exception as e:  # noqa: BLE001 - reported to the driver, which fails the trial with it
                send_object(conn, RemoteFailure(worker_index, f"{type(e).__name__}: {e}", traceback.format_exc()))
                return
            send_object(conn, batch)
            credits -= 1
    except (OSError, EOFError):
        return  # the driver closed the connection
    finally:
        conn.close()


def _merge(old: Grant | None, new: Grant) -> Grant:
    """The newest weights and the newest epsilon of two grants."""
    if old is None:
        return new
    weights, version = (new.weights, new.version) if new.weights is not None else (old.weights, old.version)
    epsilon = new.epsilon if new.epsilon is not None else old.epsilon
    return Grant(new.num_steps, new.credits, version, weights, epsilon)


def check_transport(name: str) -> Transport:
    """``name`` if it is a transport, else ValueError naming the known ones."""
    if name not in TRANSPORTS:
        raise ValueError(f"unknown transport {name!r}; known: {', '.join(TRANSPORTS)}")
    return name  # type: ignore[return-value]
