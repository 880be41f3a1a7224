"""`crossrl bench sampling --sweep`: each engine's layouts for the same envs within the process cap, the sweep's
rounds, early stop and best layout (a fake measurement), and a tiny real sweep through the CLI."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from crossrl.measure.bench.layouts import (
    SWEEP_ENGINES,
    candidates,
    fixed_layout,
    grid,
    label,
    max_processes,
    processes,
    sweep,
    total_envs,
)
from crossrl.measure.bench.results import print_layout_sweep
from crossrl.measure.bench.samplers import BenchError, SamplerResult
from crossrl.reports.store import ResultsStore
from crossrl.scenarios.spec import EnvSpec, ModelSpec

SIZES = [(1, 2), (1, 8), (2, 8), (2, 4), (4, 4), (3, 8)]


@pytest.mark.parametrize("engine", SWEEP_ENGINES)
@pytest.mark.parametrize(("workers", "envs"), SIZES)
@pytest.mark.parametrize("cores", [1, 2, 4])
def test_grids_keep_the_envs_within_the_process_cap_and_start_with_the_fixed_layout(
    engine: str, workers: int, envs: int, cores: int
) -> None:
    fixed = fixed_layout(engine, workers=workers, envs_per_worker=envs, fragment=250)
    lays = grid(engine, workers=workers, envs_per_worker=envs, cores=cores, fragment=250, native_vector=True)
    assert lays[0] == fixed
    assert len({json.dumps(lay, sort_keys=True) for lay in lays}) == len(lays)  # no layout twice
    for lay in lays:
        assert total_envs(engine, lay) == workers * envs, lay
        if lay is not lays[0]:  # the fixed layout is kept whatever its processes
            assert processes(engine, lay) <= max_processes(cores) == 2 * cores, lay
    if engine == "crossrl":
        assert len(lays) <= 2  # its fixed layout and at most one more
    if engine == "rllib":  # every iteration samples the same batch: the fragment is the bench's, or a quarter
        assert {lay["fragment"] for lay in lays} <= {250, 62}
    if engine == "torchrl":
        assert {lay["frames_per_batch"] for lay in lays} <= {250 * workers * envs, 62 * workers * envs}
    # capped at `points`, fixed first
    assert grid(engine, workers=workers, envs_per_worker=envs, cores=cores, fragment=250, points=2)[0] == fixed
    assert len(grid(engine, workers=workers, envs_per_worker=envs, cores=cores, fragment=250, points=2)) <= 2


def test_the_grid_at_2_x_8_on_2_cores() -> None:
    """The layouts a maintainer asks about are there: RLlib's local env runner and native vector env, TorchRL's
    in-process Collector over gymnasium's vector env; ASYNC (one process per env) is over the cap."""
    rl = [label("rllib", x) for x in grid("rllib", workers=2, envs_per_worker=8, cores=2, native_vector=True)]
    assert rl[:3] == [
        "2 runners x 8 SYNC, fragment 250",
        "local runner x 16 SYNC, fragment 250",
        "2 runners x 8 native vector, fragment 250",
    ]
    assert not any("ASYNC" in x for x in rl) and "4 runners x 4 SYNC, fragment 250" in rl
    assert not any("native" in label("rllib", x) for x in grid("rllib", workers=2, envs_per_worker=8, cores=2))
    tr = [label("torchrl", x) for x in grid("torchrl", workers=2, envs_per_worker=8, cores=2)]
    assert tr[:3] == [
        "MultiSync 2 x gym Sync(8), 4000 frames",
        "Collector gym Sync(16), 4000 frames",
        "Collector SerialEnv(16), 4000 frames",
    ]  # the fixed one: the adapter's default, gym_sync
    assert "Collector ParallelEnv(2 x SerialEnv(8)), 4000 frames" in tr and not any("Async(" in x for x in tr)
    every = candidates("torchrl", workers=2, envs_per_worker=8, fragment=250, cap=4)
    assert processes("torchrl", next(x for x in every if x["env"] == "gym_async" and x["workers"] == 1)) == 17


def _fake(speeds: dict[str, list[float]], calls: list[str]) -> Any:
    """A measure() that returns the next speed of the point named by its label (crossrl: by workers)."""

    def measure(engine: str, **kw: Any) -> SamplerResult:
        key = label(engine, kw["layout"]) if kw.get("layout") else f"{kw['workers']} x {kw['envs_per_worker']}"
        calls.append(f"{engine}: {key}")
        seq = speeds.get(f"{engine}: {key}", [100.0])
        speed = seq[min(sum(c == f"{engine}: {key}" for c in calls) - 1, len(seq) - 1)]
        if speed < 0:
            raise BenchError(f"{engine}: measurement process exited with 1; log:\nboom")
        cpu = {"machine_busy_cpus": 1.5, "workers_cpus": 1.0, "driver_cpus": 0.1}
        return SamplerResult(engine, kw["workers"], kw["envs_per_worker"], [speed], cpu=cpu, layout=kw.get("layout"))

    return measure


def test_sweep_interleaves_rounds_stops_slow_points_and_picks_each_engines_best() -> None:
    speeds = {
        "rllib: local runner x 16 SYNC, fragment 250": [300.0, 310.0, 290.0],  # rllib's best
        "rllib: 2 runners x 8 native vector, fragment 250": [120.0],  # < 0.5 x 300: stops after round 1
        "rllib: 2 runners x 8 SYNC, fragment 250": [100.0, 100.0, 100.0],  # fixed: never stops
        "torchrl: Collector gym Sync(16), 4000 frames": [-1.0],  # fails: left out
        "crossrl: 2 x 8": [400.0],
        "crossrl: 1 x 16": [350.0],
    }
    calls: list[str] = []
    res = sweep(EnvSpec(id="CartPole-v1"), workers=2, envs_per_worker=8, repeat=3, seconds=1.0, fragment=250,
                model=ModelSpec(), cores=2, points=3, measure_fn=_fake(speeds, calls))  # fmt: skip
    assert calls[:3] == ["crossrl: 2 x 8", "rllib: 2 runners x 8 SYNC, fragment 250",
                         "torchrl: MultiSync 2 x gym Sync(8), 4000 frames"]  # fmt: skip
    assert len(res.of("rllib")) == len(res.of("torchrl")) == 3 and len(res.of("crossrl")) == 2  # crossrl has 2
    native = next(p for p in res.of("rllib") if "native" in p.label)
    assert native.stopped_early and len(native.samples) == 1
    assert len(res.fixed("rllib").samples) == 3 and not res.fixed("rllib").stopped_early
    failed = next(p for p in res.of("torchrl") if p.label.startswith("Collector gym Sync"))
    assert failed.error and not failed.samples and failed.stopped_after == 0
    assert res.best("rllib").label == "local runner x 16 SYNC, fragment 250"
    assert res.best("rllib").median == max(p.median for p in res.of("rllib"))
    r = res.ratios()["rllib"]
    assert r["crossrl_fixed_over_best"] == pytest.approx(400 / 300) and r["crossrl_fixed_over_fixed"] == 4.0
    m = res.metrics()
    assert m["rllib.best_over_fixed"] == pytest.approx(3.0) and m["crossrl.fixed_over_rllib_best"] == pytest.approx(
        4 / 3
    )
    assert m["rllib.fixed.cpu_us_per_step"] == pytest.approx(1e6 * 1.1 / 100)
    doc = res.to_dict()
    assert len(doc["points"]) == len(res.points) and doc["engines"]["rllib"]["stopped_early"] == [native.label]
    print_layout_sweep(res)  # prints without failing on stopped, failed and unmeasured points


def test_a_failing_fixed_layout_fails_the_sweep() -> None:
    speeds = {"rllib: 2 runners x 8 SYNC, fragment 250": [-1.0]}
    with pytest.raises(BenchError):
        sweep(EnvSpec(id="CartPole-v1"), workers=2, envs_per_worker=8, engines=["rllib"], repeat=1, fragment=250,
              model=ModelSpec(), cores=2, points=2, measure_fn=_fake(speeds, []))  # fmt: skip


@pytest.mark.integration
@pytest.mark.system
@pytest.mark.long(3)
def test_a_tiny_sweep_through_the_cli(tmp_path: Path) -> None:
    """2 layouts of every engine on CartPole, 1 round: every point measured, each engine's best is its fastest point, the
    grid in JSON and PNG, a bench run of kind sampling-sweep in the store."""
    results = tmp_path / "results"
    out = tmp_path / "sweep.json"
    cmd = [sys.executable, "-m", "crossrl.cli", "bench", "sampling", "--sweep", "--env", "CartPole-v1"]
    cmd += ["--workers", "1", "--envs-per-worker", "2", "--points", "2", "--repeat", "1", "--seconds", "1"]
    cmd += ["--fragment", "64", "--json", str(out), "--results-dir", str(results)]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    wall = time.perf_counter() - t0
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "experiment bench-sampling-sweep" in proc.stdout and "crossrl (fixed) / rllib's best" in proc.stdout
    data = json.loads(out.read_text())
    assert data["bench"] == "sampling-sweep" and data["conditions"]["total_envs"] == 2
    points = data["points"]
    assert sorted(p["engine"] for p in points) == ["crossrl", "crossrl", "rllib", "rllib", "torchrl", "torchrl"]
    for p in points:
        assert p["steps_per_s"]["median"] > 0, p
        assert p["cpus"]["cpu_us_per_step"] > 0, p
    for engine in SWEEP_ENGINES:
        mine = [p for p in points if p["engine"] == engine]
        [fixed] = [p for p in mine if p["fixed"]]
        assert fixed["layout"] == fixed_layout(engine, workers=1, envs_per_worker=2, fragment=64)
        best = max(mine, key=lambda p: p["steps_per_s"]["median"])
        summary = data["engines"][engine]
        assert summary["best"] == best["label"] and summary["fixed"] == fixed["label"]
        assert summary["best_over_fixed"] == pytest.approx(
            best["steps_per_s"]["median"] / fixed["steps_per_s"]["median"]
        )
    assert set(data["ratios"]) == {"rllib", "torchrl"}
    png = out.with_suffix(".png")
    assert data["figure"] == str(png) and png.stat().st_size > 5000 and png.read_bytes()[:4] == b"\x89PNG"
    store = ResultsStore(None, results_dir=results)
    exp = store.client.get_experiment_by_name("bench-sampling-sweep")
    assert exp is not None
    [run] = store.client.search_runs([exp.experiment_id])
    assert run.data.tags["bench"] == "sampling-sweep"
    assert run.data.metrics["rllib.best.steps_per_s"] == pytest.approx(data["engines"]["rllib"]["best_steps_per_s"])
    print(f"tiny sweep: {wall:.0f} s")
