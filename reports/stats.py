"""Statistics over seeds for one scenario's trials: pure functions, explicit ``rng`` where random.

Methods follow rliable (Agarwal et al., "Deep RL at the Edge of the Statistical Precipice", 2021):
the interquartile mean (IQM) as the point estimate, percentile-bootstrap 95% confidence intervals
from a *stratified* bootstrap (runs are resampled with replacement inside each stratum, i.e. task;
a report covers one scenario, so there is one stratum and it is a bootstrap over seeds), and the
probability of improvement P(X > Y). The bootstrap is our own vectorized version of rliable's
``StratifiedBootstrap`` (percentile method), not ``scipy.stats.bootstrap``: it handles strata and
ragged groups, and runs all resamples in one array operation so a report stays fast.

Only trials whose status is FINISHED count; the others are listed by the report with their reasons.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from numpy.typing import ArrayLike, NDArray
from scipy.stats import mannwhitneyu, trim_mean

from crossrl.scenarios import metrics as M
from crossrl.scenarios.catalog import ENGINES

CONFIDENCE = 0.95
BOOTSTRAP_REPS = 2000
GRID_POINTS = 100
COUNTED_STATUS = M.FINISHED
ENGINE_ORDER = ENGINES

Stat = Callable[[NDArray[np.float64]], NDArray[np.float64]]  # reduces the last axis


def iqm(x: ArrayLike, axis: int | None = -1) -> NDArray[np.float64]:
    """Interquartile mean: the mean of the middle 50% (``trim_mean`` cutting 25% off each end).

    With fewer than 4 values nothing is cut (it is then the plain mean), as in rliable.
    """
    return np.asarray(trim_mean(np.asarray(x, dtype=float), 0.25, axis=axis), dtype=float)


def _mean_last(a: NDArray[np.float64]) -> NDArray[np.float64]:
    return np.asarray(np.mean(a, axis=-1), dtype=float)


def _iqm_last(a: NDArray[np.float64]) -> NDArray[np.float64]:
    return iqm(a, axis=-1)


def stratified_bootstrap_ci(
    strata: Sequence[ArrayLike],
    *,
    statistic: Stat,
    rng: np.random.Generator,
    reps: int = BOOTSTRAP_REPS,
    confidence: float = CONFIDENCE,
) -> tuple[float, float]:
    """Percentile-bootstrap CI of ``statistic`` over the concatenated strata.

    Each resample draws, inside every stratum, as many values as it has, with replacement; the
    statistic (which must reduce the last axis) is then taken over the concatenation. Returns
    (nan, nan) when no stratum has two values (one seed: nothing to resample).
    """
    arrays = [np.asarray(s, dtype=float).ravel() for s in strata]
    if not arrays or all(a.size < 2 for a in arrays):
        return (np.nan, np.nan)
    draws = [a[rng.integers(0, a.size, size=(reps, a.size))] for a in arrays if a.size]
    stats = statistic(np.concatenate(draws, axis=1))
    tail = (1.0 - confidence) / 2.0 * 100.0
    lo, hi = np.percentile(stats, [tail, 100.0 - tail])
    return (float(lo), float(hi))


@dataclass(frozen=True)
class PairedRatio:
    """A ratio of paired measurements: the IQM of the per-pair ratios (in log terms) and its CI."""

    ratio: float
    lo: float
    hi: float
    pairs: int


def paired_ratio_ci(
    x: ArrayLike,
    y: ArrayLike,
    *,
    rng: np.random.Generator,
    groups: ArrayLike | None = None,
    reps: int = BOOTSTRAP_REPS,
    confidence: float = CONFIDENCE,
) -> PairedRatio:
    """x/y over pairs ``(x[i], y[i])`` measured together: exp(IQM(log(x/y))) and its paired percentile-bootstrap CI.

    The pairs are resampled as units, so what the two sides shared (the machine's load while the pair ran)
    cancels. ``groups`` (one label per pair; e.g. the pair of processes that measured it): a two-level
    bootstrap that resamples groups, then pairs inside each drawn group, so what a group's pairs share
    widens the CI instead of hiding in it. The IQM, the report's own point estimate, keeps a pair that
    another job disturbed from moving the estimate; in log terms x/y and y/x are reciprocal. With one pair
    the CI is (nan, nan).
    """
    xa, ya = np.asarray(x, dtype=float).ravel(), np.asarray(y, dtype=float).ravel()
    if xa.shape != ya.shape or xa.size == 0:
        raise ValueError(f"paired_ratio_ci: {xa.size} and {ya.size} values are not pairs")
    if not (np.all(xa > 0) and np.all(ya > 0)):
        raise ValueError("paired_ratio_ci: every value must be > 0")
    logs = np.log(xa / ya)
    point = float(np.exp(iqm(logs)))
    labels = np.zeros(logs.size, int) if groups is None else np.asarray(groups).ravel()
    if labels.size != logs.size:
        raise ValueError(f"paired_ratio_ci: {labels.size} group labels for {logs.size} pairs")
    members = [logs[labels == g] for g in dict.fromkeys(labels.tolist())]
    if len(members) == 1:
        lo, hi = stratified_bootstrap_ci(members, statistic=_iqm_last, rng=rng, reps=reps, confidence=confidence)
        return PairedRatio(point, float(np.exp(lo)), float(np.exp(hi)), int(xa.size))
    stats = np.empty(reps)
    for r in range(reps):
        drawn = [members[i] for i in rng.integers(0, len(members), len(members))]
        stats[r] = iqm(np.concatenate([m[rng.integers(0, m.size, m.size)] for m in drawn]))
    tail = (1.0 - confidence) / 2.0 * 100.0
    lo, hi = np.percentile(stats, [tail, 100.0 - tail])
    return PairedRatio(point, float(np.exp(lo)), float(np.exp(hi)), int(xa.size))


def probability_of_improvement(x: ArrayLike, y: ArrayLike) -> float:
    """P(X > Y) as rliable defines it for one task: the Mann-Whitney U statistic over all pairs / (n_x n_y).

    A pair counts 1 when x > y and 0.5 on a tie. Higher scores are better.
    """
    xa, ya = np.asarray(x, dtype=float).ravel(), np.asarray(y, dtype=float).ravel()
    if xa.size == 0 or ya.size == 0:
        return np.nan
    diff = xa[:, None] - ya[None, :]
    return float(np.mean((diff > 0) + 0.5 * (diff == 0)))


def rank_test_p(x: ArrayLike, y: ArrayLike) -> float:
    """Two-sided p-value of the Mann-Whitney U test of X against Y (exact for small samples without ties).

    What a bootstrap cannot give from few seeds: with 3 seeds each, every resample of three seeds of X above three
    of Y is still above them, so the percentile CI of P(X > Y) is [1.00, 1.00] whatever the spread; the exact rank
    test says how often that ordering comes by chance (1 in 10 for 3 against 3, two-sided)."""
    xa, ya = np.asarray(x, dtype=float).ravel(), np.asarray(y, dtype=float).ravel()
    if xa.size == 0 or ya.size == 0:
        return np.nan
    return float(mannwhitneyu(xa, ya, alternative="two-sided").pvalue)


def probability_of_improvement_ci(
    x: ArrayLike,
    y: ArrayLike,
    *,
    rng: np.random.Generator,
    reps: int = BOOTSTRAP_REPS,
    confidence: float = CONFIDENCE,
) -> tuple[float, float]:
    """Bootstrap CI of :func:`probability_of_improvement`, resampling X and Y independently (as rliable)."""
    xa, ya = np.asarray(x, dtype=float).ravel(), np.asarray(y, dtype=float).ravel()
    if (xa.size < 2 and ya.size < 2) or xa.size == 0 or ya.size == 0:
        return (np.nan, np.nan)
    xs = xa[rng.integers(0, xa.size, size=(reps, xa.size))]
    ys = ya[rng.integers(0, ya.size, size=(reps, ya.size))]
    diff = xs[:, :, None] - ys[:, None, :]
    p = np.mean((diff > 0) + 0.5 * (diff == 0), axis=(1, 2))
    tail = (1.0 - confidence) / 2.0 * 100.0
    lo, hi = np.percentile(p, [tail, 100.0 - tail])
    return (float(lo), float(hi))


def interpolate_curve(x: ArrayLike, y: ArrayLike, grid: ArrayLike) -> NDArray[np.float64]:
    """One seed's curve on ``grid``: linear between its points, NaN outside [first x, last x] (no extrapolation).

    Points with a NaN y (no episode completed there) are dropped first; x need not be sorted.
    """
    xa, ya, g = (np.asarray(a, dtype=float) for a in (x, y, grid))
    keep = np.isfinite(xa) & np.isfinite(ya)
    xa, ya = xa[keep], ya[keep]
    if xa.size == 0:
        return np.full(g.shape, np.nan)
    order = np.argsort(xa, kind="stable")
    return np.asarray(np.interp(g, xa[order], ya[order], left=np.nan, right=np.nan), dtype=float)


def mean_curve_ci(
    values: ArrayLike,
    *,
    rng: np.random.Generator,
    reps: int = BOOTSTRAP_REPS,
    confidence: float = CONFIDENCE,
) -> tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.float64], NDArray[np.int64]]:
    """Mean over seeds at each grid point, with a bootstrap CI over the seeds present there.

    ``values`` has shape (seeds, grid points), NaN where a seed has no value (before its first or
    after its last point). Returns (mean, ci_low, ci_high, n): the mean is NaN where no seed has a
    value, the CI is NaN where fewer than two do.
    """
    v = np.asarray(values, dtype=float)
    if v.ndim != 2:
        raise ValueError(f"values must be (seeds, grid points), got shape {v.shape}")
    present = np.isfinite(v)
    n = present.sum(axis=0)
    mean = np.full(v.shape[1], np.nan)
    lo, hi = np.full_like(mean, np.nan), np.full_like(mean, np.nan)
    has = n > 0
    mean[has] = np.nansum(np.where(present, v, 0.0), axis=0)[has] / n[has]
    tail = (1.0 - confidence) / 2.0 * 100.0
    # Columns sharing the same set of present seeds are resampled together: few such sets exist
    # (seeds differ only in where their curves start and end).
    patterns, inverse = np.unique(present, axis=1, return_inverse=True)
    for k in range(patterns.shape[1]):
        rows = np.flatnonzero(patterns[:, k])
        if rows.size < 2:
            continue
        cols = np.flatnonzero(inverse.ravel() == k)
        sub = v[np.ix_(rows, cols)]  # (seeds present, columns)
        idx = rng.integers(0, rows.size, size=(reps, rows.size))
        boot = sub[idx].mean(axis=1)  # (reps, columns)
        lo[cols], hi[cols] = np.percentile(boot, [tail, 100.0 - tail], axis=0)
    return mean, lo, hi, n.astype(np.int64)


@dataclass(frozen=True)
class ReportStats:
    """Every number a report shows, as tidy frames (one row per engine x workers unless said)."""

    final_return: pd.DataFrame  # engine, workers, n_seeds, iqm, ci_low, ci_high
    return_at_wall: pd.DataFrame  # engine, workers, n_seeds, wall_s, iqm, ci_low, ci_high (see return_at_wall_table)
    curves_steps: pd.DataFrame  # engine, workers, x (env steps), mean, ci_low, ci_high, n
    curves_wall: pd.DataFrame  # engine, workers, x (s), mean, ci_low, ci_high, n
    time_to_target: pd.DataFrame  # engine, workers, n_seeds, n_reached, median_steps, ... (see time_to_target)
    throughput: pd.DataFrame  # engine, workers, n_seeds, median, min, max (env steps/s)
    scaling: pd.DataFrame  # engine, workers, baseline_workers, throughput, speedup, efficiency
    improvement: pd.DataFrame  # workers, engine_x, engine_y, n_x, n_y, p, ci_low, ci_high, rank_p
    cost: pd.DataFrame  # engine, workers, n_seeds, peak_rss_mb, cpu_seconds, setup_s (medians)
    problems: pd.DataFrame  # trial, engine, workers, seed, status, reason (every non-FINISHED trial)
    agent_return: pd.DataFrame  # multi-agent envs: engine, workers, agent, n_seeds, iqm, ci_low, ci_high
    target_return: float  # NaN when the spec sets none
    budget_env_steps: int
    # worker counts whose trials ended at different env steps: the final return compared at the most every trial
    # reached (at_common_step): workers, engine, ..., common_step, steps_min, steps_max; empty where none differ
    final_at_common: pd.DataFrame = field(default_factory=pd.DataFrame)
    improvement_at_common: pd.DataFrame = field(default_factory=pd.DataFrame)
    # convergence scaling (reports/scaling.py): per engine with 2+ worker counts and a target; empty otherwise
    convergence: pd.DataFrame = field(default_factory=pd.DataFrame)
    convergence_fits: pd.DataFrame = field(default_factory=pd.DataFrame)  # Amdahl and USL, 3+ worker counts
    batch_note: str = ""  # which batch scaling the trials ran (reports.scaling.batch_note); "" where untagged
    stop_at_target: bool = False  # the counted trials stopped on reaching the target (budget.stop_at_target)


def engine_sort_key(engine: str) -> tuple[int, str]:
    """crossrl, rllib, torchrl first (in that order), then other engine ids alphabetically."""
    return (ENGINE_ORDER.index(engine) if engine in ENGINE_ORDER else len(ENGINE_ORDER), engine)


def _groups(counted: pd.DataFrame) -> list[tuple[str, int, pd.DataFrame]]:
    out = [(str(e), int(w), g) for (e, w), g in counted.groupby(["engine", "workers"], sort=False)]
    return sorted(out, key=lambda t: (engine_sort_key(t[0]), t[1]))


def wide_points(points: pd.DataFrame, metrics: Sequence[str]) -> pd.DataFrame:
    """The long history as one row per (run_id, step) and one column per metric (NaN where absent)."""
    sub = points[points["metric"].isin(list(metrics))]
    wide = sub.groupby(["run_id", "step", "metric"], sort=True)["value"].last().unstack("metric")
    return wide.reindex(columns=list(metrics)).reset_index()


def final_return_table(counted: pd.DataFrame, *, rng: np.random.Generator) -> pd.DataFrame:
    """IQM of ``final_return_mean`` over seeds with its stratified-bootstrap 95% CI, per engine x workers."""
    rows = []
    for engine, workers, g in _groups(counted):
        x = g[M.FINAL_RETURN_MEAN].to_numpy(dtype=float)
        x = x[np.isfinite(x)]
        lo, hi = stratified_bootstrap_ci([x], statistic=_iqm_last, rng=rng)
        value = float(iqm(x)) if x.size else np.nan
        rows.append(dict(engine=engine, workers=workers, n_seeds=int(x.size), iqm=value, ci_low=lo, ci_high=hi))
    return pd.DataFrame(rows, columns=["engine", "workers", "n_seeds", "iqm", "ci_low", "ci_high"])


def return_at_wall_table(counted: pd.DataFrame, wide: pd.DataFrame, *, rng: np.random.Generator) -> pd.DataFrame:
    """The return every engine reached after the same training wall time: IQM over seeds with its CI.

    The time is the shortest training wall time among the counted trials (every trial trained at least
    that long; with ``budget.train_seconds`` it is about the budget). Each trial's score there is the
    mean return of its episodes completed in the last 10 % of that time (each point's mean weighted by
    its episode count), as ``final_return_mean`` is over env steps.
    """
    cols = ["engine", "workers", "n_seeds", "wall_s", "iqm", "ci_low", "ci_high"]
    runs = wide[wide["run_id"].isin(counted["run_id"])].dropna(subset=[M.WALL_TIME_S])
    if runs.empty:
        return pd.DataFrame(columns=cols)
    horizon = float(runs.groupby("run_id")[M.WALL_TIME_S].max().min())
    per_run = _return_up_to(runs, M.WALL_TIME_S, horizon)
    rows = []
    for engine, workers, g in _groups(counted):
        x = per_run.reindex(g["run_id"]).to_numpy(dtype=float)
        x = x[np.isfinite(x)]
        lo, hi = stratified_bootstrap_ci([x], statistic=_iqm_last, rng=rng)
        value = float(iqm(x)) if x.size else np.nan
        rows.append(
            dict(engine=engine, workers=workers, n_seeds=int(x.size), wall_s=horizon, iqm=value, ci_low=lo, ci_high=hi)
        )
    return pd.DataFrame(rows, columns=cols)


def _return_up_to(runs: pd.DataFrame, x: str, end: float) -> pd.Series:
    """Each run's mean return over the points in the last 10 % of ``x`` up to ``end`` (weighted by their episode
    counts), as ``final_return_mean`` is taken; a run with no episode ending there (iterations longer than the window)
    counts at its last point before ``end`` instead."""
    before = runs[runs[x] <= end].dropna(subset=[M.EPISODE_RETURN_MEAN])
    window = before[before[x] >= 0.9 * end]
    weights = window[M.EPISODES_THIS_POINT].fillna(1.0) if M.EPISODES_THIS_POINT in window else 1.0
    weighted = window.assign(w=weights, wr=weights * window[M.EPISODE_RETURN_MEAN])
    per_run = weighted.groupby("run_id")["wr"].sum() / weighted.groupby("run_id")["w"].sum()
    return per_run.combine_first(before.sort_values(x).groupby("run_id")[M.EPISODE_RETURN_MEAN].last())


UNEQUAL_STEPS = (
    0.9  # trials of one worker count "ended at different env steps" when the fewest is below 90 % of the most
)


def at_common_step(counted: pd.DataFrame, wide: pd.DataFrame, last_step: pd.Series) -> pd.DataFrame:
    """Where the trials of a worker count ended at different env steps (time budgets, an engine's big batches): each
    trial's return at the largest env step every one of them reached, as ``final_return_mean`` is taken (the mean of
    its episodes in the last 10 % of that many env steps, or its last point before it where none ended there).

    Returns ``counted`` with ``final_return_mean`` replaced by that value and the columns ``common_step``,
    ``steps_min``, ``steps_max`` added, for the worker counts whose trials differ; empty when none do. Trials that
    stop on reaching the target (``budget.stop_at_target``) end at different env steps by design: at the env steps
    the first of them stopped, the others are still learning, so those worker counts are left out (their final
    returns are compared as they are, and the time to target is their measure)."""
    out = []
    for _, g in counted.groupby("workers", sort=True):
        if "stop_at_target" in g and g["stop_at_target"].astype(bool).any():
            continue
        steps = last_step.reindex(g["run_id"]).to_numpy(dtype=float)
        if not np.isfinite(steps).all() or steps.min() >= UNEQUAL_STEPS * steps.max():
            continue
        common = float(steps.min())
        value = _return_up_to(wide[wide["run_id"].isin(g["run_id"])], "step", common)
        out.append(
            g.assign(
                **{M.FINAL_RETURN_MEAN: value.reindex(g["run_id"]).to_numpy(dtype=float)},
                common_step=int(common),
                steps_min=int(steps.min()),
                steps_max=int(steps.max()),
            )
        )
    return pd.concat(out, ignore_index=True) if out else pd.DataFrame()


def curves_table(
    counted: pd.DataFrame, wide: pd.DataFrame, *, x_metric: str, rng: np.random.Generator, grid_points: int
) -> pd.DataFrame:
    """Mean return and CI per engine x workers on one grid of ``x_metric`` shared by every group."""
    cols = ["engine", "workers", "x", "mean", "ci_low", "ci_high", "n"]
    has = wide[wide["run_id"].isin(counted["run_id"])].dropna(subset=[x_metric, M.EPISODE_RETURN_MEAN])
    if has.empty:
        return pd.DataFrame(columns=cols)
    grid = np.linspace(float(has[x_metric].min()), float(has[x_metric].max()), grid_points)
    by_run = {rid: g for rid, g in has.groupby("run_id", sort=False)}
    frames = []
    for engine, workers, g in _groups(counted):
        runs = [by_run[r] for r in g["run_id"] if r in by_run]
        if not runs:
            continue
        values = np.stack([interpolate_curve(r[x_metric], r[M.EPISODE_RETURN_MEAN], grid) for r in runs])
        mean, lo, hi, n = mean_curve_ci(values, rng=rng)
        frames.append(pd.DataFrame(dict(engine=engine, workers=workers, x=grid, mean=mean, ci_low=lo, ci_high=hi, n=n)))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=cols)


def time_to_target(counted: pd.DataFrame, last_wall: pd.Series, last_step: pd.Series) -> pd.DataFrame:
    """Median env steps and wall seconds to the target per engine x workers, censored where not reached.

    A seed that never reached the target counts as +inf, so the median is NaN and ``median_reached``
    False ("not reached in N steps") whenever half the seeds or more did not reach it (an even count
    splits on an unreached seed, so it counts as not reached); ``steps_censored_at`` (the most env steps an
    unreached seed sampled: the env-step budget, or less where a time budget stopped it first, then
    ``censored_by`` says "time budget") and
    ``wall_censored_at`` (the longest training wall time of an unreached seed, s) say how long they
    tried. Per-seed values are kept (``None`` = not reached) for the figure.
    """
    rows = []
    for engine, workers, g in _groups(counted):
        steps = g[M.STEPS_TO_TARGET].to_numpy(dtype=float)
        wall = g[M.WALL_S_TO_TARGET].to_numpy(dtype=float)
        reached = np.isfinite(steps)
        med_steps = float(np.median(np.where(reached, steps, np.inf))) if steps.size else np.inf
        med_wall = float(np.median(np.where(np.isfinite(wall), wall, np.inf))) if wall.size else np.inf
        unreached_wall = last_wall.reindex(g.loc[~reached, "run_id"]).to_numpy(dtype=float)
        sampled = last_step.reindex(g.loc[~reached, "run_id"]).to_numpy(dtype=float)
        budget = int(g["budget_env_steps"].max() or 0)
        # a miss counts at what it sampled: the env-step budget, or less where a time budget (or a failure to
        # reach the budget's last point) stopped it first
        censored = int(np.nanmax(sampled)) if np.isfinite(sampled).any() else budget
        rows.append(
            dict(
                engine=engine,
                workers=workers,
                n_seeds=int(steps.size),
                n_reached=int(reached.sum()),
                median_reached=bool(np.isfinite(med_steps)),
                median_steps=med_steps if np.isfinite(med_steps) else None,
                median_wall_s=med_wall if np.isfinite(med_wall) else None,
                steps_censored_at=censored,
                censored_by="time budget" if budget and censored < budget else "",
                wall_censored_at=float(np.nanmax(unreached_wall)) if np.isfinite(unreached_wall).any() else None,
                seeds=[int(s) for s in g["seed"]],
                steps_per_seed=[float(s) if np.isfinite(s) else None for s in steps],
                wall_s_per_seed=[float(s) if np.isfinite(s) else None for s in wall],
            )
        )
    return pd.DataFrame(rows)


def throughput_tables(counted: pd.DataFrame, wide: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Sampling throughput (env steps/s) and its scaling per engine x workers.

    Per trial: the median over its iterations of ``sample_throughput``; then per group the median
    over seeds, with the min and max as spread. Speedup is against the engine's 1-worker group (or
    its smallest worker count, named in ``baseline_workers``); efficiency = speedup / (workers / baseline).
    ``shared``: how many of the group's trials ran beside other trials on their node (a sweep with
    ``--parallel``), so that their speed was contended.
    """
    per_trial = wide.groupby("run_id")[M.SAMPLE_THROUGHPUT].median()
    rows = []
    for engine, workers, g in _groups(counted):
        t = per_trial.reindex(g["run_id"]).to_numpy(dtype=float)
        t = t[np.isfinite(t)]
        rows.append(
            dict(
                engine=engine,
                workers=workers,
                n_seeds=int(t.size),
                median=float(np.median(t)) if t.size else np.nan,
                min=float(t.min()) if t.size else np.nan,
                max=float(t.max()) if t.size else np.nan,
                shared=int(g["node_shared"].sum()) if "node_shared" in g else 0,
            )
        )
    thr = pd.DataFrame(rows, columns=["engine", "workers", "n_seeds", "median", "min", "max", "shared"])
    scale_rows = []
    for engine, g in thr.groupby("engine", sort=False):
        g = g.dropna(subset=["median"])
        if g.empty:
            continue
        base_w = int(g["workers"].min())
        base = float(g.loc[g["workers"] == base_w, "median"].iloc[0])
        for _, r in g.iterrows():
            speedup = float(r["median"]) / base if base > 0 else np.nan
            scale_rows.append(
                dict(
                    engine=engine,
                    workers=int(r["workers"]),
                    baseline_workers=base_w,
                    throughput=float(r["median"]),
                    speedup=speedup,
                    efficiency=speedup / (int(r["workers"]) / base_w),
                )
            )
    scaling = pd.DataFrame(
        scale_rows, columns=["engine", "workers", "baseline_workers", "throughput", "speedup", "efficiency"]
    )
    return thr, scaling


def improvement_table(counted: pd.DataFrame, *, rng: np.random.Generator) -> pd.DataFrame:
    """P(engine_x's final return > engine_y's) per worker count, for every pair of engines."""
    rows = []
    for workers, g in sorted(counted.groupby("workers"), key=lambda t: int(t[0])):  # type: ignore[arg-type]
        engines = sorted(g["engine"].unique(), key=engine_sort_key)
        finals = {
            e: (v := g.loc[g["engine"] == e, M.FINAL_RETURN_MEAN].to_numpy(dtype=float))[np.isfinite(v)]
            for e in engines
        }
        for i, ex in enumerate(engines):
            for ey in engines[i + 1 :]:
                x, y = finals[ex], finals[ey]
                lo, hi = probability_of_improvement_ci(x, y, rng=rng)
                rows.append(
                    dict(
                        workers=int(workers),
                        engine_x=ex,
                        engine_y=ey,
                        n_x=int(x.size),
                        n_y=int(y.size),
                        p=probability_of_improvement(x, y),
                        ci_low=lo,
                        ci_high=hi,
                        rank_p=rank_test_p(x, y),
                    )
                )
    cols = ["workers", "engine_x", "engine_y", "n_x", "n_y", "p", "ci_low", "ci_high", "rank_p"]
    return pd.DataFrame(rows, columns=cols)


def agent_return_table(counted: pd.DataFrame, points: pd.DataFrame, *, rng: np.random.Generator) -> pd.DataFrame:
    """Multi-agent envs: each agent's final return per engine x workers (empty for single-agent runs).

    Per trial, the agent's mean return over the episodes completed in the last 10 % of the env steps (each
    point weighted by its episode count), as the team's ``final_return_mean``; then IQM over seeds with the
    stratified-bootstrap CI. The agents' figures add up to about the team's final return.
    """
    cols = ["engine", "workers", "agent", "n_seeds", "iqm", "ci_low", "ci_high"]
    suffix = "." + M.EPISODE_RETURN_MEAN
    names = sorted({m for m in points["metric"].unique() if m.startswith(M.AGENT_PREFIX) and m.endswith(suffix)})
    if not names:
        return pd.DataFrame(columns=cols)
    wide = wide_points(points[points["run_id"].isin(counted["run_id"])], [*names, M.EPISODES_THIS_POINT])
    per_run: dict[str, pd.Series] = {}
    for run_id, g in wide.groupby("run_id", sort=False):
        tail = g[g["step"] >= 0.9 * g["step"].max()]
        w = tail[M.EPISODES_THIS_POINT].fillna(1.0)
        per_run[str(run_id)] = pd.Series(
            {n: float((w * tail[n]).sum() / w[tail[n].notna()].sum()) for n in names if tail[n].notna().any()}
        )
    rows = []
    for engine, workers, g in _groups(counted):
        for name in names:
            x = np.array([per_run[r].get(name, np.nan) for r in g["run_id"] if r in per_run], dtype=float)
            x = x[np.isfinite(x)]
            if not x.size:
                continue
            lo, hi = stratified_bootstrap_ci([x], statistic=_iqm_last, rng=rng)
            agent = name[len(M.AGENT_PREFIX) : -len(suffix)]
            rows.append(
                dict(engine=engine, workers=workers, agent=agent, n_seeds=int(x.size), iqm=float(iqm(x)), ci_low=lo,
                     ci_high=hi)
            )  # fmt: skip
    return pd.DataFrame(rows, columns=cols)


def cost_table(counted: pd.DataFrame) -> pd.DataFrame:
    """Median over seeds of peak RSS (MiB), CPU seconds and set-up seconds, per engine x workers."""
    cols = ["peak_rss_mb", "cpu_seconds", "setup_s"]
    rows = []
    for engine, workers, g in _groups(counted):
        row: dict[str, object] = dict(engine=engine, workers=workers, n_seeds=len(g))
        for c in cols:
            v = g[c].to_numpy(dtype=float) if c in g else np.array([])
            v = v[np.isfinite(v)]
            row[c] = float(np.median(v)) if v.size else np.nan
        rows.append(row)
    return pd.DataFrame(rows, columns=["engine", "workers", "n_seeds", *cols])


def compute(
    *, trials: pd.DataFrame, points: pd.DataFrame, rng: np.random.Generator, grid_points: int = GRID_POINTS
) -> ReportStats:
    """All of a report's statistics from the store's two frames (see reports.store.Loaded)."""
    counted = trials[trials["status"] == COUNTED_STATUS]
    wide = wide_points(points, [M.EPISODE_RETURN_MEAN, M.WALL_TIME_S, M.SAMPLE_THROUGHPUT, M.EPISODES_THIS_POINT])
    last_wall = wide.groupby("run_id")[M.WALL_TIME_S].max()
    last_step = wide.groupby("run_id")["step"].max()
    thr, scaling = throughput_tables(counted, wide)
    bad = trials[trials["status"] != COUNTED_STATUS]
    problems = bad[["trial", "engine", "workers", "seed", "status", "reason"]].reset_index(drop=True)
    targets = trials["target_return"].dropna() if "target_return" in trials else pd.Series([], dtype=float)
    return ReportStats(
        final_return=final_return_table(counted, rng=rng),
        return_at_wall=return_at_wall_table(counted, wide, rng=rng),
        curves_steps=curves_table(counted, wide, x_metric="step", rng=rng, grid_points=grid_points),
        curves_wall=curves_table(counted, wide, x_metric=M.WALL_TIME_S, rng=rng, grid_points=grid_points),
        time_to_target=time_to_target(counted, last_wall, last_step) if len(targets) else pd.DataFrame(),
        throughput=thr,
        scaling=scaling,
        improvement=improvement_table(counted, rng=rng),
        cost=cost_table(counted),
        problems=problems,
        agent_return=agent_return_table(counted, points, rng=rng),
        target_return=float(targets.iloc[0]) if len(targets) else np.nan,
        budget_env_steps=int(trials["budget_env_steps"].max()) if len(trials) else 0,
        **_convergence(counted, last_wall, last_step, wide, rng=rng, has_target=bool(len(targets))),
        **_at_common(counted, wide, last_step, rng=rng),
        batch_note=_batch_note(counted),
        stop_at_target=bool("stop_at_target" in counted and counted["stop_at_target"].astype(bool).any()),
    )


def _batch_note(counted: pd.DataFrame) -> str:
    from crossrl.reports import scaling as SC

    return SC.batch_note(counted)


def _at_common(
    counted: pd.DataFrame, wide: pd.DataFrame, last_step: pd.Series, *, rng: np.random.Generator
) -> dict[str, pd.DataFrame]:
    common = at_common_step(counted, wide, last_step)
    if common.empty:
        return {}
    table = final_return_table(common, rng=rng)
    spans = common.groupby("workers")[["common_step", "steps_min", "steps_max"]].first().reset_index()
    return {
        "final_at_common": table.merge(spans, on="workers", how="left"),
        "improvement_at_common": improvement_table(common, rng=rng),
    }


def _convergence(
    counted: pd.DataFrame,
    last_wall: pd.Series,
    last_step: pd.Series,
    wide: pd.DataFrame,
    *,
    rng: np.random.Generator,
    has_target: bool,
) -> dict[str, pd.DataFrame]:
    """Convergence scaling and its fitted models, where the spec has a target and an engine several worker counts."""
    if not has_target or counted.empty or counted.groupby("engine")["workers"].nunique().max() < 2:
        return {}
    from crossrl.reports import scaling as SC

    times = SC.seed_times(counted, last_wall, last_step)
    table = SC.convergence_table(times, rng=rng)
    if not (table["speedup"].notna() & (table["workers"] > table.groupby("engine")["workers"].transform("min"))).any():
        return {}  # no engine reached the target at two worker counts: nothing to scale (a smoke run's tiny budget)
    per_trial = wide.groupby("run_id")[M.SAMPLE_THROUGHPUT].median()
    fits = SC.convergence_fits(times, rng=rng) + SC.throughput_fits(counted, per_trial, rng=rng)
    return {"convergence": table, "convergence_fits": SC.fits_frame(fits)}
