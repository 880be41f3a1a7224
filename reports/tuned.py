"""The tuned report: what `crossrl tune` found, per engine, read from the store.

For the newest `crossrl tune` of a scenario: each engine's own setting against its chosen configuration on the test
seeds (IQM of the final returns with a 95 % stratified bootstrap CI, the probability that the tuned setting beats the
own one, the target reached), the probability of improvement between engines at their tuned best, each engine's chosen
configuration and what its search cost, and how sensitive each engine is to its setting (how many searched
configurations come within 10 % of the best). A reader sees whether a verdict is about the engine or about the setting.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from crossrl.reports.stats import (
    engine_sort_key,
    iqm,
    probability_of_improvement,
    probability_of_improvement_ci,
    stratified_bootstrap_ci,
)
from crossrl.scenarios import metrics as M

NEAR_BEST = 0.10  # a configuration within this fraction of the best one's final return counts as "as good"
SEARCH_KIND = "search"  # a parent run holding one engine's search (`crossrl tune`)
TUNED_KIND = "tuned"  # a parent run holding test-seed trials run by `crossrl tune`
LINEAGE_ARTIFACT = "pbt_lineage.json"  # on a PBT search's parent run: every exploit, in order


@dataclass
class TunedData:
    """One `crossrl tune`: its searches' configurations (a row each) and its test-seed trials (a row each)."""

    scenario: str
    configs: pd.DataFrame  # engine, label, values, status, final, steps_to_target, env_steps, stopped, cpu_s, setup_s
    tested: pd.DataFrame  # engine, role (shared | tuned), seed, status, final, steps_to_target
    searches: pd.DataFrame  # engine, parent_id, scheduler, metric, best_config, env_steps, wall_s, setup_s
    lineage: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # engine -> PBT's exploits
    shared_id: str = ""  # the parent run of the own setting's test-seed trials


def load_tuned(store: Any, scenario: str) -> TunedData:
    """The newest `crossrl tune` of ``scenario``: the test-seed run of the own setting names the searches it belongs to.
    StoreError when there is none."""
    from crossrl.reports.store import StoreError

    exp = store.experiment_id(scenario, create=False)
    if exp is None:
        raise StoreError(f"no results for scenario {scenario!r} in {store.uri}")
    tuned = list(
        store.client.search_runs(
            [exp], filter_string=f"tags.`crossrl.kind` = '{TUNED_KIND}'", order_by=["attributes.start_time DESC"]
        )
    )
    shared = next((r for r in tuned if r.data.tags.get("tuned.role") == "shared"), None)
    if shared is None:
        raise StoreError(f"no `crossrl tune {scenario}` with test-seed runs in {store.uri}")
    search_ids = [s for s in shared.data.tags.get("tuned.searches", "").split(",") if s]
    configs, tested, searches = [], [], []
    lineage: dict[str, list[dict[str, Any]]] = {}
    for sid in search_ids:
        parent = store.parent_run(sid)
        tags = parent.data.tags
        engine = tags.get("search.engine", "")
        searches.append(
            {
                "engine": engine,
                "parent_id": sid,
                "scheduler": tags.get("search.scheduler", ""),
                "metric": tags.get("search.metric", ""),
                "best_config": json.loads(tags.get("search.best_config", "{}")),
                "env_steps": _num(tags.get("search.env_steps_total")),
                "wall_s": _num(tags.get("search.wall_s")),
                "setup_s": _num(tags.get("search.setup_s_median")),
                "best_run": tags.get("search.best_run", ""),
            }
        )
        for run in store.children(parent):
            t, m = run.data.tags, run.data.metrics
            configs.append(
                {
                    "engine": engine,
                    "run_id": run.info.run_id,
                    "label": str(run.info.run_name).rsplit("-", 1)[-1],
                    "values": json.loads(t.get("search.values", "{}")),
                    "status": t.get("status", ""),
                    "final": m.get(M.FINAL_RETURN_MEAN, math.nan),
                    "steps_to_target": m.get(M.STEPS_TO_TARGET, math.nan),
                    "budget": _num(t.get("budget_env_steps")),
                    "env_steps": m.get(M.ENV_STEPS_SAMPLED, math.nan),
                    "stopped": "search.stopped" in t,
                    "cpu_s": m.get(M.CPU_SECONDS, math.nan),
                    "setup_s": m.get("setup_s", math.nan),
                }
            )
        if tags.get("search.scheduler") == "pbt":
            try:
                lineage[engine] = json.loads(store.artifact_bytes(sid, LINEAGE_ARTIFACT))
            except Exception:
                lineage[engine] = []
    chosen = [
        r for r in tuned if r.data.tags.get("tuned.role") == "tuned" and r.data.tags.get("tuned.searches") in search_ids
    ]
    for parent in [shared, *chosen]:
        role = parent.data.tags.get("tuned.role", "")
        for run in store.children(parent):
            t, m = run.data.tags, run.data.metrics
            tested.append(
                {
                    "engine": t.get("engine", ""),
                    "role": role,
                    "seed": int(t.get("seed", "-1")),
                    "status": t.get("status", ""),
                    "final": m.get(M.FINAL_RETURN_MEAN, math.nan),
                    "steps_to_target": m.get(M.STEPS_TO_TARGET, math.nan),
                }
            )
    return TunedData(
        scenario=scenario,
        configs=pd.DataFrame(configs),
        tested=pd.DataFrame(tested),
        searches=pd.DataFrame(searches),
        lineage=lineage,
        shared_id=str(shared.info.run_id),
    )


def _num(x: Any) -> float:
    try:
        return float(x)
    except (TypeError, ValueError):
        return math.nan


def _engines(data: TunedData) -> list[str]:
    names = set(data.searches.engine) if not data.searches.empty else set()
    return sorted(names, key=engine_sort_key)


def _iqm_ci(values: Sequence[float], rng: np.random.Generator) -> tuple[float, float, float, int]:
    vals = np.asarray([v for v in values if math.isfinite(v)], dtype=float)
    if vals.size == 0:
        return (math.nan, math.nan, math.nan, 0)
    lo, hi = stratified_bootstrap_ci([vals], statistic=lambda a: iqm(a, axis=-1), rng=rng)
    return (float(iqm(vals)), lo, hi, int(vals.size))


def verdict_table(data: TunedData, *, rng: np.random.Generator) -> pd.DataFrame:
    """Per engine, on the test seeds: the own setting and the tuned one (final return IQM and CI, target reached,
    median env steps to target) and P(tuned > own) on final returns with its CI."""
    rows = []
    for engine in _engines(data):
        row: dict[str, Any] = {"engine": engine}
        finals = {}
        for role in ("shared", "tuned"):
            part = (
                data.tested[(data.tested.engine == engine) & (data.tested.role == role)]
                if not data.tested.empty
                else data.tested
            )
            finals[role] = [float(x) for x in part.get("final", [])]
            mid, lo, hi, n = _iqm_ci(finals[role], rng)
            row |= {f"{role}_iqm": mid, f"{role}_lo": lo, f"{role}_hi": hi, f"{role}_n": n}
            steps = [float(x) for x in part.get("steps_to_target", []) if math.isfinite(float(x))]
            row[f"{role}_reached"] = len(steps)
            row[f"{role}_steps_median"] = float(np.median(steps)) if steps else math.nan
        tuned, own = [x for x in finals["tuned"] if math.isfinite(x)], [x for x in finals["shared"] if math.isfinite(x)]
        row["p_tuned_better"] = probability_of_improvement(tuned, own) if tuned and own else math.nan
        lo, hi = probability_of_improvement_ci(tuned, own, rng=rng) if tuned and own else (math.nan, math.nan)
        row |= {"p_lo": lo, "p_hi": hi}
        rows.append(row)
    return pd.DataFrame(rows)


def improvement_between_engines(data: TunedData, *, rng: np.random.Generator) -> pd.DataFrame:
    """P(X > Y) between every pair of engines at their tuned best, on the test seeds' final returns."""
    engines = _engines(data)
    finals = (
        {
            e: [
                float(x)
                for x in data.tested[(data.tested.engine == e) & (data.tested.role == "tuned")].get("final", [])
            ]
            for e in engines
        }
        if not data.tested.empty
        else {}
    )
    rows = []
    for i, x in enumerate(engines):
        for y in engines[i + 1 :]:
            a = [v for v in finals.get(x, []) if math.isfinite(v)]
            b = [v for v in finals.get(y, []) if math.isfinite(v)]
            p = probability_of_improvement(a, b) if a and b else math.nan
            lo, hi = probability_of_improvement_ci(a, b, rng=rng) if a and b else (math.nan, math.nan)
            rows.append({"x": x, "y": y, "p": p, "lo": lo, "hi": hi, "n_x": len(a), "n_y": len(b)})
    return pd.DataFrame(rows)


def sensitivity_table(data: TunedData) -> pd.DataFrame:
    """Per engine: configurations searched, how many ran their whole budget, the best final return among those, and how
    many come within 10 % of it (of the best's distance above the worst: returns may be negative)."""
    rows = []
    for engine in _engines(data):
        part = data.configs[data.configs.engine == engine] if not data.configs.empty else data.configs
        whole = part[(part.status == "FINISHED") & ~part.stopped] if not part.empty else part
        finals = np.asarray([float(x) for x in whole.get("final", []) if math.isfinite(float(x))], dtype=float)
        best = float(finals.max()) if finals.size else math.nan
        near = near_best(finals)
        rows.append(
            {
                "engine": engine,
                "configurations": int(len(part)),
                "whole_budget": int(len(whole)),
                "stopped": int(part.stopped.sum()) if not part.empty else 0,
                "failed": int((part.status != "FINISHED").sum()) if not part.empty else 0,
                "best": best,
                "worst": float(finals.min()) if finals.size else math.nan,
                "near_best": near,
            }
        )
    return pd.DataFrame(rows)


def near_best(finals: np.ndarray[Any, Any], fraction: float = NEAR_BEST) -> int:
    """How many of ``finals`` are within ``fraction`` of the best: within fraction x |best| of it (returns may be
    negative, so the distance is to the best's magnitude, not a ratio)."""
    if finals.size == 0:
        return 0
    best = float(finals.max())
    return int(np.sum(finals >= best - fraction * abs(best)))


def cost_table(data: TunedData) -> pd.DataFrame:
    """Per engine: the scheduler, the chosen configuration, and what the search cost (env steps, CPU seconds over its
    trials, wall time, median set-up per trial)."""
    rows = []
    for engine in _engines(data):
        s = data.searches[data.searches.engine == engine].iloc[0]
        part = data.configs[data.configs.engine == engine] if not data.configs.empty else data.configs
        rows.append(
            {
                "engine": engine,
                "scheduler": s.scheduler,
                "chosen": ", ".join(f"{k}={_value(v)}" for k, v in dict(s.best_config).items()) or "-",
                "env_steps": s.env_steps,
                "cpu_s": float(np.nansum(part.cpu_s)) if not part.empty else math.nan,
                "wall_s": s.wall_s,
                "setup_s": s.setup_s,
                "exploits": len(data.lineage.get(engine, [])),
            }
        )
    return pd.DataFrame(rows)


def _value(x: Any) -> str:
    return f"{x:.3g}" if isinstance(x, float) else str(x)


def _f(x: Any, fmt: str) -> str:
    return "-" if x is None or (isinstance(x, float) and not math.isfinite(x)) else format(x, fmt)


def _ci(mid: float, lo: float, hi: float, n: int, fmt: str = ".1f") -> str:
    if n == 0:
        return "-"
    ci = f" [{_f(lo, fmt)}, {_f(hi, fmt)}]" if math.isfinite(lo) else ""
    return f"{_f(mid, fmt)}{ci} (n={n})"


def markdown(data: TunedData, *, rng: np.random.Generator | None = None) -> str:
    """The tuned report as Markdown: four tables, each with what it says."""
    rng = rng or np.random.default_rng(0)
    lines = [f"# {data.scenario}: tuned", ""]
    v = verdict_table(data, rng=rng)
    lines += [
        "## Own setting against tuned, on the test seeds",
        "",
        "Final return: IQM [95 % stratified bootstrap CI] (seeds). P(tuned > own): probability of improvement on "
        "the final returns. Reached: test seeds that reached the target; steps: their median env steps to it.",
        "",
        "| engine | own | tuned | P(tuned > own) | own reached, steps | tuned reached, steps |",
        "|---|---|---|---|---|---|",
    ]
    for r in v.itertuples():
        lines.append(
            f"| {r.engine} | {_ci(r.shared_iqm, r.shared_lo, r.shared_hi, r.shared_n)} | "
            f"{_ci(r.tuned_iqm, r.tuned_lo, r.tuned_hi, r.tuned_n)} | {_ci(r.p_tuned_better, r.p_lo, r.p_hi, 1, '.2f').removesuffix(' (n=1)')} | "
            f"{r.shared_reached}/{r.shared_n}, {_f(r.shared_steps_median, ',.0f')} | "
            f"{r.tuned_reached}/{r.tuned_n}, {_f(r.tuned_steps_median, ',.0f')} |"
        )
    pairs = improvement_between_engines(data, rng=rng)
    if not pairs.empty:
        lines += [
            "",
            "## Engines against each other, each at its tuned best",
            "",
            "| X | Y | P(X > Y) [95 % CI] |",
            "|---|---|---|",
        ]
        lines += [
            f"| {r.x} | {r.y} | {_f(r.p, '.2f')} [{_f(r.lo, '.2f')}, {_f(r.hi, '.2f')}] |" for r in pairs.itertuples()
        ]
    c = cost_table(data)
    lines += [
        "",
        "## Chosen configuration and the search's cost",
        "",
        "| engine | scheduler | chosen | env steps | CPU s | wall s | set-up s per trial | PBT exploits |",
        "|---|---|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {r.engine} | {r.scheduler} | {r.chosen} | {_f(r.env_steps, ',.0f')} | {_f(r.cpu_s, ',.0f')} | "
        f"{_f(r.wall_s, ',.0f')} | {_f(r.setup_s, '.1f')} | {r.exploits} |"
        for r in c.itertuples()
    ]
    s = sensitivity_table(data)
    lines += [
        "",
        "## Sensitivity: how much the setting matters",
        "",
        f"Final return of the configurations that ran their whole budget; near best: within {NEAR_BEST:.0%} of the "
        "best's magnitude. Many near the best: the engine is robust to its setting; one: the verdict rests on finding it.",
        "",
        "| engine | configurations | whole budget | stopped early | failed | best | worst | near best |",
        "|---|---|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {r.engine} | {r.configurations} | {r.whole_budget} | {r.stopped} | {r.failed} | {_f(r.best, '.1f')} | "
        f"{_f(r.worst, '.1f')} | {r.near_best}/{r.whole_budget} |"
        for r in s.itertuples()
    ]
    return "\n".join(lines) + "\n"


def write_report(store: Any, scenario: str, out_dir: Path) -> Path:
    """``tuned.md`` for the newest `crossrl tune` of ``scenario`` in ``out_dir``, also logged to its own-setting run."""
    data = load_tuned(store, scenario)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "tuned.md"
    path.write_text(markdown(data))
    store.log_file(data.shared_id, path, "report")
    return path
