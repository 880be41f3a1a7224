"""What `crossrl run` shows in the terminal: live progress per trial and a summary table at the end."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from crossrl.scenarios import metrics as M
from crossrl.scenarios.spec import ScenarioSpec

_STYLE = {M.FINISHED: "green", M.FAILED: "red", M.TIMEOUT: "yellow", M.KILLED: "magenta", M.SKIPPED: "dim"}


class RunDisplay:
    """Receives the runner's events (``event(name, payload)``) and draws them with rich."""

    def __init__(self, console: Console, spec: ScenarioSpec) -> None:
        self.console = console
        self.spec = spec
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
            self.console.print(
                f"[bold]{self.spec.name}[/bold]: {self._total} trials, fingerprint {self.spec.fingerprint()}, "
                f"parent run {payload['parent_id']}"
            )
        elif name == "warning":
            self.console.print(f"[yellow]{payload['trial'].name}: {payload['message']}[/yellow]")
        elif name == "store_warning":
            self.console.print(f"[yellow]store: {payload['message']}[/yellow]")
        elif name == "trial_start":
            trial = payload["trial"]
            by_time = trial.budget.env_steps is None  # a time budget: progress in training seconds
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
            self.progress.update(task, completed=min(done, self.progress.tasks[task].total or 0), info=info)
        elif name == "trial_end":
            result = payload["result"]
            task = self._tasks.pop(result.trial.name, None)
            if task is not None:
                style = _STYLE.get(result.status, "")
                self.progress.update(task, info=f"[{style}]{result.status}[/{style}] {result.reason[:60]}")
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
        if outcome.unsent:  # the caller says what is missing and how to send it
            return
        self.console.print(f"results: {store.uri} (experiment {outcome.experiment_id}, parent run {outcome.parent_id})")
        self.console.print(
            "browse them: crossrl ui" + ("" if store.uri.startswith("sqlite") else f" --tracking-uri {store.uri}")
        )


def _fmt(x: float | None, spec: str) -> str:
    return "-" if x is None else format(x, spec)
