"""Open report.html in real headless Chromium and check what a reader would see.

Chromium is driven over the DevTools protocol on a pipe (tests/support/browser.py), so the test
needs no websocket client and no selenium.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from browser import CHROMIUM, check_report_in_chromium

from crossrl.reports.figures import ENGINE_COLOURS
from crossrl.reports.render import build_report

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not CHROMIUM.exists(), reason="needs /usr/bin/chromium (`apt-get install chromium`)"),
]


def test_report_opens_and_draws_in_chromium(tmp_path: Path, frames: Any) -> None:
    trials, points, meta = frames
    paths = build_report(trials=trials, points=points, meta=meta, out_dir=tmp_path / "report")
    shot = check_report_in_chromium(paths.html, tmp_path, engines=list(ENGINE_COLOURS), convergence=True)
    assert shot.stat().st_size > 10_000
