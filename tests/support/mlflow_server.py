"""A real `mlflow server` on loopback for tests: started, killed (its whole tree) and restarted on one store."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import psutil


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class MlflowServer:
    """`mlflow server` with an sqlite backend and an artifact folder under ``root``, on ``port`` (free if 0)."""

    def __init__(self, root: Path, port: int = 0) -> None:
        self.root = root
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 120.0) -> MlflowServer:
        self.root.mkdir(parents=True, exist_ok=True)
        with open(self.root / "server.log", "ab") as log:
            self.proc = subprocess.Popen(
                [
                    sys.executable, "-m", "mlflow", "server",
                    "--backend-store-uri", f"sqlite:///{self.root / 'mlflow.db'}",
                    "--artifacts-destination", (self.root / "artifacts").as_uri(),
                    "--host", "127.0.0.1", "--port", str(self.port), "--workers", "1",
                ],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                env={**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true"},
            )  # fmt: skip
        deadline = time.time() + timeout
        while not self.answers():
            if self.proc.poll() is not None or time.time() > deadline:
                self.stop(hard=True)
                raise RuntimeError(f"mlflow server did not start: {(self.root / 'server.log').read_text()[-2000:]}")
            time.sleep(0.5)
        return self

    def answers(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=2) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    def stop(self, *, hard: bool = False) -> None:
        """The server and every process it started (uvicorn, huey workers): SIGKILL when ``hard``."""
        if self.proc is None:
            return
        try:
            procs = [psutil.Process(self.proc.pid), *psutil.Process(self.proc.pid).children(recursive=True)]
        except psutil.Error:
            procs = []
        with_signal = signal.SIGKILL if hard else signal.SIGTERM
        try:
            os.killpg(self.proc.pid, with_signal)
        except ProcessLookupError:
            pass
        for p in procs:  # any that left the group
            try:
                p.send_signal(with_signal)
            except psutil.Error:
                continue
        _, alive = psutil.wait_procs(procs, timeout=20)
        for p in alive:
            try:
                p.kill()
            except psutil.Error:
                continue
        self.proc.wait()
        self.proc = None
