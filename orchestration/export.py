"""``crossrl export``: a trained policy of any engine, from its trial's newest checkpoint, as one TorchScript file that
loads with torch alone (``torch.jit.load``), and a JSON sidecar that says its inputs and outputs.

The file maps observations ``float32 [B, *obs_shape]`` (the observation as every engine's policy sees it: Dict and
Tuple observations flattened) to the greedy action: ``int64 [B]`` (the index of a Discrete action: the argmax of the
logits or of the Q-values) or ``float32 [B, act_dim]`` (a Box action in the env's own bounds: a Gaussian policy's mean
as the engine clips or rescales it, SAC's ``tanh(mean)`` rescaled). Each engine rebuilds its own network from the
checkpoint (the registry's ``policy_exporter``); the result is the engine's greedy action (its ``policy_loader`` with
``greedy=True``), and where the trial rescaled the env's actions to [-1, 1] (``env.actions: unit``, SAC's default)
the file maps them back to the env's bounds, as gymnasium's ``RescaleAction`` does, so its actions step the env
``gymnasium.make(env.id)`` builds.
"""

from __future__ import annotations

import importlib
import json
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from crossrl.adapters import checkpoints
from crossrl.adapters.registry import engine_info, engines
from crossrl.scenarios.loader import env_id_problem
from crossrl.scenarios.spec import Trial

FORMAT = "torchscript"
TRACE_BATCH = 3
"""The batch the module is traced on; it is checked on another batch size (the file takes any B)."""


class ExportError(Exception):
    """Nothing to export, said in one line (what, where, how to fix)."""


@dataclass
class Exported:
    trial: Trial
    run_id: str
    path: Path
    sidecar: Path
    info: dict[str, Any]


def policy_exporter(engine: str) -> Callable[[Trial, Path], Any]:
    """The engine's ``export_policy(trial, folder)`` (the registry's ``policy_exporter``)."""
    target = engine_info(engine).policy_exporter
    if target is None:
        able = ", ".join(e for e, info in engines().items() if info.policy_exporter)
        raise ExportError(f"engine {engine!r} cannot export a policy; export takes trials of {able}")
    module, _, name = target.partition(":")
    exporter: Callable[[Trial, Path], Any] = getattr(importlib.import_module(module), name)
    return exporter


def space_info(space: Any) -> dict[str, Any]:
    """A gymnasium space as JSON: its type, shape and dtype; a Discrete's ``n`` (and ``start``); a Box's bounds."""
    import gymnasium as gym

    out: dict[str, Any] = {"type": type(space).__name__, "repr": str(space)}
    if isinstance(space, gym.spaces.Discrete):
        out.update(n=int(space.n), start=int(space.start), dtype=str(space.dtype))
    elif isinstance(space, gym.spaces.Box):
        out.update(shape=list(space.shape), dtype=str(space.dtype))
        if space.low.size <= 64:
            out.update(low=_floats(space.low), high=_floats(space.high))
    else:
        out["shape"] = list(space.shape) if space.shape is not None else None
    return out


def _floats(x: np.ndarray) -> list[Any]:
    """Bounds as JSON numbers (infinite ones as the strings "inf" / "-inf")."""
    return [float(v) if np.isfinite(v) else ("inf" if v > 0 else "-inf") for v in np.asarray(x, float).reshape(-1)]


def example_observations(space: Any, n: int, *, seed: int = 0) -> np.ndarray:
    """``n`` float32 observations in ``space``: standard normal draws clipped to its bounds (a Box's own sample of a
    near-unbounded dimension, CartPole's velocities, is of order 1e38)."""
    rng = np.random.default_rng(seed)
    shape = tuple(space.shape)
    x = rng.standard_normal((n, *shape))
    low = getattr(space, "low", None)
    if low is not None:
        x = np.clip(x, np.broadcast_to(low, shape), np.broadcast_to(space.high, shape))
    return x.astype(np.float32)


def export_policy(trial: Trial, run_id: str, folder: Path, meta: dict[str, Any], out: Path) -> Exported:
    """Write ``out/<trial>.pt`` (the traced greedy policy) and ``out/<trial>.json`` (its sidecar) from the checkpoint
    ``folder`` (``meta``: its ``crossrl.json``)."""
    import gymnasium as gym
    import torch

    from crossrl.adapters.exported import EnvActions
    from crossrl.core.envs import make_env

    if trial.env.multi_agent:
        raise ExportError(f"{trial.name}: exporting a multi-agent env's policies is not supported yet")
    problem = env_id_problem(trial.env.model_dump(), trial.name)
    if problem:
        raise ExportError(problem)
    exporter = policy_exporter(trial.engine)
    quiet = trial.env.model_copy(update={"step_latency_ms": 0.0})
    env = make_env(quiet)
    raw = make_env(quiet.model_copy(update={"actions": "env"}))
    try:
        obs_space, act_space, env_space = env.observation_space, env.action_space, raw.action_space
        flattened = isinstance(raw.unwrapped.observation_space, gym.spaces.Dict | gym.spaces.Tuple)
    finally:
        env.close()
        raw.close()
    try:
        module = exporter(trial, folder / checkpoints.ENGINE_DIR)
    except (ValueError, TypeError, NotImplementedError) as e:  # what the engine refuses, said by the engine
        raise ExportError(str(e) if str(e).startswith(trial.name) else f"{trial.name}: {e}") from None
    except Exception as e:  # a checkpoint the engine cannot read back: one line, not a traceback
        first = str(e).splitlines()[0] if str(e) else ""
        raise ExportError(f"{trial.name}: {trial.engine} could not rebuild its policy from {folder}: "
                          f"{type(e).__name__}: {first}") from None  # fmt: skip
    rescaled = isinstance(act_space, gym.spaces.Box) and not (
        np.array_equal(act_space.low, env_space.low) and np.array_equal(act_space.high, env_space.high)
    )
    if rescaled:
        module = EnvActions(module, env_space.low.reshape(-1), env_space.high.reshape(-1))
    module.eval()
    example = torch.from_numpy(example_observations(obs_space, TRACE_BATCH, seed=trial.seed))
    check = torch.from_numpy(example_observations(obs_space, TRACE_BATCH + 2, seed=trial.seed + 1))
    try:
        with torch.no_grad(), warnings.catch_warnings():
            # torch 2.13 deprecates TorchScript for torch.export; a .pt2 needs torch's export runtime to run it
            warnings.simplefilter("ignore", DeprecationWarning)
            traced = torch.jit.trace(module, example, check_trace=False)
            same = torch.equal(traced(check), module(check))
    except Exception as e:  # the engine's network does not trace: said in one line
        raise ExportError(f"{trial.name}: torch.jit.trace of the {trial.engine} policy failed: "
                          f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}") from None  # fmt: skip
    if not same:
        raise ExportError(f"{trial.name}: the traced {trial.engine} policy acts otherwise than the policy itself on a "
                          f"batch of {TRACE_BATCH + 2}; it cannot be exported by tracing")  # fmt: skip
    out.mkdir(parents=True, exist_ok=True)
    path, sidecar = out / f"{trial.name}.pt", out / f"{trial.name}.json"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        traced.save(str(path))
    discrete = isinstance(act_space, gym.spaces.Discrete)
    info = {
        "format": FORMAT,
        "file": path.name,
        "load": "module = torch.jit.load(file); action = module(obs)",
        "input": {
            "dtype": "float32",
            "shape": ["B", *[int(n) for n in obs_space.shape]],
            "observation_space": space_info(obs_space),
            "flattened": bool(flattened),  # the env's Dict or Tuple observation, flattened as gymnasium flattens it
        },
        "output": {
            "dtype": "int64" if discrete else "float32",
            "shape": ["B"] if discrete else ["B", int(np.prod(env_space.shape))],
            "action": "the greedy action's index" if discrete else "the greedy action, in the env's bounds",
            "action_space": space_info(env_space),
            "rescaled_from_unit": bool(rescaled),
        },
        "engine": trial.engine,
        "algorithm": trial.algorithm,
        "env_id": trial.env.id,
        "env_kwargs": trial.env.kwargs,
        "trial": trial.name,
        "run_id": run_id,
        "fingerprint": trial.fingerprint,
        "seed": trial.seed,
        "checkpoint": {"folder": str(folder), "env_steps_sampled": int(meta.get("env_steps_sampled", -1))},
        "torch_version": torch.__version__,
    }
    sidecar.write_text(json.dumps(info, indent=2) + "\n")
    return Exported(trial, run_id, path, sidecar, info)
