"""Bench tables from given numbers: ratios to raw and to crossrl, scaling speedup/efficiency, JSON fields."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from crossrl.measure.bench.results import (
    E2ERow,
    E2ETable,
    Overhead,
    SpeedTable,
    add_scaling,
    cpu_bound,
    print_e2e_table,
    print_overhead,
    print_speed_table,
    speed_rows,
)
from crossrl.measure.bench.samplers import SamplerResult


def _r(engine: str, workers: int, *xs: float, optimizer: str | None = None) -> SamplerResult:
    return SamplerResult(engine=engine, workers=workers, envs_per_worker=8, steps_per_s=list(xs), optimizer=optimizer)


def _sampling_rows() -> list:  # type: ignore[type-arg]
    # Interleaved rounds as bench_sampling produces them: one figure per measurement.
    results = []
    for raw, core, rl in [(100_000, 60_000, 1_000), (120_000, 50_000, 2_000), (110_000, 70_000, 1_500)]:
        results += [_r("raw", 1, raw), _r("crossrl", 1, core), _r("rllib", 1, rl)]
    results += [_r("raw", 2, 200_000), _r("crossrl", 2, 90_000)]
    return speed_rows(results)


def test_ratios_are_of_medians_at_the_same_size() -> None:
    rows = {(r.engine, r.workers): r for r in _sampling_rows()}
    raw1, core1, rl1 = rows["raw", 1], rows["crossrl", 1], rows["rllib", 1]
    assert (raw1.median, raw1.min, raw1.max) == (110_000, 100_000, 120_000)
    assert core1.median == 60_000 and rl1.median == 1_500
    assert core1.ratio_to_raw == pytest.approx(60_000 / 110_000)
    assert rl1.ratio_to_crossrl == pytest.approx(1_500 / 60_000)
    assert rl1.ratio_to_raw == pytest.approx(1_500 / 110_000)
    assert raw1.ratio_to_raw == pytest.approx(1.0) and core1.ratio_to_crossrl == pytest.approx(1.0)
    # 2 workers compare with 2 workers only.
    assert rows["crossrl", 2].ratio_to_raw == pytest.approx(0.45)
    assert rows["raw", 2].ratio_to_crossrl == pytest.approx(200_000 / 90_000)


def test_ratio_is_none_without_its_reference() -> None:
    (row,) = speed_rows([_r("rllib", 4, 1000.0)])
    assert row.ratio_to_raw is None and row.ratio_to_crossrl is None


def test_scaling_speedup_and_efficiency_per_contestant() -> None:
    results = [
        _r("crossrl", 1, 400.0, optimizer="sync_samples"),
        _r("crossrl", 4, 1400.0, optimizer="sync_samples"),
        _r("crossrl", 1, 500.0, optimizer="async_samples"),
        _r("crossrl", 4, 2000.0, optimizer="async_samples"),
        _r("rllib", 2, 300.0),
        _r("rllib", 4, 450.0),
    ]
    rows = speed_rows(results, crossrl_label="crossrl/sync_samples")
    add_scaling(rows)
    by = {(r.engine, r.workers): r for r in rows}
    assert by["crossrl/sync_samples", 4].speedup == pytest.approx(3.5)
    assert by["crossrl/sync_samples", 4].efficiency == pytest.approx(0.875)
    assert by["crossrl/async_samples", 4].efficiency == pytest.approx(1.0)
    assert by["crossrl/async_samples", 4].ratio_to_crossrl == pytest.approx(2000 / 1400)
    # rllib's fewest workers are 2: its base is its own 2-worker figure.
    assert by["rllib", 4].speedup == pytest.approx(1.5) and by["rllib", 4].efficiency == pytest.approx(0.75)
    metrics = SpeedTable(kind="scaling", env_id="CartPole-v1", rows=rows).metrics()
    assert metrics["crossrl/sync_samples.w4.efficiency"] == pytest.approx(0.875)
    assert metrics["rllib.w2.steps_per_s"] == 300.0 and "rllib.w2.ratio_to_raw" not in metrics  # no raw row


def test_a_fragment_sweep_scales_each_fragment_against_its_own_base() -> None:
    from rich.console import Console

    def at(engine: str, workers: int, fragment: int, x: float, optimizer: str | None = None) -> SamplerResult:
        r = _r(engine, workers, x, optimizer=optimizer)
        r.fragment = fragment
        return r

    results = [
        at("raw", 1, 64, 400.0), at("crossrl", 1, 64, 380.0, "sync_samples"),
        at("raw", 1, 128, 420.0), at("crossrl", 1, 128, 400.0, "sync_samples"),
        at("raw", 16, 64, 6000.0), at("crossrl", 16, 64, 4560.0, "sync_samples"),
        at("raw", 16, 128, 6300.0), at("crossrl", 16, 128, 5760.0, "sync_samples"),
    ]  # fmt: skip
    rows = speed_rows(results, crossrl_label="crossrl/sync_samples")
    add_scaling(rows)
    by = {(r.engine, r.workers, r.fragment): r for r in rows}
    assert len(rows) == 8  # a row per contestant, worker count and fragment: nothing merged across fragments
    assert by["crossrl/sync_samples", 16, 64].efficiency == pytest.approx(4560 / 16 / 380)  # 75 %
    assert by["crossrl/sync_samples", 16, 128].efficiency == pytest.approx(5760 / 16 / 400)  # 90 %
    assert by["raw", 16, 128].efficiency == pytest.approx(6300 / 16 / 420)
    # ratios compare the same fragment only
    assert by["crossrl/sync_samples", 16, 64].ratio_to_raw == pytest.approx(4560 / 6000)
    assert by["crossrl/sync_samples", 16, 128].ratio_to_raw == pytest.approx(5760 / 6300)
    table = SpeedTable(kind="scaling", env_id="CartPole-v1", rows=rows)
    assert table.fragment_sweep and table.row("crossrl/sync_samples", 16, 128).median == 5760
    metrics = table.metrics()
    assert metrics["crossrl/sync_samples.f128.w16.efficiency"] == pytest.approx(0.9)
    assert metrics["crossrl/sync_samples.f64.w16.efficiency"] == pytest.approx(0.75)
    assert not any(k.startswith("crossrl/sync_samples.w16.") for k in metrics)  # ambiguous in a sweep
    assert {r["fragment"] for r in table.to_dict()["rows"]} == {64, 128}
    con = Console(record=True, width=250)
    print_speed_table(table, console=con)
    text = con.export_text()
    assert "fragment" in text and "90%" in text and "75%" in text
    # One fragment (or one per worker count, as bench sampling's auto fragments): the names stay as they were.
    single = SpeedTable(kind="scaling", env_id="CartPole-v1", rows=[r for r in rows if r.fragment == 64])
    assert not single.fragment_sweep and "crossrl/sync_samples.w16.efficiency" in single.metrics()


def test_sampling_json_has_the_documented_fields(tmp_path: Path) -> None:
    table = SpeedTable(kind="sampling", env_id="CartPole-v1", rows=_sampling_rows(), conditions={"seconds": 3.0})
    doc = json.loads(table.to_json(tmp_path / "out" / "s.json").read_text())
    assert doc["bench"] == "sampling" and doc["schema_version"] == 1 and doc["env_id"] == "CartPole-v1"
    assert len(doc["rows"]) == 5
    for row in doc["rows"]:
        assert {"engine", "workers", "envs_per_worker", "steps_per_s", "ratio_to_raw", "ratio_to_crossrl"} <= set(row)
        assert {"median", "min", "max"} <= set(row["steps_per_s"])
        assert row["steps_per_s"]["min"] <= row["steps_per_s"]["median"] <= row["steps_per_s"]["max"]
    rl = next(r for r in doc["rows"] if r["engine"] == "rllib")
    assert rl["steps_per_s"]["median"] == 1_500 and rl["ratio_to_crossrl"] == pytest.approx(0.025)


def test_cpu_per_step_and_the_cpu_bound_mark() -> None:
    from rich.console import Console

    def measured(workers: int, steps_per_s: list[float], busy: float, stepping: float) -> SamplerResult:
        r = _r("crossrl", workers, *steps_per_s, optimizer="sync_samples")
        r.cpu = {"machine_busy_cpus": busy, "workers_cpus": stepping, "driver_cpus": 0.1}
        return r

    rows = speed_rows(
        [
            measured(1, [400.0], busy=0.2, stepping=0.1),  # 0.2 CPU-s per 400 steps: 500 us a step
            measured(16, [5000.0, 4000.0], busy=1.7, stepping=1.25),  # (1.25 + 0.1) / 4500 steps/s
            measured(16, [6000.0], busy=1.5, stepping=1.5),
            _r("raw", 16, 7000.0),  # no CPU figures: no CPU per step
        ],
        crossrl_label="crossrl/sync_samples",
    )
    add_scaling(rows)
    by = {(r.engine, r.workers): r for r in rows}
    assert by["crossrl/sync_samples", 1].cpus["cpu_us_per_step"] == pytest.approx(500.0)
    # the median over the two 16-worker measurements: 300 and 266.7 us
    assert by["crossrl/sync_samples", 16].cpus["cpu_us_per_step"] == pytest.approx((300.0 + 1.6e6 / 6000) / 2)
    assert "cpu_us_per_step" not in by["raw", 16].cpus
    table = SpeedTable(kind="scaling", env_id="CartPole-v1", rows=rows, conditions={"machine_cores": 2})
    assert table.metrics()["crossrl/sync_samples.w1.cpu_us_per_step"] == pytest.approx(500.0)
    # 16 workers: the machine 1.6 of 2 cores busy (median of 1.7 and 1.5) is CPU-bound; 1 worker is not
    assert cpu_bound(by["crossrl/sync_samples", 16], 2) and not cpu_bound(by["crossrl/sync_samples", 1], 2)
    con = Console(record=True, width=250)
    print_speed_table(table, console=con)
    text = con.export_text()
    assert "1.60 / 1.38 *" in text and "cores were >= 80% busy" in text and "500" in text
    con = Console(record=True, width=250)
    print_speed_table(SpeedTable(kind="scaling", env_id="CartPole-v1", rows=rows[:1], conditions={}), console=con)
    assert "busy: CPU-bound" not in con.export_text()  # cores unknown (older results): no mark


def test_e2e_ratio_and_json(tmp_path: Path) -> None:
    table = E2ETable(
        scenario="cartpole-ppo",
        target=450.0,
        rows=[
            E2ERow("crossrl", [30.0, None, 50.0], [60_000.0, None, 80_000.0], ["FINISHED"] * 3),
            E2ERow("rllib", [100.0, 140.0, 120.0], [90_000.0, 95_000.0, 99_000.0], ["FINISHED"] * 3),
        ],
    )
    assert table.rows[0].reached == 2 and table.rows[0].median_wall_s == 40.0
    assert table.ratio() == pytest.approx(40.0 / 120.0)
    doc = json.loads(table.to_json(tmp_path / "e.json").read_text())
    assert doc["ratio_crossrl_to_rllib"] == pytest.approx(1 / 3)
    assert doc["rows"][0]["median_wall_s"] == 40.0 and doc["rows"][0]["wall_s"][1] is None


def test_overhead_shares_and_json(tmp_path: Path) -> None:
    o = Overhead(
        run_wall_s=50.0,
        log_points_s=0.5,
        store_writes_s=2.0,
        report_build_s=[3.0, 2.0, 4.0],
        help_s=[0.3, 0.4, 0.2, 0.3, 0.5],
        evaluator_peak_rss_mb=[250.0, 260.0],
    )
    doc = json.loads(o.to_json(tmp_path / "o.json").read_text())
    assert doc["log_share"] == pytest.approx(0.01) and doc["store_share"] == pytest.approx(0.04)
    assert doc["report_build_s_median"] == 3.0 and doc["help_s_median"] == 0.3
    assert doc["evaluator_peak_rss_mb_max"] == 260.0


def test_printers_show_the_figures() -> None:
    from rich.console import Console

    con = Console(record=True, width=200)
    rows = _sampling_rows()
    add_scaling(rows)
    print_speed_table(SpeedTable(kind="scaling", env_id="CartPole-v1", rows=rows), console=con)
    print_e2e_table(E2ETable("cartpole-ppo", 450.0, [E2ERow("crossrl", [30.0], [6e4], ["FINISHED"])]), console=con)
    print_overhead(Overhead(10.0, 0.1, 0.2, [1.0], [0.3], [200.0]), console=con)
    text = con.export_text()
    assert "110,000" in text and "0.55" in text  # raw median; crossrl/raw at 1 worker
    assert "1.00%" in text and "200 MiB" in text


def test_e2e_table_from_runner_results() -> None:
    from crossrl.measure.bench.commands import e2e_table
    from crossrl.orchestration.runner import RunOutcome, TrialResult
    from crossrl.scenarios import metrics as M
    from crossrl.scenarios.loader import load

    spec, _ = load("cartpole-ppo", overrides={"engines": ["crossrl", "rllib"], "seeds": [0, 1]})
    wall = {("crossrl", 0): 40.0, ("crossrl", 1): 60.0, ("rllib", 0): 200.0}  # rllib seed 1 never reached 450
    results = [
        TrialResult(
            trial=t,
            run_id=t.name,
            status="FINISHED",
            summary={M.WALL_S_TO_TARGET: wall.get((t.engine, t.seed)), M.STEPS_TO_TARGET: 5e4},
        )
        for t in spec.trials()
    ]
    table = e2e_table(spec, RunOutcome(parent_id="p1", experiment_id="e1", results=results))
    assert [r.engine for r in table.rows] == ["crossrl", "rllib"] and table.target == 450
    crossrl, rllib = table.rows
    assert crossrl.wall_s == [40.0, 60.0] and crossrl.median_wall_s == 50.0
    assert rllib.reached == 1 and rllib.median_wall_s == 200.0
    assert table.ratio() == pytest.approx(0.25) and table.parent_run_id == "p1"
    assert crossrl.limit_s == [] and crossrl.to_limit is None  # no parts timed: no limit

    # With the parts: 5e4 env steps need 5e4 / 1e5 s of raw env and 5e4 / 1e4 s of learning = 5.5 s.
    parts = {"raw_env_steps_per_s": 1e5, "learner_env_steps_per_s": 1e4, "learner_s_per_iteration": 0.4,
             "train_batch": 4000.0}  # fmt: skip
    table = e2e_table(spec, RunOutcome(parent_id="p1", experiment_id="e1", results=results), parts)
    crossrl, rllib = table.rows
    assert crossrl.limit_s == [pytest.approx(5.5)] * 2
    assert crossrl.to_limit == pytest.approx(50.0 / 5.5)  # median of 40 / 5.5 and 60 / 5.5
    assert rllib.to_limit == pytest.approx(200.0 / 5.5)  # the seed that never reached counts for nothing
    assert table.metrics()["crossrl.to_limit"] == pytest.approx(50.0 / 5.5)
    assert table.metrics()["limit.raw_env_steps_per_s"] == 1e5
    from rich.console import Console

    con = Console(record=True, width=250)
    print_e2e_table(table, console=con)
    text = con.export_text()
    assert "x limit" in text and "9.09" in text and "100,000 steps/s" in text


def test_auto_fragment_is_what_ppo_samples_with() -> None:
    from crossrl.measure.bench.commands import auto_fragment

    assert auto_fragment(1, 8) == 500 and auto_fragment(2, 8) == 250 and auto_fragment(3, 8) == 167


def test_every_metric_name_is_one_mlflow_accepts() -> None:
    from mlflow.utils.validation import _validate_metric_name  # the store's own check (it refused "+" once)

    results = []
    for transport in ("calls", "stream"):
        for w, x in ((1, 400.0), (16, 6000.0)):
            results.append(_r("crossrl", w, x, optimizer="sync_samples"))
            results[-1].transport = transport
    rows = speed_rows(results, crossrl_label="crossrl/sync_samples")
    add_scaling(rows)
    metrics = SpeedTable(kind="scaling", env_id="CartPole-v1", rows=rows).metrics()
    assert "crossrl/sync_samples:calls.w16.efficiency" in metrics and "crossrl/sync_samples.w16.efficiency" in metrics
    for name in metrics:
        _validate_metric_name(name)


def test_an_e2e_sweep_table_gives_each_layout_its_iqm_and_marks_the_default_and_the_fastest() -> None:
    from rich.console import Console

    from crossrl.measure.bench.commands import e2e_layouts
    from crossrl.scenarios.loader import load

    spec, _ = load("cartpole-ppo")
    layouts = e2e_layouts(spec)
    assert [label for label, _ in layouts["torchrl"]] == ["gym_sync", "SerialEnv"]  # the default first
    assert [label for label, _ in layouts["rllib"]] == ["SYNC", "native vector"]  # CartPole has its own vector env
    assert layouts["torchrl"][1][1] == {"execution.layout.torchrl.env": "SerialEnv"}
    minatar, _ = load("minatar-breakout-ppo")
    assert [label for label, _ in e2e_layouts(minatar)["rllib"]] == ["SYNC"]

    fast = E2ERow("torchrl", [10.0, 12.0, 11.0, 30.0], [4e4] * 4, ["FINISHED"] * 4, layout="gym_sync",
                  setup_s=[20.0, 22.0, 21.0, 20.0])  # fmt: skip
    slow = E2ERow("torchrl", [25.0, 27.0, None, 26.0], [4e4, 4e4, None, 4e4], ["FINISHED"] * 4, layout="SerialEnv",
                  default_layout=False)  # fmt: skip
    table = E2ETable("cartpole-ppo", 450.0, [fast, slow])
    assert fast.iqm_wall_s == pytest.approx(11.5)  # the middle two of 10, 11, 12, 30
    lo, hi = fast.wall_s_ci or (0.0, 0.0)
    assert 10.0 <= lo <= 11.5 <= hi <= 30.0
    assert table.fastest("torchrl") is fast  # the SerialEnv row missed on one seed: not a candidate
    assert table.metrics()["torchrl/SerialEnv.iqm_wall_s"] == pytest.approx(26.0)
    from mlflow.utils.validation import _validate_metric_name

    for name in table.metrics():  # the store takes them (a name MLflow refuses loses the whole run's figures)
        _validate_metric_name(name)
    con = Console(record=True, width=250)
    print_e2e_table(table, console=con)
    text = con.export_text()
    assert "gym_sync (default, fastest)" in text and "11.5 [" in text and "20.5" in text  # median set-up
    assert "SerialEnv" in text and "3/4" in text
