"""Benchmark: build a report for 100 trials x 200 points of synthetic data and print the time.

Run from the repository root: ``.venv/bin/python tests/reports/bench_report.py [--repeat 3]``.
Target: under 5 s per build on 2 cores.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import tempfile
import time
from pathlib import Path

from crossrl.reports.render import build_report


def _synthetic_frames():  # type: ignore[no-untyped-def]
    # The generator lives in the tests' conftest (shared with the pytest fixtures); load it by path.
    path = Path(__file__).with_name("conftest.py")
    spec = importlib.util.spec_from_file_location("crossrl_reports_conftest", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.synthetic_frames


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=3, help="builds to time (the median is reported)")
    args = parser.parse_args()
    # 4 engines x 5 worker counts x 5 seeds = 100 trials, 200 points each (15 metrics a point).
    trials, points, meta = _synthetic_frames()(
        engines=("crossrl", "rllib", "torchrl", "mystack"),
        workers=(1, 2, 4, 8, 16),
        seeds=(0, 1, 2, 3, 4),
        n_points=200,
        budget=200_000,
    )
    print(f"input: {len(trials)} trials, {points.run_id.nunique()} with history, {len(points):,} metric rows")
    times, cpu = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeat):
            t0, c0 = time.perf_counter(), time.process_time()
            paths = build_report(trials=trials, points=points, meta=meta, out_dir=Path(tmp) / f"r{i}")
            times.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
        sizes = ", ".join(
            f"{p.name} {p.stat().st_size / 1024:.0f} KiB" for p in (paths.html, paths.markdown, paths.json)
        )
    # CPU seconds too: on a shared machine the wall time mostly measures the other tenants.
    print(
        f"build_report: wall median {statistics.median(times):.2f} s (min {min(times):.2f}, max {max(times):.2f}), "
        f"CPU median {statistics.median(cpu):.2f} s, over {len(times)} builds; {sizes}"
    )


if __name__ == "__main__":
    main()
