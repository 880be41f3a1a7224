"""Open a report.html in real headless Chromium and check what a reader would see (shared by tests).

Chromium is driven over the DevTools protocol on a pipe (``--remote-debugging-pipe``: commands on
fd 3, replies on fd 4, NUL-separated JSON), so the test needs no websocket client and no selenium.
"""

from __future__ import annotations

import base64
import fcntl
import io
import json
import os
import select
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from crossrl.reports.figures import ENGINE_COLOURS

CHROMIUM = Path("/usr/bin/chromium")
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
    "--remote-debugging-pipe",
]
WIDTH = 1200


class DevTools:
    """A minimal DevTools-protocol client over Chromium's debugging pipe."""

    def __init__(self, *, user_data_dir: Path, log: Path) -> None:
        cmd_r, self._cmd_w = os.pipe()
        self._res_r, res_w = os.pipe()
        # The child's ends move above fd 10 first so that dup2 onto 3 and 4 cannot clobber them.
        child_r, child_w = (fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10) for fd in (cmd_r, res_w))
        os.close(cmd_r)
        os.close(res_w)

        def _fds() -> None:
            os.dup2(child_r, 3)
            os.dup2(child_w, 4)

        self._log = log.open("wb")
        self.proc = subprocess.Popen(
            [str(CHROMIUM), *FLAGS, f"--user-data-dir={user_data_dir}", "about:blank"],
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=self._log,
            preexec_fn=_fds,
            close_fds=False,  # only inheritable fds pass: 0-2 and the two dup2'ed above
        )
        os.close(child_r)
        os.close(child_w)
        self._buf = b""
        self._next_id = 0
        self.events: list[dict[str, Any]] = []

    def send(self, method: str, params: dict[str, Any] | None = None, *, session: str | None = None) -> Any:
        self._next_id += 1
        msg: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self._cmd_w, json.dumps(msg).encode() + b"\0")
        reply = self._wait(lambda m: m.get("id") == self._next_id, timeout=30.0)
        if "error" in reply:
            raise RuntimeError(f"{method}: {reply['error']}")
        return reply.get("result", {})

    def wait_event(self, method: str, *, timeout: float = 30.0) -> dict[str, Any]:
        for ev in self.events:
            if ev.get("method") == method:
                return ev
        return self._wait(lambda m: m.get("method") == method, timeout=timeout)

    def _wait(self, match: Callable[[dict[str, Any]], bool], *, timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            while b"\0" in self._buf:
                raw, self._buf = self._buf.split(b"\0", 1)
                msg = json.loads(raw)
                if "method" in msg:
                    self.events.append(msg)
                if match(msg):
                    return msg  # type: ignore[no-any-return]
            left = deadline - time.monotonic()
            if left <= 0 or self.proc.poll() is not None:
                raise TimeoutError(f"no DevTools reply (chromium exit code {self.proc.poll()})")
            ready, _, _ = select.select([self._res_r], [], [], left)
            if ready:
                chunk = os.read(self._res_r, 1 << 20)
                if not chunk:
                    raise RuntimeError("chromium closed the DevTools pipe")
                self._buf += chunk

    def close(self) -> None:
        try:
            self.send("Browser.close")
        except (RuntimeError, TimeoutError, OSError):
            pass
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._cmd_w)
        os.close(self._res_r)
        self._log.close()


_FIGURE_CHECK = """
JSON.stringify([...document.querySelectorAll("figure.figure")].map(f => {
  const svg = f.querySelector("svg"); const r = (svg || f).getBoundingClientRect();
  return {id: f.id, svg: !!svg, paths: svg ? svg.querySelectorAll("path").length : 0,
          x: r.left + window.scrollX, y: r.top + window.scrollY, w: r.width, h: r.height};
}))
"""


_VERDICT_CHECK = """
JSON.stringify((() => { const v = document.querySelector("#verdict"); if (!v) return null;
  const r = v.getBoundingClientRect();
  return {text: v.innerText, x: r.left + window.scrollX, y: r.top + window.scrollY, w: r.width, h: r.height}; })())
"""


def _colour_pixels(img: np.ndarray, hex_colour: str, tol: int = 12) -> int:
    rgb = np.array([int(hex_colour[i : i + 2], 16) for i in (1, 3, 5)])
    return int((np.abs(img[..., :3].astype(int) - rgb).max(axis=-1) <= tol).sum())


def check_report_in_chromium(html: Path, tmp_path: Path, *, engines: list[str], convergence: bool = False) -> Path:
    """Open ``html`` in headless Chromium; assert every figure is drawn with each engine's colour (the convergence
    figure too where the report has one: ``convergence``), no page errors, no network requests. Returns the
    full-page screenshot's path."""
    from PIL import Image

    browser = DevTools(user_data_dir=tmp_path / "chromium-profile", log=tmp_path / "chromium.log")
    try:
        target = browser.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = browser.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Page", "Runtime", "Log", "Network"):
            browser.send(f"{domain}.enable", session=session)
        browser.send(
            "Emulation.setDeviceMetricsOverride",
            {"width": WIDTH, "height": 900, "deviceScaleFactor": 1, "mobile": False},
            session=session,
        )
        browser.send("Page.navigate", {"url": html.resolve().as_uri()}, session=session)
        browser.wait_event("Page.loadEventFired")
        result = browser.send("Runtime.evaluate", {"expression": _FIGURE_CHECK, "returnByValue": True}, session=session)
        figures = json.loads(result["result"]["value"])
        verdict = json.loads(
            browser.send("Runtime.evaluate", {"expression": _VERDICT_CHECK, "returnByValue": True}, session=session)[
                "result"
            ]["value"]
        )
        height = browser.send("Page.getLayoutMetrics", session=session)["cssContentSize"]["height"]
        shot = browser.send(
            "Page.captureScreenshot",
            {
                "format": "png",
                "captureBeyondViewport": True,
                "clip": {"x": 0, "y": 0, "width": WIDTH, "height": height, "scale": 1},
            },
            session=session,
        )
    finally:
        browser.close()
    png = base64.b64decode(shot["data"])
    (tmp_path / "report.png").write_bytes(png)
    img = np.asarray(Image.open(io.BytesIO(png)).convert("RGB"))

    # The verdict is what a reader sees first: on the first screen, laid out, with its sentences drawn.
    assert verdict is not None, "the report has no verdict section"
    assert verdict["y"] + verdict["h"] <= 900, f"the verdict is not on the first screen: {verdict}"
    assert verdict["text"].startswith("Verdict") and "final return" in verdict["text"].lower(), verdict["text"]
    box = img[
        int(verdict["y"]) : int(verdict["y"] + verdict["h"]), int(verdict["x"]) : int(verdict["x"] + verdict["w"])
    ]
    assert (box.min(axis=-1) < 100).sum() > 500, "the verdict's text is not drawn (no dark pixels in its box)"

    ids = {f["id"] for f in figures}
    expected = {"fig-return-vs-steps", "fig-return-vs-wall", "fig-throughput", "fig-scaling", "fig-time-to-target"}
    expected |= {"fig-convergence"} if convergence else set()
    assert ids == expected, f"figures in the page: {sorted(ids)}"
    assert len(np.unique(img.reshape(-1, 3), axis=0)) > 50, "the screenshot is (nearly) one colour"
    for f in figures:
        assert f["svg"] and f["paths"] > 10, f"{f['id']} has no drawn SVG: {f}"
        assert f["w"] > 200 and f["h"] > 100, f"{f['id']} is not laid out: {f}"
        crop = img[int(f["y"]) : int(f["y"] + f["h"]), int(f["x"]) : int(f["x"] + f["w"])]
        assert crop.size, f"{f['id']} lies outside the screenshot"
        # Drawn, not an empty frame: each engine's fixed colour shows up inside every figure.
        for engine in engines:
            colour = ENGINE_COLOURS[engine]
            assert _colour_pixels(crop, colour) > 20, f"{f['id']}: no {engine} ({colour}) pixels"

    errors = [
        e["params"]
        for e in browser.events
        if e["method"] == "Runtime.exceptionThrown"
        or (e["method"] == "Runtime.consoleAPICalled" and e["params"]["type"] in ("error", "assert"))
        or (e["method"] == "Log.entryAdded" and e["params"]["entry"]["level"] == "error")
    ]
    assert not errors, f"the page logged errors: {errors}"
    requests = [e["params"]["request"]["url"] for e in browser.events if e["method"] == "Network.requestWillBeSent"]
    remote = [u for u in requests if not u.startswith(("file:", "data:", "about:"))]
    assert not remote, f"the report asked the network for {remote}: it must be self-contained"
    assert any(u.startswith("file:") for u in requests), "the browser never loaded the report file"
    return tmp_path / "report.png"
