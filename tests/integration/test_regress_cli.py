"""`crossrl regress` end to end on real runs: the baseline's own run passes, an injected slowdown fails
naming the metric, another spec is unusable input, and the JUnit XML lists every comparison."""

from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import yaml

from crossrl.scenarios.loader import resolve

pytestmark = pytest.mark.integration


def crossrl(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "crossrl.cli", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "160"},
        timeout=900,
    )


@pytest.mark.system
@pytest.mark.long(3)
def test_regress_catches_a_real_slowdown(tmp_path: Path) -> None:
    run = ["--engines", "crossrl", "--workers", "1", "--seeds", "0", "--no-report"]  # one seed: the tolerance alone
    first = crossrl("run", "smoke", *run, cwd=tmp_path)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    made = crossrl("baseline", "update", "smoke", "-o", "base.json", cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    assert "1 entries" in made.stdout

    # the run the baseline came from passes against it (an unchanged rerun against a stored baseline is
    # what `make test` gates on: tests/integration/test_contract.py)
    same = crossrl("regress", "--baseline", "base.json", "--junit", "same.xml", cwd=tmp_path)
    assert same.returncode == 0, same.stdout + same.stderr
    assert "no regression" in same.stdout and "Learning checks only" in same.stdout  # speed only when asked
    cases = ET.parse(tmp_path / "same.xml").getroot().findall("./testsuite/testcase")
    assert {c.get("name") for c in cases} == {"env steps to target"}
    same = crossrl("regress", "--baseline", "base.json", "--speed", "--junit", "same.xml", cwd=tmp_path)
    assert same.returncode == 0 and "moves with whatever else runs on the machine" in same.stdout  # its noise stated
    cases = ET.parse(tmp_path / "same.xml").getroot().findall("./testsuite/testcase")
    assert {c.get("name") for c in cases} == {"sample throughput / raw env speed", "env steps to target"}
    assert all(c.get("classname") == "smoke.crossrl/ppo/w1" for c in cases)

    # the same scenario on an env whose every step costs 5 ms more: a real slowdown
    slow = yaml.safe_load(resolve("smoke").read_text())
    slow["env"]["step_latency_ms"] = 5
    (tmp_path / "slow.yaml").write_text(yaml.safe_dump(slow))
    slowed = crossrl("run", "slow.yaml", *run, cwd=tmp_path)
    assert slowed.returncode == 0, slowed.stdout[-3000:]

    refused = crossrl("regress", "--baseline", "base.json", cwd=tmp_path)
    assert refused.returncode == 2
    assert "env.step_latency_ms: baseline 0.0, current 5.0" in refused.stderr
    assert "Traceback" not in refused.stderr

    learning = crossrl("regress", "--baseline", "base.json", "--allow-spec-change", cwd=tmp_path)
    assert learning.returncode == 0 and "no regression" in learning.stdout  # a slower env learns the same
    flagged = crossrl("regress", "--baseline", "base.json", "--allow-spec-change", "--speed", "--junit", "slow.xml",
                      cwd=tmp_path)  # fmt: skip
    assert flagged.returncode == 1, flagged.stdout + flagged.stderr
    assert "| crossrl/ppo/w1 | sample throughput / raw env speed |" in flagged.stdout
    assert "**REGRESSION**" in flagged.stdout
    failures = [c for c in ET.parse(tmp_path / "slow.xml").getroot().iter("testcase") if c.find("failure") is not None]
    assert [c.get("name") for c in failures] == ["sample throughput / raw env speed"]


def test_regress_unusable_baseline_exits_2(tmp_path: Path) -> None:
    missing = crossrl("regress", "--baseline", "nope.json", cwd=tmp_path)
    assert missing.returncode == 2 and "baseline not found" in missing.stderr
    (tmp_path / "bad.json").write_text("[1, 2")
    bad = crossrl("regress", "--baseline", "bad.json", cwd=tmp_path)
    assert bad.returncode == 2 and "not a readable JSON baseline" in bad.stderr
    assert "Traceback" not in missing.stderr + bad.stderr
