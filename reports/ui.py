"""`crossrl ui`: the MLflow UI on 127.0.0.1 over the results store."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from crossrl.reports.store import is_embedded, resolve_tracking_uri


def serve(*, tracking_uri: str | None, results_dir: Path, port: int) -> int:
    """Serve the store until Ctrl-C; returns the exit code (a remote server is only pointed at)."""
    uri = resolve_tracking_uri(tracking_uri, results_dir)
    if not is_embedded(uri):
        print(f"{uri} is a tracking server already: open it in a browser")
        return 0
    folder = results_dir.resolve()
    cmd = [
        sys.executable, "-m", "mlflow", "server",
        "--backend-store-uri", uri,
        "--artifacts-destination", (folder / "artifacts").as_uri(),
        "--host", "127.0.0.1",
        "--port", str(port),
        "--workers", "1",
    ]  # fmt: skip
    print(f"MLflow UI on http://127.0.0.1:{port}/ (runs: #/experiments/<id>/runs); Ctrl-C stops it", flush=True)
    try:
        return subprocess.call(cmd)
    except KeyboardInterrupt:
        return 0
