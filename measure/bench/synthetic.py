"""Synthetic store frames (trials, points, meta) shaped like ``ResultsStore.load``'s, to time report builds.

A compact cousin of the reports tests' generator (tests/reports/conftest.py, which the package cannot
import): sigmoid learning curves, noisy throughput, every common point metric, all trials FINISHED.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from crossrl.scenarios import metrics as M


def synthetic_frames(
    *,
    engines: Sequence[str] = ("crossrl", "rllib", "torchrl", "mystack"),
    workers: Sequence[int] = (1, 2, 4, 8, 16),
    seeds: Sequence[int] = (0, 1, 2, 3, 4),
    n_points: int = 200,
    budget: int = 200_000,
    target: float = 450.0,
    seed: int = 0,
) -> tuple[pd.DataFrame, pd.DataFrame, dict[str, Any]]:
    """``len(engines) x len(workers) x len(seeds)`` trials (100 by default) of ``n_points`` points each."""
    rng = np.random.default_rng(seed)
    trials: list[dict[str, Any]] = []
    rows: list[tuple[str, str, int, float]] = []
    steps = np.linspace(budget / n_points, budget, n_points).astype(int)
    for w in workers:
        for s in seeds:
            for k, e in enumerate(engines):
                run_id = f"run{len(trials):04d}"
                speed = 1.0 / (1 + 0.3 * k)  # learning speed factor: engines differ
                rate0 = 8000.0 / (1 + k) * w**0.8  # env steps/s
                wall, prev, hit = 0.0, 0, None
                returns = []
                for i, st in enumerate(steps):
                    rate = rate0 * float(rng.uniform(0.85, 1.15))
                    wall += (st - prev) / rate
                    prev = int(st)
                    ret = 500.0 / (1.0 + math.exp(-(speed * 8.0 * st / budget - 4.0)))
                    ret = float(np.clip(ret + rng.normal(0, 15.0), 8.0, 500.0))
                    returns.append(ret)
                    if hit is None and ret >= target:
                        hit = (float(st), wall)
                    vals = {
                        M.ENV_STEPS_SAMPLED: float(st), M.ENV_STEPS_TRAINED: float(st), M.WALL_TIME_S: wall,
                        M.SAMPLE_THROUGHPUT: rate, M.TRAIN_THROUGHPUT: rate, M.EPISODES_TOTAL: float(3 * (i + 1)),
                        M.TIME_SAMPLE_S: 0.7 * budget / n_points / rate, M.TIME_LEARN_S: 0.05,
                        M.TIME_SYNC_WEIGHTS_S: 0.002, M.POLICY_LOSS: float(rng.normal(0, 0.1)),
                        M.VALUE_LOSS: float(rng.uniform(1, 50)), M.ENTROPY: 0.69 * (1 - st / budget / 2),
                        M.WORKER_RESTARTS: 0.0, M.EPISODE_RETURN_MEAN: ret, M.EPISODES_THIS_POINT: 3.0,
                    }  # fmt: skip
                    rows += [(run_id, m, int(st), v) for m, v in vals.items()]
                trials.append(
                    {
                        "run_id": run_id, "trial": f"{e}-ppo-w{w}-s{s}", "scenario": "synthetic-ppo",
                        "fingerprint": "0123456789abcdef", "engine": e, "engine_version": "1.0",
                        "algorithm": "ppo", "optimizer": "sync_samples", "workers": w, "envs_per_worker": 4,
                        "seed": s, "status": M.FINISHED, "reason": "", "target_return": target,
                        "budget_env_steps": budget, M.FINAL_RETURN_MEAN: float(np.mean(returns[-3:])),
                        M.STEPS_TO_TARGET: hit[0] if hit else math.nan,
                        M.WALL_S_TO_TARGET: hit[1] if hit else math.nan,
                        M.PEAK_RSS_MB: 400.0 + 150 * w, M.CPU_SECONDS: wall * min(w, 2) * 0.9, "setup_s": 3.0,
                    }
                )  # fmt: skip
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
        "machine": {"host": "bench", "cpu_count": "2", "platform": "synthetic"},
        "versions": {"python": "3.11", "crossrl": "0.1.0"},
        "created": "2025-01-01 12:00:00",
    }
    return pd.DataFrame(trials), pd.DataFrame(rows, columns=["run_id", "metric", "step", "value"]), meta
