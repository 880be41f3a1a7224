"""The report's "Final policies" section, from clips stored as trial artifacts in a real embedded MLflow store."""

from __future__ import annotations

import base64
import io
import re
from pathlib import Path

import numpy as np
from PIL import GifImagePlugin, Image

from crossrl.adapters.base import ListSink
from crossrl.core.clips import encode_clip
from crossrl.orchestration.trials import TrialRecorder
from crossrl.reports.api import make_report
from crossrl.reports.store import ResultsStore
from crossrl.scenarios.loader import validate

POINTS = [(100 * i, {"episode_return_mean": float(i), "wall_time_s": 0.1 * i, "sample_throughput": 1e3})
          for i in range(1, 11)]  # fmt: skip


def _spec():  # type: ignore[no-untyped-def]
    return validate(
        {
            "name": "clips-test",
            "env": {"id": "CartPole-v1"},
            "algorithm": {"name": "ppo"},
            "engines": ["crossrl", "rllib"],
            "budget": {"env_steps": 1000},
            "seeds": [1, 0],  # the spec's first seed is 1
        },
        label="clips.yaml",
    )


def _gif(shade: int) -> bytes:
    frames = [np.full((8, 8, 3), shade, np.uint8), np.full((8, 8, 3), 255 - shade, np.uint8)]
    return encode_clip(frames, 10)


def _run(results_dir: Path, *, with_clips: bool) -> tuple[ResultsStore, str, dict[str, bytes]]:
    """A parent run of 2 engines x 2 seeds; with clips, each trial sends one through a sink, as adapters do."""
    store = ResultsStore(results_dir=results_dir)
    spec = _spec()
    parent = store.start_parent(spec, spec_path=None, command="crossrl run clips-test")
    sent: dict[str, bytes] = {}
    for i, trial in enumerate(spec.trials()):
        run_id = store.start_trial(parent, trial, spec=spec)
        rec = TrialRecorder(trial, store=store, run_id=run_id, progress=lambda _e, _p: None)
        sink = ListSink(trial)
        if with_clips:
            sent[trial.name] = _gif(20 * i)
            sink.artifact("clip.gif", sent[trial.name])
            sink.tags(**{"clip": "clip.gif", "clip.score": f"{i + 0.5:g}", "clip.length": str(10 + i),
                         "clip.ended": "true", "clip.seed": str(trial.seed)})  # fmt: skip
        for msg in sink.messages:
            rec.handle(msg)
        store.log_points(run_id, POINTS)
        store.finish_trial(run_id, status="FINISHED", summary={"final_return_mean": 10.0}, history=POINTS,
                           last_step=1000)  # fmt: skip
    store.finish_parent(parent, status="FINISHED", counts={"FINISHED": len(spec.trials())})
    return store, parent, sent


def test_final_policies_embed_one_clip_per_engine_from_the_first_seed(results_dir: Path, tmp_path: Path) -> None:
    store, parent, sent = _run(results_dir, with_clips=True)
    loaded = store.load(parent_id=parent)
    assert set(loaded.trials["clip"]) == {"clip.gif"}
    assert store.artifact_bytes(loaded.trials["run_id"][0], "clip.gif") == sent[loaded.trials["trial"][0]]

    paths = make_report(store, parent_id=parent, out_dir=tmp_path / "report")
    page = paths.html.read_text()
    assert '<h2 id="final-policies">Final policies</h2>' in page
    images = re.findall(r'<figure class="clip" id="clip-(\w+)">.*?src="data:image/gif;base64,([^"]+)".*?'
                        r"<figcaption>(.*?)</figcaption>", page)  # fmt: skip
    assert [engine for engine, _, _ in images] == ["crossrl", "rllib"]
    for engine, b64, caption in images:
        trial = f"{engine}-ppo-w1-s1"  # seed 1: the spec's first seed
        assert base64.b64decode(b64) == sent[trial]
        assert trial in caption and "seed 1" in caption and "score" in caption
        gif = Image.open(io.BytesIO(base64.b64decode(b64)))
        assert isinstance(gif, GifImagePlugin.GifImageFile) and gif.n_frames == 2

    md = paths.markdown.read_text()
    assert "## Final policies" in md
    for engine in ("crossrl", "rllib"):
        link = f"clips/{engine}-ppo-w1-s1.gif"
        assert f"]({link})" in md
        assert (paths.html.parent / link).read_bytes() == sent[f"{engine}-ppo-w1-s1"]


def test_no_clip_no_section(results_dir: Path, tmp_path: Path) -> None:
    store, parent, _ = _run(results_dir, with_clips=False)
    paths = make_report(store, parent_id=parent, out_dir=tmp_path / "report")
    assert "Final policies" not in paths.html.read_text()
    assert "Final policies" not in paths.markdown.read_text()
    assert not (paths.html.parent / "clips").exists()
