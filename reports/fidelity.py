"""The fidelity report: an engine's own minimal loop against the same trials run through crossrl's adapter.

Both sides are in one parent run of kind ``fidelity`` (tags ``fidelity.engine``, ``fidelity.key``): per seed the trial
on the engine through crossrl's adapter (role ``adapter``) and right after it the same trial on ``<engine>-native``,
the engine's own loop (role ``native``), with the same budget and measured by the same sink. Per measure (env steps to the target, final
return, env steps per second over training time) the table gives each side's IQM with its 95 % stratified bootstrap
CI, the ratio adapter / native paired by seed with its CI (IQM of the log-ratios, paired bootstrap), and the
probability that the adapter's trial is better than the native one (rliable's probability of improvement). A ratio
whose CI holds 1 is within the noise; one that does not is an adapter defect to find.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from crossrl.reports.stats import (
    iqm,
    paired_ratio_ci,
    probability_of_improvement,
    stratified_bootstrap_ci,
)
from crossrl.scenarios import metrics as M

FIDELITY_KIND = "fidelity"  # a parent run of `crossrl fidelity`: both sides of one comparison
NATIVE_SUFFIX = "-native"  # the engine id of an engine's own loop: rllib-native, torchrl-native
STEPS_PER_S = "env_steps_per_s"  # a trial's env steps sampled over its training seconds
# measure -> (label, higher is better, format)
MEASURES: dict[str, tuple[str, bool, str]] = {
    M.STEPS_TO_TARGET: ("env steps to target", False, ",.0f"),
    M.FINAL_RETURN_MEAN: ("final return", True, ".1f"),
    STEPS_PER_S: ("env steps / s", True, ",.0f"),
}


@dataclass
class FidelityData:
    scenario: str
    engine: str
    key: str
    trials: pd.DataFrame  # role, seed, status, reason, and one column per measure
    parent_id: str
    target: float


def trial_measures(loaded: Any) -> pd.DataFrame:
    """One row per trial of a loaded parent run: seed, status, reason and the measures (NaN where none)."""
    trials, points = loaded.trials, loaded.points
    rows = []
    for t in trials.itertuples():
        mine = points[points.run_id == t.run_id] if not points.empty else points
        steps = mine[mine.metric == M.ENV_STEPS_SAMPLED]["value"]
        wall = mine[mine.metric == M.WALL_TIME_S]["value"]
        per_s = float(steps.max() / wall.max()) if len(steps) and len(wall) and wall.max() > 0 else math.nan
        rows.append(
            {
                "seed": int(t.seed),
                "engine": t.engine,
                "status": t.status,
                "reason": t.reason,
                M.STEPS_TO_TARGET: float(getattr(t, M.STEPS_TO_TARGET)),
                M.FINAL_RETURN_MEAN: float(getattr(t, M.FINAL_RETURN_MEAN)),
                STEPS_PER_S: per_s,
                "budget_env_steps": int(t.budget_env_steps),
                "target_return": float(t.target_return),
            }
        )
    return pd.DataFrame(rows)


def load_fidelity(store: Any, scenario: str, *, engine: str | None = None, key: str | None = None) -> FidelityData:
    """The newest `crossrl fidelity` of ``scenario`` (on ``engine``, or the one tagged ``key``). StoreError if none."""
    from crossrl.reports.store import StoreError

    exp = store.experiment_id(scenario, create=False)
    if exp is None:
        raise StoreError(f"no results for scenario {scenario!r} in {store.uri}")
    runs = store.client.search_runs(
        [exp], filter_string=f"tags.`crossrl.kind` = '{FIDELITY_KIND}'", order_by=["attributes.start_time DESC"]
    )
    for run in runs:
        tags = run.data.tags
        if (engine and tags.get("fidelity.engine") != engine) or (key and tags.get("fidelity.key") != key):
            continue
        trials = trial_measures(store.load(parent_id=run.info.run_id))
        if trials.empty:
            continue
        trials["role"] = np.where(trials.engine.str.endswith(NATIVE_SUFFIX), "native", "adapter")
        known = trials["target_return"].dropna()
        return FidelityData(
            scenario=scenario,
            engine=tags.get("fidelity.engine", ""),
            key=tags.get("fidelity.key", ""),
            trials=trials,
            parent_id=run.info.run_id,
            target=float(known.iloc[0]) if len(known) else math.nan,
        )
    raise StoreError(f"no `crossrl fidelity` of {scenario!r}{' on ' + engine if engine else ''} in {store.uri}")


def _iqm_ci(values: np.ndarray, rng: np.random.Generator) -> tuple[float, float, float]:
    vals = values[np.isfinite(values)]
    if vals.size == 0:
        return (math.nan, math.nan, math.nan)
    if vals.size == 1:
        return (float(vals[0]), math.nan, math.nan)
    lo, hi = stratified_bootstrap_ci([vals], statistic=lambda a: iqm(a, axis=-1), rng=rng)
    return (float(iqm(vals)), lo, hi)


def table(data: FidelityData, *, rng: np.random.Generator | None = None) -> pd.DataFrame:
    """Per measure: each side's IQM and CI over its seeds, the paired ratio adapter / native with its CI, P(adapter
    better), and whether the ratio's CI holds 1. Steps to target: a seed that did not reach the target counts as not
    better than one that did; the IQM and the ratio are over the seeds that reached it (``reached`` says how many)."""
    rng = rng or np.random.default_rng(0)
    t = data.trials
    a = t[t.role == "adapter"].set_index("seed")
    n = t[t.role == "native"].set_index("seed")
    seeds = sorted(set(a.index) & set(n.index))
    rows = []
    for measure, (label, higher, _) in MEASURES.items():
        x = a.loc[seeds, measure].to_numpy(dtype=float)
        y = n.loc[seeds, measure].to_numpy(dtype=float)
        row: dict[str, Any] = {"measure": measure, "label": label, "seeds": len(seeds)}
        for side, vals in (("adapter", x), ("native", y)):
            mid, lo, hi = _iqm_ci(vals, rng)
            row |= {f"{side}": mid, f"{side}_lo": lo, f"{side}_hi": hi, f"{side}_n": int(np.isfinite(vals).sum())}
        both = np.isfinite(x) & np.isfinite(y) & (x > 0) & (y > 0)
        if both.sum() >= 1:
            r = paired_ratio_ci(x[both], y[both], rng=rng)
            row |= {"ratio": r.ratio, "ratio_lo": r.lo, "ratio_hi": r.hi, "pairs": int(both.sum())}
        else:
            row |= {"ratio": math.nan, "ratio_lo": math.nan, "ratio_hi": math.nan, "pairs": 0}
        worst = -1e300 if higher else 1e300  # a seed without the measure (target not reached) is worst
        xs, ys = np.where(np.isfinite(x), x, worst), np.where(np.isfinite(y), y, worst)
        row["p_adapter_better"] = (
            probability_of_improvement(xs if higher else -xs, ys if higher else -ys) if seeds else math.nan
        )
        lo, hi = row["ratio_lo"], row["ratio_hi"]
        row["within_noise"] = bool(lo <= 1.0 <= hi) if math.isfinite(lo) and math.isfinite(hi) else None
        rows.append(row)
    return pd.DataFrame(rows)


def _f(x: Any, fmt: str) -> str:
    return "-" if x is None or (isinstance(x, float) and not math.isfinite(x)) else format(x, fmt)


def _ci(mid: float, lo: float, hi: float, fmt: str) -> str:
    return f"{_f(mid, fmt)} [{_f(lo, fmt)}, {_f(hi, fmt)}]" if math.isfinite(lo) else _f(mid, fmt)


def verdict(row: Any) -> str:
    if row.within_noise is None:
        return "too few pairs to tell"
    if row.within_noise:
        return "within the noise"
    higher = MEASURES[row.measure][1]
    better = (row.ratio > 1) == higher
    return f"adapter {'better' if better else 'worse'}: find why"


def markdown(data: FidelityData, *, rng: np.random.Generator | None = None) -> str:
    tab = table(data, rng=rng)
    t = data.trials
    lines = [
        f"# {data.scenario}: {data.engine} through crossrl against {data.engine}'s own loop",
        "",
        f"Seeds {', '.join(str(s) for s in sorted(set(t.seed)))}; the same budget and the same sink on both sides "
        f"(target {_f(data.target, 'g')}). Each side: IQM [95 % stratified bootstrap CI] over its seeds. Ratio: "
        "adapter / native paired by seed, IQM of the log-ratios with a paired bootstrap CI. P(adapter better): "
        "probability of improvement (a seed that missed the target counts as worst).",
        "",
        "| measure | adapter | native | adapter / native | P(adapter better) | verdict |",
        "|---|---|---|---|---|---|",
    ]
    for r in tab.itertuples():
        fmt = MEASURES[r.measure][2]
        reached = f" ({r.adapter_n}/{r.seeds})" if r.measure == M.STEPS_TO_TARGET else ""
        reached_n = f" ({r.native_n}/{r.seeds})" if r.measure == M.STEPS_TO_TARGET else ""
        lines.append(
            f"| {r.label} | {_ci(r.adapter, r.adapter_lo, r.adapter_hi, fmt)}{reached} | "
            f"{_ci(r.native, r.native_lo, r.native_hi, fmt)}{reached_n} | {_ci(r.ratio, r.ratio_lo, r.ratio_hi, '.2f')} | "
            f"{_f(r.p_adapter_better, '.2f')} | {verdict(r)} |"
        )
    lines += [
        "",
        "| side | seed | status | env steps to target | final return | env steps / s |",
        "|---|---|---|---|---|---|",
    ]
    for r in t.sort_values(["role", "seed"]).itertuples():
        lines.append(
            f"| {r.role} | {r.seed} | {r.status}{': ' + r.reason[:120] if r.reason else ''} | "
            f"{_f(getattr(r, M.STEPS_TO_TARGET), ',.0f')} | {_f(getattr(r, M.FINAL_RETURN_MEAN), '.1f')} | "
            f"{_f(getattr(r, STEPS_PER_S), ',.0f')} |"
        )
    return "\n".join(lines) + "\n"


def write_report(store: Any, data: FidelityData, out_dir: Path) -> Path:
    """``fidelity-<engine>.md`` in ``out_dir``, also logged to the comparison's parent run."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"fidelity-{data.engine}.md"
    path.write_text(markdown(data))
    store.log_file(data.parent_id, path, "report")
    return path
