"""Regression verdicts on baselines small enough to check by hand; Markdown and JUnit outputs."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from crossrl.reports.regress import (
    REGRESSION,
    BaselineError,
    check_comparable,
    compare,
    junit_xml,
    markdown,
    read_baseline,
)
from crossrl.scenarios.spec import RegressSpec


def run(thr: list[float], ret: list[float], steps: list[float | None], *, fp: str = "abc", lr: float = 3e-4) -> dict:
    return {
        "schema_version": 1,
        "scenario": "s",
        "fingerprint": fp,
        "spec": {"algorithm": {"hyperparams": {"lr": lr}}, "env": {"id": "CartPole-v1"}},
        "target_return": 100.0,
        "entries": {
            "crossrl/ppo/w2": {
                "seeds": [0, 1, 2],
                "throughput_ratio": thr,
                "final_return": ret,
                "steps_to_target": steps,
            }
        },
    }


TOL = RegressSpec()
BASE = run([0.50, 0.52, 0.55], [60.0, 70.0, 80.0], [1000.0, 1200.0, 1400.0])


def verdicts(current: dict, baseline: dict = BASE) -> dict[str, str]:
    return {c.metric: c.verdict for c in compare(baseline, current, tolerances=TOL)}


def test_unchanged_run_is_no_regression() -> None:
    assert set(verdicts(BASE).values()) == {"ok"}


def test_throughput_drop_beyond_tolerance_and_spread_is_flagged() -> None:
    v = verdicts(run([0.30, 0.31, 0.32], [60.0, 70.0, 80.0], [1000.0, 1200.0, 1400.0]))
    assert v["sample throughput / raw env speed"] == REGRESSION


def test_throughput_drop_inside_the_seeds_spread_is_not_flagged() -> None:
    # median drops 20% (> 15%) but one current seed is as fast as the slowest baseline seed
    v = verdicts(run([0.41, 0.42, 0.55], [60.0, 70.0, 80.0], [1000.0, 1200.0, 1400.0]))
    assert v["sample throughput / raw env speed"] == "ok"


def test_small_drop_within_tolerance_is_not_flagged() -> None:
    v = verdicts(run([0.45, 0.46, 0.47], [60.0, 70.0, 80.0], [1000.0, 1200.0, 1400.0]))  # -12%
    assert v["sample throughput / raw env speed"] == "ok"


def test_final_return_below_ci_is_flagged_unless_target_reached() -> None:
    assert (
        verdicts(run([0.5, 0.52, 0.55], [20.0, 25.0, 30.0], [1000.0, 1200.0, 1400.0]))["final return IQM"] == REGRESSION
    )
    high = run([0.5, 0.52, 0.55], [150.0, 160.0, 170.0], [1000.0, 1200.0, 1400.0])
    base_high = run([0.5, 0.52, 0.55], [300.0, 310.0, 320.0], [1000.0, 1200.0, 1400.0])
    assert verdicts(high, base_high)["final return IQM"] == "ok"  # below the CI, but at/over the target 100


def test_steps_to_target_growth_and_censoring() -> None:
    slower = verdicts(run([0.5, 0.52, 0.55], [60.0, 70.0, 80.0], [1600.0, 1700.0, 1800.0]))
    assert slower["env steps to target"] == REGRESSION  # median 1200 -> 1700 (+42% > 25%)
    never = verdicts(run([0.5, 0.52, 0.55], [60.0, 70.0, 80.0], [None, None, 1300.0]))
    assert never["env steps to target"] == REGRESSION  # median not reached
    assert verdicts(BASE, run([0.5], [1.0], [None]))["env steps to target"] == "n/a"


def test_spec_change_and_missing_engine_are_unusable_input() -> None:
    other = run([0.5], [1.0], [None], fp="def", lr=1e-3)
    with pytest.raises(BaselineError, match=r"algorithm\.hyperparams\.lr: baseline 0\.0003, current 0\.001"):
        check_comparable(BASE, other, allow_spec_change=False)
    check_comparable(BASE, other, allow_spec_change=True)
    missing = dict(BASE, entries={})
    with pytest.raises(BaselineError, match="no finished trials for crossrl/ppo/w2"):
        check_comparable(BASE, missing, allow_spec_change=False)


def test_read_baseline_rejects_missing_and_malformed(tmp_path: Path) -> None:
    with pytest.raises(BaselineError, match="baseline not found"):
        read_baseline(tmp_path / "nope.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(BaselineError, match="not a readable JSON baseline"):
        read_baseline(bad)
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"schema_version": 0}))
    with pytest.raises(BaselineError, match="schema_version 0 is not 1"):
        read_baseline(old)


def test_markdown_and_junit_list_every_comparison() -> None:
    current = run([0.30, 0.31, 0.32], [60.0, 70.0, 80.0], [1000.0, 1200.0, 1400.0])
    comps = compare(BASE, current, tolerances=TOL)
    md = markdown(comps, title="t")
    assert "1 regression(s)" in md and md.count("\n| crossrl/ppo/w2 |") == len(comps)
    root = ET.fromstring(junit_xml(comps, suite="s"))
    cases = root.findall("./testsuite/testcase")
    assert len(cases) == len(comps) == 3
    failed = [c for c in cases if c.find("failure") is not None]
    assert [c.get("name") for c in failed] == ["sample throughput / raw env speed"]
    assert root.find("testsuite").get("failures") == "1"
