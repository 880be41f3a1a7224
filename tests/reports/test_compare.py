"""Algorithms compared in one report (reports/compare.py) on synthetic tidy frames with known answers."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from crossrl.reports.compare import CompareError, build, check_comparable, compare_table, verdicts
from crossrl.scenarios import metrics as M


def _frames(to_target: dict[str, list[float]], engine: str = "rllib") -> tuple[pd.DataFrame, pd.DataFrame]:
    """One trial per (algorithm, seed): steps to target (NaN = missed), a 10-point history up to 10,000 steps."""
    trials, points = [], []
    for algorithm, steps in to_target.items():
        for seed, s in enumerate(steps):
            run = f"{engine}-{algorithm}-{seed}"
            trials.append({"run_id": run, "engine": engine, "algorithm": algorithm, "seed": seed, "workers": 1,
                           "status": M.FINISHED, M.STEPS_TO_TARGET: s, M.WALL_S_TO_TARGET: s / 1000,
                           M.FINAL_RETURN_MEAN: -150.0 if math.isfinite(s) else -400.0, "target_return": -200.0,
                           "budget_env_steps": 10_000})  # fmt: skip
            for i in range(1, 11):
                step = i * 1000
                points.append({"run_id": run, "step": step, "metric": M.WALL_TIME_S, "value": step / 1000})
                ret = -200.0 if math.isfinite(s) and step >= s else -800.0
                points.append({"run_id": run, "step": step, "metric": M.EPISODE_RETURN_MEAN, "value": ret})
    return pd.DataFrame(trials), pd.DataFrame(points)


def test_the_faster_algorithm_is_named_with_its_ratio() -> None:
    trials, points = _frames({"sac": [1000.0, 1000.0, 2000.0], "ppo": [5000.0, 6000.0, 5000.0]})
    table = compare_table(trials, points, rng=np.random.default_rng(0))
    (line,) = verdicts(table, -200.0)
    assert line.startswith("On rllib, to -200: in env steps, sac 1,000")
    assert "5.0x fewer than ppo 5,000" in line
    assert "in seconds, sac 1.0 s" in line


def test_a_miss_is_censored_at_the_steps_it_sampled() -> None:
    trials, points = _frames({"sac": [1000.0, 2000.0, 1000.0], "ppo": [math.nan, math.nan, 4000.0]})
    table = compare_table(trials, points, rng=np.random.default_rng(0)).set_index("algorithm")
    assert not table.loc["ppo", "median_reached"]
    assert table.loc["ppo", "median_steps"] == 10_000  # the misses count at the 10,000 steps they sampled
    assert table.loc["ppo", "n_reached"] == 1
    (line,) = verdicts(table.reset_index(), -200.0)
    assert "ppo did not reach it (1/3 seeds" in line


def test_too_few_seeds_name_no_fastest() -> None:
    trials, points = _frames({"sac": [1000.0, 1000.0], "ppo": [5000.0, 5000.0]})
    (line,) = verdicts(compare_table(trials, points, rng=np.random.default_rng(0)), -200.0)
    assert "too few seeds to name the fastest" in line
    assert "fewer than" not in line


def test_scenarios_on_different_envs_are_refused() -> None:
    a = {"env": {"id": "Pendulum-v1"}, "algorithm": {"name": "sac"}, "target": {"episode_return_mean": -200}}
    with pytest.raises(CompareError, match="different envs"):
        check_comparable([a, {**a, "env": {"id": "CartPole-v1"}, "algorithm": {"name": "ppo"}}])
    with pytest.raises(CompareError, match="2\\+ algorithms"):
        check_comparable([a, a])
    check_comparable([a, {**a, "algorithm": {"name": "ppo"}}])


def test_the_report_renders_html_markdown_json_and_figure(tmp_path: Path) -> None:
    sac = _frames({"sac": [1000.0, 1000.0, 2000.0], "ppo": [5000.0, 6000.0, 5000.0]})
    tor = _frames({"sac": [2000.0, 2000.0, 2000.0], "ppo": [3000.0, 3000.0, 3000.0]}, engine="torchrl")
    trials, points = (pd.concat([x, y], ignore_index=True) for x, y in zip(sac, tor, strict=True))
    paths = build(trials, points, env_id="Pendulum-v1", scenarios=["p-sac", "p-ppo"], out_dir=tmp_path)
    md = paths.markdown.read_text()
    assert "On rllib, to -200" in md and "On torchrl, to -200" in md
    assert "| rllib | sac | 3/3 |" in md
    assert "<svg" in paths.html.read_text() and (tmp_path / "figures" / "algorithms.svg").exists()
    doc = json.loads(paths.json.read_text())
    assert {(r["engine"], r["algorithm"]) for r in doc["algorithms"]} == {
        ("rllib", "sac"), ("rllib", "ppo"), ("torchrl", "sac"), ("torchrl", "ppo")}  # fmt: skip


def test_an_algorithm_is_first_only_where_the_rank_test_supports_it_and_alone_where_only_it_reached() -> None:
    five = {"sac": [1000.0, 1000.0, 2000.0, 1000.0, 2000.0], "ppo": [5000.0, 6000.0, 5000.0, 7000.0, 6000.0]}
    (line,) = verdicts(compare_table(*_frames(five), rng=np.random.default_rng(0)), -200.0)
    assert "in env steps, sac first, 1,000" in line and "in seconds, sac first, 1.0 s" in line
    assert "sooner than ppo" in line and "not a difference" not in line
    three = {"sac": [1000.0, 1000.0, 2000.0], "ppo": [5000.0, 6000.0, 5000.0]}  # exact p = 0.10 at best
    (line,) = verdicts(compare_table(*_frames(three), rng=np.random.default_rng(0)), -200.0)
    assert "first" not in line and "not a difference the seeds support" in line
    alone = {"sac": [1000.0, 2000.0, 1000.0], "ppo": [math.nan, math.nan, math.nan]}
    (line,) = verdicts(compare_table(*_frames(alone), rng=np.random.default_rng(0)), -200.0)
    assert "in env steps, only sac reaches it, 1,000" in line and "ppo did not reach it (0/3 seeds" in line
