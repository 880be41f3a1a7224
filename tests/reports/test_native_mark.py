"""The report marks the engines that ran with engine-native settings (the spec's native section): a § beside the
engine in the tables and a line under the verdict saying its figures break the equal-settings rule."""

from __future__ import annotations

from typing import Any

from crossrl.reports import verdict as V
from crossrl.reports.render import build_report, load_report_json


def test_an_engine_with_native_settings_is_marked_in_tables_and_verdict(tmp_path: Any, make_frames: Any) -> None:
    trials, points, meta = make_frames(workers=(1,), seeds=(0, 1), n_points=10, failures=False)
    trials = trials.assign(native_overrides="")
    trials.loc[trials.engine == "rllib", "native_overrides"] = "training.vf_clip_param=5.0"
    paths = build_report(trials=trials, points=points, meta=meta, out_dir=tmp_path / "out", grid_points=20)
    doc = load_report_json(paths.json)
    line = (
        "§ rllib ran with engine-native settings (training.vf_clip_param=5.0): its figures do not follow the "
        "equal-settings rule."
    )
    assert doc["verdict"][-1] == line
    assert doc["native_settings"] == {"rllib": "training.vf_clip_param=5.0"}
    md = paths.markdown.read_text()
    assert f"- {line}" in md
    assert "| rllib § | 1 | 2 | " in md  # the final-return table
    assert "| crossrl | 1 | 2 | " in md and "| torchrl | 1 | 2 | " in md  # the others unmarked
    assert "Ran with engine-native settings" in md
    assert "rllib §" in paths.html.read_text()


def test_no_native_settings_no_mark(make_frames: Any) -> None:
    trials, _, _ = make_frames(workers=(1,), seeds=(0,), n_points=5, failures=False)
    assert V.native_settings(trials) == {}  # a store from before the tag: no column
    assert V.native_settings(trials.assign(native_overrides="")) == {}
    assert V.native_lines({}) == []
