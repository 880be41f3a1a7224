"""What `crossrl run` shows in the terminal: live progress per trial and a summary table at the end."""

from __future__ import annotations

import time
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from crossrl.scenarios import metrics as M
from crossrl.scenarios.spec import ScenarioSpec

_STYLE = {M.FINISHED: "green", M.FAILED: "red", M.TIMEOUT: "yellow", M.KILLED: "magenta", M.SKIPPED: "dim"}


PLAIN_EVERY_S = 5.0
"""Without a terminal (CI logs, a pipe): one plain line per trial at most this often, besides its start and end."""


class RunDisplay:
    """Receives the runner's events (``event(name, payload)``) and draws them with rich: live bars on a terminal, and
    plain lines (trial, env steps, return, rate; at most every :data:`PLAIN_EVERY_S` per trial) where there is none,
    so a CI log moves while a run trains."""

    def __init__(self, console: Console, spec: ScenarioSpec, *, clock: Any = time.monotonic) -> None:
        self.console = console
        self.spec = spec
        self.plain = not console.is_terminal
        self._clock = clock
        self._last_line: dict[str, float] = {}  # trial name -> when its last plain line was printed
        self.progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            TextColumn("{task.completed:,.0f}/{task.total:,.0f} {task.fields[unit]}"),
            TextColumn("{task.fields[info]}"),
            TimeElapsedColumn(),
            console=console,
            transient=False,
        )
        self._tasks: dict[str, Any] = {}  # trial name -> its progress bar (several at once in a sweep)
        self._total = 0

    def __enter__(self) -> RunDisplay:
        self.progress.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.__exit__(*exc)  # type: ignore[arg-type]

    def event(self, name: str, payload: dict[str, Any]) -> None:
        if name == "start":
            self._total = len(payload["trials"])
            kept = payload.get("kept", 0)
            what = f"{self._total} trial{'s' * (self._total != 1)}" + (
                f" to run, {kept} kept (they had ended)" if kept else ""
            )
            self.console.print(
                f"[bold]{self.spec.name}[/bold]: {what}, fingerprint {self.spec.fingerprint()}, "
                f"parent run {payload['parent_id']}"
            )
        elif name == "resumed":
            self.console.print(f"{payload['trial'].name}: resumed from env step {payload['env_step']:,}")
        elif name == "restarted":
            self.console.print(f"{payload['trial'].name}: restarted from the start: {payload['why']}")
        elif name == "retry":
            start = "the start" if payload["env_step"] is None else f"env step {payload['env_step']:,}"
            self.console.print(
                f"[magenta]{payload['trial'].name}: {payload['lost']}; starting it again from {start} "
                f"(attempt {payload['attempt']} of {payload['of']})[/magenta]"
            )
        elif name == "retried":
            start = "the start" if payload["env_step"] is None else f"env step {payload['env_step']:,}"
            self.console.print(
                f"{payload['trial'].name}: resumed on node {payload['node']} from {start} after {payload['lost']}"
            )
        elif name == "warning":
            self.console.print(f"[yellow]{payload['trial'].name}: {payload['message']}[/yellow]")
        elif name == "store_warning":
            self.console.print(f"[yellow]store: {payload['message']}[/yellow]")
        elif name == "trial_start":
            trial = payload["trial"]
            by_time = trial.budget.env_steps is None  # a time budget: progress in training seconds
            if self.plain:
                self.console.print(f"[{payload['index'] + 1}/{payload['total']}] {trial.name}: starting")
                self._last_line[trial.name] = self._clock()
            self._tasks[trial.name] = self.progress.add_task(
                f"[{payload['index'] + 1}/{payload['total']}] {trial.name}",
                total=trial.budget.train_seconds if by_time else trial.budget.env_steps,
                info="starting",
                unit="s of training" if by_time else "env steps",
            )
        elif name == "point" and payload["trial"].name in self._tasks:
            trial, task = payload["trial"], self._tasks[payload["trial"].name]
            v = payload["values"]
            ret = v.get(M.EPISODE_RETURN_MEAN)
            info = f"return {ret:8.1f}" if ret is not None else "return      -"
            info += f"  {v.get(M.SAMPLE_THROUGHPUT, 0):9,.0f} steps/s"
            done = v.get(M.WALL_TIME_S, 0.0) if trial.budget.env_steps is None else payload["step"]
            # past the budget (an engine's last iteration overshoots it) the count shows it, as the table will
            self.progress.update(task, completed=done, info=info)
            if self.plain and self._clock() - self._last_line.get(trial.name, -PLAIN_EVERY_S) >= PLAIN_EVERY_S:
                self._last_line[trial.name] = self._clock()
                total = self.progress.tasks[task].total or 0
                unit = "s of training" if trial.budget.env_steps is None else "env steps"
                self.console.print(f"{trial.name}: {done:,.0f}/{total:,.0f} {unit}, {' '.join(info.split())}")
        elif name == "trial_end":
            result = payload["result"]
            task = self._tasks.pop(result.trial.name, None)
            if task is not None:
                style = _STYLE.get(result.status, "")
                self.progress.update(task, info=f"[{style}]{result.status}[/{style}] {result.reason[:60]}")
                if self.plain:
                    reason = f": {result.reason[:200]}" if result.reason else ""
                    self.console.print(f"{result.trial.name}: {result.status}, {result.env_steps:,} env steps{reason}")
            elif result.status == M.SKIPPED:
                self.console.print(f"[dim]SKIPPED {result.trial.name}: {result.reason}[/dim]")

    def summary(self, outcome: Any, store: Any) -> None:
        table = Table(title=f"{self.spec.name}: {outcome.counts()}")
        for col in (
            "trial",
            "status",
            "env steps",
            "final return",
            "steps to target",
            "median steps/s",
            "wall s",
            "reason",
        ):
            table.add_column(col, justify="left" if col in ("trial", "status", "reason") else "right")
        for r in outcome.results:
            s = r.summary
            style = _STYLE.get(r.status, "")
            table.add_row(
                r.trial.name,
                f"[{style}]{r.status}[/{style}]",
                f"{r.env_steps:,}",
                _fmt(s.get(M.FINAL_RETURN_MEAN), ".1f"),
                _fmt(s.get(M.STEPS_TO_TARGET), ",.0f") if r.trial.target_return is not None else "no target",
                _fmt(r.median_throughput, ",.0f"),
                f"{r.wall_s:.1f}",
                r.reason[:400],  # wrapped by the table: a fault's reason names what, where and when
            )
        self.console.print(table)
        past = [r for r in outcome.results if r.trial.budget.env_steps and r.env_steps > r.trial.budget.env_steps]
        if past:
            most = max(past, key=lambda r: r.env_steps)
            self.console.print(
                f"env steps past the budget ({most.env_steps:,} of {most.trial.budget.env_steps:,} at most): a trial "
                "stops at the end of the iteration that reaches its budget, so each engine's batch (train_batch, "
                "its fragments) sets how far past it goes"
            )
        if outcome.unsent:  # the caller says what is missing and how to send it
            return
        self.console.print(f"results: {store.uri} (experiment {outcome.experiment_id}, parent run {outcome.parent_id})")
        self.console.print(
            "browse them: crossrl ui" + ("" if store.uri.startswith("sqlite") else f" --tracking-uri {store.uri}")
        )


def _fmt(x: float | None, spec: str) -> str:
    """A number as the table prints it; "-" for none, and never "-0.0" for a value that rounds to zero."""
    if x is None:
        return "-"
    out = format(x, spec)
    return out[1:] if out.startswith("-") and not any(c in "123456789" for c in out) else out


def tune_summary(console: Console, spec: ScenarioSpec, outcome: Any) -> None:
    """`crossrl tune`'s tables: each engine's search (every configuration, the chosen one marked), then the scenario's
    own setting against each engine's chosen configuration on the test seeds (IQM of the final returns, 95 % CI)."""
    import numpy as np

    from crossrl.reports.stats import iqm, stratified_bootstrap_ci

    search = spec.search
    assert search is not None
    names = list(search.space)
    for found in outcome.searches:
        if found.skipped:
            console.print(f"[dim]{found.engine}: not searched: {found.skipped}[/dim]")
            continue
        table = Table(
            title=f"{found.engine}: {search.scheduler} search, {len(found.results)} configurations, "
            f"{found.env_steps:,} env steps, {found.cpu_seconds:,.0f} CPU s, {found.wall_s:,.0f} s, "
            f"set-up {_fmt(found.setup_s, '.0f')} s per trial "
            f"(parent run {found.parent_id})"
        )
        for col in ("configuration", *names, "status", "env steps", "final return", "steps to target", "note"):
            table.add_column(col, justify="left" if col in ("configuration", "status", "note") else "right")
        for r in sorted(found.results, key=lambda r: r.trial.label):
            s = r.summary
            best = found.best is not None and r.run_id == found.best.run_id
            table.add_row(
                ("[bold]* " if best else "  ") + r.trial.label + ("[/bold]" if best else ""),
                *(_value(r.trial.hyperparams.get(n)) for n in names),
                f"[{_STYLE.get(r.status, '')}]{r.status}[/{_STYLE.get(r.status, '')}]",
                f"{r.env_steps:,}",
                _fmt(s.get(M.FINAL_RETURN_MEAN), ".1f"),
                _fmt(s.get(M.STEPS_TO_TARGET), ",.0f"),
                r.reason[:80],
            )
        console.print(table)
    if outcome.shared is None:
        return
    rng = np.random.default_rng(0)
    table = Table(title=f"{spec.name} on the test seeds {', '.join(map(str, search.test_seeds))}: final return, IQM")
    for col in ("engine", "own setting", "tuned", "tuned configuration"):
        table.add_column(col, justify="left" if col in ("engine", "tuned configuration") else "right")

    def cell(results: list[Any]) -> str:
        vals = [r.summary[M.FINAL_RETURN_MEAN] for r in results if r.summary.get(M.FINAL_RETURN_MEAN) is not None]
        if not vals:
            return "-"
        lo, hi = stratified_bootstrap_ci([vals], statistic=lambda a: iqm(a, axis=-1), rng=rng)
        ci = f" [{lo:.1f}, {hi:.1f}]" if np.isfinite(lo) else ""
        return f"{float(iqm(vals)):.1f}{ci} (n={len(vals)})"

    for found in outcome.searches:
        own = [r for r in outcome.shared.results if r.trial.engine == found.engine]
        tuned = outcome.tuned.get(found.engine)
        config = "-"
        if found.best is not None:
            config = ", ".join(f"{n}={_value(found.best.trial.hyperparams.get(n))}" for n in names)
        table.add_row(found.engine, cell(own), cell(tuned.results) if tuned is not None else "-", config)
    console.print(table)


def _value(x: Any) -> str:
    if isinstance(x, float):
        return f"{x:.3g}"
    return "-" if x is None else str(x)
