"""Convergence scaling (reports/scaling.py): speedup to the target with its CI and bound, efficiency, sample cost,
worker-seconds, the verdict's sentence per engine, and Amdahl / USL fits that recover known laws and predict a
held-out count."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from crossrl.reports import scaling as SC
from crossrl.scenarios import metrics as M

WORKERS = (1, 2, 4, 8, 16, 32)


def _counted(law: dict[int, float], *, seeds: int = 5, noise: float = 0.03, miss: dict[int, int] | None = None,
             engine: str = "crossrl", t1: float = 400.0, seed: int = 0) -> tuple[pd.DataFrame, pd.Series, pd.Series]:  # fmt: skip
    """Trials whose seconds to target are t1 / law[w] (x lognormal noise), env steps 10,000 x w**0.2; ``miss``: how
    many seeds of a worker count never reach the target (they ran 1.5x the time and steps)."""
    rng = np.random.default_rng(seed)
    rows, last_wall, last_step = [], {}, {}
    for w, speedup in law.items():
        for s in range(seeds):
            run = f"{engine}-w{w}-s{s}"
            wall = t1 / speedup * float(np.exp(rng.normal(0, noise)))
            steps = 10_000 * w**0.2 * float(np.exp(rng.normal(0, noise)))
            missed = s < (miss or {}).get(w, 0)
            rows.append(
                {
                    "run_id": run, "engine": engine, "workers": w, "seed": s, "setup_s": 5.0 + w,
                    M.STEPS_TO_TARGET: math.nan if missed else steps, M.WALL_S_TO_TARGET: math.nan if missed else wall,
                }
            )  # fmt: skip
            last_wall[run], last_step[run] = wall * 1.5, steps * 1.5
    return pd.DataFrame(rows), pd.Series(last_wall), pd.Series(last_step)


def _table(law: dict[int, float], **kw: object) -> pd.DataFrame:
    counted, wall, steps = _counted(law, **kw)  # type: ignore[arg-type]
    return SC.convergence_table(SC.seed_times(counted, wall, steps), rng=np.random.default_rng(0))


def test_speedup_efficiency_sample_cost_and_worker_seconds_follow_the_seeds() -> None:
    law = {w: float(SC.amdahl(w, 0.05)) for w in WORKERS}
    t = _table(law).set_index("workers")
    assert list(t.index) == list(WORKERS)
    assert t.loc[1, "speedup"] == pytest.approx(1.0) and t.loc[1, "bound"] == ""
    for w in WORKERS:
        assert t.loc[w, "speedup"] == pytest.approx(law[w], rel=0.08), w
        assert t.loc[w, "speedup_low"] <= t.loc[w, "speedup"] <= t.loc[w, "speedup_high"]
        assert t.loc[w, "efficiency"] == pytest.approx(t.loc[w, "speedup"] / w)
        assert t.loc[w, "sample_cost"] == pytest.approx(w**0.2, rel=0.08)  # env steps grow with staleness here
        assert t.loc[w, "worker_seconds"] == pytest.approx(w * t.loc[w, "median_wall_s"])
        assert t.loc[w, "setup_s"] == 5.0 + w and t.loc[w, "n_reached"] == 5


def test_a_miss_counts_at_what_it_ran_and_makes_the_speedup_a_bound() -> None:
    law = {1: 1.0, 2: 1.9, 4: 3.5}
    upper = _table(law, miss={4: 3}).set_index("workers")  # 3 of 5 seeds at 4 workers missed
    assert upper.loc[4, "n_reached"] == 2 and upper.loc[4, "bound"] == "upper"
    assert upper.loc[4, "speedup"] < 3.5 / 1.2  # the misses' longer runs drag the median: a bound, said so
    lower = _table(law, miss={1: 3}).set_index("workers")
    assert lower.loc[2, "bound"] == lower.loc[4, "bound"] == "lower"
    both = _table(law, miss={1: 1, 4: 1}).set_index("workers")
    assert both.loc[4, "bound"] == "none" and both.loc[2, "bound"] == "lower"


def test_the_sentence_names_the_speedup_the_doubling_limit_and_the_cheapest_count() -> None:
    law = {1: 1.0, 2: 1.95, 4: 3.7, 8: 6.0, 16: 6.3, 32: 6.1}  # doubling past 8 buys 5 %
    t = _table(law)
    [line] = SC.convergence_sentences(t, target=450)
    assert line.startswith("crossrl: 32 workers reach the target "), line
    assert "x sooner than 1 (5/5 seeds reached 450, 95 % CI [" in line
    assert "a doubling beyond 8 workers buys less than 10%" in line
    cheapest = int(t.loc[t["worker_seconds"].idxmin(), "workers"])
    assert cheapest == 1 and f"cheapest in worker-seconds: {cheapest} (" in line  # sublinear: one worker is cheapest
    linear = SC.convergence_sentences(_table({w: float(w) for w in (1, 2, 4)}), target=450)[0]
    assert "every measured doubling still buys 10 % or more" in linear
    flat = SC.convergence_sentences(_table({1: 1.0, 2: 1.02, 4: 1.03}), target=450)[0]
    assert "a doubling beyond 1 worker buys less than 10%" in flat
    missed = SC.convergence_sentences(_table(law, miss={32: 3}), target=450)[0]
    assert "reach the target at most " in missed and "2/5 seeds reached 450" in missed


def test_amdahl_and_usl_recover_known_laws_and_predict_the_held_out_count() -> None:
    rng = np.random.default_rng(1)
    amdahl_law = {w: float(SC.amdahl(w, 0.06)) for w in WORKERS}
    counted, wall, steps = _counted(amdahl_law, noise=0.02)
    fits = {f.model: f for f in SC.convergence_fits(SC.seed_times(counted, wall, steps), rng=rng, reps=100)}
    a = fits["amdahl"]
    assert a.params["s"] == pytest.approx(0.06, abs=0.01)
    lo, hi = a.ci["s"]
    assert lo <= a.params["s"] <= hi and lo < 0.06 < hi + 0.005
    assert a.holdout is not None and a.holdout["workers"] == 32
    assert a.holdout["predicted"] == pytest.approx(a.holdout["measured"], rel=0.1)  # fitted up to 16, predicts 32
    assert 64 in a.predictions and 64 not in a.measured  # a prediction past the measured counts, marked by absence

    usl_law = {w: float(SC.usl(w, 0.03, 0.004)) for w in WORKERS}  # peaks near sqrt(0.97 / 0.004) = 15.6
    counted, wall, steps = _counted(usl_law, noise=0.02)
    u = {f.model: f for f in SC.convergence_fits(SC.seed_times(counted, wall, steps), rng=rng, reps=100)}["usl"]
    assert u.params["kappa"] == pytest.approx(0.004, rel=0.35)
    assert u.best_workers == pytest.approx(15.6, rel=0.3)
    assert u.ci["kappa"][0] <= u.params["kappa"] <= u.ci["kappa"][1]
    frame = SC.fits_frame([a, u])
    assert set(frame["model"]) == {"amdahl", "usl"} and {"s", "s_low", "sigma", "kappa_high"} <= set(frame.columns)


def test_one_worker_count_or_a_law_that_cannot_be_fitted_gives_no_row() -> None:
    assert _table({4: 1.0}).empty
    counted, wall, steps = _counted({1: 1.0, 2: 1.8})
    assert SC.convergence_fits(SC.seed_times(counted, wall, steps), rng=np.random.default_rng(0)) == []  # 2 counts
    assert SC.best_count(0.1, 0.0) == math.inf
    assert SC.doubling_limit(pd.DataFrame({"workers": [1, 4], "median_wall_s": [10.0, 9.9]})) is None  # no doubling


def test_the_models_fit_the_sampling_throughput_too() -> None:
    """Each trial's median env steps/s; throughput that follows Amdahl's law with s = 0.1 gives s back."""
    rng = np.random.default_rng(3)
    rows, per_trial = [], {}
    for w in WORKERS:
        for s in range(4):
            run = f"w{w}-s{s}"
            rows.append({"run_id": run, "engine": "torchrl", "workers": w, "seed": s})
            per_trial[run] = 1000.0 * float(SC.amdahl(w, 0.1)) * float(np.exp(rng.normal(0, 0.02)))
    fits = {f.model: f for f in SC.throughput_fits(pd.DataFrame(rows), pd.Series(per_trial), rng=rng, reps=100)}
    assert fits["amdahl"].measure == "throughput" and fits["amdahl"].params["s"] == pytest.approx(0.1, abs=0.015)
    lo, hi = fits["amdahl"].ci["s"]
    assert lo <= fits["amdahl"].params["s"] <= hi
    assert fits["usl"].holdout is not None and fits["usl"].holdout["workers"] == 32


def test_the_report_says_which_batch_scaling_the_trials_ran() -> None:
    def trials(mode: str, batches: dict[int, int], key: str = "train_batch") -> pd.DataFrame:
        rows = [
            {"engine": "crossrl", "workers": w, "scaling": mode, "scaling_batch": f"{key}={b}"}
            for w, b in batches.items()
        ]
        return pd.DataFrame(rows * 2)  # two seeds

    assert SC.batch_note(trials("strong", {1: 4000, 32: 4000})) == (
        "Batch: strong scaling, the train batch held fixed and split over the workers (train_batch 4,000 at every "
        "worker count) (`execution.scaling`, docs/fairness.md)."
    )
    weak = SC.batch_note(trials("weak", {1: 500, 4: 2000, 32: 16000}))
    assert "weak scaling, a batch per worker held fixed, so the train batch grows with the workers" in weak
    assert "(train_batch 500 at 1 worker to 16,000 at 32)" in weak
    split = SC.batch_note(trials("strong", {1: 8, 32: 1}, key="rollout_fragment"))
    assert "(rollout_fragment 8 at 1 worker to 1 at 32)" in split
    assert SC.batch_note(pd.DataFrame({"engine": ["crossrl"], "workers": [1], "scaling": [""]})) == ""  # untagged
