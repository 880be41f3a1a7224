"""The report's verdict: what a reader should take from a run, in plain sentences with their uncertainty.

Computed from the same numbers as the tables (:class:`crossrl.reports.stats.ReportStats`), per worker count (engines
are compared only at equal workers): the best final return and how sure that is (the probability of improvement
over the runner-up and its CI), the fastest to the target in env steps and in seconds, the fastest sampler. With one
seed per engine the sentence says that one seed supports no conclusion; where a measure cannot be read (no target,
no engine reached it) the sentence says so instead of guessing.

Also the definitions of every measure the report shows (:data:`DEFINITIONS`), written once for the HTML and
Markdown outputs.
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from crossrl.reports import stats as S

DEFINITIONS: tuple[tuple[str, str], ...] = (
    (
        "final return",
        "a trial's mean episode return over the episodes it completed in the last 10 % of the env steps it sampled; "
        "across seeds the interquartile mean (IQM) with a 95 % stratified-bootstrap CI",
    ),
    (
        "steps to target",
        "env steps sampled when the trial's mean episode return at an iteration first reached the target; the "
        "median over seeds, a seed that never reached it counting as infinite",
    ),
    ("seconds to target", "the same, in seconds of training (the engine's set-up excluded)"),
    (
        "return after N s of training",
        "each trial's mean return over the episodes it completed in the last 10 % of the same training time, the "
        "shortest any counted trial trained",
    ),
    (
        "sampling throughput",
        "env steps sampled per second of an iteration (learning included), the median over a trial's iterations, "
        "then over seeds",
    ),
    (
        "speedup, efficiency",
        "throughput against the engine's smallest worker count; efficiency = speedup / (ratio of workers)",
    ),
    (
        "convergence scaling",
        "with several worker counts and a target: seconds of training to the target per worker count (a seed that "
        "missed at what it ran, making the figure a bound); speedup = T(fewest) / T(N) with a bootstrap CI over seeds, "
        "efficiency = speedup / worker ratio, sample cost = env steps(N) / env steps(fewest), worker-seconds = N x T(N); "
        "Amdahl's law and the Universal Scalability Law fitted to the speedups",
    ),
    (
        "P(X > Y)",
        "the probability that a seed of X ends with a higher final return than a seed of Y (all pairs, ties count "
        "one half); 0.5 means no difference",
    ),
    ("counted trials", f"only trials that ended {S.COUNTED_STATUS}; the others are listed with their reasons"),
)

SURE = 0.5  # a CI of P(X > Y) that excludes 0.5 on one side: a difference the seeds support
# Fewer seeds than this name no winner: from 2 seeds a bootstrap has 3 distinct resamples per engine, so its CI of
# P(X > Y) is [1.00, 1.00] whenever both seeds of X are ahead, which says nothing about the next seed.
MIN_SEEDS = 3
# Where every resample orders the engines the same way (a zero-width CI), the exact rank test decides instead: a
# winner only at p < ALPHA (3 seeds above 3 give p = 0.10: too few to tell; 4 above 4 give 0.029).
ALPHA = 0.05


def _fmt(x: float, digits: str = ".1f") -> str:
    return format(x, digits)


def _steps(x: float) -> str:
    return f"{x:,.0f}"


def _secs(x: float) -> str:
    return f"{x:,.0f}" if x >= 100 else f"{x:.1f}" if x >= 10 else f"{x:.2f}"


def _fin(x: Any) -> bool:
    try:
        return x is not None and math.isfinite(float(x))
    except (TypeError, ValueError):
        return False


def _improvement(
    improvement: pd.DataFrame, workers: int, best: str, second: str
) -> tuple[float, float, float, int, str, float] | None:
    """P(best > second), its CI, the fewer seeds of the two, "" (or, with fewer than 2 seeds, who has only one) and
    the rank test's p-value."""
    rows = improvement[
        (improvement["workers"] == workers)
        & (
            ((improvement["engine_x"] == best) & (improvement["engine_y"] == second))
            | ((improvement["engine_x"] == second) & (improvement["engine_y"] == best))
        )
    ]
    if rows.empty:
        return None
    r = rows.iloc[0]
    n = int(min(r["n_x"], r["n_y"]))
    flip = r["engine_x"] != best
    p = 1 - float(r["p"]) if flip else float(r["p"])
    lo, hi = (1 - float(r["ci_high"]), 1 - float(r["ci_low"])) if flip else (float(r["ci_low"]), float(r["ci_high"]))
    alone = ""
    if n < 2:
        fewer = best if int(r["n_x" if not flip else "n_y"]) < 2 else second
        alone = "one seed per engine" if int(max(r["n_x"], r["n_y"])) < 2 else f"only one seed of {fewer}"
    rank_p = float(r["rank_p"]) if "rank_p" in r.index else math.nan
    return p, lo, hi, n, alone, rank_p


def _final_return(st: S.ReportStats, workers: int) -> str | None:
    """The best final return, named only when the difference shows at the printed precision and the CI of P(best >
    runner-up) excludes a tie; otherwise "no clear difference", and "no conclusion" from one seed. Where the trials
    ended at different env steps, the comparison is made at the most every trial reached, and said so."""
    common = st.final_at_common
    if not common.empty and workers in set(common["workers"]):
        span = common[common["workers"] == workers].iloc[0]
        said = (
            f"the trials ended at different env steps ({int(span['steps_min']):,}-{int(span['steps_max']):,}: time "
            f"budgets or unequal batches), so they are compared at {int(span['common_step']):,} env steps, the most "
            "every one reached"
        )
        line = _final_return_of(st.final_at_common, st.improvement_at_common, workers)
        return None if line is None else f"{line[:-1]}; {said}."
    line = _final_return_of(st.final_return, st.improvement, workers)
    if line is not None and st.stop_at_target and _fin(st.target_return):
        stopped = _stopped_at_target(st.time_to_target, workers, st.target_return)
        if stopped:
            line = (
                f"{line[:-1]}; {stopped}, so their final returns sit near it by design: the time to the target below "
                "is what tells them apart."
            )
    return line


def _stopped_at_target(ttt: pd.DataFrame, workers: int, target: float) -> str:
    """Which trials of a worker count stopped on reaching the target (``budget.stop_at_target``): all of them, some
    (how many), or "" where none reached it (those ran their whole budget, and their final returns compare as any)."""
    if ttt.empty:
        return ""
    g = ttt[ttt["workers"] == workers]
    reached, seeds = int(g["n_reached"].sum()), int(g["n_seeds"].sum())
    if reached == 0:
        return ""
    if reached == seeds:
        return f"the trials stopped on reaching the target ({target:g})"
    return f"the {reached} of {seeds} trials that reached the target ({target:g}) stopped there"


def _final_return_of(final: pd.DataFrame, improvement: pd.DataFrame, workers: int) -> str | None:
    fr = final[(final["workers"] == workers) & final["iqm"].notna()]
    if fr.empty:
        return None
    fr = fr.sort_values("iqm", ascending=False)
    best, iqms = (
        str(fr.iloc[0]["engine"]),
        f"IQM over seeds: {', '.join(f'{r.engine} {_num(r.iqm)}' for r in fr.itertuples())}",
    )
    if len(fr) == 1:
        return f"Final return: {best} alone ({iqms})."
    second = str(fr.iloc[1]["engine"])
    found = _improvement(improvement, workers, best, second)
    if found is None:
        return f"Final return: no conclusion ({iqms}; no paired comparison)."
    p, lo, hi, n, alone, rank_p = found
    if alone:
        return f"Final return: {alone}: no conclusion ({iqms}; P({best} > {second}) = {p:.2f} from single pairs)."
    if n < MIN_SEEDS:
        return (
            f"Final return: too few seeds to tell ({n}; a winner needs {MIN_SEEDS} per engine) "
            f"({iqms}; P({best} > {second}) = {p:.2f} over {n} x {n} pairs)."
        )
    if not (_fin(lo) and _fin(hi)):
        return f"Final return: no conclusion ({iqms}; P({best} > {second}) = {p:.2f}, no CI)."
    ci = f"P({best} > {second}) = {p:.2f}, 95% CI [{lo:.2f}, {hi:.2f}], {n} seeds"
    if _num(fr.iloc[0]["iqm"]) == _num(fr.iloc[1]["iqm"]):
        return f"Final return: no clear difference ({iqms}: equal at this precision; {ci})."
    if lo > SURE and hi - lo < 1e-9:  # every resample ordered them the same way: the CI's width says nothing
        test = f"every resample ordered them alike; rank test p = {rank_p:.3f}"
        if _fin(rank_p) and rank_p < ALPHA:
            return f"Best final return: {best} ({iqms}; {ci}: {test})."
        return f"Final return: too few seeds to tell ({n}) ({iqms}; {ci}: {test}, not below {ALPHA:g})."
    if lo > SURE:
        return f"Best final return: {best} ({iqms}; {ci})."
    return f"Final return: no clear difference ({iqms}; {ci}: the CI includes 0.5)."


def _num(x: Any, digits: str = ".1f") -> str:
    """A number as printed: one decimal, and never "-0.0"."""
    out = format(float(x), digits)
    return out[1:] if out.startswith("-") and float(out) == 0 else out


def _seed_range(values: Any, fmt: Any, unit: str) -> str:
    """The range over the seeds that reached the target ("" for fewer than two)."""
    got = sorted(float(v) for v in values if v is not None and math.isfinite(float(v)))
    if len(got) < 2:
        return ""
    return f": {fmt(got[0])}{unit}" if fmt(got[0]) == fmt(got[-1]) else f": {fmt(got[0])}-{fmt(got[-1])}{unit}"


def _to_target(st: S.ReportStats, workers: int, column: str, unit: str, fmt: Any, unit_of: str = "") -> str | None:
    """The fastest median seed to the target, each engine with its seeds' range (the uncertainty a reader needs: the
    medians alone do not say whether the ranges overlap); with one seed, "no conclusion"."""
    if not math.isfinite(st.target_return) or st.time_to_target.empty:
        return None
    tt = st.time_to_target[st.time_to_target["workers"] == workers]
    if tt.empty:
        return None
    reached = tt[tt["median_reached"] & tt[column].notna()].sort_values(column)
    what = f"the target ({st.target_return:g})"
    if reached.empty:
        return f"Fastest to {what} in {unit}: none: no engine's median seed reached it within the budget."
    per_seed = "steps_per_seed" if column == "median_steps" else "wall_s_per_seed"
    best = reached.iloc[0]
    parts = [
        f"{r.engine} {fmt(getattr(r, column))}{unit_of} ({r.n_reached}/{r.n_seeds} seeds"
        f"{_seed_range(getattr(r, per_seed), fmt, unit_of)})"
        for r in reached.itertuples()
    ]
    missed = [f"{r.engine} ({r.n_reached}/{r.n_seeds} seeds)" for r in tt.itertuples() if not r.median_reached]
    lead = f"Fastest to {what} in {unit}: {best['engine']}"
    if int(best["n_seeds"]) < 2:
        lead = f"Fastest to {what} in {unit}: one seed of {best['engine']}: no conclusion"
    elif int(best["n_seeds"]) < MIN_SEEDS:
        lead = f"Fastest to {what} in {unit}: too few seeds to tell ({int(best['n_seeds'])} of {best['engine']})"
    elif len(reached) > 1 and _overlap(reached.iloc[0][per_seed], reached.iloc[1][per_seed]):
        lead = f"Fastest to {what} in {unit}: no clear difference, the seeds' ranges overlap"
    sentence = f"{lead} (median {', '.join(parts)})"
    if missed:
        sentence += f"; the median seed did not reach it for {', '.join(missed)}"
    return sentence + "."


def _overlap(a: Any, b: Any) -> bool:
    """Whether two engines' seeds that reached the target overlap in range (a seed that missed left out)."""
    xa = [float(v) for v in a if v is not None]
    xb = [float(v) for v in b if v is not None]
    return bool(xa and xb) and min(xb) <= max(xa)


def _sampler(st: S.ReportStats, workers: int) -> str | None:
    tp = st.throughput[(st.throughput["workers"] == workers) & st.throughput["median"].notna()]
    if len(tp) < 2:
        return None
    tp = tp.sort_values("median", ascending=False)
    best, second = tp.iloc[0], tp.iloc[1]
    parts = ", ".join(f"{r.engine} {r.median:,.0f}" for r in tp.itertuples())
    ratio = float(best["median"]) / float(second["median"]) if float(second["median"]) > 0 else math.inf
    shared = " (some trials shared a node with others of the sweep: contended speeds)" if tp["shared"].any() else ""
    return f"Fastest sampler: {best['engine']}, {ratio:.1f}x {second['engine']} (median env steps/s: {parts}){shared}."


NATIVE_MARK = "§"
"""Beside an engine in the report's tables: it ran with engine-native settings (the spec's ``native`` section)."""


def native_settings(trials: pd.DataFrame) -> dict[str, str]:
    """Engine -> the engine-native settings its trials ran with, on one line (their ``native.overrides`` tag), for
    the engines that had any."""
    if "native_overrides" not in trials.columns:
        return {}
    out: dict[str, str] = {}
    for engine, rows in trials.groupby("engine", sort=False):
        texts = sorted({str(t) for t in rows["native_overrides"].fillna("") if str(t)})
        if texts:
            out[str(engine)] = "; ".join(texts)
    return dict(sorted(out.items(), key=lambda kv: S.engine_sort_key(kv[0])))


def native_lines(native: dict[str, str]) -> list[str]:
    """One verdict line per engine that ran with engine-native settings: its figures break the equal-settings rule."""
    return [
        f"{NATIVE_MARK} {engine} ran with engine-native settings ({text}): its figures do not follow the "
        "equal-settings rule."
        for engine, text in native.items()
    ]


def verdict(st: S.ReportStats) -> list[str]:
    """The verdict's sentences, per worker count (prefixed by it when the run has several)."""
    counted = sorted({int(w) for w in st.final_return["workers"]}) if not st.final_return.empty else []
    out: list[str] = []
    for workers in counted:
        lines = [
            _final_return(st, workers),
            _to_target(st, workers, "median_steps", "env steps", _steps),
            _to_target(st, workers, "median_wall_s", "seconds of training", _secs, " s"),
            _sampler(st, workers),
        ]
        prefix = f"{workers} worker{'s' if workers != 1 else ''}: " if len(counted) > 1 else ""
        out += [prefix + line for line in lines if line]
    if not st.convergence.empty:
        from crossrl.reports.scaling import convergence_sentences

        out += [
            f"Convergence scaling: {line}" for line in convergence_sentences(st.convergence, target=st.target_return)
        ]
    if not out:
        out.append("No trial finished: nothing to compare (see the trials that did not finish, below).")
    if not st.problems.empty:
        out.append(
            f"{len(st.problems)} trial{'s' if len(st.problems) != 1 else ''} did not finish and "
            f"{'are' if len(st.problems) != 1 else 'is'} left out (reasons below)."
        )
    return out


def single_worker_count(st: S.ReportStats) -> bool:
    """True when no engine ran more than one worker count: speedup and scaling mean nothing then."""
    if st.throughput.empty:
        return True
    return bool((st.throughput.groupby("engine")["workers"].nunique() <= 1).all())


def missing_at_wall(st: S.ReportStats, trials: pd.DataFrame) -> list[str]:
    """Engines with no seed in "Return after N s of training", each with why (their trials' status or too short)."""
    if st.return_at_wall.empty:
        return []
    out = []
    for r in st.return_at_wall.itertuples():
        if int(r.n_seeds) > 0:
            continue
        rows = trials[(trials["engine"] == r.engine) & (trials["workers"] == r.workers)]
        statuses = sorted({str(s) for s in rows["status"]})
        why = (
            f"its trials ended {', '.join(statuses)}"
            if statuses and statuses != [S.COUNTED_STATUS]
            else "no episode ended in that window (its iterations are longer than 10 % of the time)"
        )
        out.append(f"{r.engine} ({r.workers} worker{'s' if int(r.workers) != 1 else ''}): no seed: {why}")
    return out
