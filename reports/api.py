"""Reports from the store: load a run's results, render them, attach the files to the parent run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from crossrl.reports.store import ResultsStore, load_spec_artifact


def make_report(store: ResultsStore, *, parent_id: str, out_dir: Path) -> Any:
    """Render report.html/.md/.json for one `crossrl run` and log them as the parent run's artifacts."""
    from crossrl.reports.render import build_report

    loaded = store.load(parent_id=parent_id)
    meta = {**loaded.meta, "spec": load_spec_artifact(store, parent_id)}
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = build_report(trials=loaded.trials, points=loaded.points, meta=meta, out_dir=out_dir)
    for path in (paths.html, paths.markdown, paths.json):
        store.log_file(parent_id, Path(path), "report")
    return paths
