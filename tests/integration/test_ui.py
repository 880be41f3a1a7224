"""`crossrl ui` serves the embedded store over HTTP on 127.0.0.1 (its REST API and its page, opened in Chromium)."""

from __future__ import annotations

import base64
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from browser import CHROMIUM, DevTools

from crossrl.reports.store import ResultsStore
from crossrl.scenarios import metrics as M
from crossrl.scenarios.loader import load

# What the page shows, evaluated in it: the chart cards in document order (each card's title and legend text, its
# place, how many Plotly line paths it draws and the longest path's data), the section headers, the run names.
_PAGE_CHECK = """
JSON.stringify({
  href: location.href,
  text: document.body.innerText,
  sections: [...document.querySelectorAll('[data-testid="experiment-view-compare-runs-section-header"]')]
    .map(h => h.innerText.split("\\n")[0]),
  cards: [...document.querySelectorAll('[data-testid="experiment-view-compare-runs-card"]')].map(c => {
    const r = c.getBoundingClientRect();
    const d = [...c.querySelectorAll("path.js-line")].map(p => (p.getAttribute("d") || "").length);
    return {text: c.innerText, y: r.top + window.scrollY, w: r.width, h: r.height, lines: d.length,
            longest: Math.max(0, ...d)};
  }),
  assistant: !!document.querySelector('[data-component-id="mlflow.assistant.chat_panel.close"]'),
})
"""


def _page(browser: Any, session: str) -> dict[str, Any]:
    reply = browser.send("Runtime.evaluate", {"expression": _PAGE_CHECK, "returnByValue": True}, session=session)
    if "value" not in reply["result"]:  # the page is not there yet (no body while it loads)
        return {"href": "", "text": "", "sections": [], "cards": [], "assistant": False, "error": reply}
    return json.loads(reply["result"]["value"])  # type: ignore[no-any-return]


def _drawn(page: dict[str, Any], names: list[str]) -> bool:
    """The first chart has its lines and the run list its runs (the two load apart)."""
    cards = page["cards"]
    listed = all(name in page["text"] for name in names)
    return listed and bool(cards) and cards[0]["lines"] >= 3 and cards[0]["longest"] > 20


@pytest.mark.integration
@pytest.mark.skipif(not CHROMIUM.exists(), reason="needs /usr/bin/chromium (`apt-get install chromium`)")
def test_ui_opens_on_the_scenarios_return_curves(results_dir: Path, tmp_path: Path) -> None:
    """`crossrl ui smoke` prints a URL; headless Chromium opened on it shows MLflow's classic (Model training) view of
    the smoke experiment: its chart view, crossrl's Return curves section first, the return curve of every engine
    drawn, the trials listed by name. MLflow opens its assistant panel once per browser on a local server (nothing
    turns it off in 3.17); closed, it stays closed on the next load."""
    from crossrl.reports.ui import VIEW_TAG

    store = ResultsStore(None, results_dir=results_dir)
    spec, path = load("smoke")
    parent = store.start_parent(spec, spec_path=path)
    trials = {t.engine: t for t in reversed(spec.trials())}  # one trial per engine: s0, w1
    for k, trial in enumerate(trials.values()):
        run_id = store.start_trial(parent, trial, spec=spec)
        points = [
            (
                step * 1000,
                {
                    M.ENV_STEPS_SAMPLED: step * 1000,
                    M.EPISODE_RETURN_MEAN: 10.0 + 20 * step + 5 * k,
                    M.WALL_TIME_S: 2.0 * step,
                    M.SAMPLE_THROUGHPUT: 500.0 + 10 * k,
                    M.ENTROPY: 1.0 - 0.1 * step,
                    M.DIAG_APPROX_KL: 0.01,  # sorts before the return: the default order would chart it first
                },
            )
            for step in range(1, 6)
        ]
        store.log_points(run_id, points)
        store.finish_trial(run_id, status="FINISHED", last_step=5000)
    store.finish_parent(parent, status="FINISHED", counts={"FINISHED": len(trials)})
    exp_id = store.experiment_id("smoke", create=False)
    assert exp_id is not None and VIEW_TAG in store.client.get_experiment(exp_id).tags

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cli = [sys.executable, "-m", "crossrl.cli", "ui"]
    unknown = subprocess.run(
        [*cli, "no-such-scenario", "--port", str(port), "--results-dir", str(results_dir)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert unknown.returncode == 2 and unknown.stderr.strip().splitlines() == [
        f"error: no runs of scenario 'no-such-scenario' in {store.uri}: `crossrl runs` lists the stored ones"
    ], unknown.stderr
    store.client.delete_experiment_tag(exp_id, VIEW_TAG)  # an experiment from before: `crossrl ui` sets its view

    proc = subprocess.Popen(
        [*cli, "smoke", "--port", str(port), "--results-dir", str(results_dir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    browser = None
    try:
        assert proc.stdout is not None
        url = ""
        while not url.startswith("http"):
            line = proc.stdout.readline()
            assert line, f"crossrl ui printed no URL: {url}"
            url = line.strip() if "#/experiments/" in line else url
        assert url.startswith(f"http://127.0.0.1:{port}/#/experiments/{exp_id}/runs?"), url
        assert "workflowType=machine_learning" in url and "compareRunsMode=CHART" in url, url
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2).close()
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, "crossrl ui did not come up"
                time.sleep(0.3)
        assert VIEW_TAG in store.client.get_experiment(exp_id).tags
        # the server serves the embedded store: MLflow's REST API lists the stored runs (the parent and its trials)
        req = urllib.request.Request(
            f"http://127.0.0.1:{port}/api/2.0/mlflow/runs/search",
            data=json.dumps({"experiment_ids": [exp_id]}).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=10) as r:
            listed = {run["info"]["run_id"] for run in json.loads(r.read())["runs"]}
        stored = {parent, *(run.info.run_id for run in store.children(store.client.get_run(parent)))}
        assert listed == stored and len(listed) == 1 + len(trials)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=10) as r:
            assert r.status == 200 and b"<html" in r.read().lower()

        browser = DevTools(user_data_dir=tmp_path / "chromium-profile", log=tmp_path / "chromium.log")
        target = browser.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = browser.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        browser.send("Runtime.enable", session=session)
        browser.send(
            "Emulation.setDeviceMetricsOverride",
            {"width": 1400, "height": 1000, "deviceScaleFactor": 1, "mobile": False},
            session=session,
        )

        names = [t.name for t in trials.values()]

        def load_page() -> dict[str, Any]:
            browser.send("Page.navigate", {"url": url}, session=session)
            until = time.monotonic() + 45
            while not _drawn(page := _page(browser, session), names) and time.monotonic() < until:
                time.sleep(0.5)
            return page

        page = load_page()
        shot = browser.send("Page.captureScreenshot", {"format": "png"}, session=session)
        (tmp_path / "ui.png").write_bytes(base64.b64decode(shot["data"]))
        if page["assistant"]:  # opened by MLflow on the first visit: closed once, it stays closed
            browser.send(
                "Runtime.evaluate",
                {"expression": "document.querySelector('[data-component-id=\"mlflow.assistant.chat_panel.close\"]')"
                 ".click()"},
                session=session,
            )  # fmt: skip
            time.sleep(1)
            page = load_page()
            shot = browser.send("Page.captureScreenshot", {"format": "png"}, session=session)
            (tmp_path / "ui-reloaded.png").write_bytes(base64.b64decode(shot["data"]))
    finally:
        if browser is not None:
            browser.close()
        os.killpg(proc.pid, signal.SIGTERM)
        proc.communicate(timeout=30)

    report = json.dumps({k: v for k, v in page.items() if k != "text"})[:3000]
    text = page["text"]
    # The classic view: the runs page (not GenAI's overview, traces or evaluations), in its chart view.
    assert "workflowType=machine_learning" in page["href"] and "compareRunsMode=CHART" in page["href"], page["href"]
    assert "Model training" in text and "Runs" in text.split("\n"), text[:500]
    assert not {"Overview", "Evaluations", "Judges"} & set(text.split("\n")), text[:500]
    assert not page["assistant"], "the assistant panel came back after it was closed"
    # The experiment's trials are listed, by the names that say engine, workers and seed.
    for trial in trials.values():
        assert trial.name in text, f"{trial.name} is not listed"
    # crossrl's section first, the return curve its first chart: one line per engine, drawn.
    assert page["sections"][:2] == ["Return curves", "Model metrics"], report
    first = page["cards"][0]
    assert M.EPISODE_RETURN_MEAN in first["text"], report
    assert first["lines"] >= len(trials) and first["longest"] > 20, f"the return curve is not drawn: {report}"
    assert first["w"] > 100 and first["h"] > 100, report
