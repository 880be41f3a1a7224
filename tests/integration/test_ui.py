"""`crossrl ui` serves the embedded store over HTTP on 127.0.0.1."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from crossrl.reports.store import ResultsStore
from crossrl.scenarios.loader import load


@pytest.mark.integration
def test_ui_serves_the_embedded_store(results_dir: Path) -> None:
    store = ResultsStore(None, results_dir=results_dir)
    spec, path = load("smoke")
    parent = store.start_parent(spec, spec_path=path)
    exp_id = store.experiment_id("smoke")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "crossrl.cli", "ui", "--port", str(port), "--results-dir", str(results_dir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        body = None
        deadline = time.time() + 120
        while body is None:
            try:
                req = urllib.request.Request(
                    f"{url}/api/2.0/mlflow/runs/search",
                    data=json.dumps({"experiment_ids": [exp_id]}).encode(),
                    headers={"Content-Type": "application/json"},
                )
                with urllib.request.urlopen(req, timeout=5) as r:
                    body = json.loads(r.read())
            except OSError:
                assert proc.poll() is None and time.time() < deadline, "crossrl ui did not come up"
                time.sleep(0.5)
        assert [r["info"]["run_id"] for r in body["runs"]] == [parent]
        with urllib.request.urlopen(f"{url}/", timeout=5) as r:
            assert r.status == 200 and b"<html" in r.read().lower()
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        out = proc.communicate(timeout=30)[0].decode()
    assert f"http://127.0.0.1:{port}/" in out
