"""`crossrl ui`: the MLflow UI on 127.0.0.1 over the results store, opened on a scenario's return curves.

How MLflow 3.17's UI decides what it shows (its web app, mlflow/server/js):

- GenAI or classic ML ("Model training"): the ``workflowType`` query parameter of the page's URL
  (``genai`` | ``machine_learning``), else the browser's localStorage key ``mlflow.workflowType``, else GenAI.
  The experiment tag ``mlflow.experimentKind`` is not read for this in 3.17 (its workflow switch is on), so
  the URL crossrl prints carries ``workflowType=machine_learning``.
- The assistant panel: on a local server (the page's host ``localhost``, ``127.0.0.1`` or ``::1``) MLflow opens it
  by itself once per browser (localStorage ``mlflow.assistant.fab.autoOpenedOnFirstLoad``), in either workflow;
  nothing on the server side turns it off in 3.17 (``MLFLOW_ENABLE_REMOTE_ASSISTANT`` only adds it for remote
  hosts). Closed once, it stays closed (localStorage ``mlflow.assistant.panelOpen``).
- Table or chart view of the runs page: the ``compareRunsMode`` query parameter (``TABLE`` | ``CHART``).
- Which charts, in which order: without a saved view, one chart per metric in a "Model metrics" section,
  sorted by metric name (so ``episode_return_mean`` would come after ``diag.*``, ``entropy``, ``env_steps_*``).
  A shared view (``viewStateShareKey=<key>`` in the URL, its state in the experiment tag
  ``mlflow.sharedViewState.<key>``, plain JSON accepted) sets the charts, their sections and the run filter;
  sections other than "Model metrics" and "System metrics" come first. crossrl's view puts a "Return curves"
  section first (return vs env steps, return vs wall-clock seconds, sample throughput) over the trial runs only;
  the UI adds every other metric below it as usual.
"""

from __future__ import annotations

import json
from typing import Any

from crossrl.scenarios import metrics as M

VIEW_KEY = "crossrl"
VIEW_TAG = f"mlflow.sharedViewState.{VIEW_KEY}"  # the experiment tag MLflow's UI reads a shared view from
RETURN_SECTION = "crossrl-return-curves"


def _line(uuid: str, metric: str, title: str, *, x_metric: str = "") -> dict[str, Any]:
    """One line chart card as MLflow 3.17's runs chart view stores it (its RunsChartsLineCardConfig)."""
    return {
        "uuid": uuid,
        "type": "LINE",
        "metricSectionId": RETURN_SECTION,
        "isGenerated": False,
        "deleted": False,
        "runsCountToCompare": 20,
        "displayName": title,
        "metricKey": metric,
        "selectedMetricKeys": [metric],
        "lineSmoothness": 0,
        "xAxisScaleType": "linear",
        "scaleType": "linear",
        "range": {},
        "xAxisKey": "metric" if x_metric else "step",  # step = env steps sampled (crossrl logs points at it)
        "selectedXAxisMetricKey": x_metric,
        "yAxisKey": "metric",
        "yAxisExpressions": [],
        "ignoreOutliers": False,
        "useGlobalXaxisKey": False,
        "useGlobalLineSmoothing": False,
    }


def _section(uuid: str, name: str) -> dict[str, Any]:
    return {"uuid": uuid, "name": name, "display": True, "isReordered": False, "deleted": False, "isGenerated": False}


def view_state() -> dict[str, Any]:
    """The runs page's state crossrl opens an experiment with: the trials only, return curves first."""
    return {
        "searchFilter": "tags.`crossrl.kind` = 'trial'",
        "orderByKey": "attributes.start_time",
        "orderByAsc": False,
        "runsHiddenMode": "FIRST_20_RUNS",
        # One line per engine and worker count (the mean over seeds, their range shaded): the trials are child runs,
        # which the ungrouped list keeps folded under their parent, out of the charts.
        "groupBy": {
            "aggregateFunction": "average",
            "groupByKeys": [{"mode": "tag", "groupByData": "engine"}, {"mode": "tag", "groupByData": "workers"}],
        },
        "compareRunCharts": [
            _line("crossrl-return-vs-steps", M.EPISODE_RETURN_MEAN, "Return vs env steps sampled"),
            _line("crossrl-return-vs-wall", M.EPISODE_RETURN_MEAN, "Return vs wall time (s)", x_metric=M.WALL_TIME_S),
            _line("crossrl-sample-throughput", M.SAMPLE_THROUGHPUT, "Env steps sampled per second"),
        ],
        "compareRunSections": [
            _section(RETURN_SECTION, "Return curves"),
            _section("crossrl-model-metrics", "Model metrics"),  # MLflow's own section names: the UI adds the
            _section("crossrl-system-metrics", "System metrics"),  # other metrics' charts to these
        ],
    }


def view_state_json() -> str:
    return json.dumps(view_state(), separators=(",", ":"))


def experiment_url(base: str, experiment_id: str, *, view: bool = True) -> str:
    """The runs page of one experiment in the classic ML view, its chart view; crossrl's charts first (``view``)."""
    query = f"{f'viewStateShareKey={VIEW_KEY}&' if view else ''}compareRunsMode=CHART&workflowType=machine_learning"
    return f"{base.rstrip('/')}/#/experiments/{experiment_id}/runs?{query}"
