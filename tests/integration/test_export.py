"""`crossrl export` on a target that names nothing: one line, exit 2. Exporting trained trials (PPO on CartPole and SAC
on Pendulum, every engine, the files loaded in a fresh interpreter without crossrl) is checked on the trials
tests/faults/test_checkpoint_resume.py trains and resumes (tests/support/export_check.py); each engine's file against
its own policy, and a checkpoint or engine it cannot export, in tests/unit/test_export.py; MultiDiscrete and DreamerV3
refused in tests/adapters/."""

from __future__ import annotations

from pathlib import Path

import pytest
from export_check import export

pytestmark = pytest.mark.integration


def test_a_target_that_names_nothing_is_one_line(results_dir: Path) -> None:
    out = export(results_dir, "no-such-scenario")
    assert out.returncode == 2 and "Traceback" not in out.stderr
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "no-such-scenario" in lines[0] and lines[0].startswith("error: "), lines
