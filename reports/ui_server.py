"""`crossrl ui`'s server: `mlflow server` over the embedded store, its link printed in crossrl's view
(reports/ui.py says how MLflow 3.17's UI picks what it shows)."""

from __future__ import annotations

import sys
from pathlib import Path

from crossrl.reports.store import is_embedded, resolve_tracking_uri, with_busy_timeout
from crossrl.reports.ui import experiment_url


def server_command(
    *, tracking_uri: str | None, results_dir: Path, port: int, experiment_id: str | None = None, view: bool = True
) -> list[str] | None:
    """The `mlflow server` command over the embedded store (its URL printed: the experiment's runs page when
    ``experiment_id`` is given, in crossrl's view when ``view``), or None for a tracking server, which is only
    pointed at. The caller runs it (`crossrl ui`: in its own session, its whole tree ended on Ctrl-C, SIGTERM or
    SIGHUP)."""
    uri = resolve_tracking_uri(tracking_uri, results_dir)
    if not is_embedded(uri):
        where = experiment_url(uri, experiment_id, view=view) if experiment_id else uri
        print(f"{uri} is a tracking server already: open {where} in a browser")
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
    base = f"http://127.0.0.1:{port}/"
    if experiment_id:
        print(
            f"MLflow UI on {base}; Ctrl-C stops it. The scenario's runs:\n{experiment_url(base, experiment_id, view=view)}",
            flush=True,
        )
    else:
        print(f"MLflow UI on {base} (a scenario's runs: crossrl ui SCENARIO); Ctrl-C stops it", flush=True)
    return cmd
