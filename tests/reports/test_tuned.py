"""The tuned report's tables from a `crossrl tune`'s records: own setting against tuned on the test seeds, engines
against each other at their tuned best, the chosen configuration and its cost, and the sensitivity to the setting."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from crossrl.reports.tuned import (
    TunedData,
    cost_table,
    improvement_between_engines,
    markdown,
    near_best,
    pbt_figure,
    sensitivity_figure,
    sensitivity_table,
    steps_needed,
    verdict_table,
)


def _data() -> TunedData:
    configs = []
    for engine, finals in {"crossrl": [480, 470, 300, 100], "rllib": [450, 200, 150, 90]}.items():
        for i, final in enumerate(finals):
            configs.append(
                {
                    "engine": engine,
                    "label": f"c{i:02d}",
                    "values": {"lr": 1e-4 * (i + 1)},
                    "status": "FINISHED",
                    "final": float(final),
                    "steps_to_target": math.nan,
                    "env_steps": 100_000 if i < 3 else 6_250,
                    "stopped": i == 3,  # ASHA stopped the last one early
                    "cpu_s": 100.0,
                    "setup_s": 15.0,
                }
            )
    tested = []
    for engine, own, tuned in (
        ("crossrl", [400, 410, 420, 430, 440], [490, 495, 500, 500, 500]),
        ("rllib", [150, 160, 170, 180, 190], [440, 450, 460, 470, 480]),
    ):
        for seed, (o, t) in enumerate(zip(own, tuned, strict=True)):
            tested.append(
                {
                    "engine": engine,
                    "role": "shared",
                    "seed": seed,
                    "status": "FINISHED",
                    "final": float(o),
                    "steps_to_target": math.nan,
                }
            )
            tested.append(
                {
                    "engine": engine,
                    "role": "tuned",
                    "seed": seed,
                    "status": "FINISHED",
                    "final": float(t),
                    "steps_to_target": 40_000.0 + seed if t >= 450 else math.nan,
                }
            )
    searches = pd.DataFrame(
        [
            {
                "engine": e,
                "parent_id": f"p-{e}",
                "scheduler": "asha",
                "metric": "final_return",
                "best_config": {"lr": 1e-4},
                "env_steps": 306_250.0,
                "wall_s": 900.0,
                "setup_s": 15.0,
                "best_run": "",
            }
            for e in ("rllib", "crossrl")
        ]
    )
    return TunedData(scenario="s", configs=pd.DataFrame(configs), tested=pd.DataFrame(tested), searches=searches)


def test_own_against_tuned_per_engine_on_the_test_seeds() -> None:
    v = verdict_table(_data(), rng=np.random.default_rng(0)).set_index("engine")
    assert list(v.index) == ["crossrl", "rllib"]  # the engines' usual order
    assert v.loc["rllib", "shared_iqm"] == 170.0 and v.loc["rllib", "tuned_iqm"] == 460.0
    assert v.loc["rllib", "tuned_n"] == 5 and v.loc["rllib", "p_tuned_better"] == 1.0
    assert v.loc["rllib", "tuned_lo"] <= 460.0 <= v.loc["rllib", "tuned_hi"]
    assert v.loc["crossrl", "tuned_reached"] == 5 and v.loc["rllib", "tuned_reached"] == 4
    assert v.loc["crossrl", "tuned_steps_median"] == 40_002.0


def test_engines_against_each_other_at_their_tuned_best() -> None:
    pairs = improvement_between_engines(_data(), rng=np.random.default_rng(0))
    [row] = pairs.to_dict("records")
    assert (row["x"], row["y"]) == ("crossrl", "rllib") and row["p"] == 1.0 and row["n_x"] == row["n_y"] == 5


def test_sensitivity_counts_whole_budget_configurations_near_the_best() -> None:
    s = sensitivity_table(_data()).set_index("engine")
    assert s.loc["crossrl", "configurations"] == 4 and s.loc["crossrl", "whole_budget"] == 3
    assert s.loc["crossrl", "stopped"] == 1 and s.loc["crossrl", "best"] == 480.0
    assert s.loc["crossrl", "near_best"] == 2  # 480 and 470 (within 48); 300 is not
    assert s.loc["rllib", "near_best"] == 1  # 450 alone: its verdict rests on finding that setting
    assert near_best(np.array([-60.0, -62.0, -80.0])) == 2  # negative returns: within 10 % of |best|
    assert near_best(np.array([])) == 0


def test_the_markdown_has_every_table_and_the_cost() -> None:
    md = markdown(_data())
    for heading in ("Own setting against tuned", "Engines against each other", "Chosen configuration", "Sensitivity"):
        assert heading in md
    assert "| rllib | asha | lr=0.0001 | 306,250 | 400 | 900 | 15.0 | 0 |" in md
    c = cost_table(_data()).set_index("engine")
    assert c.loc["rllib", "cpu_s"] == 400.0


def _by_steps() -> TunedData:
    """The same records under a steps_to_target search: crossrl's tuned seeds reach the target in 40,000-40,004 env
    steps, its own seeds miss it (counted at the 100,000-step budget); rllib's tuned seed 0 misses it."""
    data = _data()
    data.searches["metric"] = "steps_to_target"
    data.tested["budget"] = 100_000.0
    data.configs["steps_to_target"] = [30_000.0, 32_000.0, np.nan, np.nan, 60_000.0, 90_000.0, np.nan, np.nan]
    return data


def test_a_steps_to_target_search_compares_env_steps_with_misses_at_the_budget() -> None:
    data = _by_steps()
    assert data.metric == "steps_to_target"
    part = data.tested[(data.tested.engine == "rllib") & (data.tested.role == "tuned")]
    assert steps_needed(part) == [100_000.0, 40_001.0, 40_002.0, 40_003.0, 40_004.0]  # seed 0 missed: its budget
    v = verdict_table(data, rng=np.random.default_rng(0)).set_index("engine")
    assert v.loc["crossrl", "shared_steps_iqm"] == 100_000.0 and v.loc["crossrl", "tuned_steps_iqm"] == 40_002.0
    assert v.loc["crossrl", "p_fewer_steps"] == 1.0  # every tuned seed needs fewer than every own one
    [pair] = improvement_between_engines(data, rng=np.random.default_rng(0)).to_dict("records")
    # P(crossrl needs fewer than rllib): rllib's seed 0 missed; its others tie or beat crossrl's by a step or two
    assert (pair["x"], pair["y"]) == ("crossrl", "rllib") and pair["p"] == pytest.approx(17 / 25)
    s = sensitivity_table(data).set_index("engine")
    assert s.loc["crossrl", "best"] == 30_000.0 and s.loc["crossrl", "near_best"] == 2  # 32,000 <= 33,000
    assert s.loc["rllib", "best"] == 60_000.0 and s.loc["rllib", "near_best"] == 1  # 90,000 is not; misses are not
    md = markdown(data)
    assert "## Env steps to the target, on the test seeds" in md and "| crossrl | 100,000 [" in md
    assert "fewer env steps to the target" in md
    assert "Env steps to the target" not in markdown(_data())  # a final-return search has no such table


def test_the_report_draws_the_sensitivity_and_the_pbt_population() -> None:
    data = _by_steps()
    svg = sensitivity_figure(data)
    assert svg.startswith("<svg") and "crossrl" in svg and "rllib" in svg
    assert pbt_figure(data) is None  # no PBT search
    data.curves = pd.DataFrame(
        [
            {"engine": "rllib", "member": f"rllib-ppo-w2-s7-c0{m}", "step": step, "value": float(step * (m + 1))}
            for m in range(2)
            for step in (500, 1000)
        ]
    )
    data.lineage = {
        "rllib": [{"member": "rllib-ppo-w2-s7-c00", "copied": "rllib-ppo-w2-s7-c01", "env_step": 500, "values": {}}]
    }
    svg = pbt_figure(data)
    assert svg is not None and "c00" in svg and "c01" in svg and "&lt;- c01" in svg  # the exploit, labelled
    md = markdown(data, figures={"tuned-pbt.svg": "the population"})
    assert md.rstrip().endswith("![the population](tuned-pbt.svg)")
    data.tested = pd.DataFrame()  # `crossrl tune --no-test`: the searches' tables and figures alone
    md = markdown(data, figures={"tuned-pbt.svg": "the population"})
    assert "no test-seed runs" in md and "Own setting against tuned" not in md and "## Sensitivity" in md


def test_one_test_seed_gives_no_conclusion_not_a_probability() -> None:
    data = _data()
    data.tested = data.tested[data.tested["seed"] == 0]
    md = markdown(data)
    [row] = [line for line in md.splitlines() if line.startswith("| rllib | ") and "no conclusion" in line]
    assert "no conclusion (one seed)" in row and "0.00" not in row and "1.00" not in row
    assert "| crossrl | " in markdown(_data()) and "no conclusion" not in markdown(_data())  # five seeds: a figure
