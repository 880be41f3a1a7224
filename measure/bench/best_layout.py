"""``best`` layouts: an engine's layout knob set to ``best`` (``execution.layout.torchrl.env``,
``execution.layout.rllib.vectorize``) takes, per worker count, the value the newest stored ``crossrl bench sampling
--sweep`` of the env and the trial's envs timed fastest (:func:`crossrl.reports.layouts.fastest_layout`). Where no
stored sweep timed any of the values, one is measured first at the trial's workers and envs (its cost printed) and
stored, so the next run finds it. ``crossrl run`` resolves them before any trial starts; each trial records the layout
it ran in (its ``layout`` tag and native config).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from crossrl.reports.layouts import LayoutChoice, fastest_layout
from crossrl.reports.store import ResultsStore
from crossrl.scenarios.spec import BEST, RLLIB_VECTORIZE, TORCHRL_ENVS, ScenarioSpec, Trial

KNOB = {"torchrl": "env", "rllib": "vectorize"}
"""The layout knob ``best`` stands for, per engine."""


@dataclass(frozen=True)
class Resolved:
    """Each (engine, workers) with ``best``: the layout its trials run in, and how it was chosen."""

    layouts: dict[tuple[str, int], dict[str, Any]]
    choices: list[LayoutChoice]
    measured_s: float  # wall seconds spent measuring sweeps that were missing (0: every choice was stored)


def candidates(trial: Trial) -> dict[str, str]:
    """Each value of the trial's engine's layout knob -> the trial's layout label with it (as the sweep names
    layouts). RLlib's VECTOR_ENTRY_POINT only where the env has its own vector class and rewards are not clipped."""
    if trial.engine == "torchrl":
        from crossrl.adapters.torchrl.adapter import collector_class, layout_label

        collector = collector_class(trial)
        return {env: layout_label(trial, collector, env) for env in TORCHRL_ENVS}
    if trial.engine == "rllib":
        from crossrl.adapters.rllib.adapter import layout_label as rllib_label
        from crossrl.measure.bench.layouts import has_native_vector

        native = has_native_vector(trial.env) and not trial.env.resolved_reward_clip
        modes = [m for m in RLLIB_VECTORIZE if m != "VECTOR_ENTRY_POINT" or native]
        return {m: rllib_label(trial.model_copy(update={"layout": {**trial.layout, "vectorize": m}})) for m in modes}
    raise ValueError(f"execution.layout: {trial.engine} has no layout knob to set to 'best'")


def resolve(
    spec: ScenarioSpec,
    store: ResultsStore,
    *,
    measure: bool = True,
    progress: Callable[[str], None] | None = None,
    sweep_kw: dict[str, Any] | None = None,
) -> Resolved:
    """The layout of every (engine, workers) of ``spec`` whose knob is ``best``. ``measure``: sweep what no stored
    sweep covers (else that is a ValueError naming the command to run); ``sweep_kw``: more arguments for the sweep
    (:func:`~crossrl.measure.bench.commands.bench_sampling_sweep`: repeat, seconds, ...)."""
    say = progress or (lambda _text: None)
    engines = [e for e in spec.execution.layout.best_engines() if e in spec.engines]
    layouts: dict[tuple[str, int], dict[str, Any]] = {}
    choices: list[LayoutChoice] = []
    measured_s = 0.0
    if not engines:
        return Resolved(layouts, choices, measured_s)
    sweeps = store.layout_sweeps(spec.env.id)
    all_trials = spec.trials()
    for workers in spec.execution.workers:
        trials = {t.engine: t for t in all_trials if t.workers == workers and t.engine in engines}
        total = workers * spec.execution.envs_per_worker
        found = {e: _choose(t, total, sweeps) for e, t in trials.items()}
        missing = [e for e, choice in found.items() if choice is None]
        if missing:
            if not measure:
                raise ValueError(
                    f"execution.layout: 'best' for {', '.join(missing)} at {workers} worker(s) x "
                    f"{spec.execution.envs_per_worker} envs: no stored layout sweep of {spec.env.id} timed it; "
                    f"measure one: crossrl bench sampling --sweep --env {spec.env.id} --workers {workers} "
                    f"--envs-per-worker {spec.execution.envs_per_worker} --engines {','.join(missing)}"
                )
            say(f"execution.layout best: no stored sweep of {spec.env.id} at {workers} x "
                f"{spec.execution.envs_per_worker} envs for {', '.join(missing)}; measuring one "
                "(`crossrl bench sampling --sweep`: each of their layouts over 3 rounds, minutes)")  # fmt: skip
            start = time.monotonic()
            sweeps = [_measure(spec, workers, missing, store, say, sweep_kw or {}), *sweeps]
            took = time.monotonic() - start
            measured_s += took
            say(f"execution.layout best: the sweep took {took:.0f} s")
            found.update({e: _choose(trials[e], total, sweeps) for e in missing})
        for engine, choice in found.items():
            if choice is None:
                raise ValueError(f"execution.layout: the layout sweep timed none of {engine}'s layouts for "
                                 f"{spec.env.id} at {workers} worker(s); set execution.layout.{engine}."
                                 f"{KNOB[engine]} to one of {', '.join(candidates(trials[engine]))}")  # fmt: skip
            layouts[(engine, workers)] = {**trials[engine].layout, KNOB[engine]: choice.value}
            choices.append(choice)
    return Resolved(layouts, choices, measured_s)


def _choose(trial: Trial, total: int, sweeps: list[dict[str, Any]]) -> LayoutChoice | None:
    return fastest_layout(
        trial.engine, workers=trial.workers, total_envs=total, candidates=candidates(trial), sweeps=sweeps
    )


def _measure(
    spec: ScenarioSpec,
    workers: int,
    engines: list[str],
    store: ResultsStore,
    say: Callable[[str], None],
    sweep_kw: dict[str, Any],
) -> dict[str, Any]:
    """Sweep ``engines``' layouts for the spec's env at ``workers`` x its envs per worker, store it, return it as
    :meth:`~crossrl.reports.store.ResultsStore.layout_sweeps` would."""
    from crossrl.measure.bench.commands import bench_sampling_sweep

    result = bench_sampling_sweep(
        env_spec=spec.env,
        model=spec.algorithm.model,
        workers=workers,
        envs_per_worker=spec.execution.envs_per_worker,
        engines=tuple(engines),
        progress=say,
        **sweep_kw,
    )
    data = {"bench": "sampling-sweep", **result.to_dict()}
    run_id = store.log_bench("sampling-sweep", data=data, metrics=result.metrics(), command=" ".join(sys.argv))
    return {**data, "run_id": run_id, "start_time": int(time.time() * 1000)}


def describe(choice: LayoutChoice) -> str:
    """One line: which layout won, by how much, from which sweep."""
    when = time.strftime("%Y-%m-%d", time.localtime(choice.sweep_start_ms / 1000)) if choice.sweep_start_ms else "?"
    others = ", ".join(f"{v} {rate:,.0f}" for v, rate in sorted(choice.others.items(), key=lambda kv: -kv[1]))
    return (
        f"{choice.engine} at {choice.workers} worker(s): {KNOB[choice.engine]} {choice.value} ({choice.label}, "
        f"{choice.steps_per_s:,.0f} env steps/s{'; ' + others if others else ''}; sweep {choice.sweep_run[:8]}, {when})"
    )


__all__ = ["BEST", "KNOB", "Resolved", "candidates", "describe", "resolve"]
