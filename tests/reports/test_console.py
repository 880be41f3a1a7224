"""What `crossrl run` prints: without a terminal (a CI log) a plain line per trial every few seconds; the count goes
past the budget when an engine's last iteration does; no "-0.0"."""

from __future__ import annotations

import io
from types import SimpleNamespace

from rich.console import Console

from crossrl.reports.console import PLAIN_EVERY_S, RunDisplay, _fmt
from crossrl.scenarios import metrics as M
from crossrl.scenarios.loader import load


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _feed(display: RunDisplay, clock: Clock, trial: object, steps: list[int]) -> None:
    display.event("trial_start", {"trial": trial, "index": 0, "total": 1})
    for step in steps:
        clock.now += 1.0
        values = {M.EPISODE_RETURN_MEAN: 21.5, M.SAMPLE_THROUGHPUT: 1234.0}
        display.event("point", {"trial": trial, "step": step, "values": values})
    result = SimpleNamespace(trial=trial, status=M.FINISHED, reason="", env_steps=steps[-1])
    display.event("trial_end", {"result": result})


def test_without_a_terminal_each_trial_prints_a_plain_line_every_few_seconds_and_its_end() -> None:
    spec, _ = load("smoke")
    trial = spec.trials()[0]
    out, clock = io.StringIO(), Clock()
    with RunDisplay(Console(file=out, force_terminal=False, width=200), spec, clock=clock) as display:
        budget = trial.budget.env_steps
        steps = [budget * (i + 1) // 20 for i in range(20)] + [budget + 333]  # 21 points, one second apart
        _feed(display, clock, trial, steps)
    lines = [line for line in out.getvalue().splitlines() if line.startswith(trial.name)]
    assert f"[1/1] {trial.name}: starting" in out.getvalue().splitlines()
    progress = [line for line in lines if "env steps, return" in line]
    assert 3 <= len(progress) <= 21 // PLAIN_EVERY_S + 1, progress  # throttled, not one per point
    assert f"{trial.name}: {steps[4]:,}/{budget:,} env steps, return 21.5 1,234 steps/s" in progress[0]
    assert lines[-1] == f"{trial.name}: FINISHED, {budget + 333:,} env steps"  # the overshoot, as the table says


def test_on_a_terminal_the_bar_counts_past_the_budget_and_prints_no_plain_lines() -> None:
    spec, _ = load("smoke")
    trial = spec.trials()[0]
    out, clock = io.StringIO(), Clock()
    display = RunDisplay(Console(file=out, force_terminal=True, width=200), spec, clock=clock)
    with display:
        _feed(display, clock, trial, [trial.budget.env_steps + 333])
    assert "env steps, return" not in out.getvalue()
    [task] = display.progress.tasks
    assert task.completed == trial.budget.env_steps + 333


def test_a_value_that_rounds_to_zero_prints_without_a_sign() -> None:
    assert _fmt(-0.04, ".1f") == "0.0" and _fmt(-0.4, ".0f") == "0" and _fmt(-0.06, ".1f") == "-0.1"
    assert _fmt(None, ".1f") == "-" and _fmt(-1234.0, ",.0f") == "-1,234"


def test_the_summary_says_why_env_steps_pass_the_budget() -> None:
    spec, _ = load("smoke")
    trial = spec.trials()[0]
    budget = trial.budget.env_steps

    def outcome(env_steps: int) -> SimpleNamespace:
        result = SimpleNamespace(
            trial=trial,
            status=M.FINISHED,
            reason="",
            env_steps=env_steps,
            summary={},
            median_throughput=1.0,
            wall_s=1.0,
        )
        return SimpleNamespace(results=[result], unsent=1, counts=lambda: {M.FINISHED: 1})

    for steps, said in ((budget + 333, True), (budget, False)):
        out = io.StringIO()
        RunDisplay(Console(file=out, force_terminal=False, width=300), spec).summary(outcome(steps), store=None)
        text = " ".join(out.getvalue().split())
        assert (f"env steps past the budget ({budget + 333:,} of {budget:,} at most)" in text) == said, text
        assert ("each engine's batch (train_batch, its fragments) sets how far past it goes" in text) == said
