"""`crossrl regress`: the current results against a committed baseline, as a noise-aware CI gate.

A baseline is JSON (schema version, fingerprint, canonical spec, versions, machine) with one entry
per (engine, algorithm, workers): the per-seed values of three metrics.

- ``throughput_ratio``: each trial's median sampling throughput divided by the raw gymnasium speed
  of the same env measured in the same run (so a slower machine is not a regression);
- ``final_return``: each trial's final return (IQM over seeds, with a bootstrap 95% CI);
- ``steps_to_target``: env steps to the target return (censored: ``null`` when not reached).

As in asv, a change is flagged only when it beats both the scenario's tolerance and the run-to-run
spread (here: the ranges over seeds of baseline and current do not overlap). With one seed on each
side there is no spread to beat, and only the tolerance applies.
"""

from __future__ import annotations

import json
import math
import statistics
import time
import xml.etree.ElementTree as ET
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from crossrl.reports.stats import iqm, stratified_bootstrap_ci
from crossrl.reports.store import Loaded
from crossrl.scenarios import metrics as M
from crossrl.scenarios.spec import RegressSpec

SCHEMA_VERSION = 1
OK, REGRESSION, IMPROVED, NOT_APPLICABLE = "ok", "REGRESSION", "improved", "n/a"


class BaselineError(Exception):
    """The baseline cannot be used (missing, malformed, another spec, an engine missing): exit 2."""


@dataclass(frozen=True)
class Comparison:
    key: str  # "crossrl/ppo/w2"
    metric: str
    baseline: str
    current: str
    change: str
    verdict: str
    detail: str


def _key(engine: str, algorithm: str, workers: int) -> str:
    return f"{engine}/{algorithm}/w{workers}"


def summarize_run(loaded: Loaded) -> dict[str, dict[str, list[float | None]]]:
    """Per (engine, algorithm, workers): per-seed throughput ratio, final return, steps to target."""
    raw = loaded.meta.get(M.RAW_ENV_STEPS_PER_S, math.nan)
    thr = loaded.points[loaded.points.metric == M.SAMPLE_THROUGHPUT].groupby("run_id").value.median()
    out: dict[str, dict[str, list[float | None]]] = {}
    finished = loaded.trials[loaded.trials.status == M.FINISHED]
    for row in finished.sort_values("seed").to_dict("records"):
        entry = out.setdefault(
            _key(row["engine"], row["algorithm"], row["workers"]),
            {"seeds": [], "throughput_ratio": [], "final_return": [], "steps_to_target": []},
        )
        entry["seeds"].append(row["seed"])
        t = thr.get(row["run_id"], math.nan)
        entry["throughput_ratio"].append(_clean(t / raw if raw and math.isfinite(raw) else math.nan))
        entry["final_return"].append(_clean(row[M.FINAL_RETURN_MEAN]))
        entry["steps_to_target"].append(_clean(row[M.STEPS_TO_TARGET]))
    return out


def _clean(x: Any) -> float | None:
    return float(x) if x is not None and math.isfinite(float(x)) else None


def make_baseline(loaded: Loaded, *, canonical_spec: Mapping[str, Any], target: float | None) -> dict[str, Any]:
    return {
        "schema_version": SCHEMA_VERSION,
        "scenario": loaded.meta.get("scenario"),
        "fingerprint": loaded.meta.get("fingerprint"),
        "spec": dict(canonical_spec),
        "target_return": target,
        "parent_run_id": loaded.meta.get("parent_run_id"),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "versions": loaded.meta.get("versions", {}),
        "machine": loaded.meta.get("machine", {}),
        M.RAW_ENV_STEPS_PER_S: _clean(loaded.meta.get(M.RAW_ENV_STEPS_PER_S)),
        "entries": summarize_run(loaded),
    }


def read_baseline(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise BaselineError(
            f"{path}: baseline not found (write one with `crossrl baseline update -o {path}`)"
        ) from None
    except (OSError, json.JSONDecodeError) as e:
        raise BaselineError(f"{path}: not a readable JSON baseline: {e}") from None
    if not isinstance(data, dict) or data.get("schema_version") != SCHEMA_VERSION:
        got = data.get("schema_version") if isinstance(data, dict) else type(data).__name__
        raise BaselineError(f"{path}: schema_version {got!r} is not {SCHEMA_VERSION}; regenerate the baseline")
    for field in ("fingerprint", "spec", "entries"):
        if field not in data:
            raise BaselineError(f"{path}: the field {field!r} is missing; regenerate the baseline")
    return data


def spec_differences(a: Mapping[str, Any], b: Mapping[str, Any], prefix: str = "") -> list[str]:
    """Dotted paths where two canonical specs differ, with both values."""
    out = []
    for k in sorted(set(a) | set(b)):
        path = f"{prefix}{k}"
        va, vb = a.get(k), b.get(k)
        if isinstance(va, Mapping) and isinstance(vb, Mapping):
            out.extend(spec_differences(va, vb, prefix=f"{path}."))
        elif va != vb:
            out.append(f"{path}: baseline {va!r}, current {vb!r}")
    return out


def check_comparable(baseline: Mapping[str, Any], current: Mapping[str, Any], *, allow_spec_change: bool) -> None:
    if baseline["fingerprint"] != current["fingerprint"] and not allow_spec_change:
        diffs = spec_differences(baseline["spec"], current["spec"]) or ["(no field differs: fingerprint scheme?)"]
        raise BaselineError(
            f"spec fingerprint differs (baseline {baseline['fingerprint']}, current {current['fingerprint']}): "
            + "; ".join(diffs)
            + " (use --allow-spec-change to compare anyway)"
        )
    missing = sorted(set(baseline["entries"]) - set(current["entries"]))
    if missing:
        raise BaselineError(
            f"the current run has no finished trials for {', '.join(missing)} (the baseline has them): "
            "run those engines, or update the baseline"
        )


def _vals(xs: Sequence[float | None]) -> list[float]:
    return [x for x in xs if x is not None]


def _spread_ok(base: list[float], cur: list[float], *, lower_is_worse: bool) -> bool:
    """True when the seed ranges do not overlap in the worse direction (the change beats the noise)."""
    if len(base) < 2 and len(cur) < 2:
        return True
    return max(cur) < min(base) if lower_is_worse else min(cur) > max(base)


def _compare_throughput(key: str, b: list[float], c: list[float], tol: float) -> Comparison:
    metric = "sample throughput / raw env speed"
    if not b or not c:
        return Comparison(key, metric, _fmt(b), _fmt(c), "", NOT_APPLICABLE, "no throughput on one side")
    mb, mc = statistics.median(b), statistics.median(c)
    change = mc / mb - 1 if mb else math.nan
    verdict, detail = OK, f"tolerance -{tol:.0%}"
    if change < -tol and _spread_ok(b, c, lower_is_worse=True):
        verdict, detail = REGRESSION, f"dropped {-change:.0%} (> {tol:.0%}) beyond the seeds' spread"
    elif change < -tol:
        detail = f"dropped {-change:.0%} but inside the seeds' spread"
    elif change > tol and _spread_ok(b, c, lower_is_worse=False):
        verdict = IMPROVED
    return Comparison(key, metric, f"{mb:.4g}", f"{mc:.4g}", f"{change:+.0%}", verdict, detail)


def _compare_return(
    key: str, b: list[float], c: list[float], target: float | None, rng: np.random.Generator
) -> Comparison:
    metric = "final return IQM"
    if not b or not c:
        return Comparison(key, metric, _fmt(b), _fmt(c), "", NOT_APPLICABLE, "no returns on one side")
    ib, ic = float(iqm(b)), float(iqm(c))
    lo, hi = stratified_bootstrap_ci([b], statistic=lambda a: iqm(a, axis=-1), rng=rng)
    base_txt = f"{ib:.1f}" + (f" [{lo:.1f}, {hi:.1f}]" if math.isfinite(lo) else "")
    change = f"{ic - ib:+.1f}"
    if target is not None and ic >= target:
        return Comparison(key, metric, base_txt, f"{ic:.1f}", change, OK, f"reaches the target {target:g}")
    if not math.isfinite(lo):
        return Comparison(key, metric, base_txt, f"{ic:.1f}", change, OK, "one baseline seed: no CI to test against")
    if ic < lo:
        return Comparison(key, metric, base_txt, f"{ic:.1f}", change, REGRESSION, "below the baseline's 95% CI")
    if ic > hi:
        return Comparison(key, metric, base_txt, f"{ic:.1f}", change, IMPROVED, "above the baseline's 95% CI")
    return Comparison(key, metric, base_txt, f"{ic:.1f}", change, OK, "inside the baseline's 95% CI")


def _compare_steps(
    key: str, b: list[float | None], c: list[float | None], tol: float, target: float | None
) -> Comparison:
    metric = "env steps to target"
    if target is None or not any(x is not None for x in b):
        return Comparison(key, metric, _fmt(b), _fmt(c), "", NOT_APPLICABLE, "baseline never reached the target")
    inf = math.inf
    bb = [x if x is not None else inf for x in b]
    cc = [x if x is not None else inf for x in c]
    mb, mc = statistics.median(bb), statistics.median(cc)
    if mc == inf and mb < inf:
        return Comparison(
            key, metric, f"{mb:,.0f}", "not reached", "", REGRESSION, "most seeds no longer reach the target"
        )
    if mb == inf:
        return Comparison(key, metric, "not reached", f"{mc:,.0f}", "", IMPROVED if mc < inf else OK, "")
    growth = mc / mb - 1
    if growth > tol and _spread_ok(bb, cc, lower_is_worse=False):
        return Comparison(
            key, metric, f"{mb:,.0f}", f"{mc:,.0f}", f"{growth:+.0%}", REGRESSION, f"grew more than {tol:.0%}"
        )
    verdict = IMPROVED if growth < -tol and _spread_ok(bb, cc, lower_is_worse=True) else OK
    return Comparison(key, metric, f"{mb:,.0f}", f"{mc:,.0f}", f"{growth:+.0%}", verdict, f"tolerance +{tol:.0%}")


def _fmt(xs: Sequence[float | None]) -> str:
    vals = _vals(xs)
    return f"{statistics.median(vals):.4g}" if vals else "-"


def compare(
    baseline: Mapping[str, Any],
    current: Mapping[str, Any],
    *,
    tolerances: RegressSpec,
    seed: int = 0,
    speed: bool = True,
) -> list[Comparison]:
    """Every comparison, baseline entry by entry (entries only in the current run are reported as new). ``speed``:
    also the throughput ratio, which other work on the machine moves (the learning checks it does not)."""
    rng = np.random.default_rng(seed)
    target = current.get("target_return")
    out: list[Comparison] = []
    for key in sorted(baseline["entries"]):
        b, c = baseline["entries"][key], current["entries"][key]
        if speed:
            out.append(
                _compare_throughput(
                    key, _vals(b["throughput_ratio"]), _vals(c["throughput_ratio"]), tolerances.throughput_drop
                )
            )
        if tolerances.final_return:
            out.append(_compare_return(key, _vals(b["final_return"]), _vals(c["final_return"]), target, rng))
        out.append(
            _compare_steps(key, b["steps_to_target"], c["steps_to_target"], tolerances.steps_to_target_growth, target)
        )
    for key in sorted(set(current["entries"]) - set(baseline["entries"])):
        out.append(Comparison(key, "(all)", "-", "present", "", NOT_APPLICABLE, "not in the baseline"))
    return out


SPEED_NOTE = (
    "Speed (throughput_ratio: each trial's sampling throughput over the raw env's, measured in the same run) moves with "
    "whatever else runs on the machine: a stored baseline from another day or host cannot tell a few percent from "
    "noise, so it is flagged only past the spec's regress.throughput tolerance and the seeds' ranges; for a paired "
    "check of a code change use `crossrl ab` (docs/ab-gate.md)."
)
LEARNING_NOTE = "Learning checks only (final return, steps to target); `--speed` adds the throughput ratio."


def markdown(comparisons: Sequence[Comparison], *, title: str, speed: bool = True) -> str:
    regressions = sum(c.verdict == REGRESSION for c in comparisons)
    head = f"### {title}: " + (f"{regressions} regression(s)" if regressions else "no regression") + "\n\n"
    head += (SPEED_NOTE if speed else LEARNING_NOTE) + "\n\n"
    rows = [
        "| engine/algorithm/workers | metric | baseline | current | change | verdict | detail |",
        "|---|---|---|---|---|---|---|",
    ]
    for c in comparisons:
        verdict = f"**{c.verdict}**" if c.verdict == REGRESSION else c.verdict
        rows.append(f"| {c.key} | {c.metric} | {c.baseline} | {c.current} | {c.change} | {verdict} | {c.detail} |")
    return head + "\n".join(rows) + "\n"


def junit_xml(comparisons: Sequence[Comparison], *, suite: str) -> str:
    """One test case per comparison; regressions are failures, n/a comparisons are skipped."""
    failures = sum(c.verdict == REGRESSION for c in comparisons)
    skipped = sum(c.verdict == NOT_APPLICABLE for c in comparisons)
    root = ET.Element("testsuites", name="crossrl regress", tests=str(len(comparisons)), failures=str(failures))
    ts = ET.SubElement(
        root,
        "testsuite",
        name=suite,
        tests=str(len(comparisons)),
        failures=str(failures),
        skipped=str(skipped),
        errors="0",
    )
    for c in comparisons:
        case = ET.SubElement(ts, "testcase", classname=f"{suite}.{c.key}", name=c.metric)
        text = f"baseline {c.baseline}, current {c.current}, change {c.change}: {c.detail}"
        if c.verdict == REGRESSION:
            ET.SubElement(case, "failure", message=f"{c.metric} regressed: {c.detail}").text = text
        elif c.verdict == NOT_APPLICABLE:
            ET.SubElement(case, "skipped", message=c.detail)
        else:
            ET.SubElement(case, "system-out").text = text
    return ET.tostring(root, encoding="unicode", xml_declaration=True)
