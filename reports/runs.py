"""Past runs in a store, without the UI (``crossrl runs``): one row per ``crossrl run``, newest first."""

from __future__ import annotations

import datetime
from pathlib import Path

import pandas as pd

from crossrl.reports.store import ResultsStore
from crossrl.scenarios import metrics as M

COLUMNS = ["scenario", "parent run", "started", "status", "trials", "report"]


def past_runs(store: ResultsStore, *, scenario: str | None = None, limit: int = 50) -> pd.DataFrame:
    """The ``crossrl run`` parent runs in ``store`` (of ``scenario``, or of every scenario), newest first: scenario,
    parent run id, start time (UTC), status, trial counts by status, and the report's path where the default report
    folder (``<results>/reports/<scenario>/report.html``, rewritten by each run) has one."""
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
        report = Path(store.results_dir) / "reports" / name / "report.html"
        started = datetime.datetime.fromtimestamp(run.info.start_time / 1000, tz=datetime.UTC)
        rows.append(
            {
                "scenario": name,
                "parent run": str(run.info.run_id),
                "started": started.strftime("%Y-%m-%d %H:%M UTC"),
                "status": tags.get("status", run.info.status),
                "trials": ", ".join(counts) or "-",
                "report": str(report) if report.exists() else "-",
            }
        )
    return pd.DataFrame(rows, columns=COLUMNS)
