"""Algorithms compared in one report: several scenarios' newest runs on one env, side by side per engine.

`crossrl compare A B ...` reads each named scenario's newest `crossrl run` (each scenario runs one algorithm; they
must share the env id and the target) and, for every engine, puts the algorithms next to each other: env steps and
training seconds to the target (median over seeds with a 95 % bootstrap CI; a seed that missed counts at the env
steps, or seconds, it sampled, as in :func:`crossrl.reports.stats.time_to_target`), the final return (IQM, CI), the
rank test between the two fastest, and one verdict sentence per engine. No algorithm is named first from fewer than
:data:`crossrl.reports.verdict.MIN_SEEDS` seeds, nor unless the rank test against every other algorithm that reached
the target gives p < 0.05 (3 seeds each cannot: their smallest exact p is 0.10); where no other algorithm's median
seed reached it, the sentence says the fact, "only X reaches it", not a test.
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from crossrl.reports import stats as S
from crossrl.reports.render import REPORT_CSS, Table, html_table, md_cell
from crossrl.reports.verdict import ALPHA, MIN_SEEDS
from crossrl.scenarios import metrics as M


class CompareError(ValueError):
    """Scenarios that cannot be compared (different envs or targets, fewer than two algorithms)."""


def _median(a: Any) -> Any:
    return np.median(a, axis=-1)


def _seed_values(g: pd.DataFrame, column: str, censor: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    """Per seed: the value to the target, or (a miss) what it sampled; and which seeds reached it."""
    values = pd.to_numeric(g[column], errors="coerce").to_numpy(dtype=float)
    reached = np.isfinite(values)
    fallback = censor.reindex(g["run_id"]).to_numpy(dtype=float)
    return np.where(reached, values, fallback), reached


def compare_table(trials: pd.DataFrame, points: pd.DataFrame, *, rng: np.random.Generator) -> pd.DataFrame:
    """One row per engine x algorithm (FINISHED trials): seeds, reached, median steps/seconds to target with CIs
    (misses censored at what they sampled; ``*_reached`` false when half the seeds or more missed), final return."""
    counted = trials[trials["status"] == M.FINISHED]
    wide = S.wide_points(points, [M.WALL_TIME_S])
    last_step = wide.groupby("run_id")["step"].max()
    last_wall = wide.groupby("run_id")[M.WALL_TIME_S].max()
    rows = []
    for (engine, algorithm), g in counted.groupby(["engine", "algorithm"], sort=False):
        steps, reached = _seed_values(g, M.STEPS_TO_TARGET, last_step)
        wall, _ = _seed_values(g, M.WALL_S_TO_TARGET, last_wall)
        # a miss ranks after every hit: the median is "reached" only when more than half the seeds reached it
        median_reached = bool(reached.sum() * 2 > reached.size)
        final = pd.to_numeric(g[M.FINAL_RETURN_MEAN], errors="coerce").dropna().to_numpy(dtype=float)
        s_lo, s_hi = S.stratified_bootstrap_ci([steps], statistic=_median, rng=rng)
        w_lo, w_hi = S.stratified_bootstrap_ci([wall], statistic=_median, rng=rng)
        f_lo, f_hi = S.stratified_bootstrap_ci([final], statistic=S.iqm, rng=rng)
        rows.append(
            dict(
                engine=str(engine), algorithm=str(algorithm), n_seeds=int(steps.size), n_reached=int(reached.sum()),
                median_reached=median_reached, median_steps=float(np.median(steps)) if steps.size else math.nan,
                steps_ci_low=s_lo, steps_ci_high=s_hi, median_wall_s=float(np.median(wall)) if wall.size else math.nan,
                wall_ci_low=w_lo, wall_ci_high=w_hi, final_iqm=float(S.iqm(final)) if final.size else math.nan,
                final_ci_low=f_lo, final_ci_high=f_hi,
                steps_per_seed=[float(x) for x in steps], wall_s_per_seed=[float(x) for x in wall],
                reached_per_seed=[bool(x) for x in reached],
            )
        )  # fmt: skip
    out = pd.DataFrame(rows)
    if out.empty:
        return out
    out["_k"] = out["engine"].map(S.engine_sort_key)
    return out.sort_values(["_k", "algorithm"]).drop(columns="_k").reset_index(drop=True)


def _steps(x: float) -> str:
    return f"{x:,.0f}"


def _secs(x: float) -> str:
    return f"{x:,.1f} s"


def _ci(lo: float, hi: float, fmt: Any) -> str:
    return f" [{fmt(lo)}, {fmt(hi)}]" if math.isfinite(lo) and math.isfinite(hi) else ""


def _rank_key(r: Any, column: str) -> tuple[int, float, float]:
    # reached first, then fewer steps (seconds); ties broken by more seeds reaching the target
    return (0 if r["median_reached"] else 1, float(r[column]), -float(r["n_reached"]))


def _clause(g: pd.DataFrame, column: str, per_seed: str, unit: str, fmt: Any, target: float) -> str:
    ranked = sorted((r for _, r in g.iterrows()), key=lambda r: _rank_key(r, column))
    best = ranked[0]
    if not best["median_reached"]:
        return f"in {unit}, no algorithm's median seed reached {target:g}"
    lo, hi = ("steps_ci_low", "steps_ci_high") if column == "median_steps" else ("wall_ci_low", "wall_ci_high")
    head = f"{best['algorithm']} {fmt(best[column])}{_ci(best[lo], best[hi], fmt)}"
    if int(g["n_seeds"].min()) < MIN_SEEDS:
        few = ", ".join(f"{r['algorithm']} {int(r['n_seeds'])}" for r in ranked)
        return f"in {unit}, too few seeds to name the fastest (seeds: {few}; {MIN_SEEDS} needed): median {head}"
    others, supported = [], True
    for r in ranked[1:]:
        if not r["median_reached"]:
            others.append(f"{r['algorithm']} did not reach it ({r['n_reached']}/{r['n_seeds']} seeds; misses counted "
                          f"at the {fmt(r[column])} they sampled)")  # fmt: skip
            continue
        ratio = float(r[column]) / float(best[column]) if float(best[column]) > 0 else math.nan
        p = S.rank_test_p(best[per_seed], r[per_seed])
        sure = math.isfinite(p) and p < ALPHA
        supported &= sure
        faster = "fewer than" if column == "median_steps" else "sooner than"
        others.append(f"{ratio:.1f}x {faster} {r['algorithm']} {fmt(r[column])} (rank test p = {p:.2f}"
                      + ("" if sure else ", not a difference the seeds support") + ")")  # fmt: skip
    tail = f", {'; '.join(others)}" if others else ""
    if not any(r["median_reached"] for r in ranked[1:]):  # a fact of the medians, not a claim of the test
        return f"in {unit}, only {best['algorithm']} reaches it, {head.partition(' ')[2]}{tail}"
    return (
        f"in {unit}, {best['algorithm']} first, {head.partition(' ')[2]}{tail}"
        if supported
        else f"in {unit}, {head}{tail}"
    )


def verdicts(table: pd.DataFrame, target: float) -> list[str]:
    """One sentence per engine: which algorithm reaches the target first in env steps, then in seconds."""
    out = []
    for engine, g in table.groupby("engine", sort=False):
        if g["algorithm"].nunique() < 2:
            out.append(f"On {engine}: only {g['algorithm'].iloc[0]} ran; nothing to compare.")
            continue
        if not math.isfinite(target):
            out.append(f"On {engine}: the specs set no target; only final returns are compared.")
            continue
        steps = _clause(g, "median_steps", "steps_per_seed", "env steps", _steps, target)
        secs = _clause(g, "median_wall_s", "wall_s_per_seed", "seconds", _secs, target)
        out.append(f"On {engine}, to {target:g}: {steps}; {secs}.")
    return out


def tables(table: pd.DataFrame) -> list[Table]:
    """The comparison as one report table (rows: engine x algorithm)."""
    rows = [
        [
            r.engine, r.algorithm, f"{r.n_reached}/{r.n_seeds}",
            ("" if r.median_reached else "> ") + _steps(r.median_steps) + _ci(r.steps_ci_low, r.steps_ci_high, _steps),
            ("" if r.median_reached else "> ") + _secs(r.median_wall_s) + _ci(r.wall_ci_low, r.wall_ci_high, _secs),
            f"{r.final_iqm:,.1f}" + _ci(r.final_ci_low, r.final_ci_high, lambda x: f"{x:,.1f}"),
        ]
        for r in table.itertuples()
    ]  # fmt: skip
    note = (
        "Median over seeds with a 95 % bootstrap CI; a seed that missed the target counts at the env steps (seconds) "
        "it sampled, so '> x' means the median seed did not reach it. Final return: IQM over seeds, 95 % CI."
    )
    headers = ["engine", "algorithm", "seeds reached", "env steps to target", "seconds to target", "final return"]
    return [Table(key="algorithms", title="Algorithms per engine", headers=headers, rows=rows, note=note,
                  text_columns=frozenset({0, 1}))]  # fmt: skip


def curves(trials: pd.DataFrame, points: pd.DataFrame, *, rng: np.random.Generator) -> pd.DataFrame:
    """Mean return vs env steps with its CI per engine x algorithm (the report's curve, algorithm in the engine slot)."""
    frames = []
    for algorithm, g in trials.groupby("algorithm", sort=False):
        counted = g[g["status"] == M.FINISHED]
        wide = S.wide_points(points[points["run_id"].isin(counted["run_id"])], [M.EPISODE_RETURN_MEAN])
        c = S.curves_table(counted, wide, x_metric="step", rng=rng, grid_points=S.GRID_POINTS)
        frames.append(c.assign(algorithm=str(algorithm)))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def figure_svg(curve: pd.DataFrame, target: float) -> str:
    """Return vs env steps: a panel per engine, a line (and CI band) per algorithm."""
    from crossrl.reports.figures import FALLBACK_COLOURS, new_figure, to_svg

    engines = sorted(curve["engine"].unique(), key=S.engine_sort_key) if len(curve) else []
    fig, axes = new_figure(max(len(engines), 1))
    algorithms = sorted(curve["algorithm"].unique()) if len(curve) else []
    colour = {a: FALLBACK_COLOURS[i % len(FALLBACK_COLOURS)] for i, a in enumerate(algorithms)}
    for ax, engine in zip(axes, engines, strict=False):
        for algorithm in algorithms:
            c = curve[(curve["engine"] == engine) & (curve["algorithm"] == algorithm)]
            if c.empty:
                continue
            ax.plot(c["x"], c["mean"], color=colour[algorithm], label=algorithm)
            ax.fill_between(c["x"], c["ci_low"], c["ci_high"], color=colour[algorithm], alpha=0.2, linewidth=0)
        if math.isfinite(target):
            ax.axhline(target, color="#7F7F7F", linestyle="--", linewidth=0.8)
        ax.set_title(engine)
        ax.set_xlabel("env steps")
        ax.legend(loc="lower right")
    axes[0].set_ylabel("episode return")
    return to_svg(fig, "algorithms")


@dataclass(frozen=True)
class ComparePaths:
    html: Path
    markdown: Path
    json: Path


def check_comparable(specs: Sequence[dict[str, Any]]) -> None:
    """Raise :class:`CompareError` unless the scenarios share the env id and target and name 2+ algorithms."""
    envs = {(s.get("env") or {}).get("id") for s in specs}
    if len(envs) != 1:
        raise CompareError(f"the scenarios run different envs ({', '.join(sorted(map(str, envs)))}); compare "
                           "scenarios on one env")  # fmt: skip
    targets = {(s.get("target") or {}).get("episode_return_mean") for s in specs}
    if len(targets) != 1:
        raise CompareError(f"the scenarios set different targets ({', '.join(map(str, targets))}); give them one")
    algorithms = {(s.get("algorithm") or {}).get("name") for s in specs}
    if len(algorithms) < 2:
        raise CompareError(f"the scenarios all run {', '.join(map(str, algorithms))}; name scenarios of 2+ algorithms")


def build(
    trials: pd.DataFrame, points: pd.DataFrame, *, env_id: str, scenarios: Sequence[str], out_dir: Path,
    command: str = "", seed: int = 0,
) -> ComparePaths:  # fmt: skip
    """Write compare.html, compare.md and compare.json under ``out_dir``."""
    rng = np.random.default_rng(seed)
    table = compare_table(trials, points, rng=rng)
    targets = trials["target_return"].dropna() if "target_return" in trials else pd.Series([], dtype=float)
    target = float(targets.iloc[0]) if len(targets) else math.nan
    sentences = verdicts(table, target) if len(table) else ["No FINISHED trial to compare."]
    parts = tables(table) if len(table) else []
    svg = figure_svg(curves(trials, points, rng=rng), target)
    out_dir.mkdir(parents=True, exist_ok=True)
    title = f"crossrl compare: {env_id}: {', '.join(scenarios)}"
    created = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    (out_dir / "figures").mkdir(exist_ok=True)
    (out_dir / "figures" / "algorithms.svg").write_text(svg)
    md = [f"# {title}", "", f"{created}" + (f" · `{command}`" if command else ""), "", "## Verdict", ""]
    md += [f"- {s}" for s in sentences] + [""]
    for t in parts:
        md += [f"## {t.title}", "", "| " + " | ".join(md_cell(h) for h in t.headers) + " |"]
        md += ["|" + "|".join("---" for _ in t.headers) + "|"]
        md += ["| " + " | ".join(md_cell(c) for c in row) + " |" for row in t.rows] + ["", f"_{t.note}_", ""]
    md += ["## Return vs env steps", "", "![return vs env steps](figures/algorithms.svg)", ""]
    md_path = out_dir / "compare.md"
    md_path.write_text("\n".join(md))
    esc = html.escape
    page = (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><link rel="icon" href="data:,">'
        f"<title>{esc(title)}</title><style>{REPORT_CSS}</style></head><body><h1>{esc(title)}</h1>"
        f'<p class="meta">{esc(created)}' + (f" · <code>{esc(command)}</code>" if command else "") + "</p>"
        "<h2>Verdict</h2><ul>" + "".join(f"<li>{esc(s)}</li>" for s in sentences) + "</ul>"
        + "".join(html_table(t) for t in parts)
        + f"<h2>Return vs env steps</h2>{svg}</body></html>\n"
    )  # fmt: skip
    html_path = out_dir / "compare.html"
    html_path.write_text(page)
    doc = {
        "env_id": env_id, "scenarios": list(scenarios), "target_return": target if math.isfinite(target) else None,
        "verdict": sentences, "algorithms": json.loads(table.to_json(orient="records")) if len(table) else [],
    }  # fmt: skip
    json_path = out_dir / "compare.json"
    json_path.write_text(json.dumps(doc, indent=2) + "\n")
    return ComparePaths(html=html_path, markdown=md_path, json=json_path)


def load(store: Any, scenarios: Sequence[str]) -> tuple[pd.DataFrame, pd.DataFrame, str]:
    """Each scenario's newest run from the store, checked comparable: (trials, points, env id)."""
    if len(scenarios) < 2:
        raise CompareError("name two or more scenarios (one algorithm each) to compare")
    loaded = [store.load(scenario=s) for s in scenarios]
    specs = [store.spec(x.meta["parent_run_id"]) or {} for x in loaded]
    check_comparable(specs)
    trials = pd.concat([x.trials for x in loaded], ignore_index=True)
    points = pd.concat([x.points for x in loaded], ignore_index=True)
    return trials, points, str((specs[0].get("env") or {}).get("id"))


__all__ = ["CompareError", "build", "check_comparable", "compare_table", "load", "verdicts"]
