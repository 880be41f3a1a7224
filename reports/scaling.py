"""Convergence scaling: do more workers reach the target sooner, by how much, and where do they stop paying?

The measurement of Mnih et al. 2016, Table 2 (the wall-time speedup to a reference score at 1/2/4/8/16 threads),
per engine: for each worker count, the seconds of training each seed took to reach the spec's target (the engine's
set-up excluded; its median beside it) and the env steps it sampled by then. A seed that never reached the target
counts at what it ran (its last training second, its last env step), so a figure built on it is a bound, and the
table says which way:

- **speedup** T(fewest workers) / T(N), the ratio of the median seeds, with a 95 % percentile-bootstrap CI that
  resamples the seeds of both groups independently; a miss among N's seeds makes it an upper bound (N would have
  needed longer), a miss among the fewest's a lower bound, misses in both no bound at all;
- **efficiency**: speedup / (N / fewest);
- **sample cost**: env steps(N) / env steps(fewest), with its CI (IMPALA's and A3C's staleness shows here);
- **worker-seconds to target**: N x T(N), what a cloud bill charges.

Two scaling models are fitted to each engine's speedup (to target, and to its sampling throughput): Amdahl's law
S(n) = 1 / (s + (1 - s) / n) (serial fraction s) and Gunther's Universal Scalability Law S(n) = n / (1 + sigma (n - 1)
+ kappa n (n - 1)) (contention sigma, coherency kappa), n the worker ratio to the fewest. Parameters come with
bootstrap CIs over the seeds; the USL's best count is sqrt((1 - sigma) / kappa) (infinite for kappa = 0). A holdout
check fits on the counts up to :data:`HOLDOUT_FIT_UPTO` and predicts the largest measured count beyond it.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from scipy.optimize import OptimizeWarning, curve_fit

from crossrl.scenarios import metrics as M

BOOTSTRAP_REPS = 2000
CONFIDENCE = 0.95
DOUBLING_GAIN = 0.10  # "a doubling buys less than 10 %": T(N) / T(2N) < 1.10
HOLDOUT_FIT_UPTO = 16  # the honest check: fit on the counts up to 16, predict the next measured one (32)

COLUMNS = [
    "engine", "workers", "n_seeds", "n_reached", "median_wall_s", "median_steps", "setup_s",
    "speedup", "speedup_low", "speedup_high", "bound", "efficiency",
    "sample_cost", "sample_cost_low", "sample_cost_high", "worker_seconds",
]  # fmt: skip


def amdahl(n: np.ndarray | float, s: float) -> np.ndarray | float:
    """Amdahl's law: the speedup at n times the workers when a fraction ``s`` of the work does not parallelise."""
    return 1.0 / (s + (1.0 - s) / np.asarray(n, dtype=float))


def usl(n: np.ndarray | float, sigma: float, kappa: float) -> np.ndarray | float:
    """Gunther's Universal Scalability Law: contention ``sigma`` (queueing) and coherency ``kappa`` (crosstalk)."""
    x = np.asarray(n, dtype=float)
    return x / (1.0 + sigma * (x - 1.0) + kappa * x * (x - 1.0))


@dataclass(frozen=True)
class SeedTimes:
    """One engine's seeds at one worker count: seconds and env steps to the target (or what a miss ran)."""

    workers: int
    wall_s: np.ndarray
    steps: np.ndarray
    reached: np.ndarray  # bool per seed
    setup_s: float = math.nan

    @property
    def any_missed(self) -> bool:
        return bool((~self.reached).any())


def _median_ratio_ci(
    a: np.ndarray, b: np.ndarray, *, rng: np.random.Generator, reps: int = BOOTSTRAP_REPS
) -> tuple[float, float, float]:
    """median(a) / median(b) and its percentile-bootstrap CI, resampling a and b independently."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if a.size == 0 or b.size == 0:
        return (math.nan, math.nan, math.nan)
    point = float(np.median(a) / np.median(b)) if np.median(b) > 0 else math.nan
    if a.size < 2 and b.size < 2:
        return (point, math.nan, math.nan)
    ra = np.median(a[rng.integers(0, a.size, size=(reps, a.size))], axis=1)
    rb = np.median(b[rng.integers(0, b.size, size=(reps, b.size))], axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratios = ra / rb
    ratios = ratios[np.isfinite(ratios)]
    if ratios.size == 0:
        return (point, math.nan, math.nan)
    tail = (1.0 - CONFIDENCE) / 2.0 * 100.0
    lo, hi = np.percentile(ratios, [tail, 100.0 - tail])
    return (point, float(lo), float(hi))


def _bound(base: SeedTimes, other: SeedTimes) -> str:
    """Which way a speedup built on misses is off: "upper" (N missed), "lower" (the fewest missed), "none" (both)."""
    if other.workers == base.workers or not (base.any_missed or other.any_missed):
        return ""
    if base.any_missed and other.any_missed:
        return "none"
    return "upper" if other.any_missed else "lower"


def seed_times(counted: pd.DataFrame, last_wall: pd.Series, last_step: pd.Series) -> dict[str, list[SeedTimes]]:
    """Per engine, its worker counts in order, each with its seeds' times to the target (misses at what they ran)."""
    out: dict[str, list[SeedTimes]] = {}
    for (engine, workers), g in counted.groupby(["engine", "workers"], sort=True):
        steps = g[M.STEPS_TO_TARGET].to_numpy(dtype=float)
        wall = g[M.WALL_S_TO_TARGET].to_numpy(dtype=float)
        reached = np.isfinite(steps) & np.isfinite(wall)
        ran_wall = last_wall.reindex(g["run_id"]).to_numpy(dtype=float)
        ran_steps = last_step.reindex(g["run_id"]).to_numpy(dtype=float)
        setup = g["setup_s"].to_numpy(dtype=float) if "setup_s" in g else np.array([])
        setup = setup[np.isfinite(setup)]
        out.setdefault(str(engine), []).append(
            SeedTimes(
                workers=int(workers),
                wall_s=np.where(reached, wall, ran_wall),
                steps=np.where(reached, steps, ran_steps),
                reached=reached,
                setup_s=float(np.median(setup)) if setup.size else math.nan,
            )
        )
    for groups in out.values():
        groups.sort(key=lambda t: t.workers)
    return out


def convergence_table(times: Mapping[str, Sequence[SeedTimes]], *, rng: np.random.Generator) -> pd.DataFrame:
    """One row per engine x worker count (engines with two counts or more): see the module's docstring."""
    rows = []
    for engine, groups in times.items():
        usable = [g for g in groups if np.isfinite(g.wall_s).any()]
        if len(usable) < 2:
            continue
        base = usable[0]
        for g in usable:
            ok_wall, ok_steps = g.wall_s[np.isfinite(g.wall_s)], g.steps[np.isfinite(g.steps)]
            speedup, s_lo, s_hi = _median_ratio_ci(base.wall_s[np.isfinite(base.wall_s)], ok_wall, rng=rng)
            cost, c_lo, c_hi = _median_ratio_ci(ok_steps, base.steps[np.isfinite(base.steps)], rng=rng)
            if not (base.reached.any() and g.reached.any()):  # a ratio of two run lengths, not of times to target
                speedup = s_lo = s_hi = cost = c_lo = c_hi = math.nan
            median_wall = float(np.median(ok_wall)) if ok_wall.size else math.nan
            rows.append(
                dict(
                    engine=engine,
                    workers=g.workers,
                    n_seeds=int(g.wall_s.size),
                    n_reached=int(g.reached.sum()),
                    median_wall_s=median_wall,
                    median_steps=float(np.median(ok_steps)) if ok_steps.size else math.nan,
                    setup_s=g.setup_s,
                    speedup=speedup,
                    speedup_low=s_lo,
                    speedup_high=s_hi,
                    bound=_bound(base, g),
                    efficiency=speedup / (g.workers / base.workers) if math.isfinite(speedup) else math.nan,
                    sample_cost=cost,
                    sample_cost_low=c_lo,
                    sample_cost_high=c_hi,
                    worker_seconds=g.workers * median_wall,
                )
            )
    return pd.DataFrame(rows, columns=COLUMNS)


# -- scaling models ------------------------------------------------------------------------------------------------


def _fit_one(model: str, n: np.ndarray, s: np.ndarray) -> tuple[float, ...] | None:
    """Least-squares parameters of ``model`` through (1, 1) and the measured speedups (None when it does not fit)."""
    keep = np.isfinite(n) & np.isfinite(s) & (s > 0)
    n, s = n[keep], s[keep]
    if n.size < (2 if model == "amdahl" else 3):
        return None
    f: Callable[..., np.ndarray | float]
    if model == "amdahl":
        f, p0, bounds = amdahl, [0.1], ([0.0], [1.0])
    else:
        f, p0, bounds = usl, [0.05, 0.001], ([0.0, 0.0], [1.0, 1.0])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", OptimizeWarning)
        try:
            params, _ = curve_fit(f, n, s, p0=p0, bounds=bounds, maxfev=20000)
        except (RuntimeError, ValueError):
            return None
    return tuple(float(p) for p in params)


def best_count(sigma: float, kappa: float) -> float:
    """The USL's peak: sqrt((1 - sigma) / kappa) worker ratios (infinite without coherency cost)."""
    if kappa <= 0:
        return math.inf
    return math.sqrt(max(0.0, 1.0 - sigma) / kappa)


@dataclass
class ModelFit:
    """One model fitted to one engine's speedups: parameters with bootstrap CIs, and what it predicts."""

    engine: str
    measure: str  # "time to target" or "throughput"
    model: str  # "amdahl" or "usl"
    params: dict[str, float]
    ci: dict[str, tuple[float, float]]
    base_workers: int
    best_workers: float = math.nan  # the USL's peak in workers (Amdahl's: none, it only flattens)
    predictions: dict[int, float] = field(default_factory=dict)  # worker count -> predicted speedup
    measured: dict[int, float] = field(default_factory=dict)
    holdout: dict[str, float] | None = None  # fit up to HOLDOUT_FIT_UPTO: {"workers", "predicted", "measured"}

    def predict(self, workers: int | float) -> float:
        n = float(workers) / self.base_workers
        if self.model == "amdahl":
            return float(amdahl(n, self.params["s"]))
        return float(usl(n, self.params["sigma"], self.params["kappa"]))


_NAMES = {"amdahl": ("s",), "usl": ("sigma", "kappa")}


def _speedups(groups: Sequence[SeedTimes], resample: np.random.Generator | None) -> tuple[np.ndarray, np.ndarray]:
    base = groups[0]

    def med(x: np.ndarray) -> float:
        x = x[np.isfinite(x)]
        if resample is not None and x.size:
            x = x[resample.integers(0, x.size, x.size)]
        return float(np.median(x)) if x.size else math.nan

    t0 = med(base.wall_s)
    n = np.array([g.workers / base.workers for g in groups], dtype=float)
    return n, np.array([t0 / med(g.wall_s) for g in groups], dtype=float)


def fit_models(
    engine: str,
    measure: str,
    workers: Sequence[int],
    speedup: Sequence[float] | np.ndarray,
    *,
    resampled: Callable[[np.random.Generator], Sequence[float] | np.ndarray] | None = None,
    rng: np.random.Generator,
    reps: int = 300,
    predict: Sequence[int] = (),
) -> list[ModelFit]:
    """Amdahl and USL fitted to ``speedup`` at ``workers`` (relative to the fewest); CIs from ``resampled`` (a
    bootstrap draw of the same speedups) when given; ``predict``: counts to predict (past the measured: marked so)."""
    w = np.asarray(workers, dtype=float)
    s = np.asarray(speedup, dtype=float)
    base = int(w.min())
    n = w / base
    out = []
    for model in ("amdahl", "usl"):
        found = _fit_one(model, n, s)
        if found is None:
            continue
        names = _NAMES[model]
        params = dict(zip(names, found, strict=True))
        draws: list[tuple[float, ...]] = []
        if resampled is not None:
            for _ in range(reps):
                again = _fit_one(model, n, np.asarray(resampled(rng), dtype=float))
                if again is not None:
                    draws.append(again)
        tail = (1.0 - CONFIDENCE) / 2.0 * 100.0
        ci = {
            name: (
                (
                    float(np.percentile([d[i] for d in draws], tail)),
                    float(np.percentile([d[i] for d in draws], 100 - tail)),
                )
                if len(draws) >= 20
                else (math.nan, math.nan)
            )
            for i, name in enumerate(names)
        }
        fit = ModelFit(engine=engine, measure=measure, model=model, params=params, ci=ci, base_workers=base)
        if model == "usl":
            fit.best_workers = best_count(params["sigma"], params["kappa"]) * base
        fit.measured = {int(k): float(v) for k, v in zip(w, s, strict=True) if math.isfinite(v)}
        fit.predictions = {int(k): fit.predict(int(k)) for k in sorted({*map(int, w), *predict})}
        upto = w <= HOLDOUT_FIT_UPTO
        beyond = sorted(int(x) for x in w[~upto])
        if beyond and upto.sum() >= (2 if model == "amdahl" else 3):
            held = _fit_one(model, n[upto], s[upto])
            if held is not None:
                probe = ModelFit(engine, measure, model, dict(zip(names, held, strict=True)), {}, base)
                target = beyond[0]
                fit.holdout = {
                    "workers": float(target),
                    "predicted": probe.predict(target),
                    "measured": float(s[w == target][0]),
                }
        out.append(fit)
    return out


def usable_for_fits(groups: Sequence[SeedTimes]) -> list[SeedTimes]:
    """The worker counts a fit may use: some seed reached the target there, and at the fewest workers."""
    usable = [g for g in groups if np.isfinite(g.wall_s).any() and g.reached.any()]
    return usable if usable and usable[0].workers == groups[0].workers else []


def convergence_fits(
    times: Mapping[str, Sequence[SeedTimes]], *, rng: np.random.Generator, reps: int = 300
) -> list[ModelFit]:
    """Both models on each engine's speedup to target, bootstrapped over its seeds (3 worker counts or more)."""
    fits: list[ModelFit] = []
    for engine, groups in times.items():
        usable = usable_for_fits(groups)
        if len(usable) < 3:
            continue
        workers = [g.workers for g in usable]
        _, point = _speedups(usable, None)
        fits += fit_models(
            engine,
            "time to target",
            workers,
            point,
            resampled=lambda r, u=usable: _speedups(u, r)[1],  # type: ignore[misc,arg-type]
            rng=rng,
            reps=reps,
            predict=[2 * max(workers)],
        )
    return fits


def throughput_fits(
    counted: pd.DataFrame, per_trial: pd.Series, *, rng: np.random.Generator, reps: int = 300
) -> list[ModelFit]:
    """Both models on each engine's sampling-throughput speedup (each trial's median env steps/s over its iterations;
    the ratio of the groups' medians), bootstrapped over the seeds, for engines with 3 worker counts or more."""
    fits: list[ModelFit] = []
    for engine, g in counted.groupby("engine", sort=True):
        groups = []
        for workers, gw in sorted(g.groupby("workers"), key=lambda t: int(t[0])):  # type: ignore[arg-type]
            x = per_trial.reindex(gw["run_id"]).to_numpy(dtype=float)
            x = x[np.isfinite(x) & (x > 0)]
            if x.size:
                groups.append((int(workers), x))
        if len(groups) < 3:
            continue

        def speedups(r: np.random.Generator | None, gs: list[tuple[int, np.ndarray]] = groups) -> np.ndarray:
            meds = [float(np.median(x if r is None else x[r.integers(0, x.size, x.size)])) for _, x in gs]
            return np.array([m / meds[0] for m in meds], dtype=float)

        workers = [w for w, _ in groups]
        fits += fit_models(
            str(engine), "throughput", workers, speedups(None), resampled=speedups, rng=rng, reps=reps,
            predict=[2 * max(workers)],
        )  # fmt: skip
    return fits


def doubling_limit(rows: pd.DataFrame) -> int | None:
    """The fewest workers beyond which a doubling buys less than :data:`DOUBLING_GAIN` (T(N) / T(2N) < 1.10), or None
    when every measured doubling still pays."""
    by_w = {int(r.workers): float(r.median_wall_s) for r in rows.itertuples() if math.isfinite(r.median_wall_s)}
    for w in sorted(by_w):
        if 2 * w in by_w and by_w[2 * w] > 0 and by_w[w] / by_w[2 * w] < 1.0 + DOUBLING_GAIN:
            return w
    return None


def convergence_sentences(table: pd.DataFrame, *, target: float) -> list[str]:
    """The verdict's sentence per engine: how much sooner the most workers reach the target than the fewest, the
    count beyond which a doubling buys less than 10 %, and the cheapest count in worker-seconds."""
    out = []
    for engine, rows in table.groupby("engine", sort=False):
        rows = rows.sort_values("workers")
        fewest, most = rows.iloc[0], rows.iloc[-1]
        if not math.isfinite(most["speedup"]):
            missed = int(fewest["workers"]) if fewest["n_reached"] == 0 else int(most["workers"])
            out.append(
                f"{engine}: no speedup to tell: no seed reached the target at {missed} worker{'s' * (missed != 1)}."
            )
            continue
        bound = {"upper": "at most ", "lower": "at least ", "none": "(misses on both sides) "}.get(
            str(most["bound"]), ""
        )
        ci = (
            f", 95 % CI [{most['speedup_low']:.2f}, {most['speedup_high']:.2f}]"
            if math.isfinite(most["speedup_low"])
            else ""
        )
        reached = f"{int(most['n_reached'])}/{int(most['n_seeds'])} seeds reached {target:g}"
        parts = [
            f"{engine}: {int(most['workers'])} workers reach the target {bound}{most['speedup']:.2f}x sooner than "
            f"{int(fewest['workers'])} ({reached}{ci})"
        ]
        limit = doubling_limit(rows)
        parts.append(
            f"a doubling beyond {limit} worker{'s' * (limit != 1)} buys less than {DOUBLING_GAIN:.0%}"
            if limit is not None
            else "every measured doubling still buys 10 % or more"
        )
        cheap = rows.loc[rows["worker_seconds"].idxmin()]
        parts.append(f"cheapest in worker-seconds: {int(cheap['workers'])} ({cheap['worker_seconds']:,.0f})")
        out.append("; ".join(parts) + ".")
    return out


def fits_frame(fits: Sequence[ModelFit]) -> pd.DataFrame:
    """The fits as rows: engine, measure, model, parameters with CIs, best count, holdout check."""
    rows = []
    for f in fits:
        row: dict[str, object] = dict(engine=f.engine, measure=f.measure, model=f.model, best_workers=f.best_workers)
        for name, value in f.params.items():
            row[name] = value
            row[f"{name}_low"], row[f"{name}_high"] = f.ci.get(name, (math.nan, math.nan))
        if f.holdout:
            row.update({f"holdout_{k}": v for k, v in f.holdout.items()})
        rows.append(row)
    return pd.DataFrame(rows)


def batch_note(counted: pd.DataFrame) -> str:
    """Which batch scaling the trials ran (``execution.scaling``: the ``scaling`` and ``scaling_batch`` columns), in a
    sentence: "Batch: strong scaling, the train batch held fixed and split over the workers (train_batch 4000 at every
    worker count)." Empty where the trials carry no such tags (stored before the setting existed)."""
    if counted.empty or "scaling" not in counted or not counted["scaling"].astype(bool).any():
        return ""
    modes = sorted(set(counted["scaling"]) - {""})
    parts = []
    for mode in modes:
        rows = counted[counted["scaling"] == mode]
        by_count = rows.groupby("workers")["scaling_batch"].first().sort_index()
        values = [str(v).partition("=") for v in by_count]
        key = values[0][0]
        sizes = [int(v[2]) if v[2].isdigit() else v[2] for v in values]
        if len(set(sizes)) == 1:
            sizing = f"{key} {sizes[0]:,} at every worker count" if isinstance(sizes[0], int) else key
        else:
            first, last = by_count.index[0], by_count.index[-1]
            sizing = f"{key} {sizes[0]:,} at {first} worker{'s' if first > 1 else ''} to {sizes[-1]:,} at {last}"
        meaning = (
            "the train batch held fixed and split over the workers"
            if mode == "strong"
            else "a batch per worker held fixed, so the train batch grows with the workers"
        )
        parts.append(f"{mode} scaling, {meaning} ({sizing})")
    return "Batch: " + "; ".join(parts) + " (`execution.scaling`, docs/fairness.md)."
