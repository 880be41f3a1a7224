"""The sample transports: the stream's framing and credits (over a pipe), and both transports on real Ray actors."""

from __future__ import annotations

import os
import select
import socket
import threading
import time
from multiprocessing import Pipe
from typing import Any

import numpy as np
import psutil
import pytest
import ray

from crossrl.core import sample_batch as sb
from crossrl.core import transport as tx
from crossrl.core.algorithms import load
from crossrl.core.evaluator import EvaluatorSet
from crossrl.core.policy import PolicySpec
from crossrl.core.sample_batch import SampleBatch
from crossrl.scenarios.catalog import HYPERPARAM_DEFAULTS
from crossrl.scenarios.spec import EnvSpec, ModelSpec


def batch_of(rows: int, width: int) -> SampleBatch:
    rng = np.random.default_rng(rows)
    batch = SampleBatch(
        {sb.OBS: rng.random((rows, 2, width), np.float32), sb.VALID: rng.random((rows, 2)) < 0.9},
        time_major=True,
        episode_returns=[1.5, 2.0],
        episode_lengths=[3, 4],
    )
    batch.weights_version = 7
    return batch


@pytest.mark.parametrize("width", [4, 300_000])  # 200 bytes / 12 MB: many partial writes and reads
def test_a_batch_crosses_the_stream_whole_and_writable(width: int) -> None:
    a, b = Pipe()
    sent = batch_of(5, width)
    sender = threading.Thread(target=tx.send_object, args=(a, sent))
    sender.start()
    got = tx.recv_object(b)
    sender.join()
    assert isinstance(got, SampleBatch) and got.time_major
    assert got.keys() == sent.keys()
    for k in sent:
        np.testing.assert_array_equal(got[k], sent[k])
        assert got[k].dtype == sent[k].dtype and got[k].flags.writeable
    assert (got.episode_returns, got.episode_lengths, got.weights_version) == ([1.5, 2.0], [3, 4], 7)
    got[sb.OBS][0, 0, 0] = -1.0  # the receiver owns its columns


def test_the_stream_samples_on_credits_and_takes_the_newest_weights_between_fragments() -> None:
    driver, evaluator = Pipe()
    calls: list[tuple[int | None, float | None, int]] = []

    def sample(grant: tx.Grant | None, num_steps: int) -> dict[str, Any]:
        calls.append((None if grant is None else grant.version, None if grant is None else grant.epsilon, num_steps))
        return {"n": len(calls)}

    stopped = threading.Event()
    loop = threading.Thread(target=tx.serve_fragments, args=(evaluator, sample, stopped))
    # Grants without credits only update what the next fragment uses; the loop samples once it has credits, with
    # the newest weights and epsilon of everything it took.
    driver.send(tx.Grant(8, credits=0, version=1, weights=b"w1"))
    driver.send(tx.Grant(8, credits=0, version=2, weights=b"w2"))
    driver.send(tx.Grant(8, credits=0, epsilon=0.5))
    driver.send(tx.Grant(8, credits=3))
    loop.start()
    assert [tx.recv_object(driver)["n"] for _ in range(3)] == [1, 2, 3]
    assert calls == [(2, 0.5, 8), (None, None, 8), (None, None, 8)]
    assert not driver.poll(0.3)  # out of credits: it waits
    driver.send(tx.Grant(16, credits=2))
    assert [tx.recv_object(driver)["n"] for _ in range(2)] == [4, 5]
    assert calls[3:] == [(None, None, 16), (None, None, 16)]
    driver.send(None)  # stop
    loop.join(timeout=5)
    assert not loop.is_alive()


def evaluator_set(transport: str, *, num_remote: int = 2) -> EvaluatorSet:
    alg = load("ppo")
    return EvaluatorSet(
        env_spec=EnvSpec(id="CartPole-v1"),
        num_envs=3,
        policy_factory=PolicySpec(
            policy_cls=alg.policy_cls, hyperparams=alg.hyperparams(HYPERPARAM_DEFAULTS["ppo"]), model=ModelSpec()
        ),
        num_remote=num_remote,
        seed=11,
        transport=transport,
    )


@pytest.mark.usefixtures("ray_cluster")
def test_both_transports_sample_the_same_fragments_with_the_same_weights() -> None:
    out = {}
    for transport in ("calls", "stream"):
        ev = evaluator_set(transport)
        try:
            rounds = []
            for r in range(3):  # new weights every round, as sync_samples sends them
                ev.local.set_weights({k: v + 0.1 * r for k, v in ev.local.get_weights().items()})
                ev.broadcast_weights(with_next_sample=True)
                rounds.append(ev.sample(num_steps=40))
            out[transport] = rounds
        finally:
            ev.stop()
    for calls_round, stream_round in zip(out["calls"], out["stream"], strict=True):
        assert len(calls_round) == len(stream_round) == 2
        for a, b in zip(calls_round, stream_round, strict=True):
            assert a.keys() == b.keys()
            for k in a:
                np.testing.assert_array_equal(a[k], b[k], err_msg=k)
            assert a.episode_returns == b.episode_returns
    assert [b.weights_version for r in out["stream"] for b in r] == [1, 1, 2, 2, 3, 3]


@pytest.mark.usefixtures("ray_cluster")
def test_a_streaming_evaluator_that_dies_is_reported_once_and_its_replacement_streams() -> None:
    ev = evaluator_set("stream")
    try:
        ev.launch(0, 20, credits=1)
        ev.launch(1, 20, credits=1)
        got: dict[int, Any] = {}
        while len(got) < 2:
            got.update(ev.ready())
        pid = ev.pids()[1]
        assert pid is not None and pid != os.getpid()
        ray.kill(ev.remotes[1], no_restart=True)
        deadline = time.monotonic() + 30
        while psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
            assert time.monotonic() < deadline, "the killed evaluator's process lives on"
            time.sleep(0.05)
        ev.launch(0, 20)
        ev.launch(1, 20)
        seen: list[tuple[int, bool]] = []
        while len(seen) < 2:
            seen += [(i, b is not None) for i, b in ev.ready()]
        assert sorted(seen) == [(0, True), (1, False)]
        ev.restart(1)
        ev.launch(1, 20, weights=ev.payload(ev.local.get_weights()), version=5)
        (i, batch), *rest = ev.ready(timeout=60)
        assert not rest and i == 1 and batch is not None and batch.weights_version == 5
        assert ev.worker_restarts == 1
    finally:
        ev.stop()


def test_a_failing_fragment_reaches_the_driver_as_the_error_and_its_traceback() -> None:
    driver, evaluator = Pipe()

    def sample(grant: tx.Grant | None, num_steps: int) -> None:
        raise RuntimeError("the simulator crashed")

    loop = threading.Thread(target=tx.serve_fragments, args=(evaluator, sample, threading.Event()),
                            kwargs={"worker_index": 3})  # fmt: skip
    loop.start()
    driver.send(tx.Grant(4))
    failure = tx.recv_object(driver)
    loop.join(timeout=5)
    assert not loop.is_alive()  # the loop ends after reporting
    assert isinstance(failure, tx.RemoteFailure) and failure.worker_index == 3
    assert failure.error == "RuntimeError: the simulator crashed"
    assert "raise RuntimeError" in failure.traceback


def test_a_big_grant_and_a_big_batch_crossing_at_once_do_not_deadlock() -> None:
    """The driver sends new weights (megabytes) while the evaluator is blocked sending a batch bigger than the
    socket's buffer: the driver's send returns at once (its outbox writes the rest), everything arrives, in order."""
    driver, evaluator = Pipe()
    big = batch_of(4, 400_000)  # ~13 MB
    seen: list[tuple[int | None, float | None]] = []

    def sample(grant: tx.Grant | None, num_steps: int) -> SampleBatch:
        seen.append((None, None) if grant is None else (grant.version, grant.epsilon))
        return big

    loop = threading.Thread(target=tx.serve_fragments, args=(evaluator, sample, threading.Event()), daemon=True)
    loop.start()
    outbox = tx.Outbox(driver)
    outbox.send(tx.Grant(4, credits=2))
    time.sleep(0.5)  # the evaluator is now blocked writing its first batch
    t0 = time.perf_counter()
    outbox.send(tx.Grant(4, credits=1, version=1, weights=bytes(8 << 20)))
    outbox.send(tx.Grant(4, credits=0, epsilon=0.25))  # queued behind the big one
    assert time.perf_counter() - t0 < 1.0, "the driver waited on its grant"
    for _ in range(3):
        got = tx.recv_object(driver)
        np.testing.assert_array_equal(got[sb.OBS], big[sb.OBS])
    # both grants read whole and applied by fragment 3 (the weights with fragment 2 if they were in by then)
    assert seen[0] == (None, None)
    assert [v for v, _ in seen[1:] if v is not None] == [1] and [e for _, e in seen[1:] if e is not None] == [0.25]
    outbox.send(None)
    loop.join(timeout=5)
    assert not loop.is_alive()
    outbox.close()


def test_an_outbox_to_an_evaluator_that_is_gone_raises_instead_of_blocking() -> None:
    driver, evaluator = Pipe()
    outbox = tx.Outbox(driver)
    evaluator.close()
    with pytest.raises(OSError):
        for _ in range(3):  # the first write may still land in the socket's buffer
            outbox.send(tx.Grant(4, weights=bytes(1 << 20)))
            time.sleep(0.2)
    outbox.close()


def test_the_hub_queues_every_evaluators_connection_while_it_accepts_one() -> None:
    """Evaluators on other nodes connect over TCP all at once. The hub accepts one connection at a time (its handshake
    included); the others wait in the listen queue. With multiprocessing's default backlog of 1 the kernel dropped the
    rest's SYNs and each retried after 1, 2, 4, ... s: at 16 workers spread over two nodes, evaluators missed the
    hub's 120 s connect limit (measured). Here the hub's accept thread is held on a first connection that never
    answers its challenge, and 15 more TCP connections must still complete their TCP handshake at once."""
    hub = tx.StreamHub(16, node_ip="127.0.0.1", node_id="driver-node")
    held, pending = socket.create_connection(tuple(hub.address["tcp"])), []
    try:
        time.sleep(0.2)  # the accept thread takes it and waits for the answer to its challenge
        for _ in range(15):
            s = socket.socket()
            s.setblocking(False)
            s.connect_ex(tuple(hub.address["tcp"]))
            pending.append(s)
        deadline = time.monotonic() + 5
        done: set[int] = set()
        while len(done) < len(pending) and time.monotonic() < deadline:
            _, writable, _ = select.select([], [s for s in pending if s.fileno() not in done], [], 0.2)
            done |= {s.fileno() for s in writable if s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0}
        assert len(done) == len(pending), f"{len(done)} of {len(pending)} connections queued"
    finally:
        for s in [held, *pending]:
            s.close()
        hub.close()
