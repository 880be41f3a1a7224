"""reports.stats on arrays small enough to check by hand, and against independent implementations."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import stats as sps

from crossrl.reports import stats as S
from crossrl.scenarios import metrics as M


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def test_iqm_by_hand() -> None:
    assert S.iqm([1, 2, 3, 4]) == pytest.approx(2.5)  # drops 1 and 4
    assert S.iqm([1, 2, 3, 4, 5, 6, 7, 8]) == pytest.approx(4.5)  # mean of 3, 4, 5, 6
    assert S.iqm([10, 0, 100, 1]) == pytest.approx(5.5)  # order does not matter: middle two are 1 and 10
    assert S.iqm([1, 2, 30]) == pytest.approx(11.0)  # under 4 values nothing is cut
    assert S.iqm([7.0]) == pytest.approx(7.0)


def test_bootstrap_ci_two_values_spans_both() -> None:
    # Resampling [0, 1] gives means 0, 0.5, 1 with probability 1/4, 1/2, 1/4: the 2.5% and 97.5%
    # percentiles of 2000 draws are 0 and 1.
    lo, hi = S.stratified_bootstrap_ci([[0.0, 1.0]], statistic=S._mean_last, rng=rng())
    assert (lo, hi) == (0.0, 1.0)


def test_bootstrap_ci_constant_and_single_seed() -> None:
    assert S.stratified_bootstrap_ci([[3.0, 3.0, 3.0]], statistic=S._iqm_last, rng=rng()) == (3.0, 3.0)
    lo, hi = S.stratified_bootstrap_ci([[3.0]], statistic=S._iqm_last, rng=rng())
    assert math.isnan(lo) and math.isnan(hi)  # one seed: no interval, not a zero-width one


def test_bootstrap_is_stratified() -> None:
    # Stratum A is always [0, 0]; stratum B always [10, 10]: every resample keeps two of each, so the
    # mean is exactly 5. An unstratified bootstrap over the four values would spread over 0..10.
    lo, hi = S.stratified_bootstrap_ci([[0.0, 0.0], [10.0, 10.0]], statistic=S._mean_last, rng=rng())
    assert (lo, hi) == (5.0, 5.0)


def test_bootstrap_matches_scipy_percentile_bootstrap() -> None:
    x = np.array([412.0, 455.0, 470.0, 390.0, 498.0, 430.0, 461.0, 445.0])
    lo, hi = S.stratified_bootstrap_ci([x], statistic=S._mean_last, rng=rng(1), reps=20_000)
    ref = sps.bootstrap((x,), np.mean, n_resamples=20_000, method="percentile", rng=np.random.default_rng(2))
    assert lo == pytest.approx(ref.confidence_interval.low, abs=3.0)
    assert hi == pytest.approx(ref.confidence_interval.high, abs=3.0)


def test_bootstrap_is_reproducible_with_the_same_rng_seed() -> None:
    x = [1.0, 5.0, 2.0, 8.0, 3.0]
    a = S.stratified_bootstrap_ci([x], statistic=S._iqm_last, rng=rng(7))
    b = S.stratified_bootstrap_ci([x], statistic=S._iqm_last, rng=rng(7))
    assert a == b


def test_probability_of_improvement_by_hand() -> None:
    assert S.probability_of_improvement([1, 2], [0, 3]) == pytest.approx(0.5)  # 1>0, 2>0; 3 beats both
    assert S.probability_of_improvement([1, 2], [1]) == pytest.approx(0.75)  # tie counts 1/2, 2>1
    assert S.probability_of_improvement([5, 6], [1, 2, 3]) == 1.0
    assert S.probability_of_improvement([1], [5]) == 0.0
    # P(X > Y) + P(Y > X) = 1 (ties split evenly)
    x, y = [3, 1, 4, 1, 5], [9, 2, 6, 5, 3]
    assert S.probability_of_improvement(x, y) + S.probability_of_improvement(y, x) == pytest.approx(1.0)
    # The Mann-Whitney U statistic divided by n_x n_y is the same number.
    u = sps.mannwhitneyu(x, y).statistic
    assert S.probability_of_improvement(x, y) == pytest.approx(u / 25)


def test_probability_of_improvement_ci() -> None:
    lo, hi = S.probability_of_improvement_ci([5, 6, 7], [1, 2, 3], rng=rng())
    assert (lo, hi) == (1.0, 1.0)  # every resample of X beats every resample of Y
    lo, hi = S.probability_of_improvement_ci([1], [2], rng=rng())
    assert math.isnan(lo) and math.isnan(hi)


def test_interpolate_curve_does_not_extrapolate() -> None:
    grid = [0, 5, 10, 15, 20, 25]
    got = S.interpolate_curve([20, 10], [40.0, 20.0], grid)  # unsorted on purpose
    np.testing.assert_allclose(got, [np.nan, np.nan, 20.0, 30.0, 40.0, np.nan])
    # NaN returns (no episode completed at that point) are skipped, not interpolated through as 0.
    got = S.interpolate_curve([0, 10, 20], [0.0, np.nan, 20.0], [10])
    np.testing.assert_allclose(got, [10.0])
    assert np.isnan(S.interpolate_curve([], [], [1, 2])).all()


def test_mean_curve_ci_counts_only_present_seeds() -> None:
    v = np.array(
        [
            [1.0, 2.0, 3.0, np.nan],
            [3.0, 4.0, 5.0, 6.0],
            [np.nan, 6.0, 7.0, np.nan],
        ]
    )
    mean, lo, hi, n = S.mean_curve_ci(v, rng=rng())
    np.testing.assert_allclose(mean, [2.0, 4.0, 5.0, 6.0])
    np.testing.assert_array_equal(n, [2, 3, 3, 1])
    assert np.isnan(lo[3]) and np.isnan(hi[3])  # one seed there: no CI
    # Columns 1 and 2 are the same seeds shifted by 1, so their intervals shift by exactly 1.
    assert lo[2] - lo[1] == pytest.approx(1.0) and hi[2] - hi[1] == pytest.approx(1.0)
    assert lo[1] >= 2.0 and hi[1] <= 6.0 and lo[1] < 4.0 < hi[1]
    # Two values 1 and 3: resampled means are 1, 2 or 3, so the 95% CI is [1, 3].
    assert (lo[0], hi[0]) == (1.0, 3.0)


def _trials(rows: list[tuple[str, int, int, str, float, float, float]]) -> pd.DataFrame:
    """(engine, workers, seed, status, final return, steps to target, wall s to target) -> a trials frame."""
    return pd.DataFrame(
        [
            dict(
                run_id=f"r{i}",
                trial=f"{e}-ppo-w{w}-s{s}",
                engine=e,
                workers=w,
                seed=s,
                status=st,
                reason="" if st == "FINISHED" else "why",
                target_return=100.0,
                budget_env_steps=1000,
                final_return_mean=fr,
                steps_to_target=stt,
                wall_s_to_target=wst,
                peak_rss_mb=100.0 * w,
                cpu_seconds=10.0,
                setup_s=1.0,
            )
            for i, (e, w, s, st, fr, stt, wst) in enumerate(rows)
        ]
    )


def _points(spec: dict[str, list[tuple[int, float, float, float]]]) -> pd.DataFrame:
    """run_id -> [(step, return, wall s, throughput)] -> the long history frame."""
    rows = []
    for rid, pts in spec.items():
        for step, ret, wall, thr in pts:
            for metric, v in (
                (M.EPISODE_RETURN_MEAN, ret),
                (M.WALL_TIME_S, wall),
                (M.SAMPLE_THROUGHPUT, thr),
                (M.ENV_STEPS_SAMPLED, float(step)),
            ):
                if not math.isnan(v):
                    rows.append((rid, metric, step, v))
    return pd.DataFrame(rows, columns=["run_id", "metric", "step", "value"])


def test_compute_by_hand() -> None:
    nan = math.nan
    trials = _trials(
        [
            ("crossrl", 1, 0, "FINISHED", 100.0, 500.0, 5.0),
            ("crossrl", 1, 1, "FINISHED", 120.0, 700.0, 7.0),
            ("crossrl", 2, 0, "FINISHED", 130.0, 400.0, 2.0),
            ("crossrl", 2, 1, "FINISHED", 110.0, nan, nan),
            ("rllib", 1, 0, "FINISHED", 90.0, nan, nan),
            ("rllib", 1, 1, "FAILED", 500.0, 10.0, 0.1),  # failed: its numbers must not count
        ]
    )
    points = _points(
        {
            "r0": [(0, 0.0, 0.0, 100.0), (500, 100.0, 5.0, 300.0), (1000, 100.0, 10.0, 200.0)],
            "r1": [(0, 20.0, 0.0, 100.0), (500, nan, 5.0, 100.0), (1000, 120.0, 10.0, 100.0)],
            "r2": [(0, 0.0, 0.0, 400.0), (1000, 130.0, 5.0, 400.0)],
            "r3": [(0, 0.0, 0.0, 300.0), (1000, 110.0, 5.0, 500.0)],
            "r4": [(0, 0.0, 0.0, 50.0), (1000, 90.0, 20.0, 50.0)],
            "r5": [(0, 999.0, 0.0, 1e6)],
        }
    )
    st = S.compute(trials=trials, points=points, rng=rng(), grid_points=3)

    fr = st.final_return.set_index(["engine", "workers"])
    assert fr.loc[("crossrl", 1), "iqm"] == pytest.approx(110.0)
    assert fr.loc[("rllib", 1), "n_seeds"] == 1 and math.isnan(fr.loc[("rllib", 1), "ci_low"])

    # Grid 0, 500, 1000. crossrl w1 at 500: seed 0 has 100, seed 1 interpolates 20..120 to 70.
    c = st.curves_steps
    cw1 = c[(c.engine == "crossrl") & (c.workers == 1)]
    np.testing.assert_allclose(cw1["x"], [0, 500, 1000])
    np.testing.assert_allclose(cw1["mean"], [10.0, 85.0, 110.0])

    tt = st.time_to_target.set_index(["engine", "workers"])
    assert tt.loc[("crossrl", 1), "median_steps"] == 600.0 and tt.loc[("crossrl", 1), "median_reached"]
    assert tt.loc[("crossrl", 1), "median_wall_s"] == 6.0
    # One of two seeds not reached: the median lies on an infinite value -> not reached within 1000 steps.
    assert not tt.loc[("crossrl", 2), "median_reached"] and tt.loc[("crossrl", 2), "n_reached"] == 1
    assert tt.loc[("crossrl", 2), "steps_censored_at"] == 1000
    assert tt.loc[("crossrl", 2), "wall_censored_at"] == 5.0  # how long the unreached seed trained
    assert tt.loc[("rllib", 1), "n_seeds"] == 1 and tt.loc[("rllib", 1), "wall_censored_at"] == 20.0

    thr = st.throughput.set_index(["engine", "workers"])
    # Per trial medians: r0 200, r1 100 -> median over seeds 150; r2 400, r3 400 -> 400.
    assert thr.loc[("crossrl", 1), "median"] == 150.0
    assert (thr.loc[("crossrl", 1), "min"], thr.loc[("crossrl", 1), "max"]) == (100.0, 200.0)
    assert thr.loc[("crossrl", 2), "median"] == 400.0
    sc = st.scaling.set_index(["engine", "workers"])
    assert sc.loc[("crossrl", 2), "speedup"] == pytest.approx(400 / 150)
    assert sc.loc[("crossrl", 2), "efficiency"] == pytest.approx(400 / 150 / 2)
    assert sc.loc[("rllib", 1), "speedup"] == 1.0

    imp = st.improvement.set_index(["workers", "engine_x", "engine_y"])
    assert imp.loc[(1, "crossrl", "rllib"), "p"] == 1.0  # 100 and 120 both beat 90 (the failed 500 is out)
    assert list(st.problems["status"]) == ["FAILED"] and list(st.problems["reason"]) == ["why"]
    assert st.target_return == 100.0 and st.budget_env_steps == 1000


def test_compute_without_target_or_points() -> None:
    trials = _trials([("torchrl", 1, 0, "SKIPPED", math.nan, math.nan, math.nan)])
    trials["target_return"] = math.nan
    points = pd.DataFrame({"run_id": [], "metric": [], "step": [], "value": []})
    st = S.compute(trials=trials, points=points, rng=rng())
    assert st.final_return.empty and st.curves_steps.empty and st.time_to_target.empty
    assert math.isnan(st.target_return) and len(st.problems) == 1


def test_speedup_baseline_is_smallest_worker_count_without_one_worker() -> None:
    trials = _trials([("rllib", 2, 0, "FINISHED", 1.0, 1.0, 1.0), ("rllib", 4, 0, "FINISHED", 1.0, 1.0, 1.0)])
    points = _points({"r0": [(10, 1.0, 1.0, 100.0)], "r1": [(10, 1.0, 1.0, 150.0)]})
    sc = S.compute(trials=trials, points=points, rng=rng()).scaling.set_index("workers")
    assert sc.loc[4, "baseline_workers"] == 2 and sc.loc[4, "speedup"] == 1.5
    assert sc.loc[4, "efficiency"] == pytest.approx(0.75)  # 1.5x on twice the workers


def test_return_at_equal_wall_time_is_read_where_every_trial_has_trained() -> None:
    trials = _trials(
        [
            ("crossrl", 1, 0, "FINISHED", 0, 0, 0),
            ("crossrl", 1, 1, "FINISHED", 0, 0, 0),
            ("rllib", 1, 0, "FINISHED", 0, 0, 0),
        ]
    )
    rows = []
    for run_id, last, slope in (("r0", 10, 1.0), ("r1", 8, 2.0), ("r2", 12, 0.0)):
        for t in range(1, last + 1):  # one point a second; the last 10 % of 8 s holds only the point at 8 s
            rows.append(
                {
                    "run_id": run_id,
                    "step": 100 * t,
                    "wall_time_s": float(t),
                    "episode_return_mean": slope * t,
                    "episodes_this_point": 1.0,
                }
            )
    wide = pd.DataFrame(rows)
    table = S.return_at_wall_table(trials, wide, rng=rng()).set_index("engine")
    assert set(table["wall_s"]) == {8.0}  # the shortest trial's training time
    assert table.loc["crossrl", "iqm"] == pytest.approx(12.0) and table.loc["crossrl", "n_seeds"] == 2
    assert table.loc["rllib", "iqm"] == pytest.approx(0.0)


def test_agent_returns_by_hand() -> None:
    """A multi-agent run: each agent's final return over the last 10 % of env steps, weighted by episodes."""
    trials = _trials(
        [
            ("crossrl", 1, 0, "FINISHED", -30.0, math.nan, math.nan),
            ("crossrl", 1, 1, "FINISHED", -20.0, math.nan, math.nan),
        ]
    )
    a0, a1 = M.agent_metric("agent_0"), M.agent_metric("agent_1")
    rows = []
    # r0: the tail (steps >= 900) holds step 950 (1 episode) and 1000 (3 episodes); step 100 is outside it
    for step, v0, v1, n in ((100, -99.0, -99.0, 1.0), (950, -10.0, -20.0, 1.0), (1000, -14.0, -16.0, 3.0)):
        rows += [("r0", a0, step, v0), ("r0", a1, step, v1), ("r0", M.EPISODES_THIS_POINT, step, n)]
    rows += [("r1", a0, 1000, -8.0), ("r1", a1, 1000, -12.0), ("r1", M.EPISODES_THIS_POINT, 1000, 2.0)]
    points = pd.DataFrame(rows, columns=["run_id", "metric", "step", "value"])
    st = S.compute(trials=trials, points=points, rng=rng())
    ar = st.agent_return.set_index("agent")
    assert list(ar.index) == ["agent_0", "agent_1"] and set(ar["n_seeds"]) == {2}
    # r0: agent_0 (1 x -10 + 3 x -14) / 4 = -13, agent_1 (-20 + 3 x -16) / 4 = -17; r1: -8 and -12
    assert ar.loc["agent_0", "iqm"] == pytest.approx((-13.0 - 8.0) / 2)
    assert ar.loc["agent_1", "iqm"] == pytest.approx((-17.0 - 12.0) / 2)
    assert ar.loc["agent_0", "ci_low"] == pytest.approx(-13.0) and ar.loc["agent_0", "ci_high"] == pytest.approx(-8.0)
    # single-agent runs have no per-agent table
    assert S.compute(trials=trials, points=_points({"r0": [(10, 1.0, 1.0, 1.0)]}), rng=rng()).agent_return.empty


def test_a_miss_is_censored_at_the_env_steps_it_sampled_and_a_time_budget_is_named(tmp_path: Path) -> None:
    """Trials a time budget stopped before the env-step budget (30,000) count at what they sampled, in the table's
    text too: "not reached in 20,480 env steps (time budget)", not "in 30,000"."""
    from crossrl.reports.render import build_report

    nan = math.nan
    trials = _trials([("rllib", 1, 0, "FINISHED", 10.0, nan, nan), ("rllib", 1, 1, "FINISHED", 12.0, nan, nan)])
    trials["budget_env_steps"] = 30_000
    points = _points(
        {
            "r0": [(0, 0.0, 0.0, 100.0), (14_336, 10.0, 80.0, 100.0)],
            "r1": [(0, 0.0, 0.0, 100.0), (20_480, 12.0, 80.0, 100.0)],
        }
    )
    st = S.compute(trials=trials, points=points, rng=rng(), grid_points=3)
    [row] = st.time_to_target.to_dict("records")
    assert row["steps_censored_at"] == 20_480 and row["censored_by"] == "time budget"
    meta = {"scenario": "t", "spec": {"name": "t"}, "machine": {}, "versions": {}}
    md = build_report(trials=trials, points=points, meta=meta, out_dir=tmp_path).markdown.read_text()
    assert "not reached in 20,480 env steps (time budget)" in md and "30,000" not in md
    # at the budget: no reason named
    full = _points({"r0": [(0, 0.0, 0.0, 100.0), (30_000, 10.0, 80.0, 100.0)], "r1": [(30_512, 12.0, 80.0, 100.0)]})
    [row] = S.compute(trials=trials, points=full, rng=rng(), grid_points=3).time_to_target.to_dict("records")
    assert row["steps_censored_at"] == 30_512 and row["censored_by"] == ""


def test_trials_that_ended_at_different_env_steps_are_compared_at_the_most_every_one_reached() -> None:
    """A time budget stopped rllib's trials at 7,000 env steps and crossrl's at 15,000; both learn alike per env step.
    The final returns (150 against 70) would crown crossrl; the verdict says the budgets differed and compares at
    7,000, where they tie."""
    from crossrl.reports.verdict import verdict

    rows, curves = [], {}
    for engine, end in (("crossrl", 15_000), ("rllib", 7_000)):
        for seed in range(3):
            rows.append((engine, 1, seed, "FINISHED", end / 100 + seed, math.nan, math.nan))
            curves[f"r{len(rows) - 1}"] = [(s, s / 100 + seed, s / 1000, 100.0) for s in range(1000, end + 1, 1000)]
    trials = _trials(rows)
    trials["budget_env_steps"] = 30_000
    st = S.compute(trials=trials, points=_points(curves), rng=rng(), grid_points=5)
    common = st.final_at_common.set_index("engine")
    assert set(common["common_step"]) == {7_000} and set(common["steps_max"]) == {15_000}
    # the mean of each trial's episodes in 6,300..7,000 env steps: the 7,000 point (70 + seed)
    assert common.loc["crossrl", "iqm"] == pytest.approx(common.loc["rllib", "iqm"]) == pytest.approx(71.0)
    [line] = [x for x in verdict(st) if "inal return" in x]
    assert "Best" not in line and "no clear difference" in line, line
    assert "the trials ended at different env steps (7,000-15,000" in line and "compared at 7,000 env steps" in line
    # equal budgets: no such sentence, and the same data's final returns are compared as they are
    same = trials.copy()
    same_curves = {r: [p for p in pts if p[0] <= 7_000] for r, pts in curves.items()}
    st2 = S.compute(trials=same, points=_points(same_curves), rng=rng(), grid_points=5)
    assert st2.final_at_common.empty
    assert not any("different env steps" in x for x in verdict(st2))


def test_trials_stopped_at_the_target_are_compared_as_they_ended_not_at_the_first_ones_stop() -> None:
    """budget.stop_at_target: crossrl's seeds reach the target (100) at 10,000 env steps and stop, rllib's at 20,000.
    At 10,000 env steps rllib's are half-way (return 50): comparing there would call crossrl better, although both
    ended at the target. The final returns are compared as they are, the verdict says why they sit near the target,
    and the time to target tells them apart."""
    from crossrl.reports.verdict import verdict

    rows, curves = [], {}
    for engine, end in (("crossrl", 10_000), ("rllib", 20_000)):
        for seed in range(3):
            rows.append((engine, 1, seed, "FINISHED", 100.0 + seed, float(end), end / 1000))  # each stopped at 100
            curves[f"r{len(rows) - 1}"] = [
                (s, s / end * 100 + seed, s / 1000, 100.0) for s in range(1000, end + 1, 1000)
            ]
    trials = _trials(rows)
    trials["budget_env_steps"], trials["target_return"] = 50_000, 100.0
    stopping = trials.assign(stop_at_target=True)
    st = S.compute(trials=stopping, points=_points(curves), rng=rng(), grid_points=5)
    assert st.final_at_common.empty and st.stop_at_target
    [line] = [x for x in verdict(st) if "inal return" in x]
    assert "different env steps" not in line and "stopped on reaching the target (100)" in line, line
    # the same trials without the stop (a time budget, say): compared at the 10,000 env steps every one reached
    budgeted = S.compute(trials=trials.assign(stop_at_target=False), points=_points(curves), rng=rng(), grid_points=5)
    assert set(budgeted.final_at_common["common_step"]) == {10_000} and not budgeted.stop_at_target


def test_the_equal_time_table_counts_a_trial_whose_last_point_falls_before_the_window() -> None:
    """A trial whose iterations are longer than 10 % of the time has no episode end in the window: its last point
    before the time counts, so every engine that trained that long has a seed in the table."""
    nan = math.nan
    trials = _trials([("crossrl", 1, 0, "FINISHED", 10.0, nan, nan), ("rllib", 1, 0, "FINISHED", 20.0, nan, nan)])
    points = _points(
        {
            "r0": [(100 * i, float(i), float(i), 100.0) for i in range(11)],  # a point a second to 10 s
            "r1": [(0, 0.0, 0.0, 100.0), (500, 5.0, 4.0, 100.0), (1000, 7.0, 12.0, 100.0)],  # 4 s, then 12 s
        }
    )
    st = S.compute(trials=trials, points=points, rng=rng(), grid_points=3)
    at = st.return_at_wall.set_index("engine")
    assert at.loc["crossrl", "wall_s"] == 10.0  # the shortest training time among the trials
    assert at.loc["rllib", "n_seeds"] == 1 and at.loc["rllib", "iqm"] == 5.0  # its last point before 10 s
    assert at.loc["crossrl", "iqm"] == 9.5  # its points at 9 and 10 s, in the window (9..10 s)
