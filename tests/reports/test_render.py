"""build_report on synthetic store frames: the three files, and report.json against a recomputation."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from scipy.stats import trim_mean

from crossrl.reports import stats as S
from crossrl.reports.render import SCHEMA_VERSION, build_report, load_report_json
from crossrl.scenarios import metrics as M

FIGURES = ("return-vs-steps", "return-vs-wall", "throughput", "scaling", "convergence", "time-to-target")


def _rows(doc: dict[str, Any], key: str) -> dict[tuple[str, int], dict[str, Any]]:
    return {(r["engine"], r["workers"]): r for r in doc[key]}


@pytest.fixture(scope="module")
def rendered(
    tmp_path_factory: pytest.TempPathFactory, make_frames: Any
) -> tuple[Any, Any, dict[str, Any], dict[str, Any], Path]:
    """The default synthetic experiment (with a FAILED, a SKIPPED and a TIMEOUT trial), rendered once."""
    trials, points, meta = make_frames()
    out = tmp_path_factory.mktemp("report") / "out"
    paths = build_report(trials=trials, points=points, meta=meta, out_dir=out)
    assert paths.html.parent == paths.markdown.parent == paths.json.parent == out
    return trials, points, meta, load_report_json(paths.json), out


def test_html_is_one_self_contained_file_with_every_figure(rendered: Any) -> None:
    trials, _, meta, _, out = rendered
    page = (out / "report.html").read_text()
    for key in FIGURES:
        assert f'id="fig-{key}"' in page
    assert page.count("<svg ") == len(FIGURES)
    assert re.search(r"<path[^>]+d=", page), "figures carry drawn paths"
    # Nothing fetched from outside: no scripts, stylesheets, images or fonts by URL.
    assert "<script" not in page
    assert not re.search(r'(src|href)="(https?:)?//', page)
    assert "url(http" not in page and "@import" not in page
    # Inline SVG ids are unique in the page, and every url(#id) reference points at one of them.
    ids = re.findall(r'\bid="([^"]+)"', page)
    assert len(ids) == len(set(ids))
    assert set(re.findall(r"url\(#([^)]+)\)", page)) <= set(ids)
    for status in ("FAILED", "SKIPPED", "TIMEOUT"):
        row = trials[trials.status == status].iloc[0]
        assert row["trial"] in page and status in page
    assert "torchrl cannot run a3c: &lt;no async gradients&gt;" in page  # escaped, not markup
    assert meta["fingerprint"] in page and meta["parent_run_id"] in page
    for k in ("host", "cpu_count", "platform"):
        assert str(meta["machine"][k]) in page
    for name, version in meta["versions"].items():
        assert f"{name} {version}" in page
    assert "CartPole-v1" in page and "env_steps: 20000" in page  # the spec, as YAML


def test_markdown_has_the_tables(rendered: Any) -> None:
    trials, _, _, _, out = rendered
    md = (out / "report.md").read_text()
    for title in ("## Final return", "## Time to target", "## Sampling throughput", "## Probability of improvement"):
        assert title in md
    assert "| engine | workers | seeds | IQM final return | 95% CI |" in md
    assert "| rllib | 1 | 3 | " in md
    assert "not reached in 20,000 env steps" in md  # rllib's synthetic curve stops below the target
    assert "| torchrl | 2 | 1 | " in md and "— (1 seed)" in md
    for _, r in trials[trials.status != "FINISHED"].iterrows():
        assert f"| {r['trial']} | {r['engine']} | {r['workers']} | {r['seed']} | {r['status']} | " in md
    assert "torchrl cannot run a3c: &lt;no async gradients>" in md  # not swallowed as HTML (a "<" escaped is enough)
    assert "<svg" not in md


def test_json_numbers_equal_a_recomputation(rendered: Any) -> None:
    trials, points, meta, doc, _ = rendered
    assert doc["schema_version"] == SCHEMA_VERSION
    assert doc["fingerprint"] == meta["fingerprint"] and doc["versions"] == meta["versions"]
    assert doc["machine"] == meta["machine"] and doc["spec"] == meta["spec"]
    assert doc["trials"]["by_status"] == {"FINISHED": 15, "FAILED": 1, "SKIPPED": 1, "TIMEOUT": 1}
    ok = trials[trials.status == "FINISHED"]
    groups = dict(list(ok.groupby(["engine", "workers"])))
    assert set(_rows(doc, "final_return")) == set(groups)

    fr = _rows(doc, "final_return")
    for key, g in groups.items():
        x = g[M.FINAL_RETURN_MEAN].to_numpy()
        assert fr[key]["iqm"] == pytest.approx(trim_mean(x, 0.25)) and fr[key]["n_seeds"] == len(x)
        if len(x) > 1:
            assert fr[key]["ci_low"] <= fr[key]["iqm"] <= fr[key]["ci_high"]
            assert x.min() <= fr[key]["ci_low"] and fr[key]["ci_high"] <= x.max()
        else:
            assert fr[key]["ci_low"] is None and fr[key]["ci_high"] is None

    thr_points = points[points.metric == M.SAMPLE_THROUGHPUT].groupby("run_id")["value"].median()
    thr = _rows(doc, "throughput")
    sc = _rows(doc, "scaling")
    for key, g in groups.items():
        per_seed = thr_points.loc[g["run_id"]]
        assert thr[key]["median"] == pytest.approx(per_seed.median())
        assert (thr[key]["min"], thr[key]["max"]) == pytest.approx((per_seed.min(), per_seed.max()))
        base = thr_points.loc[groups[(key[0], 1)]["run_id"]].median()
        assert sc[key]["speedup"] == pytest.approx(per_seed.median() / base)
        assert sc[key]["efficiency"] == pytest.approx(per_seed.median() / base / key[1])

    tt = _rows(doc, "time_to_target")
    for key, g in groups.items():
        steps = g[M.STEPS_TO_TARGET].fillna(np.inf).to_numpy()
        median = np.median(steps)
        assert tt[key]["median_reached"] == bool(np.isfinite(median))
        assert tt[key]["median_steps"] == (float(median) if np.isfinite(median) else None)
        assert tt[key]["n_reached"] == int(np.isfinite(steps).sum())

    # convergence scaling: seconds to target, a miss at the training seconds it ran; speedup of the median seeds
    ran = points[points.metric == M.WALL_TIME_S].groupby("run_id")["value"].max()
    cv = _rows(doc, "convergence")

    def to_target(g: pd.DataFrame) -> np.ndarray:
        return np.where(g[M.STEPS_TO_TARGET].notna(), g[M.WALL_S_TO_TARGET], ran.reindex(g["run_id"]).to_numpy())

    for key, g in groups.items():
        base = groups[(key[0], 1)]
        assert cv[key]["median_wall_s"] == pytest.approx(np.median(to_target(g)))
        if g[M.STEPS_TO_TARGET].notna().any() and base[M.STEPS_TO_TARGET].notna().any():
            assert cv[key]["speedup"] == pytest.approx(np.median(to_target(base)) / np.median(to_target(g)))
            assert cv[key]["speedup_low"] <= cv[key]["speedup"] <= cv[key]["speedup_high"]
        else:
            assert cv[key]["speedup"] is None  # no seed reached it: no speedup to tell
        assert cv[key]["worker_seconds"] == pytest.approx(key[1] * cv[key]["median_wall_s"])

    for r in doc["improvement"]:
        g = ok[ok.workers == r["workers"]]
        x = g[g.engine == r["engine_x"]][M.FINAL_RETURN_MEAN].to_numpy()
        y = g[g.engine == r["engine_y"]][M.FINAL_RETURN_MEAN].to_numpy()
        wins = sum(1.0 if a > b else 0.5 if a == b else 0.0 for a in x for b in y)
        assert r["p"] == pytest.approx(wins / (len(x) * len(y)))

    cost = _rows(doc, "cost")
    for key, g in groups.items():
        assert cost[key]["peak_rss_mb"] == pytest.approx(g[M.PEAK_RSS_MB].median())
        assert cost[key]["cpu_seconds"] == pytest.approx(g[M.CPU_SECONDS].median())

    # One grid point of one learning curve, by hand: interpolate each seed there and average.
    curve = next(c for c in doc["curves"]["env_steps"] if (c["engine"], c["workers"]) == ("rllib", 2))
    i = 37
    at = curve["x"][i]
    rets = points[(points.metric == M.EPISODE_RETURN_MEAN) & points.run_id.isin(groups[("rllib", 2)]["run_id"])]
    vals = [np.interp(at, g["step"], g["value"]) for _, g in rets.sort_values("step").groupby("run_id")]
    assert curve["mean"][i] == pytest.approx(np.mean(vals)) and curve["n"][i] == len(vals)
    assert curve["x"][0] == points[points.metric == M.EPISODE_RETURN_MEAN].step.min()

    assert {(p["trial"], p["status"], p["reason"]) for p in doc["problems"]} == {
        (r.trial, r.status, r.reason) for r in trials[trials.status != "FINISHED"].itertuples()
    }


def test_same_seed_same_files_and_json_has_no_nan(tmp_path: Path, make_frames: Any) -> None:
    trials, points, meta = make_frames(n_points=15)
    a = build_report(trials=trials, points=points, meta=meta, out_dir=tmp_path / "a", rng_seed=3)
    b = build_report(trials=trials, points=points, meta=meta, out_dir=tmp_path / "b", rng_seed=3)
    assert a.json.read_text() == b.json.read_text() and a.html.read_text() == b.html.read_text()
    json.loads(a.json.read_text(), parse_constant=lambda c: pytest.fail(f"{c} in report.json"))


@pytest.mark.parametrize(
    "kwargs",
    [
        pytest.param(dict(engines=("rllib",), workers=(1,), seeds=(0,), failures=False), id="one-engine-one-seed"),
        pytest.param(dict(workers=(2,), seeds=(0, 1), target=None), id="one-worker-count-no-target"),
        pytest.param(dict(engines=("crossrl", "mystack"), seeds=(5,)), id="unknown-engine-failed"),
    ],
)
def test_renders_degenerate_experiments(tmp_path: Path, kwargs: dict[str, Any], make_frames: Any) -> None:
    trials, points, meta = make_frames(n_points=12, **kwargs)
    paths = build_report(trials=trials, points=points, meta=meta, out_dir=tmp_path)
    doc = load_report_json(paths.json)
    page = paths.html.read_text()
    has_target = kwargs.get("target", 450.0) is not None
    one_worker_count = len(kwargs.get("workers", (1, 2))) == 1  # no scaling figure: one point says nothing
    convergence = has_target and not one_worker_count  # speedup to the target needs a target and two counts
    assert page.count("<svg ") == (5 if has_target else 4) - one_worker_count + convergence
    assert ('id="fig-time-to-target"' in page) == has_target
    assert ('id="fig-convergence"' in page) == convergence == bool(doc["convergence"])
    assert ('id="fig-scaling"' in page) != one_worker_count
    assert (">speedup</th>" in page) != one_worker_count
    assert len(doc["problems"]) == len(trials[trials.status != "FINISHED"])
    assert all(r["ci_low"] is None for r in doc["final_return"] if r["n_seeds"] < 2)


def test_renders_when_every_trial_failed_or_was_skipped(tmp_path: Path, make_frames: Any) -> None:
    trials, points, meta = make_frames(n_points=10, seeds=(0,))
    trials["status"] = ["FAILED", "SKIPPED", "KILLED"] * 2
    points = points[points.run_id.isin(trials[trials.status == "FAILED"].run_id)]
    paths = build_report(trials=trials, points=points, meta=meta, out_dir=tmp_path)
    doc = load_report_json(paths.json)
    assert doc["final_return"] == [] and len(doc["problems"]) == 6
    assert "no finished trial" in paths.html.read_text()
    assert "| KILLED |" in paths.markdown.read_text()


def test_load_report_json_refuses_other_schema(tmp_path: Path) -> None:
    p = tmp_path / "report.json"
    p.write_text(json.dumps({"schema_version": SCHEMA_VERSION + 1}))
    with pytest.raises(ValueError, match="schema_version 2"):
        load_report_json(p)
    p.write_text("[]")
    with pytest.raises(ValueError, match="schema_version None"):
        load_report_json(p)


def test_input_frames_are_not_modified(tmp_path: Path, make_frames: Any) -> None:
    trials, points, meta = make_frames(n_points=8)
    before = (trials.copy(), points.copy())
    build_report(trials=trials, points=points, meta=meta, out_dir=tmp_path)
    pd.testing.assert_frame_equal(trials, before[0])
    pd.testing.assert_frame_equal(points, before[1])
    assert not math.isnan(trials[M.FINAL_RETURN_MEAN].iloc[0])


def test_refuses_an_empty_experiment(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="nothing to report: 0 trials"):
        build_report(trials=pd.DataFrame(), points=pd.DataFrame(), meta={}, out_dir=tmp_path)


def test_throughput_measured_beside_other_trials_is_marked(tmp_path: Path, make_frames: Any) -> None:
    """A sweep's trials that shared a node (`crossrl run --parallel`) are marked in the throughput table."""
    trials, points, meta = make_frames(n_points=10, failures=False)
    alone = build_report(trials=trials, points=points, meta=meta, out_dir=tmp_path / "alone")
    assert "shared a node" not in alone.markdown.read_text()
    first = trials.index[(trials.engine == "rllib") & (trials.workers == 2)][0]
    trials["node_shared"] = False
    trials.loc[first, "node_shared"] = True
    paths = build_report(trials=trials, points=points, meta=meta, out_dir=tmp_path / "shared")
    md = paths.markdown.read_text()
    marked = [line for line in md.splitlines() if "shared a node" in line and line.startswith("|")]
    assert len(marked) == 1 and marked[0].startswith("| rllib | 2 |"), marked
    assert "--parallel 1" in md
    rows = _rows(load_report_json(paths.json), "throughput")
    assert rows["rllib", 2]["shared"] == 1 and rows["crossrl", 2]["shared"] == 0


def _sweep(total: int, points: list[tuple[str, str, float]], start_ms: int = 1_764_288_000_000) -> dict[str, Any]:
    """A stored `bench sampling --sweep` result (bench.json's fields the report reads)."""
    return {
        "env_id": "CartPole-v1",
        "conditions": {"total_envs": total},
        "points": [{"engine": e, "label": label, "steps_per_s": {"median": v}} for e, label, v in points],
        "run_id": "sweep1",
        "start_time": start_ms,
    }


def test_an_engine_held_to_a_slower_layout_is_marked_in_the_throughput_table(tmp_path: Path, make_frames: Any) -> None:
    """Trials name their layout (tag `layout`); the newest stored sweep of the same env and total envs timed torchrl
    faster in another one: torchrl's rows are marked with the share and the faster layout, rllib's (at its best) and
    crossrl's (not in the sweep) are not."""
    trials, points, meta = make_frames(n_points=10, failures=False)
    envs = int(trials["envs_per_worker"].iloc[0])
    trials["layout"] = [
        {"torchrl": f"MultiSync {w} x SerialEnv({envs})", "rllib": f"{w} runners x {envs} SYNC"}.get(e, f"{w} x {envs}")
        for e, w in zip(trials["engine"], trials["workers"], strict=True)
    ]
    sweeps = [
        _sweep(
            2 * envs,
            [
                ("torchrl", f"MultiSync 2 x SerialEnv({envs}), 4000 frames", 4_649.0),
                ("torchrl", f"MultiSync 2 x gym Sync({envs}), 4000 frames", 12_422.0),
                ("rllib", f"2 runners x {envs} SYNC, fragment 250", 10_178.0),
                ("rllib", f"local runner x {2 * envs} SYNC, fragment 250", 10_500.0),
                ("torchrl", f"MultiSync 2 x gym Sync({envs}), 1000 frames", 20_000.0),  # another batch: not a peer
            ],
        ),  # fmt: skip
        _sweep(2 * envs, [("torchrl", f"MultiSync 2 x SerialEnv({envs}), 4000 frames", 9_000.0)], start_ms=0),
    ]
    paths = build_report(trials=trials, points=points, meta={**meta, "layout_sweeps": sweeps}, out_dir=tmp_path)
    md = paths.markdown.read_text()
    marked = [line for line in md.splitlines() if line.startswith("|") and "‡" in line]
    assert len(marked) == 1 and marked[0].startswith(f"| torchrl | 2 | MultiSync 2 x SerialEnv({envs}) ‡ 37% of "
                                                     f"MultiSync 2 x gym Sync({envs}), 4000 frames |"), marked  # fmt: skip
    assert f"| rllib | 2 | 2 runners x {envs} SYNC |" in md  # 97 % of its best: within the sweep's spread
    assert "4,649 env steps/s against" in md and "sweep of 2025-11-28" in md
    marks = {(m["engine"], m["workers"]): m for m in load_report_json(paths.json)["layouts"]}
    assert marks["torchrl", 2]["slower"] and marks["torchrl", 2]["share"] == pytest.approx(4_649 / 12_422)
    assert not marks["rllib", 2]["slower"] and ("crossrl", 2) not in marks  # crossrl: not timed by the sweep
    assert ("torchrl", 1) not in marks  # no sweep of its total envs
    plain = build_report(trials=trials, points=points, meta=meta, out_dir=tmp_path / "plain").markdown.read_text()
    assert "‡" not in plain and f"MultiSync 2 x SerialEnv({envs})" in plain  # no sweep stored: named, not marked


def test_the_scaling_figures_ideal_line_is_straight_on_its_log_axes(make_frames: Any) -> None:
    """Workers 1-8 put the worker axis on a log scale; the throughput axis is logged too, so the linear ideal
    (throughput proportional to workers) is drawn as the straight line it is on log-log axes, not a curve."""
    from crossrl.reports.figures import _scaling

    trials, points, _ = make_frames(n_points=15, workers=(1, 2, 4, 8), seeds=(0, 1, 2), failures=False)
    st = S.compute(trials=trials, points=points, rng=np.random.default_rng(0), grid_points=50)
    svg = _scaling(st).svg
    ideal = []
    for d, style in re.findall(r'<path d="([^"]+)"\s*clip-path="[^"]*"\s*style="([^"]*)"', svg):
        pts = np.array(re.findall(r"([-\d.]+) ([-\d.]+)", d), dtype=float)
        if "dasharray" in style and len(pts) >= 40:  # the dense dotted ideal, one per engine
            ideal.append(pts)
    assert len(ideal) == len(set(trials["engine"])), len(ideal)
    for pts in ideal:
        x, y = pts[:, 0], pts[:, 1]
        fit = np.polyfit(x, y, 1)
        assert np.max(np.abs(y - np.polyval(fit, x))) < 0.01 * (y.max() - y.min()), "the ideal line is curved"
