"""`crossrl ui`: the MLflow UI on 127.0.0.1 over the results store."""

from __future__ import annotations

import sys
from pathlib import Path

from crossrl.reports.store import is_embedded, resolve_tracking_uri, with_busy_timeout


def server_command(*, tracking_uri: str | None, results_dir: Path, port: int) -> list[str] | None:
    """The `mlflow server` command over the embedded store (its URL printed), or None for a tracking server,
    which is only pointed at. The caller runs it (`crossrl ui`: in its own session, its whole tree ended on
    Ctrl-C, SIGTERM or SIGHUP)."""
    uri = resolve_tracking_uri(tracking_uri, results_dir)
    if not is_embedded(uri):
        print(f"{uri} is a tracking server already: open it in a browser")
        return None
    folder = results_dir.resolve()
    cmd = [
        sys.executable, "-m", "mlflow", "server",
        "--backend-store-uri", with_busy_timeout(uri),
        "--artifacts-destination", (folder / "artifacts").as_uri(),
        "--host", "127.0.0.1",
        "--port", str(port),
        "--workers", "1",
    ]  # fmt: skip
    print(f"MLflow UI on http://127.0.0.1:{port}/ (runs: #/experiments/<id>/runs); Ctrl-C stops it", flush=True)
    return cmd
