"""The env guard: every env crossrl builds, for every engine, is stepped through it.

A user's env that raises, returns a non-finite reward or observation, or an observation that does not fit its
declared space, is the user's bug, not a lost worker: the guard raises :class:`EnvFault` where it happened,
naming what, where and at which env step. Engines that end a trial on a worker's exception (crossrl's core,
TorchRL) fail with that message; an engine that restarts the worker instead (RLlib restarts an env runner
whose sample raised) would retry the same bug until the wall budget. So the guard also reports the fault to
the trial's watcher (``crossrl.orchestration.watch``), which ends the trial FAILED on every engine alike.

The channel is a folder named by the environment variable :data:`WATCH_DIR_ENV`, set by the runner for the
trial's process and inherited by the processes it starts (Ray's workers on a local cluster; a sweep's hosts
pass it in their runtime env). Without it (tests, ``crossrl validate``) the guard only raises. In the folder:

- ``beat-<pid>``: touched at most every :data:`BEAT_EVERY_S` while envs of that process step (the watcher's
  stall watchdog reads the newest);
- ``fault-<pid>-<n>.json``: one per fault (``message``, ``traceback``, ``env_step``, ``pid``, ``time``);
- ``warn-<pid>-<n>.json``: a non-finite value let through under ``env.nonfinite: warn`` (once per env copy);
- ``stacks-<pid>.txt``: where the process writes every thread's Python stack on SIGUSR1 (``faulthandler``).

The per-step cost is one Python wrapper call, a clock read and the checks: about 1-2 us per env step
(``tests/core/test_envguard.py`` measures it beside the bare env in its benchmark function).
"""

from __future__ import annotations

import faulthandler
import itertools
import json
import math
import os
import signal
import sys
import time
import traceback
from typing import IO, Any

import gymnasium as gym
import numpy as np
from pettingzoo.utils.wrappers.base_parallel import BaseParallelWrapper

WATCH_DIR_ENV = "CROSSRL_WATCH_DIR"
BEAT_EVERY_S = 1.0
NONFINITE_MODES = ("error", "warn")


class EnvFault(RuntimeError):
    """The user's env broke (raised, returned a non-finite value, or an observation outside its space)."""


class _Channel:
    """This process's side of the watch folder (one per process, made at the first guard)."""

    def __init__(self) -> None:
        self.dir = os.environ.get(WATCH_DIR_ENV) or None
        self.pid = os.getpid()
        self._last_beat = 0.0
        self._seq = itertools.count()
        if self.dir is not None:
            try:
                os.makedirs(self.dir, exist_ok=True)
                self._beat_path = os.path.join(self.dir, f"beat-{self.pid}")
                register_stacks()
            except OSError:
                self.dir = None

    def beat(self) -> None:
        now = time.monotonic()
        if now - self._last_beat < BEAT_EVERY_S or self.dir is None:
            return
        self._last_beat = now
        try:
            with open(self._beat_path, "w"):
                pass
        except OSError:
            pass

    def write(self, kind: str, record: dict[str, Any]) -> None:
        """A fault or warning record, written whole (a temporary name, then renamed) so the watcher never reads half."""
        if self.dir is None:
            return
        path = os.path.join(self.dir, f"{kind}-{self.pid}-{next(self._seq)}.json")
        try:
            with open(path + ".tmp", "w") as f:
                json.dump({**record, "pid": self.pid, "time": time.time()}, f)
            os.replace(path + ".tmp", path)
        except OSError:
            pass


_channel: _Channel | None = None
_stacks_file: IO[str] | None = None


def channel() -> _Channel:
    global _channel
    if _channel is None or _channel.pid != os.getpid():  # a forked child gets its own
        _channel = _Channel()
    return _channel


def register_stacks() -> None:
    """Have this process write every thread's Python stack to ``stacks-<pid>.txt`` in the watch folder on SIGUSR1
    (the stall watchdog asks for them before it ends a hung trial). No-op without a watch folder or off the main
    thread's interpreter state (faulthandler works from any thread)."""
    global _stacks_file
    directory = os.environ.get(WATCH_DIR_ENV)
    if not directory or _stacks_file is not None or not hasattr(signal, "SIGUSR1"):
        return
    try:
        os.makedirs(directory, exist_ok=True)
        _stacks_file = open(os.path.join(directory, f"stacks-{os.getpid()}.txt"), "w")  # noqa: SIM115 - kept open
        faulthandler.register(signal.SIGUSR1, file=_stacks_file, all_threads=True, chain=False)
    except (OSError, RuntimeError, ValueError):
        _stacks_file = None


def _where(steps: int) -> str:
    return f"at env step {steps} of its env copy (pid {os.getpid()})"


class _Checks:
    """The checks shared by the single-agent and multi-agent guards: one env copy's step count and its faults."""

    def __init__(self, env_id: str, nonfinite: str) -> None:
        if nonfinite not in NONFINITE_MODES:
            raise ValueError(f"nonfinite={nonfinite!r}: one of {', '.join(NONFINITE_MODES)}")
        self.env_id = env_id
        self.nonfinite = nonfinite
        self.steps = 0
        self.warned = False
        self.chan = channel()

    def call(self, name: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)``, the env's ``reset`` or ``step``: an exception it raises becomes an
        :class:`EnvFault` (reported to the watch); a step is counted; the process beats."""
        try:
            out = fn(*args, **kwargs)
        except EnvFault:
            raise
        except Exception as e:
            raise self.raised(e, name) from e
        if name == "step":
            self.steps += 1
        self.chan.beat()
        return out

    def raised(self, e: BaseException, call: str) -> EnvFault:
        message = f"env {self.env_id} raised {type(e).__name__}: {_first_line(e)} in {call}() {_where(self.steps)}"
        tb = "".join(traceback.format_exception(e))
        self.chan.write("fault", {"message": message, "traceback": tb, "env_step": self.steps})
        return EnvFault(message)

    def fault(self, message: str) -> EnvFault:
        tb = "".join(traceback.format_stack()[:-2])
        self.chan.write("fault", {"message": message, "traceback": tb, "env_step": self.steps})
        return EnvFault(message)

    def bad_value(self, what: str, value: Any) -> None:
        message = f"env {self.env_id} returned a non-finite {what} ({value}) {_where(self.steps)}"
        if self.nonfinite == "error":
            raise self.fault(message + "; set env.nonfinite: warn to let such values through")
        if not self.warned:
            self.warned = True
            print(f"warning: {message} (env.nonfinite: warn lets it through)", file=sys.stderr, flush=True)
            self.chan.write("warn", {"message": message, "env_step": self.steps})


class _ObsCheck:
    """Shape, dtype and finiteness of a Box observation against its declared space (other spaces: not checked).

    The dtype rule is gymnasium's own (``Box.contains``): the observation's dtype must cast to the space's safely, so
    float32 into a float64 Box or uint8 into a float32 one fits, and float64 into a float32 Box does not (the engines
    would each cast it their own way, or not at all)."""

    def __init__(self, space: gym.Space) -> None:
        self.space = space
        self.box = isinstance(space, gym.spaces.Box)
        self.shape = tuple(space.shape) if self.box and space.shape is not None else None
        self.dtype = np.dtype(space.dtype) if self.box and space.dtype is not None else None
        self.floating = self.dtype is not None and self.dtype.kind == "f"
        self._ok_dtype = self.dtype

    def problem(self, obs: Any) -> tuple[str, Any] | None:
        """``("space", description)`` for a mismatch, ``("nonfinite", (index, value))``, or None when it fits."""
        if not self.box:
            return None
        shape = getattr(obs, "shape", None)
        dtype = getattr(obs, "dtype", None)
        if shape != self.shape or dtype is None:
            got = f"shape {shape}" if shape is not None else f"a {type(obs).__name__}"
            return "space", f"an observation of {got} where its observation space declares shape {self.shape}"
        if dtype is not self._ok_dtype and dtype != self._ok_dtype:
            assert self.dtype is not None
            if not np.can_cast(dtype, self.dtype):
                return "space", (
                    f"an observation of dtype {dtype} where its observation space {self.space} declares {self.dtype} "
                    f"(return obs.astype(np.{self.dtype}), or declare the Box with dtype=np.{dtype})"
                )
            self._ok_dtype = dtype
        if self.floating and not _all_finite(obs):
            index = int(np.flatnonzero(~np.isfinite(np.asarray(obs).ravel()))[0])
            return "nonfinite", (index, np.asarray(obs).ravel()[index])
        return None


class EnvGuard(gym.Wrapper):
    """A single-agent gymnasium env, checked (see the module's docstring). Put right around the user's env,
    before crossrl's own wrappers, so the faults named are the env's own."""

    def __init__(self, env: gym.Env, *, env_id: str, nonfinite: str = "error") -> None:
        super().__init__(env)
        self._checks = _Checks(env_id, nonfinite)
        self._obs = _ObsCheck(env.observation_space)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        obs, info = self._checks.call("reset", self.env.reset, seed=seed, options=options)
        self._check_obs(obs)
        return obs, info

    def step(self, action: Any) -> Any:
        checks = self._checks
        obs, reward, terminated, truncated, info = checks.call("step", self.env.step, action)
        try:
            finite = math.isfinite(reward)
        except TypeError:
            finite = bool(np.isfinite(np.asarray(reward)).all())
        if not finite:
            checks.bad_value("reward", reward)
        self._check_obs(obs)
        return obs, reward, terminated, truncated, info

    def _check_obs(self, obs: Any) -> None:
        found = self._obs.problem(obs)
        if found is None:
            return
        kind, detail = found
        checks = self._checks
        if kind == "nonfinite":
            index, value = detail
            checks.bad_value(f"observation (element {index})", value)
        else:
            raise checks.fault(f"env {checks.env_id} returned {detail} {_where(checks.steps)}")


class VectorEnvGuard(gym.vector.VectorWrapper):
    """An env's own vector class (gymnasium's CartPoleVectorEnv, for one), checked per vector step: what
    :class:`EnvGuard` checks per copy, on the batched rewards and observations."""

    def __init__(self, env: gym.vector.VectorEnv, *, env_id: str, nonfinite: str = "error") -> None:
        super().__init__(env)
        self._checks = _Checks(env_id, nonfinite)
        self._obs = _ObsCheck(env.single_observation_space)
        self._num = env.num_envs

    def reset(self, *, seed: Any = None, options: dict[str, Any] | None = None) -> Any:
        obs, info = self._checks.call("reset", self.env.reset, seed=seed, options=options)
        self._check(obs, None)
        return obs, info

    def step(self, actions: Any) -> Any:
        obs, rewards, terms, truncs, info = self._checks.call("step", self.env.step, actions)
        self._check(obs, rewards)
        return obs, rewards, terms, truncs, info

    def _check(self, obs: Any, rewards: Any) -> None:
        checks = self._checks
        if rewards is not None and not _all_finite(rewards):
            i = int(np.flatnonzero(~np.isfinite(rewards))[0])
            checks.bad_value(f"reward (vector copy {i})", rewards[i])
        if self._obs.box and self._obs.floating and not _all_finite(obs):
            rows = np.asarray(obs).reshape(self._num, -1)
            i, j = (int(k[0]) for k in np.nonzero(~np.isfinite(rows)))
            checks.bad_value(f"observation (vector copy {i}, element {j})", rows[i, j])


class ParallelEnvGuard(BaseParallelWrapper):  # type: ignore[misc]
    """A PettingZoo parallel env, checked per joint step: each agent's reward and observation."""

    def __init__(self, env: Any, *, env_id: str, nonfinite: str = "error") -> None:
        super().__init__(env)
        self._checks = _Checks(env_id, nonfinite)
        self._obs: dict[str, _ObsCheck] = {}

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        obs, infos = self._checks.call("reset", self.env.reset, seed=seed, options=options)
        self._check_obs(obs)
        return obs, infos

    def step(self, actions: dict[str, Any]) -> Any:
        checks = self._checks
        obs, rewards, terms, truncs, infos = checks.call("step", self.env.step, actions)
        for agent, r in rewards.items():
            if not math.isfinite(float(r)):
                checks.bad_value(f"reward of agent {agent!r}", r)
        self._check_obs(obs)
        return obs, rewards, terms, truncs, infos

    def _check_obs(self, obs: dict[str, Any]) -> None:
        checks = self._checks
        for agent, o in obs.items():
            check = self._obs.get(agent)
            if check is None:
                check = self._obs[agent] = _ObsCheck(self.env.observation_space(agent))
            found = check.problem(o)
            if found is None:
                continue
            kind, detail = found
            if kind == "nonfinite":
                checks.bad_value(f"observation of agent {agent!r} (element {detail[0]})", detail[1])
            else:
                raise checks.fault(f"env {checks.env_id} returned agent {agent!r} {detail} {_where(checks.steps)}")


SMALL = 64  # up to this many elements, a list's floats are checked faster than numpy's ufunc call (0.4 vs 1.9 us)


def _all_finite(a: np.ndarray) -> bool:
    if a.size <= SMALL:
        return all(map(math.isfinite, a.ravel().tolist()))
    return bool(np.isfinite(a).all())


def _first_line(e: BaseException) -> str:
    lines = str(e).strip().splitlines()
    return " ".join(lines[0].split()) if lines else "(no message)"
