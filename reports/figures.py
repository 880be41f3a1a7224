"""The report's figures, drawn from :class:`~crossrl.reports.stats.ReportStats` as inline SVG strings.

Drawing only: every number comes from ``stats``. Figures are built on ``matplotlib.figure.Figure``
directly (no pyplot, so no global figure state and no GUI backend); ``matplotlib.use("Agg")`` keeps
any stray pyplot use headless. Each engine keeps one colour in every figure (Okabe-Ito palette,
readable by colour-blind readers); worker counts get one panel each where curves would overlap.
"""

from __future__ import annotations

import io
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.axes import Axes  # noqa: E402
from matplotlib.figure import Figure as MplFigure  # noqa: E402
from matplotlib.ticker import EngFormatter, FuncFormatter  # noqa: E402

from crossrl.reports.stats import ReportStats, engine_sort_key  # noqa: E402

ENGINE_COLOURS = {"crossrl": "#0072B2", "rllib": "#D55E00", "torchrl": "#009E73"}
FALLBACK_COLOURS = ("#CC79A7", "#E69F00", "#56B4E9", "#8C564B", "#7F7F7F", "#000000")
# Typed Any: matplotlib stubs want literal rc keys, a plain dict is fine at run time.
RC: Any = {"svg.fonttype": "none", "font.size": 9.0, "axes.spines.top": False, "axes.spines.right": False}
_PANEL_W, _PANEL_H = 4.2, 3.2  # inches per panel


@dataclass(frozen=True)
class Figure:
    """One drawn figure: ``key`` is its HTML id, ``svg`` the inline ``<svg>`` element."""

    key: str
    title: str
    caption: str
    svg: str


def engine_colours(engines: Iterable[str]) -> dict[str, str]:
    """The fixed colours of crossrl, rllib and torchrl; other engine ids take the fallbacks in sorted order."""
    out = {e: ENGINE_COLOURS[e] for e in engines if e in ENGINE_COLOURS}
    others = sorted({e for e in engines if e not in ENGINE_COLOURS})
    for i, e in enumerate(others):
        out[e] = FALLBACK_COLOURS[i % len(FALLBACK_COLOURS)]
    return out


def to_svg(fig: MplFigure, key: str) -> str:
    """The figure as an ``<svg>`` element fit to inline (no XML prologue, ids unique to this figure)."""
    buf = io.StringIO()
    with matplotlib.rc_context({**RC, "svg.hashsalt": key}):
        fig.savefig(buf, format="svg", metadata={"Date": None})
    svg = buf.getvalue()
    svg = svg[svg.index("<svg") :]
    # Glyph-free SVG still has ids (clip paths, markers) that would clash between inline figures.
    svg = re.sub(r'id="([^"]+)"', rf'id="{key}-\1"', svg)
    svg = re.sub(r"#(?!{key})([A-Za-z][\w.-]*)\)", rf"#{key}-\1)", svg)
    svg = re.sub(r'xlink:href="#([^"]+)"', rf'xlink:href="#{key}-\1"', svg)
    return svg.replace("<svg ", f'<svg role="img" aria-label="{key}" ', 1)


def new_figure(
    panels: int = 1,
    *,
    width: float | None = None,
    height: float = _PANEL_H,
    left: float = 0.75,
    max_cols: int = 3,
    sharey: bool = True,
) -> tuple[MplFigure, list[Axes]]:
    """A figure of ``panels`` panels sharing y (unless ``sharey`` is false: each its own axis and labels),
    ``max_cols`` to a row (unused cells hidden).

    Margins are fixed in inches (``left``: room for y labels) instead of using matplotlib's
    constrained layout, whose layout pass measured about a third of a report's build time.
    """
    cols = min(panels, max_cols)
    rows = -(-panels // cols)
    w, h = width or _PANEL_W * cols, height * rows
    with matplotlib.rc_context(RC):
        fig = MplFigure(figsize=(w, h))
        fig.subplots_adjust(
            left=left / w,
            right=1 - 0.15 / w,
            bottom=0.5 / h,
            top=1 - 0.3 / h,
            wspace=0.06 if sharey else 0.35,
            hspace=0.8 / (height - 0.8),
        )
        axes = list(fig.subplots(rows, cols, squeeze=False, sharey=sharey).ravel())
    for ax in axes[panels:]:
        ax.set_visible(False)
    return fig, axes[:panels]


def _no_data(ax: Axes, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="#555555")
    ax.set_xticks([])
    ax.set_yticks([])


def _engines(*frames: pd.DataFrame) -> list[str]:
    found = {str(e) for f in frames if "engine" in f for e in f["engine"]}
    return sorted(found, key=engine_sort_key)


def _curves(stats: ReportStats, curves: pd.DataFrame, *, key: str, xlabel: str, x_eng: bool) -> Figure:
    workers = sorted({int(w) for w in curves["workers"]}) if len(curves) else [0]
    colours = engine_colours(_engines(stats.final_return, curves))
    fig, axes = new_figure(len(workers))
    with matplotlib.rc_context(RC):
        for ax, w in zip(axes, workers, strict=True):
            sub = curves[curves["workers"] == w] if len(curves) else curves
            if sub.empty:
                _no_data(ax, "no finished trial logged a return")
                continue
            for engine in sorted(sub["engine"].unique(), key=engine_sort_key):
                c = sub[sub["engine"] == engine]
                colour = colours[engine]
                n = int(c["n"].max())
                ax.plot(c["x"], c["mean"], color=colour, lw=1.6, label=f"{engine} (n={n})")
                ax.fill_between(c["x"], c["ci_low"], c["ci_high"], color=colour, alpha=0.18, lw=0)
            if np.isfinite(stats.target_return):
                ax.axhline(stats.target_return, color="#444444", ls="--", lw=0.9, label="target")
            ax.set_title(f"{w} worker{'s' if w != 1 else ''}")
            ax.set_xlabel(xlabel)
            if x_eng:
                ax.xaxis.set_major_formatter(EngFormatter(sep=""))
            ax.grid(alpha=0.3)
            ax.legend(loc="lower right", fontsize=8, frameon=False)
        axes[0].set_ylabel("episode return (mean of episodes)")
    return Figure(key=key, title="", caption="", svg=to_svg(fig, key))


def _throughput(stats: ReportStats) -> Figure:
    thr = stats.throughput.dropna(subset=["median"])
    fig, (ax,) = new_figure(1, width=max(_PANEL_W, 1.6 + 1.4 * max(1, thr["workers"].nunique())))
    with matplotlib.rc_context(RC):
        if thr.empty:
            _no_data(ax, "no finished trial logged a throughput")
        else:
            engines = sorted(thr["engine"].unique(), key=engine_sort_key)
            colours = engine_colours(engines)
            workers = sorted({int(w) for w in thr["workers"]})
            width = 0.8 / len(engines)
            for i, engine in enumerate(engines):
                c = thr[thr["engine"] == engine]
                pos = np.array([workers.index(int(w)) for w in c["workers"]]) + (i - (len(engines) - 1) / 2) * width
                med = c["median"].to_numpy(dtype=float)
                err = np.vstack([med - c["min"].to_numpy(dtype=float), c["max"].to_numpy(dtype=float) - med])
                ax.bar(pos, med, width=width * 0.92, color=colours[engine], label=engine)
                ax.errorbar(pos, med, yerr=err, fmt="none", ecolor="#222222", capsize=2.5, lw=0.9)
            ax.set_xticks(range(len(workers)), [str(w) for w in workers])
            ax.set_ylim(0, float(thr["max"].max()) * 1.3)  # headroom for the legend above the bars
            ax.legend(fontsize=8, frameon=False, loc="upper left", ncols=min(4, len(engines)))
        ax.set_xlabel("workers")
        ax.set_ylabel("sampling throughput (env steps/s)")
        ax.yaxis.set_major_formatter(EngFormatter(sep=""))
        ax.grid(axis="y", alpha=0.3)
    return Figure(key="throughput", title="", caption="", svg=to_svg(fig, "throughput"))


def _scaling(stats: ReportStats) -> Figure:
    sc = stats.scaling
    fig, (ax,) = new_figure(1)
    with matplotlib.rc_context(RC):
        if sc.empty:
            _no_data(ax, "no finished trial logged a throughput")
        else:
            colours = engine_colours(sc["engine"].unique())
            workers = sorted({int(w) for w in sc["workers"]})
            for engine in sorted(sc["engine"].unique(), key=engine_sort_key):
                c = sc[sc["engine"] == engine].sort_values("workers")
                w = c["workers"].to_numpy(dtype=float)
                base_w = float(c["baseline_workers"].iloc[0])
                base = float(c.loc[c["workers"] == base_w, "throughput"].iloc[0])
                ax.plot(w, c["throughput"], "o-", color=colours[engine], lw=1.6, label=engine)
                # Dense, so the ideal line is drawn true on a log-scaled worker axis.
                ideal_w = np.geomspace(base_w, max(workers), 40)
                ax.plot(ideal_w, base * ideal_w / base_w, ls=":", color=colours[engine], lw=1.2)
            ax.plot([], [], ls=":", color="#444444", label="ideal (linear)")
            log_log = max(workers) / min(workers) >= 4  # 1, 2, 4, 8, 16 would bunch up on a linear axis
            if log_log:  # both axes: a linear ideal is a straight line only on log-log (log x alone curves it)
                ax.set_xscale("log", base=2)
                ax.set_yscale("log")
                ax.minorticks_off()
            ax.set_xticks(workers, [str(w) for w in workers])
            if len(workers) == 1:
                ax.set_xlim(workers[0] - 1, workers[0] + 1)
            if not log_log:
                ax.set_ylim(bottom=0)
            ax.legend(fontsize=8, frameon=False)
        ax.set_xlabel("workers")
        ax.set_ylabel("sampling throughput (env steps/s)")
        ax.yaxis.set_major_formatter(EngFormatter(sep=""))
        ax.grid(alpha=0.3)
    return Figure(key="scaling", title="", caption="", svg=to_svg(fig, "scaling"))


def _convergence(stats: ReportStats) -> Figure:
    """Two panels per engine's worker counts: speedup to the target (log-log, the linear ideal straight, each count's
    CI as a whisker, hollow where the figure is a bound) and env steps to the target (median, with its seeds')."""
    cv = stats.convergence
    fig, (left, right) = new_figure(2, width=2 * _PANEL_W, sharey=False)
    with matplotlib.rc_context(RC):
        colours = engine_colours(cv["engine"].unique())
        workers = sorted({int(w) for w in cv["workers"]})
        for engine in sorted(cv["engine"].unique(), key=engine_sort_key):
            c = cv[cv["engine"] == engine].sort_values("workers")
            w = c["workers"].to_numpy(dtype=float)
            s = c["speedup"].to_numpy(dtype=float)
            ok = np.isfinite(s)
            if ok.any():
                lo, hi = c["speedup_low"].to_numpy(dtype=float), c["speedup_high"].to_numpy(dtype=float)
                err = np.vstack([np.where(np.isfinite(lo), s - lo, 0), np.where(np.isfinite(hi), hi - s, 0)])
                left.errorbar(w[ok], s[ok], yerr=err[:, ok], fmt="-", color=colours[engine], lw=1.6, capsize=2.5,
                              label=engine)  # fmt: skip
                bound = (c["bound"].astype(str) != "").to_numpy() & ok
                left.plot(w[ok & ~bound], s[ok & ~bound], "o", color=colours[engine])
                left.plot(w[bound], s[bound], "o", mfc="white", color=colours[engine])
            steps = c["median_steps"].to_numpy(dtype=float)
            censored = (2 * c["n_reached"] <= c["n_seeds"]).to_numpy()  # the median seed missed: what it ran
            right.plot(w, steps, "-", color=colours[engine], lw=1.6, label=engine)
            right.plot(w[~censored], steps[~censored], "o", color=colours[engine])
            right.plot(w[censored], steps[censored], "o", mfc="white", color=colours[engine])
        base = min(workers)
        ideal = np.array([base, max(workers)], dtype=float)
        left.plot(ideal, ideal / base, ls=":", color="#444444", lw=1.2, label="ideal (linear)")
        for ax in (left, right):
            if max(workers) / base >= 4:
                ax.set_xscale("log", base=2)
                ax.minorticks_off()
            ax.set_xticks(workers, [str(x) for x in workers])
            ax.set_xlabel("workers")
            ax.grid(alpha=0.3)
        if max(workers) / base >= 4:
            left.set_yscale("log", base=2)
            left.minorticks_off()
            left.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        left.set_ylabel(f"speedup to target (vs {base} worker{'s' * (base != 1)})")
        left.legend(fontsize=8, frameon=False)
        right.set_ylabel("env steps to target (median)")
        right.legend(fontsize=8, frameon=False)
        right.yaxis.set_major_formatter(EngFormatter(sep=""))
        right.set_ylim(bottom=0)
    return Figure(key="convergence", title="", caption="", svg=to_svg(fig, "convergence"))


def _time_to_target(stats: ReportStats) -> Figure:
    tt = stats.time_to_target
    rows = list(tt.itertuples(index=False))
    fig, axes = new_figure(2, width=2 * _PANEL_W, height=max(2.2, 0.9 + 0.3 * len(rows)), left=1.0)
    colours = engine_colours(tt["engine"].unique())
    labels = [f"{r.engine}, {r.workers}w" for r in rows]
    y = np.arange(len(rows))[::-1]
    panels: Sequence[tuple[Axes, str, str, str, str]] = (
        (axes[0], "median_steps", "steps_per_seed", "steps_censored_at", "env steps sampled to target"),
        (axes[1], "median_wall_s", "wall_s_per_seed", "wall_censored_at", "wall time to target (s)"),
    )
    with matplotlib.rc_context(RC):
        for ax, med_col, seeds_col, cens_col, xlabel in panels:
            longest = 0.0
            for yi, r in zip(y, rows, strict=True):
                rd = r._asdict()
                colour = colours[r.engine]
                med, cens = rd[med_col], rd[cens_col]
                if r.median_reached and med is not None and np.isfinite(med):
                    ax.barh(yi, med, color=colour, height=0.6)
                    longest = max(longest, med)
                elif cens is not None and np.isfinite(cens):
                    longest = max(longest, cens * 1.3)  # room for the label
                    ax.barh(yi, cens, color="none", edgecolor=colour, hatch="///", height=0.6)
                    ax.text(cens, yi, " not reached", va="center", fontsize=7.5, color="#333333")
                reached = [v for v in rd[seeds_col] if v is not None]
                ax.plot(reached, [yi] * len(reached), "o", ms=3.5, mfc="white", mec="#222222", mew=0.8)
                longest = max([longest, *reached])
            ax.set_yticks(y, labels)
            ax.set_xlabel(xlabel)
            ax.set_xlim(0, longest * 1.05 if longest > 0 else 1.0)
            if med_col == "median_steps":
                ax.xaxis.set_major_formatter(EngFormatter(sep=""))
            ax.grid(axis="x", alpha=0.3)
    return Figure(key="time-to-target", title="", caption="", svg=to_svg(fig, "time-to-target"))


def make_figures(stats: ReportStats) -> list[Figure]:
    """Every figure of the report, in reading order (time to target only when the spec sets a target)."""
    target = f" (dashed: target {stats.target_return:g})" if np.isfinite(stats.target_return) else ""
    band = "mean over seeds, band: 95% bootstrap CI"
    out = [
        _titled(
            _curves(stats, stats.curves_steps, key="return-vs-steps", xlabel="env steps sampled", x_eng=True),
            "Return against env steps",
            f"Episode return on a common env-step grid, {band}{target}. One panel per worker count.",
        ),
        _titled(
            _curves(stats, stats.curves_wall, key="return-vs-wall", xlabel="wall time (s)", x_eng=False),
            "Return against wall time",
            f"Episode return against seconds since training started (set-up excluded), {band}{target}.",
        ),
        _titled(
            _throughput(stats),
            "Sampling throughput",
            "Per trial the median over iterations of env steps sampled per second; bars: median over "
            "seeds, whiskers: min and max over seeds.",
        ),
        _titled(
            _scaling(stats),
            "Throughput against workers",
            "Median sampling throughput per worker count; dotted: ideal linear scaling from each "
            "engine's smallest worker count (the worker axis is logarithmic when it spans 4x or more).",
        ),
    ]
    if not stats.convergence.empty:
        out.append(
            _titled(
                _convergence(stats),
                "Convergence scaling",
                "Left: speedup in training seconds to the target against the fewest workers, log-log, whiskers its "
                "95% CI, dotted the linear ideal; hollow: a bound (some seeds missed and count at what they ran). "
                "Right: median env steps to the target (what staleness costs as workers grow; hollow: the median seed "
                "missed it and counts at what it ran).",
            )
        )
    if np.isfinite(stats.target_return) and not stats.time_to_target.empty:
        out.append(
            _titled(
                _time_to_target(stats),
                "Time to target",
                "Median over seeds (a seed that never reached the target counts as infinite); dots: "
                "seeds that reached it; hatched: the median seed did not reach it within the budget.",
            )
        )
    return out


def _titled(fig: Figure, title: str, caption: str) -> Figure:
    return Figure(key=fig.key, title=title, caption=caption, svg=fig.svg)
