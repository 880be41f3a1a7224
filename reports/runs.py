"""Past runs in a store, without the UI (``crossrl runs``): one row per ``crossrl run``, newest first."""

from __future__ import annotations

import datetime
from pathlib import Path

import pandas as pd

from crossrl.reports.api import OVERRIDES_TAG, run_report_dir
from crossrl.reports.store import ResultsStore
from crossrl.scenarios import metrics as M

COLUMNS = ["scenario", "parent run", "started", "status", "trials", "settings", "report"]


def past_runs(store: ResultsStore, *, scenario: str | None = None, limit: int = 50) -> pd.DataFrame:
    """The ``crossrl run`` parent runs in ``store`` (of ``scenario``, or of every scenario), newest first: scenario,
    parent run id, start time (UTC), status, trial counts by status, the flags that set it apart from its spec file
    (``--set``, ``--seeds``, ...), and its own report's path where it has one (``<results>/reports/<scenario>/<run
    id>/report.html``; ``crossrl report --run ID`` renders one for any run)."""
    experiments = {str(e.experiment_id): str(e.name) for e in store.client.search_experiments()}
    if scenario is not None:
        experiments = {k: v for k, v in experiments.items() if v == scenario}
    if not experiments:
        return pd.DataFrame(columns=COLUMNS)
    runs = store.client.search_runs(
        list(experiments),
        filter_string="tags.`crossrl.kind` = 'parent'",
        order_by=["attributes.start_time DESC"],
        max_results=limit,
    )
    rows = []
    for run in runs:
        tags = run.data.tags
        name = experiments.get(str(run.info.experiment_id), "?")
        counts = [f"{tags[f'trials.{s}']} {s}" for s in M.STATUSES if tags.get(f"trials.{s}", "0") not in ("", "0")]
        report = run_report_dir(Path(store.results_dir), name, str(run.info.run_id)) / "report.html"
        started = datetime.datetime.fromtimestamp(run.info.start_time / 1000, tz=datetime.UTC)
        rows.append(
            {
                "scenario": name,
                "parent run": str(run.info.run_id),
                "started": started.strftime("%Y-%m-%d %H:%M UTC"),
                "status": tags.get("status", run.info.status),
                "trials": ", ".join(counts) or "-",
                "settings": tags.get(OVERRIDES_TAG) or "the spec as written",
                "report": str(report) if report.exists() else "-",
            }
        )
    return pd.DataFrame(rows, columns=COLUMNS)
