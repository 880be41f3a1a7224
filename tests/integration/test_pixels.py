"""Pixels end to end: `crossrl run minatar-smoke` (PPO, MinAtar Breakout's uint8 frames, a small conv model) and
`crossrl run atari-smoke` (PPO, ALE Breakout with the standard preprocessing, the Nature CNN) FINISHED on every
engine, each engine's native config naming the conv stack it built (about 90 s each on 2 cores); likewise the two
scenarios nobody tuned, `atari-untuned` (IMPALA on SpaceInvaders) and `minatar-untuned` (DQN on Asterix). Every
trial stores a clip of its final policy (`clip.gif`, its score and length as tags) and the report shows one per
engine under "Final policies"."""

from __future__ import annotations

import io
import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import GifImagePlugin, Image

from crossrl.reports.store import ResultsStore
from crossrl.scenarios import metrics as M
from crossrl.scenarios.loader import load

pytestmark = [pytest.mark.integration, pytest.mark.system]


@pytest.mark.parametrize("scenario", ["minatar-smoke", "atari-smoke", "atari-untuned", "minatar-untuned"])
def test_pixel_smoke_finishes_on_every_engine(scenario: str, tmp_path: Path) -> None:
    results = tmp_path / "results"
    proc = subprocess.run(
        [sys.executable, "-m", "crossrl.cli", "run", scenario, "--results-dir", str(results)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    spec, _ = load(scenario)
    conv_spec = [list(layer) for layer in spec.algorithm.model.conv]
    store = ResultsStore(None, results_dir=results)
    loaded = store.load(scenario=scenario)
    assert sorted(loaded.trials.trial) == sorted(t.name for t in spec.trials())
    assert set(loaded.trials.engine) == {"crossrl", "rllib", "torchrl"}
    for row in loaded.trials.to_dict("records"):
        name = row["trial"]
        assert row["status"] == "FINISHED", f"{name}: {row['reason']}"
        hist = loaded.points[loaded.points.run_id == row["run_id"]]
        steps = hist[hist.metric == M.ENV_STEPS_SAMPLED].value.tolist()
        assert steps and max(steps) >= spec.budget.env_steps, f"{name}: env steps {steps}"
        # Breakout, SpaceInvaders and Asterix score points: episodes ended, with finite non-negative returns
        returns = hist[hist.metric == M.EPISODE_RETURN_MEAN].value
        assert len(returns) and all(math.isfinite(v) and v >= 0 for v in returns), f"{name}: {list(returns)}"
        native = json.loads(Path(store.client.download_artifacts(row["run_id"], "native_config.json")).read_text())
        conv = {
            "crossrl": lambda n: n["model"]["conv"] == conv_spec,
            "rllib": lambda n: n["_model_config"]["conv_filters"] == [[*layer, "valid"] for layer in conv_spec],
            "torchrl": lambda n: (
                "ConvNet" in n["networks"]["q"]
                if spec.algorithm.name == "dqn"
                else "ConvNet" in n["networks"]["actor"] and "FramesIn" in n["networks"]["critic"]
            ),
        }[row["engine"]]
        assert conv(native), f"{name}: native config does not show the conv model"
        # the final policy's clip: one greedy episode from the trial's seed, at most 400 frames
        assert row["clip"] == "clip.gif", f"{name}: no clip artifact"
        assert math.isfinite(row["clip_score"]) and row["clip_score"] >= 0, f"{name}: clip.score {row['clip_score']}"
        assert row["clip_length"] >= 1, f"{name}: clip.length {row['clip_length']}"
        # the clip's policy is reloaded from the final checkpoint, the way `crossrl evaluate` does
        assert row["clip_policy"].startswith("checkpoint ckpt-"), f"{name}: clip.policy {row['clip_policy']!r}"
        gif = Image.open(io.BytesIO(store.artifact_bytes(row["run_id"], "clip.gif")))
        assert isinstance(gif, GifImagePlugin.GifImageFile), f"{name}: clip.gif is {gif.format}"
        assert 1 <= gif.n_frames <= 400, f"{name}: {gif.n_frames} frames"
    page = (results / "reports" / scenario / "report.html").read_text()
    assert '<h2 id="final-policies">Final policies</h2>' in page
    clips = re.findall(r'<figure class="clip" id="clip-(\w+)"><h3>\w+</h3><img src="data:image/gif;base64,', page)
    assert sorted(clips) == ["crossrl", "rllib", "torchrl"], clips
