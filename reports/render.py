"""Write a scenario's comparison report: report.html, report.md and report.json.

``build_report`` takes the store's frames (see :mod:`crossrl.reports.store`), computes every number
once (:mod:`crossrl.reports.stats`), draws the figures (:mod:`crossrl.reports.figures`) and formats
the same tables three ways. report.html is one self-contained file (inline SVG and CSS, no script,
no network access); report.md holds the tables for a CI step summary or a PR comment; report.json
holds every number of the tables with the fingerprint, versions and machine, for ``crossrl regress``.
"""

from __future__ import annotations

import base64
import dataclasses
import html
import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml

from crossrl.reports import stats as S
from crossrl.reports import verdict as V
from crossrl.reports.figures import Figure, make_figures
from crossrl.reports.layouts import LayoutMark, layout_marks

SCHEMA_VERSION = 1
DASH = "—"
FIGURES_DIR = "figures"  # beside report.md: the figures as SVG files


@dataclass(frozen=True)
class ReportPaths:
    """The three files of one report."""

    html: Path
    markdown: Path
    json: Path

    @property
    def md(self) -> Path:
        return self.markdown


@dataclass(frozen=True)
class Table:
    """One table, already formatted: shared by the HTML and Markdown outputs."""

    key: str
    title: str
    headers: Sequence[str]
    rows: Sequence[Sequence[str]]
    note: str = ""
    text_columns: frozenset[int] = frozenset({0})  # left-aligned; the others are numbers


def mark_native(tables: Sequence[Table], native: Mapping[str, str]) -> list[Table]:
    """The tables with the engine-native mark (§) beside each engine that ran with engine-native settings, in every
    column headed ``engine``, and a note saying what it means."""
    if not native:
        return list(tables)
    out = []
    for t in tables:
        cols = [i for i, h in enumerate(t.headers) if h == "engine"]
        rows = [[f"{c} {V.NATIVE_MARK}" if i in cols and c in native else c for i, c in enumerate(r)] for r in t.rows]
        if rows == [list(r) for r in t.rows]:
            out.append(t)
            continue
        note = (t.note + " " if t.note else "") + (
            f"{V.NATIVE_MARK} Ran with engine-native settings (the spec's native section): outside the "
            "equal-settings rule."
        )
        out.append(dataclasses.replace(t, rows=rows, note=note))
    return out


def _fin(x: Any) -> bool:
    return x is not None and isinstance(x, int | float | np.number) and math.isfinite(float(x))


def _f(x: Any, fmt: str) -> str:
    return format(float(x), fmt) if _fin(x) else DASH


def _secs(x: Any) -> str:
    return DASH if not _fin(x) else (f"{x:,.0f}" if x >= 100 else f"{x:.1f}" if x >= 10 else f"{x:.2f}")


def _ci(lo: Any, hi: Any, fmt: str, n: int) -> str:
    if _fin(lo) and _fin(hi):
        return f"[{format(lo, fmt)}, {format(hi, fmt)}]"
    return f"{DASH} ({n} seed{'s' if n != 1 else ''})"


def _tables(st: S.ReportStats, trials: pd.DataFrame | None = None, marks: Sequence[LayoutMark] = ()) -> list[Table]:
    tables = [
        Table(
            "final-return",
            "Final return",
            ["engine", "workers", "seeds", "IQM final return", "95% CI"],
            [
                [r.engine, str(r.workers), str(r.n_seeds), _f(r.iqm, ".1f"), _ci(r.ci_low, r.ci_high, ".1f", r.n_seeds)]
                for r in st.final_return.itertuples()
            ],
            "Interquartile mean over seeds of each trial's final return; stratified bootstrap CI.",
        )
    ]
    if not st.final_at_common.empty:
        tables.append(
            Table(
                "final-return-at-common-steps",
                "Final return at the env steps every trial reached",
                ["engine", "workers", "seeds", "env steps", "IQM return", "95% CI"],
                [
                    [
                        r.engine,
                        str(r.workers),
                        str(r.n_seeds),
                        f"{int(r.common_step):,}",
                        _f(r.iqm, ".1f"),
                        _ci(r.ci_low, r.ci_high, ".1f", r.n_seeds),
                    ]
                    for r in st.final_at_common.itertuples()
                ],
                "The trials of these worker counts ended at different env steps (a time budget, an engine's larger "
                "batches): each trial's mean return over its episodes in the last 10 % of the env steps every trial "
                "reached (its last point before them where none ended there); IQM over seeds, stratified bootstrap CI. "
                "The verdict compares these.",
            )
        )
    if int((st.return_at_wall["n_seeds"] > 0).sum() if not st.return_at_wall.empty else 0) >= 2:
        # a comparison at equal training time needs two engines with a seed in it; otherwise it shows nothing
        horizon = float(st.return_at_wall["wall_s"].iloc[0])
        tables.append(
            Table(
                "return-at-wall",
                f"Return after {_secs(horizon)} s of training",
                ["engine", "workers", "seeds", "IQM return", "95% CI"],
                [
                    [
                        r.engine,
                        str(r.workers),
                        str(r.n_seeds),
                        _f(r.iqm, ".1f"),
                        _ci(r.ci_low, r.ci_high, ".1f", r.n_seeds),
                    ]
                    for r in st.return_at_wall.itertuples()
                ],
                "Each trial's mean return over the episodes it completed in the last 10 % of the shortest training "
                "wall time among the trials (the same time for every engine); IQM over seeds, stratified bootstrap CI."
                + "".join(f" {line}." for line in (V.missing_at_wall(st, trials) if trials is not None else [])),
            )
        )
    if not st.agent_return.empty:
        tables.append(
            Table(
                "agent-return",
                "Final return per agent",
                ["engine", "workers", "agent", "seeds", "IQM final return", "95% CI"],
                [
                    [
                        r.engine,
                        str(r.workers),
                        str(r.agent),
                        str(r.n_seeds),
                        _f(r.iqm, ".1f"),
                        _ci(r.ci_low, r.ci_high, ".1f", r.n_seeds),
                    ]
                    for r in st.agent_return.itertuples()
                ],
                "A multi-agent env: the final return above is the team's (the sum of the agents' returns per "
                "episode); here each agent's mean return over the same episodes (the last 10 % of the env steps), "
                "IQM over seeds, stratified bootstrap CI.",
                frozenset({0, 1, 2}),
            )
        )
    if not st.time_to_target.empty:
        rows = []
        for r in st.time_to_target.itertuples():
            seeds = f"{r.n_reached}/{r.n_seeds}"
            if r.median_reached:
                rows.append([r.engine, str(r.workers), seeds, _f(r.median_steps, ",.0f"), _secs(r.median_wall_s)])
            else:
                wall = f"not reached in {_secs(r.wall_censored_at)} s" if _fin(r.wall_censored_at) else "not reached"
                why = f" ({r.censored_by})" if getattr(r, "censored_by", "") else ""
                rows.append(
                    [r.engine, str(r.workers), seeds, f"not reached in {r.steps_censored_at:,} env steps{why}", wall]
                )
        tables.append(
            Table(
                "time-to-target",
                f"Time to target (episode return ≥ {st.target_return:g})",
                ["engine", "workers", "seeds reached", "median env steps", "median wall s"],
                rows,
                "A seed that never reached the target counts as infinite in the median.",
            )
        )
    if not st.convergence.empty:
        tables.append(_convergence_table(st))
    if not st.convergence_fits.empty:
        tables.append(_fits_table(st))
    scale = st.scaling.set_index(["engine", "workers"]) if not st.scaling.empty else None
    rows = []
    for r in st.throughput.itertuples():
        key = (r.engine, r.workers)
        sp = scale.loc[key] if scale is not None and key in scale.index else None
        speed = _f(sp["speedup"], ".2f") + "×" if sp is not None and _fin(sp["speedup"]) else DASH
        eff = _f(100 * sp["efficiency"], ".0f") + "%" if sp is not None and _fin(sp["efficiency"]) else DASH
        base = str(int(sp["baseline_workers"])) if sp is not None else DASH
        spread = f"{_f(r.min, ',.0f')} – {_f(r.max, ',.0f')}"
        shared = f" † {r.shared}/{r.n_seeds} shared a node" if r.shared else ""
        rows.append([r.engine, str(r.workers), str(r.n_seeds), _f(r.median, ",.0f") + shared, spread, speed, eff, base])
    note = (
        "Median over iterations per trial, then median over seeds. Speedup against the engine's "
        "smallest worker count; efficiency = speedup / (workers / that count)."
    )
    if st.throughput["shared"].any():
        note += (
            " † Some trials ran beside other trials of the sweep on the same node (`crossrl run --parallel`): "
            "their speed was contended; run with `--parallel 1` to compare speed."
        )
    headers = ["engine", "workers", "seeds", "env steps/s", "min – max", "speedup", "efficiency", "vs workers"]
    title = "Sampling throughput and scaling"
    if V.single_worker_count(st):  # one worker count per engine: a speedup of 1.00x would mean nothing
        headers, rows, title = headers[:5], [r[:5] for r in rows], "Sampling throughput"
        note = (
            "Median over iterations per trial, then median over seeds. Each engine ran one worker count, so "
            "there is no scaling to show (give execution.workers several counts)."
            + note.partition("smallest worker count; efficiency = speedup / (workers / that count).")[2]
        )
    elif st.batch_note:
        note += " " + st.batch_note
    text = frozenset({0})
    if trials is not None and "layout" in trials and (trials["layout"].fillna("").astype(str) != "").any():
        headers, rows, note = _with_layouts(headers, rows, note, trials, marks)
        text = frozenset({0, 2})
    tables.append(Table("throughput", title, headers, rows, note, text))
    tables.append(
        Table(
            "improvement",
            "Probability of improvement (final return)",
            ["workers", "X", "Y", "seeds X/Y", "P(X > Y)", "95% CI"],
            [
                [
                    str(r.workers),
                    r.engine_x,
                    r.engine_y,
                    f"{r.n_x}/{r.n_y}",
                    _f(r.p, ".2f"),
                    _ci(r.ci_low, r.ci_high, ".2f", min(r.n_x, r.n_y)),
                ]
                for r in st.improvement.itertuples()
            ],
            "P(X > Y) over all pairs of seeds (ties count one half), as rliable; 0.5 means no difference."
            + (
                " One seed per engine: each P(X > Y) compares a single pair of trials and supports no conclusion "
                "(run more seeds)."
                if not st.improvement.empty and int(st.improvement[["n_x", "n_y"]].min().min()) < 2
                else ""
            ),
            frozenset({1, 2}),
        )
    )
    tables.append(
        Table(
            "cost",
            "Cost",
            ["engine", "workers", "seeds", "peak RSS (MiB)", "CPU s", "set-up s"],
            [
                [
                    r.engine,
                    str(r.workers),
                    str(r.n_seeds),
                    _f(r.peak_rss_mb, ",.0f"),
                    _secs(r.cpu_seconds),
                    _secs(r.setup_s),
                ]
                for r in st.cost.itertuples()
            ],
            "Medians over seeds; the trial's whole process tree.",
        )
    )
    tables.append(
        Table(
            "problems",
            "Trials that did not finish",
            ["trial", "engine", "workers", "seed", "status", "reason"],
            [
                [str(r.trial), str(r.engine), str(r.workers), str(r.seed), str(r.status), str(r.reason) or DASH]
                for r in st.problems.itertuples()
            ],
            "None: every trial finished." if st.problems.empty else "These trials are left out of every number above.",
            frozenset({0, 1, 4, 5}),
        )
    )
    return tables


_BOUND = {"upper": "≤ ", "lower": "≥ ", "none": "~ "}


def _convergence_table(st: S.ReportStats) -> Table:
    rows = []
    for r in st.convergence.itertuples():
        bound = _BOUND.get(str(r.bound), "")
        rows.append(
            [
                r.engine,
                str(r.workers),
                f"{r.n_reached}/{r.n_seeds}",
                _secs(r.median_wall_s),
                _secs(r.setup_s),
                _f(r.median_steps, ",.0f"),
                bound + _f(r.speedup, ".2f") + "×" if _fin(r.speedup) else "not reached",
                _ci(r.speedup_low, r.speedup_high, ".2f", r.n_seeds) if _fin(r.speedup) else DASH,
                _f(100 * r.efficiency, ".0f") + "%" if _fin(r.efficiency) else DASH,
                _f(r.sample_cost, ".2f") + "×" if _fin(r.sample_cost) else DASH,
                _ci(r.sample_cost_low, r.sample_cost_high, ".2f", r.n_seeds) if _fin(r.sample_cost) else DASH,
                _f(r.worker_seconds, ",.0f"),
            ]
        )
    return Table(
        "convergence",
        f"Convergence scaling (time to episode return ≥ {st.target_return:g})",
        [
            "engine",
            "workers",
            "seeds reached",
            "median s to target",
            "set-up s",
            "median env steps",
            "speedup",
            "95% CI",
            "efficiency",
            "sample cost",
            "95% CI",
            "worker-s",
        ],  # fmt: skip
        rows,
        "Seconds of training to the target (set-up excluded, its median beside it) and env steps by then, median over "
        "seeds; a seed that missed counts at what it ran, which makes the speedup a bound: ≤ where the count's own "
        "seeds missed, ≥ where the fewest workers' did, ~ where both did. Speedup = T(fewest) / T(N), with a "
        "bootstrap CI over both groups' seeds; efficiency = speedup / worker ratio; sample cost = env steps(N) / env "
        "steps(fewest); worker-s = N × T(N), what a cloud bill charges."
        + (f" {st.batch_note}" if st.batch_note else ""),
    )


def _fits_table(st: S.ReportStats) -> Table:
    rows = []
    for r in st.convergence_fits.to_dict("records"):
        if r["model"] == "amdahl":
            params = f"s = {_f(r['s'], '.3f')} {_ci(r.get('s_low'), r.get('s_high'), '.3f', 0)}"
        else:
            params = (
                f"σ = {_f(r['sigma'], '.3f')} {_ci(r.get('sigma_low'), r.get('sigma_high'), '.3f', 0)}, "
                f"κ = {_f(r['kappa'], '.4f')} {_ci(r.get('kappa_low'), r.get('kappa_high'), '.4f', 0)}"
            )
        best = DASH
        if r["model"] == "usl":
            counts = [*st.convergence.loc[st.convergence["engine"] == r["engine"], "workers"]]
            counts += [*st.throughput.loc[st.throughput["engine"] == r["engine"], "workers"]]
            most = max(int(w) for w in counts)
            if not _fin(r["best_workers"]) or r["best_workers"] > 4 * most:
                best = f"none up to {4 * most} (κ ≈ 0)"
            else:
                best = _f(r["best_workers"], ".1f") + (" (predicted)" if r["best_workers"] > most else "")
        held = DASH
        if _fin(r.get("holdout_workers")):
            held = (
                f"{int(r['holdout_workers'])} workers: predicted {_f(r['holdout_predicted'], '.2f')}×, "
                f"measured {_f(r['holdout_measured'], '.2f')}×"
            )
        rows.append([r["engine"], str(r["measure"]), "Amdahl" if r["model"] == "amdahl" else "USL", params, best, held])
    return Table(
        "convergence-fits",
        "Scaling models (speedup to target and in sampling throughput)",
        ["engine", "measure", "model", "parameters (95% CI)", "best workers", f"fit up to {16}, predict the next"],
        rows,
        "Amdahl: S(n) = 1 / (s + (1 − s) / n), s the serial fraction; USL (Gunther): S(n) = n / (1 + σ(n − 1) + "
        "κn(n − 1)), σ contention, κ coherency, best at √((1 − σ) / κ) workers (a prediction where it lies past the "
        "measured counts); n = workers / fewest. CIs from refits on bootstrap draws of the seeds.",
        frozenset({0, 1, 2, 3, 5}),
    )


def _with_layouts(
    headers: list[str], rows: list[list[str]], note: str, trials: pd.DataFrame, marks: Sequence[LayoutMark]
) -> tuple[list[str], list[list[str]], str]:
    """The throughput table with each engine's layout (its trials' ``layout`` tag) after its worker count, marked ‡
    where the newest stored ``bench sampling --sweep`` of the env timed the engine faster in another layout."""
    named = trials.assign(layout=trials["layout"].fillna("").astype(str))
    layouts = {(str(e), int(w)): str(g["layout"].mode().iloc[0]) for (e, w), g in named.groupby(["engine", "workers"])}
    by_key = {(m.engine, m.workers): m for m in marks}
    out = []
    for row in rows:
        key = (row[0], int(row[1]))
        mark = by_key.get(key)
        cell = layouts.get(key, "") or DASH
        if mark is not None and mark.slower:
            cell += f" ‡ {mark.share:.0%} of {mark.best}"
        out.append([*row[:2], cell, *row[2:]])
    slower = [m for m in marks if m.slower]
    if slower:
        when = {m.sweep_run: pd.Timestamp(m.sweep_start_ms, unit="ms").strftime("%Y-%m-%d") for m in slower}
        note += (
            " ‡ Ran in a layout slower than its engine's fastest measured for the same envs on this store's newest "
            "`crossrl bench sampling --sweep` ("
            + "; ".join(
                f"{m.engine} {m.layout}: {m.steps_per_s:,.0f} env steps/s against {m.best} {m.best_steps_per_s:,.0f}, "
                f"sweep of {when[m.sweep_run]}"
                for m in slower
            )
            + "): its speed here is crossrl's choice of layout, not the engine at its best; set execution.layout "
            "(docs/layouts.md)."
        )
    return [*headers[:2], "layout", *headers[2:]], out, note


@dataclass(frozen=True)
class Clip:
    """One engine's final policy playing one episode (a trial's clip artifact, see ``crossrl.adapters.base.send_clip``)."""

    engine: str
    trial: str
    workers: int
    seed: int
    score: float
    length: int
    ended: bool  # False: the episode was cut at the frame cap
    name: str  # the artifact's name, e.g. clip.gif
    data: bytes

    @property
    def mime(self) -> str:
        return "image/webp" if self.name.endswith(".webp") else "image/gif"

    @property
    def file(self) -> str:
        """Where report.md links it, next to the report."""
        suffix = self.name.rsplit(".", 1)[-1] if "." in self.name else "gif"
        return f"clips/{re.sub(r'[^A-Za-z0-9_.-]', '_', self.trial)}.{suffix}"

    def caption(self) -> str:
        cut = "" if self.ended else " (cut at the frame cap)"
        return f"score {self.score:g} in {self.length:,} steps{cut} · seed {self.seed} · {self.trial}"


CLIPS_NOTE = (
    "Each engine's final policy playing one episode of the env it trained on, from the trial's seed (the first "
    "seed's trial of each engine, its fewest workers), acting greedily (the argmax of its logits or Q-values); "
    "the score is the game's raw score."
)


def _clips(trials: pd.DataFrame, meta: Mapping[str, Any], read: Callable[[str, str], bytes] | None) -> list[Clip]:
    """Per engine, the clip of its first seed's FINISHED trial that has one (seeds in the spec's order, then the
    fewest workers); none when the trials have no clip or there is no ``read(run_id, artifact)``. A clip that
    cannot be read is left out."""
    if read is None or "clip" not in trials.columns:
        return []
    have = trials[(trials["status"] == S.COUNTED_STATUS) & (trials["clip"].fillna("").astype(str) != "")]
    spec_seeds = list((meta.get("spec") or {}).get("seeds") or [])
    order = {int(s): i for i, s in enumerate(spec_seeds)}
    out = []
    for engine in sorted({str(e) for e in have["engine"]}, key=S.engine_sort_key):
        rows = have[have["engine"] == engine]
        ranked = sorted(
            rows.itertuples(), key=lambda r: (order.get(int(r.seed), len(order)), int(r.seed), int(r.workers))
        )
        for r in ranked:
            try:
                data = bytes(read(str(r.run_id), str(r.clip)))
            except Exception:  # noqa: BLE001 - a clip the store cannot give: the next seed's, or none
                continue
            score = float(r.clip_score) if _fin(r.clip_score) else math.nan
            length = int(r.clip_length) if _fin(r.clip_length) else 0
            out.append(
                Clip(
                    engine,
                    str(r.trial),
                    int(r.workers),
                    int(r.seed),
                    score,
                    length,
                    bool(r.clip_ended),
                    str(r.clip),
                    data,
                )
            )
            break
    return out


def _clips_html(clips: Sequence[Clip]) -> str:
    if not clips:
        return ""
    esc = html.escape
    items = "".join(
        f'<figure class="clip" id="clip-{esc(c.engine)}"><h3>{esc(c.engine)}</h3>'
        f'<img src="data:{c.mime};base64,{base64.b64encode(c.data).decode("ascii")}" '
        f'alt="{esc(c.engine)}: final policy, one episode"><figcaption>{esc(c.caption())}</figcaption></figure>'
        for c in clips
    )
    return f'<h2 id="final-policies">Final policies</h2><div class="clips">{items}</div><p class="note">{esc(CLIPS_NOTE)}</p>'


def _clips_markdown(clips: Sequence[Clip]) -> list[str]:
    if not clips:
        return []
    lines = ["## Final policies", ""]
    lines += [f"- **{c.engine}**: {md_cell(c.caption())} · [{c.file}]({c.file})" for c in clips]
    return [*lines, "", f"_{CLIPS_NOTE}_", ""]


def _engine_versions(trials: pd.DataFrame) -> dict[str, list[str]]:
    if "engine_version" not in trials:
        return {}
    out: dict[str, list[str]] = {}
    for engine, g in trials.groupby("engine"):
        out[str(engine)] = sorted({str(v) for v in g["engine_version"] if str(v) not in ("", "nan")})
    return dict(sorted(out.items(), key=lambda kv: S.engine_sort_key(kv[0])))


def _jsonable(x: Any) -> Any:
    """Plain JSON types; NaN and inf become null (a censored or undefined number)."""
    if isinstance(x, Mapping):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, list | tuple | np.ndarray):
        return [_jsonable(v) for v in x]
    if isinstance(x, bool | np.bool_):
        return bool(x)
    if isinstance(x, int | np.integer):
        return int(x)
    if isinstance(x, float | np.floating):
        return float(x) if math.isfinite(float(x)) else None
    if x is None or isinstance(x, str):
        return x
    return str(x)


def _records(df: pd.DataFrame) -> list[dict[str, Any]]:
    return [_jsonable(r) for r in df.to_dict(orient="records")]


def _curves(df: pd.DataFrame) -> list[dict[str, Any]]:
    return [
        _jsonable({"engine": e, "workers": w, **{c: g[c].to_numpy() for c in ("x", "mean", "ci_low", "ci_high", "n")}})
        for (e, w), g in df.groupby(["engine", "workers"], sort=False)
    ]


def _document(
    *, st: S.ReportStats, trials: pd.DataFrame, meta: Mapping[str, Any], rng_seed: int, grid_points: int
) -> dict[str, Any]:
    fingerprints = sorted({str(f) for f in trials.get("fingerprint", pd.Series([], dtype=str)) if str(f)})
    return _jsonable(
        {
            "schema_version": SCHEMA_VERSION,
            "scenario": meta.get("scenario", ""),
            "fingerprint": meta.get("fingerprint") or (fingerprints[0] if len(fingerprints) == 1 else ""),
            "trial_fingerprints": fingerprints,
            "parent_run_id": meta.get("parent_run_id", ""),
            "command": meta.get("command", ""),
            "created": meta.get("created", ""),
            "machine": dict(meta.get("machine", {})),
            "versions": dict(meta.get("versions", {})),
            "engine_versions": _engine_versions(trials),
            "spec": meta.get("spec"),
            "method": {
                "counted_status": S.COUNTED_STATUS,
                "confidence": S.CONFIDENCE,
                "bootstrap_reps": S.BOOTSTRAP_REPS,
                "bootstrap": "stratified percentile bootstrap over seeds (rliable-style, own implementation)",
                "grid_points": grid_points,
                "rng_seed": rng_seed,
            },
            "trials": {"total": len(trials), "by_status": trials["status"].value_counts().to_dict()},
            "target_return": st.target_return,
            "budget_env_steps": st.budget_env_steps,
            "final_return": _records(st.final_return),
            "final_return_at_common_steps": _records(st.final_at_common),
            "return_at_wall": _records(st.return_at_wall),
            "agent_return": _records(st.agent_return),
            "time_to_target": _records(st.time_to_target),
            "throughput": _records(st.throughput),
            "scaling": _records(st.scaling),
            "convergence": _records(st.convergence),
            "convergence_fits": _records(st.convergence_fits),
            "improvement": _records(st.improvement),
            "cost": _records(st.cost),
            "problems": _records(st.problems),
            "curves": {"env_steps": _curves(st.curves_steps), "wall_s": _curves(st.curves_wall)},
        }
    )


def md_cell(s: str) -> str:
    # GitHub renders inline HTML in tables: a reason like "<no async gradients>" would vanish ("<" is enough to stop a
    # tag; a ">" is left as written, so "P(X > Y)" reads the same in the verdict and the tables).
    s = " ".join(s.split()).replace("|", "\\|").replace("<", "&lt;")
    return s if len(s) <= 240 else s[:239] + "…"


def _markdown(
    doc: Mapping[str, Any], tables: Sequence[Table], clips: Sequence[Clip] = (), figures: Sequence[Figure] = ()
) -> str:
    lines = [
        f"# crossrl report: {doc['scenario']}",
        "",
        f"Spec fingerprint `{doc['fingerprint']}` · parent run `{doc['parent_run_id']}` · {doc['created']} · "
        + ", ".join(f"{n} {s}" for s, n in doc["trials"]["by_status"].items()),
        "",
        "## Verdict",
        "",
        *(f"- {md_cell(line)}" for line in doc["verdict"]),
        "",
    ]
    if figures:
        lines += ["## Figures", ""]
        lines += [f"![{f.title}]({FIGURES_DIR}/{f.key}.svg)  \n_{md_cell(f.caption)}_" for f in figures]
        lines.append("")
    for t in tables:
        lines += [f"## {t.title}", ""]
        if t.rows:
            lines.append("| " + " | ".join(t.headers) + " |")
            lines.append("|" + "|".join("---" for _ in t.headers) + "|")
            lines += ["| " + " | ".join(md_cell(c) for c in row) + " |" for row in t.rows]
            lines.append("")
        if t.note:
            lines += [f"_{t.note}_", ""]
    lines += _clips_markdown(clips)
    lines += ["## Definitions", "", *(f"- **{term}**: {text}" for term, text in V.DEFINITIONS), ""]
    lines += ["## Machine and versions", "", *_env_lines(doc), ""]
    spec = (
        yaml.safe_dump(doc.get("resolved_spec") or doc["spec"], sort_keys=False)
        if doc["spec"]
        else "(spec not stored)\n"
    )
    lines += [
        "<details><summary>Spec (defaults resolved)</summary>",
        "",
        "```yaml",
        spec.rstrip(),
        "```",
        "",
        "</details>",
        "",
    ]
    return "\n".join(lines)


def _env_lines(doc: Mapping[str, Any]) -> list[str]:
    m = doc["machine"]
    out = ["- machine: " + (", ".join(f"{k} {v}" for k, v in m.items()) or "unknown")]
    out.append("- versions: " + (", ".join(f"{k} {v}" for k, v in doc["versions"].items()) or "unknown"))
    out += [f"- engine `{e}`: {', '.join(v) or 'version unknown'}" for e, v in doc["engine_versions"].items()]
    return out


REPORT_CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:#1a1a1a;margin:0 auto;
max-width:1100px;padding:24px}
h1{font-size:24px;margin:0 0 4px}h2{font-size:18px;margin:28px 0 8px;border-bottom:1px solid #ddd}
.meta{color:#555}code,pre{font:12px/1.4 ui-monospace,Menlo,Consolas,monospace}
pre{background:#f6f8fa;padding:10px;overflow:auto;border-radius:4px}
table{border-collapse:collapse;margin:6px 0}th,td{padding:3px 10px;border-bottom:1px solid #e4e4e4;
vertical-align:top}th{background:#f2f4f7}.num{text-align:right;font-variant-numeric:tabular-nums}
.text{text-align:left;max-width:560px;white-space:pre-wrap;overflow-wrap:anywhere}.note{color:#555;font-size:12px}
figure{margin:16px 0}figure svg{max-width:100%;height:auto}figcaption{color:#444;font-size:12px}
.bad{color:#a40000}.clips{display:flex;flex-wrap:wrap;gap:12px 24px}.clip{margin:8px 0}
.clip h3{margin:0 0 4px;font-size:14px}#verdict li{margin:2px 0}.defs dt{font-weight:600}
.defs dd{margin:0 0 6px 16px;color:#333}.clip img{display:block;image-rendering:pixelated;border:1px solid #ddd}
"""


def html_table(t: Table) -> str:
    head = "".join(
        f'<th class="{"text" if i in t.text_columns else "num"}">{html.escape(h)}</th>' for i, h in enumerate(t.headers)
    )
    body = []
    for row in t.rows:
        cells = [
            f'<td class="{"text" if i in t.text_columns else "num"}">{html.escape(c)}</td>' for i, c in enumerate(row)
        ]
        body.append("<tr>" + "".join(cells) + "</tr>")
    table = f'<table id="table-{t.key}"><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>'
    note = f'<p class="note">{html.escape(t.note)}</p>' if t.note else ""
    return f"<h2>{html.escape(t.title)}</h2>" + (table if t.rows else "") + note


def _html(
    doc: Mapping[str, Any], tables: Sequence[Table], figures: Sequence[Figure], clips: Sequence[Clip] = ()
) -> str:
    esc = html.escape
    by_status = ", ".join(f"{n} {s}" for s, n in doc["trials"]["by_status"].items())
    mixed = (
        f'<p class="bad">Trials with differing spec fingerprints: {esc(", ".join(doc["trial_fingerprints"]))}</p>'
        if len(doc["trial_fingerprints"]) > 1
        else ""
    )
    figs = "".join(
        f'<figure id="fig-{f.key}" class="figure"><h3>{esc(f.title)}</h3>{f.svg}'
        f"<figcaption>{esc(f.caption)}</figcaption></figure>"
        for f in figures
    )
    spec = (
        yaml.safe_dump(doc.get("resolved_spec") or doc["spec"], sort_keys=False) if doc["spec"] else "(spec not stored)"
    )
    env = "".join(f"<li>{esc(line[2:].replace('`', ''))}</li>" for line in _env_lines(doc))
    parts = [
        f"<h1>crossrl report: {esc(doc['scenario'])}</h1>",
        f'<p class="meta">spec fingerprint <code>{esc(doc["fingerprint"])}</code> · parent run '
        f"<code>{esc(doc['parent_run_id'])}</code> · {esc(doc['created'])} · {esc(by_status)}</p>",
        f'<p class="meta">command: <code>{esc(doc["command"])}</code></p>' if doc["command"] else "",
        mixed,
        '<section id="verdict"><h2>Verdict</h2><ul>'
        + "".join(f"<li>{esc(line)}</li>" for line in doc["verdict"])
        + "</ul></section>",
        html_table(tables[0]),
        "<h2>Figures</h2>",
        figs,
        _clips_html(clips),
        *(html_table(t) for t in tables[1:]),
        '<h2 id="definitions">Definitions</h2><dl class="defs">'
        + "".join(f"<dt>{esc(term)}</dt><dd>{esc(text)}</dd>" for term, text in V.DEFINITIONS)
        + "</dl>",
        f"<h2>Machine and versions</h2><ul>{env}</ul>",
        f"<h2>Spec (defaults resolved)</h2><pre>{esc(spec)}</pre>",
    ]
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width,initial-scale=1">'
        # An empty icon stops the browser from asking for /favicon.ico: the file needs nothing else.
        '<link rel="icon" href="data:,">'
        f"<title>crossrl report: {esc(doc['scenario'])}</title><style>{REPORT_CSS}</style></head>"
        f"<body>{''.join(parts)}</body></html>\n"
    )


def build_report(
    *,
    trials: pd.DataFrame,
    points: pd.DataFrame,
    meta: Mapping[str, Any],
    out_dir: Path,
    rng_seed: int = 0,
    grid_points: int = S.GRID_POINTS,
    read_artifact: Callable[[str, str], bytes] | None = None,
) -> ReportPaths:
    """Compute, draw and write report.html, report.md and report.json into ``out_dir`` (created).

    ``rng_seed`` seeds the bootstrap, so the same frames give the same files. When the trials have clips of their
    final policies (a ``clip`` column naming the artifact, as ``ResultsStore.load`` gives it) and
    ``read_artifact(run_id, name)`` reads artifacts (``ResultsStore.artifact_bytes``), a "Final policies" section
    shows one per engine (:func:`_clips`): inline in report.html, as files under ``clips/`` linked from report.md.
    """
    missing = {"run_id", "trial", "engine", "workers", "seed", "status", "reason"} - set(trials.columns)
    if trials.empty or missing:
        raise ValueError(f"nothing to report: {len(trials)} trials, missing columns {sorted(missing) or 'none'}")
    rng = np.random.default_rng(rng_seed)
    st = S.compute(trials=trials, points=points, rng=rng, grid_points=grid_points)
    doc = _document(st=st, trials=trials, meta=meta, rng_seed=rng_seed, grid_points=grid_points)
    native = V.native_settings(trials)
    doc["verdict"] = V.verdict(st) + V.native_lines(native)
    doc["native_settings"] = native
    if doc.get("spec"):  # the spec as stored stays in doc["spec"] (crossrl regress compares it)
        doc["resolved_spec"] = resolved_spec(doc["spec"])
    marks = layout_marks(trials, meta.get("layout_sweeps") or [])
    doc["layouts"] = _jsonable([m.to_dict() for m in marks])
    tables = mark_native(_tables(st, trials, marks), native)
    figures = make_figures(st)
    if V.single_worker_count(st):  # a one-point scaling chart says nothing
        figures = [f for f in figures if f.key != "scaling"]
    clips = _clips(trials, meta, read_artifact)
    if clips:
        doc["clips"] = [
            _jsonable({k: getattr(c, k) for k in ("engine", "trial", "workers", "seed", "score", "length", "ended")})
            | {"file": c.file}
            for c in clips
        ]
    out_dir.mkdir(parents=True, exist_ok=True)
    for c in clips:
        (out_dir / c.file).parent.mkdir(exist_ok=True)
        (out_dir / c.file).write_bytes(c.data)
    paths = ReportPaths(out_dir / "report.html", out_dir / "report.md", out_dir / "report.json")
    paths.html.write_text(_html(doc, tables, figures, clips), encoding="utf-8")
    (out_dir / FIGURES_DIR).mkdir(exist_ok=True)
    for f in figures:  # report.md shows them as files beside it
        (out_dir / FIGURES_DIR / f"{f.key}.svg").write_text(f.svg, encoding="utf-8")
    paths.markdown.write_text(_markdown(doc, tables, clips, figures), encoding="utf-8")
    paths.json.write_text(json.dumps(doc, indent=1, allow_nan=False) + "\n", encoding="utf-8")
    return paths


def resolved_spec(spec: Mapping[str, Any]) -> Any:
    """The stored spec with what it left to defaults resolved (hyperparameters, optimizer), so the report shows the
    values every engine ran with instead of nulls; the spec as stored when it no longer validates."""
    from crossrl.scenarios.spec import ScenarioSpec

    try:
        parsed = ScenarioSpec.model_validate(dict(spec))
    except Exception:  # noqa: BLE001 - a spec of an older crossrl: shown as it was stored
        return spec
    out = parsed.model_dump(mode="json", exclude_none=True)
    out["algorithm"]["hyperparams"] = parsed.algorithm.resolved_hyperparams()
    out["execution"]["optimizer"] = parsed.optimizer
    return out


def load_report_json(path: Path) -> dict[str, Any]:
    """Read a report.json, refusing one whose schema this crossrl does not know."""
    doc = json.loads(Path(path).read_text(encoding="utf-8"))
    version = doc.get("schema_version") if isinstance(doc, dict) else None
    if version != SCHEMA_VERSION:
        raise ValueError(
            f"{path}: schema_version {version!r} is not {SCHEMA_VERSION}; re-render it with this crossrl's "
            "`crossrl report`"
        )
    return doc
