"""A table spec's report: games x (engine, algorithm, workers) -> mean episode score after the budget.

The seed's shape (its "IMPALA and A2C vs A3C after 1 hour of training" table), read from the newest stored
run of every cell (:mod:`crossrl.scenarios.table`), with random play's score and the published scores beside
the measured ones. A cell an engine cannot run shows why (SKIPPED and the reason); one not run yet says so.
"""

from __future__ import annotations

import html
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pandas as pd

from crossrl.reports.render import REPORT_CSS, Table, html_table, md_cell
from crossrl.reports.store import ResultsStore, StoreError
from crossrl.scenarios import metrics as M
from crossrl.scenarios.spec import ScenarioSpec
from crossrl.scenarios.table import TableSpec


@dataclass(frozen=True)
class CellResult:
    """What one engine did in one cell: its seeds' mean score after the budget, or why there is none."""

    row: str
    engine: str
    algorithm: str
    workers: int
    status: str  # FINISHED, or the first other status among its seeds, or "not run"
    score: float = math.nan  # mean over its FINISHED seeds of final_return_mean
    seeds: int = 0
    env_steps: float = math.nan  # mean env steps sampled in the budget
    reason: str = ""
    budget: str = ""


def _budget_text(spec: Mapping[str, Any]) -> str:
    budget = spec.get("budget") or {}
    if budget.get("train_seconds"):
        return f"{float(budget['train_seconds']):g} s of training"
    return f"{int(budget.get('env_steps') or 0):,} env steps"


def collect(store: ResultsStore, table: TableSpec, cells: Sequence[ScenarioSpec]) -> list[CellResult]:
    """Every cell x engine of ``table`` from the store (each cell's newest run)."""
    out: list[CellResult] = []
    for cell in cells:
        row, algorithm = cell.env.id, cell.algorithm.name
        try:
            loaded = store.load(scenario=cell.name)
        except StoreError:
            loaded = None
        budget = _budget_text(cell.model_dump(mode="json"))
        # what the stored run was given (read once per cell; the cell's spec when it has no run)
        budget_run = _budget_text(store.spec(loaded.meta["parent_run_id"])) if loaded is not None else budget
        workers = cell.execution.workers[0]
        for engine in table.engines:
            trials = (
                loaded.trials[loaded.trials.engine == engine] if loaded is not None and len(loaded.trials) else None
            )
            if trials is None or trials.empty:
                out.append(CellResult(row, engine, algorithm, workers, "not run", budget=budget))
                continue
            done = trials[trials.status == M.FINISHED]
            other = trials[trials.status != M.FINISHED]
            steps = _env_steps(loaded.points, list(trials.run_id)) if loaded is not None else math.nan
            workers_run = int(trials.workers.iloc[0])
            if len(done):
                scores = pd.to_numeric(done[M.FINAL_RETURN_MEAN], errors="coerce").dropna()
                out.append(
                    CellResult(
                        row, engine, algorithm, workers_run, M.FINISHED,
                        score=float(scores.mean()) if len(scores) else math.nan, seeds=len(done), env_steps=steps,
                        reason="; ".join(sorted(set(other.reason))) if len(other) else "", budget=budget_run,
                    )
                )  # fmt: skip
            else:
                first = other.iloc[0]
                out.append(
                    CellResult(
                        row, engine, algorithm, workers_run, str(first.status), reason=str(first.reason),
                        env_steps=steps, budget=budget_run,
                    )
                )  # fmt: skip
    return out


def _env_steps(points: pd.DataFrame, run_ids: list[str]) -> float:
    sampled = points[(points.metric == M.ENV_STEPS_SAMPLED) & points.run_id.isin(run_ids)]
    if sampled.empty:
        return math.nan
    return float(sampled.groupby("run_id").value.max().mean())


def _published(x: float) -> str:
    return f"{x:,.0f}" if float(x).is_integer() else f"{x:,.1f}"


def _score(c: CellResult) -> str:
    if c.status == M.FINISHED:
        text = f"{c.score:,.1f}" if math.isfinite(c.score) else "no episode ended"
        return text + (f" ({c.seeds} seeds)" if c.seeds > 1 else "")
    return c.status


def tables(
    table: TableSpec, results: Sequence[CellResult], *, random_scores: Mapping[str, float] | None = None
) -> list[Table]:
    """The seed-shaped score table, the env steps each cell sampled in its budget, and why cells are empty."""
    columns = [(col.algorithm, e) for col in table.columns for e in table.engines]
    by_key = {(c.row, c.algorithm, c.engine): c for c in results}
    rows_present = [r for r in table.rows if any(c.row == r for c in results)]

    def heading(algorithm: str, engine: str) -> str:
        ws = {c.workers for c in results if c.algorithm == algorithm and c.engine == engine}
        return f"{engine} {algorithm.upper()} {'/'.join(str(w) for w in sorted(ws))} workers"

    headers = ["game", *(heading(a, e) for a, e in columns)]
    if random_scores:
        headers.append("random play")
    headers += [p.label for p in table.published]
    score_rows, step_rows = [], []
    for row in rows_present:
        cells = [by_key.get((row, a, e)) for a, e in columns]
        line = [row, *(_score(c) if c else "not run" for c in cells)]
        if random_scores:
            r = random_scores.get(row, math.nan)
            line.append(f"{r:,.1f}" if math.isfinite(r) else "")
        line += [_published(p.scores[row]) if row in p.scores else "" for p in table.published]
        score_rows.append(line)
        step_rows.append([row, *(f"{c.env_steps:,.0f}" if c and math.isfinite(c.env_steps) else "" for c in cells)])
    budgets = sorted({c.budget for c in results if c.budget})
    note = (
        f"Mean episode score (the raw game score, unclipped) over the episodes of the last 10 % of each trial's env "
        f"steps, after {' / '.join(budgets) or 'the budget'}; mean over seeds where there are several."
        + (" Random play: uniformly random actions on the same env." if random_scores else "")
        + (" Published scores as their sources report them (other env versions, hardware and budgets)."
           if table.published else "")
    )  # fmt: skip
    out = [
        Table(key="scores", title=f"{table.name}: score after the budget", headers=headers, rows=score_rows,
              note=note),
        Table(key="env-steps", title="Env steps sampled in the budget", headers=["game", *headers[1:len(columns) + 1]],
              rows=step_rows, note="Mean over seeds of the env steps each trial sampled before its budget ended."),
    ]  # fmt: skip
    gaps = [[c.row, c.engine, c.algorithm, c.status, c.reason] for c in results if c.status != M.FINISHED or c.reason]
    if gaps:
        out.append(Table(key="gaps", title="Cells without a score", headers=["game", "engine", "algorithm", "status",
                                                                            "reason"], rows=gaps,
                         text_columns=frozenset(range(5))))  # fmt: skip
    return out


def render(table: TableSpec, parts: Sequence[Table], *, out_dir: Path, command: str = "") -> tuple[Path, Path]:
    """Write ``<table>.md`` and ``<table>.html`` under ``out_dir``; returns their paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    created = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    md = [
        f"# crossrl table: {table.name}",
        "",
        table.description.strip(),
        "",
        f"{created}" + (f" · `{command}`" if command else ""),
        "",
    ]
    for t in parts:
        md += [f"## {t.title}", ""]
        if t.rows:
            md.append("| " + " | ".join(md_cell(h) for h in t.headers) + " |")
            md.append("|" + "|".join("---" for _ in t.headers) + "|")
            md += ["| " + " | ".join(md_cell(c) for c in row) + " |" for row in t.rows]
            md.append("")
        if t.note:
            md += [f"_{t.note}_", ""]
    md_path = out_dir / f"{table.name}.md"
    md_path.write_text("\n".join(md))
    esc = html.escape
    body = "".join(html_table(t) for t in parts)
    page = (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><link rel="icon" href="data:,">'
        f"<title>crossrl table: {esc(table.name)}</title><style>{REPORT_CSS}</style></head><body>"
        f"<h1>crossrl table: {esc(table.name)}</h1><p>{esc(table.description.strip())}</p>"
        f'<p class="meta">{esc(created)}' + (f" · <code>{esc(command)}</code>" if command else "") + "</p>"
        f"{body}</body></html>\n"
    )
    html_path = out_dir / f"{table.name}.html"
    html_path.write_text(page)
    return md_path, html_path


__all__ = ["CellResult", "collect", "render", "tables"]
