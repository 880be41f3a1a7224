"""A real Ray cluster: a head started on loopback, `crossrl run smoke --ray-address` on it, per engine.

The test checks each trial joined *that* cluster (its GCS address is tagged on the run), not a fresh
local one, and stops only the head it started, by process group.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from crossrl.reports.store import ResultsStore

pytestmark = [pytest.mark.integration, pytest.mark.cluster]


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


@pytest.fixture(scope="module")
def ray_head(tmp_path_factory: pytest.TempPathFactory):  # -> Iterator[str]
    port, agent, agent_grpc, metrics, runtime_env, nm, om = _free_ports(7)
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    log = tmp_path_factory.mktemp("ray-head") / "head.log"
    with open(log, "wb") as out:
        head = subprocess.Popen(
            [
                str(Path(sys.executable).parent / "ray"), "start", "--head", "--block",
                "--node-ip-address=127.0.0.1", f"--port={port}", "--num-cpus=2", "--include-dashboard=false",
                f"--dashboard-agent-listen-port={agent}",
                f"--dashboard-agent-grpc-port={agent_grpc}", f"--metrics-export-port={metrics}",
                f"--runtime-env-agent-port={runtime_env}", f"--node-manager-port={nm}",
                f"--object-manager-port={om}", "--disable-usage-stats",
            ],
            stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True,
        )  # fmt: skip
    try:
        address = f"127.0.0.1:{port}"
        deadline = time.time() + 180
        while True:
            assert head.poll() is None and time.time() < deadline, f"ray head did not start: {log.read_text()[-3000:]}"
            try:
                probe = subprocess.run(
                    [
                        sys.executable,
                        "-c",
                        f"import ray; ray.init(address='{address}'); print(ray.cluster_resources()['CPU'])",
                    ],
                    capture_output=True,
                    text=True,
                    env=env,
                    timeout=60,
                )
                if probe.returncode == 0:
                    break
            except subprocess.TimeoutExpired:
                pass
            time.sleep(2)
        # nothing of this cluster listens off loopback
        pids = {head.pid, *(p.pid for p in psutil.Process(head.pid).children(recursive=True))}
        exposed = [
            c
            for c in psutil.net_connections(kind="inet")
            if c.pid in pids and c.status == psutil.CONN_LISTEN and not _is_loopback(c.laddr.ip)
        ]
        assert not exposed, f"the head listens off loopback: {exposed}"
        yield address
    finally:
        try:
            tree = [psutil.Process(head.pid), *psutil.Process(head.pid).children(recursive=True)]
        except psutil.NoSuchProcess:
            tree = []
        with contextlib.suppress(ProcessLookupError):
            os.killpg(head.pid, signal.SIGTERM)
        _, alive = psutil.wait_procs(tree, timeout=30)
        for p in alive:
            p.kill()


@pytest.mark.parametrize("engine", ["crossrl", "rllib", "torchrl"])
def test_smoke_runs_on_an_existing_cluster(ray_head: str, engine: str, tmp_path: Path) -> None:
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "COLUMNS": "160"}
    results = tmp_path / "res"
    proc = subprocess.run(
        [
            sys.executable, "-m", "crossrl.cli", "run", "smoke", "--engines", engine, "--workers", "2",
            "--seeds", "0", "--ray-address", ray_head, "--results-dir", str(results), "--no-report",
        ],
        capture_output=True, text=True, env=env, timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    loaded = ResultsStore(None, results_dir=results).load(scenario="smoke")
    [row] = loaded.trials.to_dict("records")
    assert row["status"] == "FINISHED"
    run = ResultsStore(None, results_dir=results).client.get_run(row["run_id"])
    assert run.data.tags.get("ray_gcs_address") == ray_head, run.data.tags
