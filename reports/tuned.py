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

import matplotlib
import numpy as np
import pandas as pd
from matplotlib.ticker import EngFormatter

from crossrl.reports.figures import FALLBACK_COLOURS, RC, engine_colours, new_figure, to_svg
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
    curves: pd.DataFrame = field(default_factory=pd.DataFrame)  # PBT members: engine, member, step, value

    @property
    def metric(self) -> str:
        """The searches' metric (``final_return`` or ``steps_to_target``): the same for every engine's search."""
        found = {str(m) for m in self.searches.get("metric", [])} - {""}
        return found.pop() if len(found) == 1 else "final_return"


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
    search_ids = [s for s in shared.data.tags.get("tuned.searches", "").split(",") if s] if shared is not None else []
    latest = _latest_searches(store, exp)
    if latest and not set(latest) <= set(search_ids):  # a newer `crossrl tune --no-test`: its searches alone
        shared, search_ids = None, latest
    if not search_ids:
        raise StoreError(f"no `crossrl tune {scenario}` in {store.uri}")
    configs, tested, searches = [], [], []
    lineage: dict[str, list[dict[str, Any]]] = {}
    curves: list[dict[str, Any]] = []
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
            for run in store.children(parent):  # the population's curves
                history = store.client.get_metric_history(run.info.run_id, M.EPISODE_RETURN_MEAN)
                curves += [
                    {"engine": engine, "member": str(run.info.run_name), "step": int(h.step), "value": float(h.value)}
                    for h in sorted(history, key=lambda h: h.step)
                ]
    chosen = [
        r for r in tuned if r.data.tags.get("tuned.role") == "tuned" and r.data.tags.get("tuned.searches") in search_ids
    ]
    for parent in [shared, *chosen] if shared is not None else []:
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
                    "budget": _num(t.get("budget_env_steps")),
                }
            )
    return TunedData(
        scenario=scenario,
        configs=pd.DataFrame(configs),
        tested=pd.DataFrame(tested),
        searches=pd.DataFrame(searches),
        lineage=lineage,
        shared_id=str(shared.info.run_id) if shared is not None else search_ids[0],
        curves=pd.DataFrame(curves),
    )


def _latest_searches(store: Any, exp: str) -> list[str]:
    """The search parent runs of the newest `crossrl tune` of the experiment (one invocation's searches share the
    journal key before its ``/``), in the order they ran."""
    runs = list(
        store.client.search_runs(
            [exp], filter_string=f"tags.`crossrl.kind` = '{SEARCH_KIND}'", order_by=["attributes.start_time DESC"]
        )
    )
    if not runs:
        return []

    def invocation(run: Any) -> str:
        return str(run.data.tags.get("crossrl.journal_key", run.info.run_id)).split("/", 1)[0]

    newest = invocation(runs[0])
    return [r.info.run_id for r in reversed(runs) if invocation(r) == newest]


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


def steps_needed(trials: pd.DataFrame) -> list[float]:
    """Env steps to the target per trial, a trial that did not reach it counted at its budget: a lower bound, so an
    IQM over them understates what an engine that often misses the target needs (the reached count says how often)."""
    out = []
    for r in trials.to_dict("records"):
        steps, budget = float(r.get("steps_to_target", math.nan)), float(r.get("budget", math.nan))
        if math.isfinite(steps):
            out.append(steps)
        elif math.isfinite(budget) and r.get("status") == M.FINISHED:
            out.append(budget)
    return out


def verdict_table(data: TunedData, *, rng: np.random.Generator) -> pd.DataFrame:
    """Per engine, on the test seeds: the own setting and the tuned one (final return IQM and CI, target reached,
    median env steps to target, env steps to target IQM and CI with misses at the budget) and P(tuned > own) on final
    returns and on env steps to the target (fewer is better), each with its CI."""
    rows = []
    for engine in _engines(data):
        row: dict[str, Any] = {"engine": engine}
        finals, needed = {}, {}
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
            needed[role] = steps_needed(part)
            mid, lo, hi, _ = _iqm_ci(needed[role], rng)
            row |= {f"{role}_steps_iqm": mid, f"{role}_steps_lo": lo, f"{role}_steps_hi": hi}
        tuned, own = [x for x in finals["tuned"] if math.isfinite(x)], [x for x in finals["shared"] if math.isfinite(x)]
        row["p_tuned_better"] = probability_of_improvement(tuned, own) if tuned and own else math.nan
        lo, hi = probability_of_improvement_ci(tuned, own, rng=rng) if tuned and own else (math.nan, math.nan)
        row |= {"p_lo": lo, "p_hi": hi}
        # fewer env steps is better: P(tuned needs fewer than own) is P(-tuned > -own)
        fewer_t, fewer_o = [-x for x in needed["tuned"]], [-x for x in needed["shared"]]
        both = bool(fewer_t and fewer_o)
        row["p_fewer_steps"] = probability_of_improvement(fewer_t, fewer_o) if both else math.nan
        lo, hi = probability_of_improvement_ci(fewer_t, fewer_o, rng=rng) if both else (math.nan, math.nan)
        row |= {"p_fewer_lo": lo, "p_fewer_hi": hi}
        rows.append(row)
    return pd.DataFrame(rows)


def improvement_between_engines(data: TunedData, *, rng: np.random.Generator) -> pd.DataFrame:
    """P(X > Y) between every pair of engines at their tuned best, on the test seeds: on final returns, or under a
    ``steps_to_target`` search on env steps to the target (P(X needs fewer than Y); misses at the budget)."""
    engines = _engines(data)
    by_steps = data.metric == "steps_to_target"
    scores: dict[str, list[float]] = {}
    for e in engines:
        part = data.tested[(data.tested.engine == e) & (data.tested.role == "tuned")] if not data.tested.empty else None
        if part is None:
            scores[e] = []
        elif by_steps:
            scores[e] = [-x for x in steps_needed(part)]
        else:
            scores[e] = [float(x) for x in part.get("final", []) if math.isfinite(float(x))]
    rows = []
    for i, x in enumerate(engines):
        for y in engines[i + 1 :]:
            a, b = scores[x], scores[y]
            p = probability_of_improvement(a, b) if a and b else math.nan
            lo, hi = probability_of_improvement_ci(a, b, rng=rng) if a and b else (math.nan, math.nan)
            rows.append({"x": x, "y": y, "p": p, "lo": lo, "hi": hi, "n_x": len(a), "n_y": len(b)})
    return pd.DataFrame(rows)


def sensitivity_table(data: TunedData) -> pd.DataFrame:
    """Per engine: configurations searched, how many ran their whole budget, and among those the best and worst by the
    search's metric and how many come within 10 % of the best: final return (of the best's magnitude: returns may be
    negative), or env steps to the target (at most 1.1 x the fewest; a configuration that missed it is not near)."""
    rows = []
    by_steps = data.metric == "steps_to_target"
    for engine in _engines(data):
        part = data.configs[data.configs.engine == engine] if not data.configs.empty else data.configs
        whole = part[(part.status == "FINISHED") & ~part.stopped] if not part.empty else part
        key = "steps_to_target" if by_steps else "final"
        values = np.asarray([float(x) for x in whole.get(key, []) if math.isfinite(float(x))], dtype=float)
        if by_steps:
            best = float(values.min()) if values.size else math.nan
            worst = float(values.max()) if values.size else math.nan
            near = int(np.sum(values <= best * (1 + NEAR_BEST))) if values.size else 0
        else:
            best = float(values.max()) if values.size else math.nan
            worst = float(values.min()) if values.size else math.nan
            near = near_best(values)
        rows.append(
            {
                "engine": engine,
                "configurations": int(len(part)),
                "whole_budget": int(len(whole)),
                "stopped": int(part.stopped.sum()) if not part.empty else 0,
                "failed": int((part.status != "FINISHED").sum()) if not part.empty else 0,
                "best": best,
                "worst": worst,
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


def markdown(data: TunedData, *, rng: np.random.Generator | None = None, figures: dict[str, str] | None = None) -> str:
    """The tuned report as Markdown: four tables (five under a ``steps_to_target`` search), each with what it says,
    then the ``figures`` (file name -> title) beside it."""
    rng = rng or np.random.default_rng(0)
    by_steps = data.metric == "steps_to_target"
    lines = [f"# {data.scenario}: tuned", ""]
    if data.tested.empty:
        lines += ["The searches alone: no test-seed runs (`crossrl tune --no-test`)."]
    else:
        lines += _verdict_sections(data, rng=rng, by_steps=by_steps)
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
        (
            "Env steps to the target of the configurations that ran their whole budget (reached it, or not: then "
            f"not near); near best: at most {1 + NEAR_BEST:.1f} x the fewest."
            if by_steps
            else f"Final return of the configurations that ran their whole budget; near best: within {NEAR_BEST:.0%} "
            "of the best's magnitude."
        )
        + " Many near the best: the engine is robust to its setting; one: the verdict rests on finding it.",
        "",
        "| engine | configurations | whole budget | stopped early | failed | best | worst | near best |",
        "|---|---|---|---|---|---|---|---|",
    ]
    fmt = ",.0f" if by_steps else ".1f"
    lines += [
        f"| {r.engine} | {r.configurations} | {r.whole_budget} | {r.stopped} | {r.failed} | {_f(r.best, fmt)} | "
        f"{_f(r.worst, fmt)} | {r.near_best}/{r.whole_budget} |"
        for r in s.itertuples()
    ]
    for name, title in (figures or {}).items():
        lines += ["", f"![{title}]({name})"]
    return "\n".join(lines) + "\n"


def _p_cell(p: float, lo: float, hi: float, row: Any) -> str:
    """A probability of improvement with its CI; "no conclusion" from a single seed on either side."""
    if min(int(row.shared_n or 0), int(row.tuned_n or 0)) < 2:
        return "no conclusion (one seed)"
    return f"{_f(p, '.2f')} [{_f(lo, '.2f')}, {_f(hi, '.2f')}]"


def _verdict_sections(data: TunedData, *, rng: np.random.Generator, by_steps: bool) -> list[str]:
    """The tables on the test seeds: own setting against tuned (and env steps to the target under a steps search),
    then the engines against each other at their tuned best."""
    v = verdict_table(data, rng=rng)
    lines = [
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
            f"{_ci(r.tuned_iqm, r.tuned_lo, r.tuned_hi, r.tuned_n)} | {_p_cell(r.p_tuned_better, r.p_lo, r.p_hi, r)} | "
            f"{r.shared_reached}/{r.shared_n}, {_f(r.shared_steps_median, ',.0f')} | "
            f"{r.tuned_reached}/{r.tuned_n}, {_f(r.tuned_steps_median, ',.0f')} |"
        )
    if by_steps:
        lines += [
            "",
            "## Env steps to the target, on the test seeds",
            "",
            "The search's metric. IQM [95 % stratified bootstrap CI] of the env steps to the target, a seed that missed "
            "it counted at its budget (a lower bound: the reached columns above say how often). P(tuned fewer): the "
            "probability that the tuned setting needs fewer env steps than the own one.",
            "",
            "| engine | own | tuned | P(tuned fewer) |",
            "|---|---|---|---|",
        ]
        lines += [
            f"| {r.engine} | {_ci(r.shared_steps_iqm, r.shared_steps_lo, r.shared_steps_hi, r.shared_n, ',.0f')} | "
            f"{_ci(r.tuned_steps_iqm, r.tuned_steps_lo, r.tuned_steps_hi, r.tuned_n, ',.0f')} | "
            f"{_p_cell(r.p_fewer_steps, r.p_fewer_lo, r.p_fewer_hi, r)} |"
            for r in v.itertuples()
        ]
    pairs = improvement_between_engines(data, rng=rng)
    if not pairs.empty:
        measure = "fewer env steps to the target" if by_steps else "higher final return"
        lines += [
            "",
            "## Engines against each other, each at its tuned best",
            "",
            f"P(X > Y): the probability that X does better than Y on a test seed ({measure}).",
            "",
            "| X | Y | P(X > Y) [95 % CI] |",
            "|---|---|---|",
        ]
        lines += [
            f"| {r.x} | {r.y} | {_f(r.p, '.2f')} [{_f(r.lo, '.2f')}, {_f(r.hi, '.2f')}] |" for r in pairs.itertuples()
        ]
    return lines


def sensitivity_figure(data: TunedData) -> str:
    """Every searched configuration's metric, a column per engine: filled ran its whole budget, hollow stopped early
    by the scheduler, a cross never reached the target (drawn above the budget); the band is within 10 % of the
    engine's best."""
    by_steps = data.metric == "steps_to_target"
    engines = _engines(data)
    colours = engine_colours(engines)
    fig, [ax] = new_figure(1, width=1.6 + 1.4 * max(1, len(engines)))
    rng = np.random.default_rng(0)
    sensitivity = sensitivity_table(data).set_index("engine")  # the near-best bands
    top = 0.0  # under a steps search, configurations that never reached the target are drawn above the budget
    if by_steps and not data.configs.empty:
        sizes = [float(x) for x in data.configs.get("budget", data.configs.get("env_steps", [])) if math.isfinite(x)]
        top = 1.08 * max([*sizes, 1.0])
    with matplotlib.rc_context(RC):
        for i, engine in enumerate(engines):
            part = data.configs[data.configs.engine == engine] if not data.configs.empty else data.configs
            if part.empty:
                continue
            x = i + rng.uniform(-0.18, 0.18, size=len(part))
            y = np.asarray(part["steps_to_target" if by_steps else "final"], dtype=float)
            stopped = np.asarray(part["stopped"], dtype=bool)
            missed = ~np.isfinite(y)
            c = colours[engine]
            ax.scatter(x[~stopped & ~missed], y[~stopped & ~missed], color=c, s=22, zorder=3)
            ax.scatter(x[stopped & ~missed], y[stopped & ~missed], facecolor="none", edgecolor=c, s=22, zorder=3)
            if by_steps and missed.any():
                ax.scatter(x[missed], np.full(missed.sum(), top), marker="x", color=c, s=22, zorder=3)
            row = sensitivity.loc[engine]
            if math.isfinite(row.best):
                lo, hi = (
                    (row.best, row.best * (1 + NEAR_BEST))
                    if by_steps
                    else (row.best - NEAR_BEST * abs(row.best), row.best)
                )
                ax.fill_between([i - 0.3, i + 0.3], lo, hi, color=c, alpha=0.15, lw=0)
        if by_steps:
            ax.axhline(top / 1.08, color="#444444", ls="--", lw=0.8)
            ax.text(
                -0.55, top / 1.08, " budget; x above: not reached (stopped early or missed)", va="bottom", fontsize=7
            )
        ax.set_xticks(range(len(engines)), engines)
        ax.set_xlim(-0.6, len(engines) - 0.4)
        ax.set_ylabel("env steps to the target" if by_steps else "final return")
        ax.grid(axis="y", alpha=0.3)
    return to_svg(fig, "tuned-sensitivity")


def pbt_figure(data: TunedData) -> str | None:
    """The PBT population's curves, a panel per engine: each member's return against env steps, a dot where it copied
    another member (PBT's exploit), labelled with the member it copied. None without a PBT search."""
    if data.curves.empty:
        return None
    engines = [e for e in _engines(data) if e in set(data.curves.engine)]
    fig, axes = new_figure(len(engines))
    with matplotlib.rc_context(RC):
        for ax, engine in zip(axes, engines, strict=True):
            part = data.curves[data.curves.engine == engine]
            members = sorted(part.member.unique())
            palette = FALLBACK_COLOURS + tuple(engine_colours(["crossrl", "rllib", "torchrl"]).values())
            colour = {m: palette[i % len(palette)] for i, m in enumerate(members)}
            for m in members:
                c = part[part.member == m]
                ax.plot(c.step, c.value, color=colour[m], lw=1.2, label=m.rsplit("-", 1)[-1])
            for entry in data.lineage.get(engine, []):
                c = part[(part.member == entry["member"]) & (part.step >= int(entry["env_step"]))]
                if not c.empty:
                    ax.plot(c.step.iloc[0], c.value.iloc[0], "o", color=colour.get(entry["member"], "#000"), ms=4)
                    ax.annotate(
                        f"<- {str(entry['copied']).rsplit('-', 1)[-1]}",
                        (c.step.iloc[0], c.value.iloc[0]),
                        fontsize=7,
                        xytext=(3, -8),
                        textcoords="offset points",
                    )
            ax.set_title(engine)
            ax.set_xlabel("env steps")
            ax.xaxis.set_major_formatter(EngFormatter(sep=""))
            ax.grid(alpha=0.3)
            ax.legend(loc="upper left", fontsize=7, frameon=False)
        axes[0].set_ylabel("episode return (mean of episodes)")
    return to_svg(fig, "tuned-pbt")


def write_report(store: Any, scenario: str, out_dir: Path) -> Path:
    """``tuned.md`` for the newest `crossrl tune` of ``scenario`` in ``out_dir`` with its figures (SVG files beside it),
    also logged to its own-setting run."""
    data = load_tuned(store, scenario)
    out_dir.mkdir(parents=True, exist_ok=True)
    drawn = {
        "tuned-sensitivity.svg": ("Each searched configuration's metric, per engine", sensitivity_figure(data)),
        "tuned-pbt.svg": ("The PBT population: each member's return, a dot where it copied another", pbt_figure(data)),
    }
    figures = {}
    for name, (title, svg) in drawn.items():
        if svg is not None:
            (out_dir / name).write_text(svg)
            figures[name] = title
    path = out_dir / "tuned.md"
    path.write_text(markdown(data, figures=figures))
    for name in [*figures, path.name]:
        store.log_file(data.shared_id, out_dir / name, "report")
    return path
