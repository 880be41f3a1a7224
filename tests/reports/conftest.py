"""Synthetic store frames of exactly the shape reports.store hands to the report builder.

``synthetic_frames`` is also loaded by path from ``bench_report.py`` (it is a plain function).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
import pytest

from crossrl.scenarios import metrics as M

_SPEED = {"crossrl": 1.0, "rllib": 0.7, "torchrl": 1.3, "mystack": 0.5}  # learning speed factor
_THROUGHPUT = {"crossrl": 9000.0, "rllib": 6000.0, "torchrl": 7000.0, "mystack": 3000.0}  # env steps/s, 1 worker


def _trial_points(
    *, rng: np.random.Generator, run_id: str, engine: str, workers: int, budget: int, n_points: int, upto: float
) -> tuple[list[tuple[str, str, int, float]], dict[str, Any]]:
    """One trial's history (cut at fraction ``upto`` of the budget) and its summary metrics."""
    steps = np.linspace(budget / n_points, budget, n_points).astype(int)
    steps = steps[: max(1, int(round(n_points * upto)))]
    thr = _THROUGHPUT.get(engine, 3000.0) * workers**0.8
    rows: list[tuple[str, str, int, float]] = []
    wall = 0.0
    prev = 0
    returns: list[tuple[int, float, float]] = []
    for i, s in enumerate(steps):
        rate = thr * float(rng.uniform(0.85, 1.15))
        wall += (s - prev) / rate
        prev = int(s)
        vals: dict[str, float] = {
            M.ENV_STEPS_SAMPLED: float(s),
            M.ENV_STEPS_TRAINED: float(s),
            M.WALL_TIME_S: wall,
            M.SAMPLE_THROUGHPUT: rate,
            M.EPISODES_TOTAL: float(3 * (i + 1)),
            M.TRAIN_THROUGHPUT: rate,
            M.TIME_SAMPLE_S: (s - prev) / rate * 0.7 if i else 0.0,
            M.TIME_LEARN_S: 0.05,
            M.TIME_SYNC_WEIGHTS_S: 0.002,
            M.POLICY_LOSS: float(rng.normal(0, 0.1)),
            M.VALUE_LOSS: float(rng.uniform(1, 50)),
            M.ENTROPY: 0.69 * (1 - s / budget / 2),
            M.WORKER_RESTARTS: 0.0,
        }
        # Early points sometimes complete no episode: no return logged there (as MetricSink does).
        if i % 7 != 3:
            ret = 500.0 / (1.0 + math.exp(-(_SPEED.get(engine, 0.5) * 8.0 * s / budget - 4.0)))
            ret = float(np.clip(ret + rng.normal(0, 15.0), 8.0, 500.0))
            vals[M.EPISODE_RETURN_MEAN] = ret
            vals["episodes_this_point"] = float(rng.integers(1, 6))
            returns.append((int(s), wall, ret))
        rows += [(run_id, k, int(s), v) for k, v in vals.items()]
    summary: dict[str, Any] = {
        M.FINAL_RETURN_MEAN: float(np.mean([r for _, _, r in returns[-3:]])) if returns else math.nan,
        M.PEAK_RSS_MB: float(400 + 150 * workers + rng.uniform(0, 50)),
        M.CPU_SECONDS: float(wall * min(workers, 2) * 0.9),
        "setup_s": float(rng.uniform(1, 6)),
        "_returns": returns,
    }
    return rows, summary


def synthetic_frames(
    *,
    engines: Sequence[str] = ("crossrl", "rllib", "torchrl"),
    workers: Sequence[int] = (1, 2),
    seeds: Sequence[int] = (0, 1, 2),
    n_points: int = 40,
    budget: int = 20_000,
    target: float | None = 450.0,
    failures: bool = True,
    seed: int = 0,
) -> tuple[pd.DataFrame, pd.DataFrame, dict[str, Any]]:
    """(trials, points, meta) for one scenario. With ``failures``: one FAILED (partial history), one
    SKIPPED (no history) trial on the last engine and worker count (which keeps one seed there), and
    one TIMEOUT (partial history) on the first engine and worker count."""
    rng = np.random.default_rng(seed)
    trials: list[dict[str, Any]] = []
    rows: list[tuple[str, str, int, float]] = []
    bad = {(engines[-1], workers[-1], seeds[0]): ("FAILED", "RuntimeError: env runner died (see traceback)")}
    if len(seeds) > 1:
        bad[(engines[-1], workers[-1], seeds[1])] = ("SKIPPED", "torchrl cannot run a3c: <no async gradients>")
    if len(seeds) > 2:
        bad[(engines[0], workers[0], seeds[2])] = ("TIMEOUT", "wall budget of 900 s exceeded")
    for w in workers:
        for s in seeds:
            for e in engines:
                run_id = f"run{len(trials):04d}"
                status, reason = bad.get((e, w, s), ("FINISHED", "")) if failures else ("FINISHED", "")
                summary: dict[str, Any] = {k: math.nan for k in (*M.SUMMARY_METRICS, "setup_s")}
                if status != "SKIPPED":
                    upto = 1.0 if status == "FINISHED" else 0.4
                    r, summary = _trial_points(
                        rng=rng, run_id=run_id, engine=e, workers=w, budget=budget, n_points=n_points, upto=upto
                    )
                    rows += r
                    returns = summary.pop("_returns")
                    hit = [(st, wt) for st, wt, ret in returns if target is not None and ret >= target]
                    summary[M.STEPS_TO_TARGET] = float(hit[0][0]) if hit else math.nan
                    summary[M.WALL_S_TO_TARGET] = float(hit[0][1]) if hit else math.nan
                trials.append(
                    dict(
                        run_id=run_id,
                        trial=f"{e}-ppo-w{w}-s{s}",
                        scenario="synthetic-ppo",
                        fingerprint="0123456789abcdef",
                        engine=e,
                        engine_version={"crossrl": "0.1.0", "rllib": "2.60.0", "torchrl": "0.14.1"}.get(e, "9.9"),
                        algorithm="ppo",
                        optimizer="sync_samples",
                        workers=w,
                        envs_per_worker=4,
                        seed=s,
                        status=status,
                        reason=reason,
                        target_return=math.nan if target is None else target,
                        budget_env_steps=budget,
                        **summary,
                    )
                )
    points = pd.DataFrame(rows, columns=["run_id", "metric", "step", "value"])
    meta = {
        "scenario": "synthetic-ppo",
        "fingerprint": "0123456789abcdef",
        "parent_run_id": "parent0001",
        "spec": {
            "name": "synthetic-ppo",
            "env": {"id": "CartPole-v1", "kwargs": {}, "step_latency_ms": 0.0},
            "algorithm": {"name": "ppo", "hyperparams": {"lr": 3e-4}, "model": {"hidden": [64, 64]}},
            "engines": list(engines),
            "execution": {"workers": list(workers), "envs_per_worker": 4, "optimizer": None},
            "budget": {"env_steps": budget, "wall_seconds": 900.0},
            "target": {"episode_return_mean": target},
            "seeds": list(seeds),
        },
        "machine": {"host": "testhost", "cpu_count": "2", "platform": "Linux-6.1-x86_64"},
        "versions": {
            "python": "3.11.2",
            "torch": "2.13.0",
            "ray": "2.60.0",
            "torchrl": "0.14.1",
            "mlflow": "3.17.2",
            "crossrl": "0.1.0",
            "crossrl_commit": "abc123def456",
        },
        "created": "2025-01-01 12:00:00",
    }
    return pd.DataFrame(trials), points, meta


@pytest.fixture
def frames() -> tuple[pd.DataFrame, pd.DataFrame, dict[str, Any]]:
    """Three engines x 1 and 2 workers x 3 seeds, with a FAILED, a SKIPPED and a TIMEOUT trial."""
    return synthetic_frames()


@pytest.fixture(scope="session")
def make_frames() -> Any:
    """``synthetic_frames`` itself, for tests that need other shapes (conftest is not importable by name)."""
    return synthetic_frames
