"""A real two-node Ray cluster on loopback, started with `ray start` (a head and a second node, separate
raylets, each with 3 CPUs and a custom resource naming it), and stopped by process group: only what was
started here.

Run as a script, it starts the cluster, runs a command on it (``{address}`` in the command is replaced by
the head's address) and stops the cluster; ``--cpus N`` first gives each node N logical CPUs::

    .venv/bin/python tests/support/ray_nodes.py .venv/bin/crossrl bench sweep smoke --ray-address {address}
    .venv/bin/python tests/support/ray_nodes.py --cpus 9 .venv/bin/crossrl run scaling-ppo --workers 8,16 \
        --ray-address {address} --placement spread
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil

RAY = str(Path(sys.executable).parent / "ray")
NODE_CPUS = 3  # each node's: a 2-worker trial (3 CPUs with its driver) fits, two 1-worker trials (4) do not
RAY_ENV = {"RAY_AUTH_MODE": "disabled", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0"}


@dataclass
class Cluster:
    address: str
    nodes: dict[str, str]  # custom resource naming a node -> its Ray node id
    procs: list[subprocess.Popen[bytes]]
    local_dirs: dict[str, Path]  # custom resource naming a node -> the folder its trials keep their own files in

    def kill_second_node(self) -> None:
        """SIGKILL every process of the second node at once (its raylet, its workers, its trials' actors), as a
        crashed or preempted machine goes; its folder goes with it."""
        node = self.procs[1]
        tree = [psutil.Process(node.pid), *psutil.Process(node.pid).children(recursive=True)]
        for q in tree:
            with contextlib.suppress(psutil.Error):
                q.kill()
        psutil.wait_procs(tree, timeout=30)
        shutil.rmtree(self.local_dirs["crossrl_test_node_b"], ignore_errors=True)

    def processes(self) -> list[psutil.Process]:
        """Every live process of the cluster's nodes (raylets, workers, actors), and no other process on the machine
        (`make test-system` may run its own Ray beside the cluster tests)."""
        out: list[psutil.Process] = []
        for node in self.procs:
            with contextlib.suppress(psutil.Error):
                out += [psutil.Process(node.pid), *psutil.Process(node.pid).children(recursive=True)]
        alive = []
        for p in out:
            with contextlib.suppress(psutil.Error):
                if p.status() != psutil.STATUS_ZOMBIE:
                    alive.append(p)
        return alive

    @property
    def env(self) -> dict[str, str]:
        """The environment a client of this cluster needs (`crossrl run --ray-address`)."""
        return {**os.environ, **RAY_ENV, "COLUMNS": "160"}


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _is_loopback(ip: str) -> bool:
    addr = ipaddress.ip_address(ip.split("%")[0])
    mapped = getattr(addr, "ipv4_mapped", None)
    return bool((mapped or addr).is_loopback)


def _node_ports() -> list[str]:
    agent, agent_grpc, metrics, runtime_env, nm, om = _free_ports(6)
    return [
        f"--dashboard-agent-listen-port={agent}", f"--dashboard-agent-grpc-port={agent_grpc}",
        f"--metrics-export-port={metrics}", f"--runtime-env-agent-port={runtime_env}",
        f"--node-manager-port={nm}", f"--object-manager-port={om}",
    ]  # fmt: skip


# `ray start` for a second node on 127.0.0.1. Ray 2.60 cannot do it as it stands: with
# RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 (what keeps a node on loopback) it refuses to join a cluster, and with
# it on it rewrites 127.0.0.1 (in --node-ip-address and --address) to the machine's network address, and
# the node's servers then listen on every interface. This runs Ray's own `ray start` with that rewrite
# left out, so the node keeps the 127.0.0.1 it is given (its servers listen on loopback: checked below).
JOIN_ON_LOOPBACK = """
import sys
import ray._private.services as services
services.resolve_ip_for_localhost = lambda host: host
from ray.scripts.scripts import main
sys.argv = ["ray", *sys.argv[1:]]
main()
"""


def _start(
    args: list[str], log: Path, local: Path, *, join: bool = False, cpus: int = NODE_CPUS
) -> subprocess.Popen[bytes]:
    ray_start = [sys.executable, "-c", JOIN_ON_LOOPBACK] if join else [RAY]
    local.mkdir(parents=True, exist_ok=True)  # the node's own disk, as far as its trials are concerned
    env = {**os.environ, **RAY_ENV, "CROSSRL_NODE_DIR": str(local),
           **({"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "1"} if join else {})}  # fmt: skip
    with open(log, "wb") as out:
        return subprocess.Popen(
            [*ray_start, "start", "--block", "--node-ip-address=127.0.0.1", f"--num-cpus={cpus}", "--disable-usage-stats",
             *args],
            stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True,
        )  # fmt: skip


def _probe(address: str) -> dict[str, str] | None:
    """The cluster's live nodes: custom resource -> node id (None until it answers)."""
    code = (
        f"import json, ray; ray.init(address={address!r}, log_to_driver=False); "
        "print(json.dumps({r: n['NodeID'] for n in ray.nodes() if n['Alive'] for r in n['Resources'] "
        "if r.startswith('crossrl_test_node_')}))"
    )
    try:
        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, env={**os.environ, **RAY_ENV}, timeout=60
        )
    except subprocess.TimeoutExpired:
        return None
    if out.returncode != 0:
        return None
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


STOP_GRACE_S = 3.0  # SIGTERM, then SIGKILL: `ray start --block` and its raylet outlived 30 s of SIGTERM (each cluster
# test's teardown waited the whole 30 s: 180 s of CI); nothing a test reads is written at a node's exit


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    tree: list[psutil.Process] = []
    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            tree += [psutil.Process(p.pid), *psutil.Process(p.pid).children(recursive=True)]
    for p in reversed(procs):  # the second node first, then the head
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGTERM)
    _, alive = psutil.wait_procs(tree, timeout=STOP_GRACE_S)
    for q in alive:
        with contextlib.suppress(psutil.Error):
            q.kill()
    psutil.wait_procs(alive, timeout=10)  # gone before the next test starts a cluster of its own
    for p in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(timeout=5)


@contextlib.contextmanager
def two_nodes(logs: Path, *, cpus: int = NODE_CPUS) -> Iterator[Cluster]:
    """A head (resource ``crossrl_test_node_a``) and a second node (``crossrl_test_node_b``), ``cpus`` logical CPUs
    each, logs in ``logs``; each node's trials keep their own files in a folder of its own there
    (``CROSSRL_NODE_DIR``)."""
    local_dirs = {name: logs / f"{name}-local" for name in ("crossrl_test_node_a", "crossrl_test_node_b")}
    [port] = _free_ports(1)
    address = f"127.0.0.1:{port}"
    procs = [
        _start(
            ["--head", f"--port={port}", "--include-dashboard=false", *_node_ports(),
             '--resources={"crossrl_test_node_a": 1}'],
            logs / "head.log",
            local_dirs["crossrl_test_node_a"],
            cpus=cpus,
        )
    ]  # fmt: skip
    try:
        deadline = time.time() + 180
        nodes: dict[str, str] | None = None
        while not nodes:
            assert procs[0].poll() is None and time.time() < deadline, (logs / "head.log").read_text()[-3000:]
            nodes = _probe(address)
            time.sleep(1)
        procs.append(
            _start(
                [f"--address={address}", *_node_ports(), '--resources={"crossrl_test_node_b": 1}'],
                logs / "node.log",
                local_dirs["crossrl_test_node_b"],
                join=True,
                cpus=cpus,
            )
        )
        while len(nodes) < 2:
            assert procs[1].poll() is None and time.time() < deadline, (logs / "node.log").read_text()[-3000:]
            time.sleep(1)
            nodes = _probe(address) or nodes
        # nothing of either node listens off loopback
        pids = {q.pid for p in procs for q in [psutil.Process(p.pid), *psutil.Process(p.pid).children(recursive=True)]}
        exposed = [
            c
            for c in psutil.net_connections(kind="inet")
            if c.pid in pids and c.status == psutil.CONN_LISTEN and not _is_loopback(c.laddr.ip)
        ]
        assert not exposed, f"the cluster listens off loopback: {exposed}"
        yield Cluster(address=address, nodes=nodes, procs=procs, local_dirs=local_dirs)
    finally:
        _stop(procs)


if __name__ == "__main__":
    import tempfile

    args = sys.argv[1:]
    cpus = NODE_CPUS
    if args[:1] == ["--cpus"]:  # each node's logical CPUs: Ray places workers by them, not by the machine's cores
        cpus, args = int(args[1]), args[2:]
    with tempfile.TemporaryDirectory(prefix="crossrl-ray-nodes-") as logs, two_nodes(Path(logs), cpus=cpus) as cluster:
        command = [arg.replace("{address}", cluster.address) for arg in args]
        print(f"two-node Ray cluster at {cluster.address}: {' '.join(command)}", flush=True)
        code = subprocess.run(command, env=cluster.env).returncode
    sys.exit(code)
