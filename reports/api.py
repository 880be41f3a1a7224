"""Reports from the store: load a run's results, render them, attach the files to the parent run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from crossrl.reports.store import ResultsStore

OVERRIDES_TAG = "run.overrides"
"""A `crossrl run`'s flags that set it apart from its spec file (``--set``, ``--engines``, ``--workers``, ...)."""


def run_report_dir(results_dir: Path, scenario: str, parent_id: str) -> Path:
    """A run's own report folder; the scenario's folder above it keeps a copy of the newest."""
    return Path(results_dir) / "reports" / scenario / parent_id


def make_report(store: ResultsStore, *, parent_id: str, out_dir: Path) -> Any:
    """Render report.html/.md/.json for one `crossrl run` and log them as the parent run's artifacts."""
    from crossrl.reports.render import build_report

    loaded = store.load(parent_id=parent_id)
    meta = {**loaded.meta, "spec": store.spec(parent_id)}
    env_id = ((meta["spec"] or {}).get("env") or {}).get("id")
    meta["layout_sweeps"] = store.layout_sweeps(env_id) if env_id else []  # marks rows run in a slower layout
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = build_report(
        trials=loaded.trials, points=loaded.points, meta=meta, out_dir=out_dir, read_artifact=store.artifact_bytes
    )
    for path in (paths.html, paths.markdown, paths.json):
        store.log_file(parent_id, Path(path), "report")
    return paths


def _parent_id(store: ResultsStore, *, scenario: str | None, parent_id: str | None) -> str:
    from crossrl.reports.store import StoreError

    if parent_id:
        return parent_id
    if not scenario:
        raise StoreError("name a scenario or give --run PARENT_RUN_ID")
    parents = store.parent_runs(scenario)
    if not parents:
        raise StoreError(f"no `crossrl run` of scenario {scenario!r} in {store.uri}")
    return str(parents[0].info.run_id)


def _current(store: ResultsStore, parent_id: str) -> tuple[dict[str, Any], Any]:
    """The run as a baseline-shaped dict, and its spec's regression tolerances."""
    from crossrl.reports.regress import make_baseline
    from crossrl.scenarios.spec import ScenarioSpec

    loaded = store.load(parent_id=parent_id)
    spec = ScenarioSpec.model_validate(store.spec(parent_id))
    canonical = store.spec(parent_id, canonical=True)
    return make_baseline(loaded, canonical_spec=canonical, target=spec.target.episode_return_mean), spec.regress


def update_baseline(store: ResultsStore, *, scenario: str | None, parent_id: str | None, out: Path) -> dict[str, Any]:
    """Write a baseline JSON from one `crossrl run` (its newest for a scenario)."""
    import json

    current, _ = _current(store, _parent_id(store, scenario=scenario, parent_id=parent_id))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(current, indent=2, sort_keys=True) + "\n")
    return current


def run_regress(
    store: ResultsStore,
    *,
    baseline_path: Path,
    scenario: str | None,
    parent_id: str | None,
    allow_spec_change: bool,
    markdown_out: Path | None = None,
    junit_out: Path | None = None,
    speed: bool = False,
) -> tuple[int, str]:
    """Compare a run with a baseline; returns (exit code 0/1, Markdown). BaselineError/StoreError mean exit 2.
    ``speed``: the throughput ratio too (learning checks alone by default)."""
    from crossrl.reports.regress import REGRESSION, check_comparable, compare, junit_xml, markdown, read_baseline

    baseline = read_baseline(baseline_path)
    pid = _parent_id(store, scenario=scenario or baseline.get("scenario"), parent_id=parent_id)
    current, tolerances = _current(store, pid)
    check_comparable(baseline, current, allow_spec_change=allow_spec_change)
    comparisons = compare(baseline, current, tolerances=tolerances, speed=speed)
    title = f"crossrl regress: {current['scenario']} (run {pid}) vs {baseline_path.name}"
    md = markdown(comparisons, title=title, speed=speed)
    if markdown_out:
        markdown_out.parent.mkdir(parents=True, exist_ok=True)
        markdown_out.write_text(md)
    if junit_out:
        junit_out.parent.mkdir(parents=True, exist_ok=True)
        junit_out.write_text(junit_xml(comparisons, suite=str(current["scenario"])))
    return (1 if any(c.verdict == REGRESSION for c in comparisons) else 0), md
