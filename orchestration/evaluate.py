"""``crossrl evaluate``: a trained policy of any engine, reloaded from its trial's newest checkpoint, played for some
episodes without training; its return's mean with a 95 % bootstrap confidence interval.

Each engine reloads its own policy (the registry's ``policy_loader``: crossrl's policy from its state, RLlib's
RLModule from ``save_to_path``'s folder, TorchRL's networks from their ``state_dict``s) and acts on the env exactly as
:func:`crossrl.core.envs.make_env` builds it (the same env the trial's clip of its final policy is recorded on). The
return is the env's raw score (no reward clipping), episodes reset with seeds apart from the training seeds.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from crossrl.adapters import checkpoints
from crossrl.adapters.registry import engine_info
from crossrl.orchestration.trials import CHECKPOINT_LATEST_TAG
from crossrl.reports.store import ResultsStore, StoreError
from crossrl.scenarios.loader import env_id_problem
from crossrl.scenarios.spec import ScenarioSpec, Trial

EVAL_SEED_OFFSET = 1_000_003
"""Evaluation episode i resets with seed ``trial.seed + EVAL_SEED_OFFSET + i``: never a training env's seed."""
EVAL_TAGS = ("evaluate.return_mean", "evaluate.ci_low", "evaluate.ci_high", "evaluate.episodes", "evaluate.mode")


class EvaluateError(Exception):
    """Nothing to evaluate, said in one line (what, where, how to fix)."""


@dataclass
class Evaluation:
    trial: Trial
    run_id: str
    checkpoint: Path
    env_step: int
    greedy: bool
    returns: list[float] = field(default_factory=list)
    lengths: list[int] = field(default_factory=list)

    @property
    def mean(self) -> float:
        return float(np.mean(self.returns)) if self.returns else math.nan

    def ci(self, *, seed: int = 0) -> tuple[float, float]:
        """95 % bootstrap interval of the mean return (percentile; a point when every episode scored the same)."""
        x = np.asarray(self.returns, dtype=float)
        if len(x) < 2 or np.all(x == x[0]):
            return (self.mean, self.mean)
        rng = np.random.default_rng(seed)
        means = x[rng.integers(0, len(x), size=(5000, len(x)))].mean(axis=1)
        low, high = np.percentile(means, [2.5, 97.5])
        return (float(low), float(high))


def trials_to_evaluate(store: ResultsStore, target: str) -> list[tuple[Trial, Any]]:
    """The trials ``target`` names: a trial run id (that trial), a `crossrl run`'s parent run id (its trials), or a
    scenario (its newest run's trials); each with its run."""
    try:
        run = store.parent_run(target)
    except StoreError:
        parents = store.parent_runs(target)
        if not parents:
            raise EvaluateError(
                f"{target!r} is neither a run id nor a scenario with runs in {store.uri}; `crossrl runs` lists them"
            ) from None
        run = parents[0]
    kind = run.data.tags.get("crossrl.kind")
    if kind == "trial":
        parent = store.parent_run(run.data.tags["mlflow.parentRunId"])
        runs = [run]
    elif kind == "parent":
        parent, runs = run, store.children(run)
    else:
        raise EvaluateError(f"run {target} is not a crossrl trial or `crossrl run`")
    spec = ScenarioSpec.model_validate(store.spec(str(parent.info.run_id)))
    by_name = {t.name: t for t in spec.trials()}
    out = []
    for r in runs:
        trial = by_name.get(str(r.info.run_name))
        if trial is not None and r.data.tags.get("status") != "SKIPPED":
            out.append((trial, r))
    if not out:
        raise EvaluateError(f"run {target} has no trial that ran")
    return out


def newest_checkpoint(trial: Trial, run: Any) -> tuple[Path, dict[str, Any]]:
    """The trial's newest good checkpoint (its run's ``checkpoint.latest`` tag names the folder)."""
    latest = run.data.tags.get(CHECKPOINT_LATEST_TAG)
    if not latest:
        raise EvaluateError(
            f"{trial.name} (run {run.info.run_id}) has no checkpoint: it ended before writing one (checkpoint.final "
            "writes one when a trial ends FINISHED); rerun it with checkpoints on"
        )
    found = checkpoints.newest_good(Path(latest).parent, fingerprint=trial.fingerprint, trial=trial.name)
    if found is None:
        raise EvaluateError(f"{trial.name}: no usable checkpoint under {Path(latest).parent} (moved or deleted?)")
    return found


def policy_loader(engine: str) -> Callable[..., Callable[[Any], Any]]:
    """The engine's ``load_policy(trial, folder, *, greedy)`` (the registry's ``policy_loader``)."""
    target = engine_info(engine).policy_loader
    if target is None:
        raise EvaluateError(f"engine {engine!r} cannot reload a policy from a checkpoint")
    module, _, name = target.partition(":")
    loader: Callable[..., Callable[[Any], Any]] = getattr(importlib.import_module(module), name)
    return loader


def evaluate(
    trial: Trial, run_id: str, folder: Path, meta: dict[str, Any], *, episodes: int, greedy: bool
) -> Evaluation:
    """``episodes`` episodes of the checkpoint's policy on a fresh env (no training, no sampling workers)."""
    from crossrl.core.envs import make_env

    if trial.env.multi_agent:
        raise EvaluateError(f"{trial.name}: evaluating a multi-agent env's policies is not supported yet")
    problem = env_id_problem(trial.env.model_dump(), trial.name)  # the user's env module must import here too
    if problem:
        raise EvaluateError(problem)
    act = policy_loader(trial.engine)(trial, folder / checkpoints.ENGINE_DIR, greedy=greedy)
    result = Evaluation(trial, run_id, folder, int(meta["env_steps_sampled"]), greedy)
    env = make_env(trial.env.model_copy(update={"step_latency_ms": 0.0}))
    try:
        for i in range(episodes):
            obs, _ = env.reset(seed=trial.seed + EVAL_SEED_OFFSET + i)
            reset = getattr(act, "reset", None)  # a recurrent policy (DreamerV3's) starts each episode afresh
            if reset is not None:
                reset()
            score, length, done = 0.0, 0, False
            while not done:
                obs, reward, terminated, truncated, _ = env.step(act(obs))
                score += float(reward)
                length += 1
                done = bool(terminated or truncated)
            result.returns.append(score)
            result.lengths.append(length)
    finally:
        env.close()
    return result
