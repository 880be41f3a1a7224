"""Env construction shared by every engine, so that all of them step the very same env."""

from __future__ import annotations

import gc
import sys
import time
import warnings
from collections.abc import Callable
from typing import Any, cast

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode, SyncVectorEnv
from pettingzoo.utils.wrappers.base_parallel import BaseParallelWrapper

from crossrl.core.envguard import EnvGuard, ParallelEnvGuard, VectorEnvGuard
from crossrl.scenarios.loader import first_line, pettingzoo_module, register_suite, registered_spec
from crossrl.scenarios.spec import EnvSpec, mapping_problems

ATARI_FRAME_STACK = 4


class StepLatency(gym.Wrapper):
    """Adds wall time to every step without using CPU (a simulated simulator's cost)."""

    def __init__(self, env: gym.Env, latency_ms: float) -> None:
        super().__init__(env)
        self._latency_s = latency_ms / 1000.0

    def step(self, action: Any):  # type: ignore[override]
        time.sleep(self._latency_s)
        return self.env.step(action)


SCORE_KEY = "crossrl_score"
"""The info key :class:`SignRewardKeepScore` keeps each step's raw reward under."""


class SignRewardKeepScore(gym.Wrapper):
    """Steps return ``sign(reward)`` (what a learner that sees only the env's reward then learns from) and keep the
    raw reward in ``info[SCORE_KEY]`` (what the game scored, which crossrl reports); for engines whose learners
    read rewards straight from the env's steps (RLlib's env runners)."""

    def step(self, action: Any):  # type: ignore[override]
        obs, reward, terminated, truncated, info = self.env.step(action)
        score = float(reward)
        return obs, float(np.sign(score)), terminated, truncated, {**info, SCORE_KEY: score}


class MinAtarFrames(gym.ObservationWrapper):
    """MinAtar's boolean channels [10, 10, C] as uint8 frames of 0 and 255 (what every model scales by 1/255)."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        space = env.observation_space
        assert isinstance(space, gym.spaces.Box)
        self.observation_space = gym.spaces.Box(0, 255, space.shape, np.uint8)

    def observation(self, observation: Any) -> np.ndarray:
        return np.multiply(observation, 255, dtype=np.uint8)


class ChannelsLast(gym.ObservationWrapper):
    """Stacked frames [K, H, W] (gymnasium's FrameStackObservation) as [H, W, K], the layout every model reads."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        space = env.observation_space
        assert isinstance(space, gym.spaces.Box) and len(space.shape) == 3
        low, high = np.moveaxis(space.low, 0, -1), np.moveaxis(space.high, 0, -1)
        self.observation_space = gym.spaces.Box(low, high, low.shape, space.dtype)  # type: ignore[arg-type]

    def observation(self, observation: Any) -> np.ndarray:
        return np.ascontiguousarray(np.moveaxis(observation, 0, -1))


def guard(env: gym.Env, spec: EnvSpec) -> gym.Env:
    """The user's env inside crossrl's :class:`~crossrl.core.envguard.EnvGuard` (every engine steps it through one)."""
    return EnvGuard(env, env_id=spec.id, nonfinite=spec.nonfinite)


def make_env(spec: EnvSpec, **overrides: Any) -> gym.Env:
    """One env as the spec describes it: the env inside crossrl's env guard (:mod:`crossrl.core.envguard`: an
    exception, a non-finite value or an observation outside its space is an :class:`EnvFault`), its preprocessing
    (``EnvSpec.preprocessing``), then the latency wrapper when ``step_latency_ms`` > 0. Pixel envs give uint8
    frames [H, W, C]."""
    register_suite(spec.id)
    kwargs = {**spec.kwargs, **overrides}
    kind = spec.resolved_preprocessing
    if kind == "atari":
        # AtariPreprocessing skips frames itself (max-pooling the last two), so the env must not.
        env = guard(gym.make(spec.id, **{"frameskip": 1, **kwargs}), spec)
        env = gym.wrappers.AtariPreprocessing(
            env, noop_max=30, frame_skip=4, screen_size=84, terminal_on_life_loss=False, grayscale_obs=True
        )
        env = ChannelsLast(gym.wrappers.FrameStackObservation(env, ATARI_FRAME_STACK))
    else:
        env = guard(flat_observations(gym.make(spec.id, **kwargs), spec.id), spec)
        if kind == "minatar":
            env = MinAtarFrames(env)
    if spec.actions == "unit":
        env = unit_actions(env, spec.id)
    if spec.step_latency_ms > 0:
        env = StepLatency(env, spec.step_latency_ms)
    return env


def flat_observations(env: gym.Env, env_id: str) -> gym.Env:
    """``env`` with its Dict or Tuple observations flattened into one float32 vector (:class:`FlatObservations`);
    an env with other observations as it is. An image among the parts cannot be flattened into an MLP's input
    fairly: a ValueError naming it."""
    space = env.observation_space
    if not isinstance(space, gym.spaces.Dict | gym.spaces.Tuple):
        return env
    for where, leaf in _leaves(space, ""):
        if isinstance(leaf, gym.spaces.Box) and len(leaf.shape) >= 2:
            raise ValueError(
                f"{env_id}: its observation part {where} is {leaf}, an array of {len(leaf.shape)} dimensions among "
                f"{type(space).__name__} observations; crossrl flattens Dict and Tuple observations of vectors only: "
                "give that part as a flat vector, or the image alone (a Box observation, with algorithm.model.conv)"
            )
        if not isinstance(
            leaf, gym.spaces.Box | gym.spaces.Discrete | gym.spaces.MultiBinary | gym.spaces.MultiDiscrete
        ):
            raise ValueError(
                f"{env_id}: its observation part {where} is {leaf}, which has no fixed-size vector form; crossrl "
                "flattens Dict and Tuple observations of Box, Discrete, MultiBinary and MultiDiscrete parts"
            )
    return FlatObservations(env)


def _leaves(space: gym.Space, where: str) -> list[tuple[str, gym.Space]]:
    if isinstance(space, gym.spaces.Dict):
        return [leaf for key, sub in space.spaces.items() for leaf in _leaves(sub, f"{where}[{key!r}]")]
    if isinstance(space, gym.spaces.Tuple):
        return [leaf for i, sub in enumerate(space.spaces) for leaf in _leaves(sub, f"{where}[{i}]")]
    return [(where or "observation", space)]


class FlatObservations(gym.ObservationWrapper):  # type: ignore[type-arg]
    """Dict and Tuple observations as one float32 vector, the same on every engine (they all step :func:`make_env`):
    gymnasium's ``spaces.flatten`` order, i.e. a Dict's parts in its keys' sorted order (gymnasium's ``Dict`` sorts a
    plain dict's keys), a Tuple's in position order, nested ones depth first; a Box part row-major, a Discrete part
    one-hot, MultiBinary as 0/1, MultiDiscrete one-hot per dimension. The bounds are the parts' bounds, cast to float32.
    An observation that does not match the declared structure (a missing key, a part of another shape) raises a
    ValueError naming it, which the env guard reports as the env's fault."""

    def __init__(self, env: gym.Env) -> None:  # type: ignore[type-arg]
        super().__init__(env)
        self.source = env.observation_space
        flat = gym.spaces.flatten_space(self.source)
        assert isinstance(flat, gym.spaces.Box)
        self.observation_space = gym.spaces.Box(
            flat.low.astype(np.float32), flat.high.astype(np.float32), dtype=np.float32
        )
        self.size = int(flat.shape[0])

    def observation(self, observation: Any) -> np.ndarray:
        try:
            out = np.asarray(gym.spaces.flatten(self.source, observation), dtype=np.float32)
        except Exception as e:
            out, why = None, f"{type(e).__name__}: {first_line(e)}"
        if out is None or out.shape != (self.size,):
            found = _mismatch(self.source, observation, "")
            raise ValueError(
                f"an observation that does not match its observation space {self.source}: "
                f"{found or why if out is None else found or 'another number of values'}"
            )
        return out


def _mismatch(space: gym.Space, obs: Any, where: str) -> str | None:  # type: ignore[type-arg]
    """Where ``obs`` first leaves the structure of a Dict or Tuple ``space`` (a missing key, a part's shape)."""
    if isinstance(space, gym.spaces.Dict):
        if not isinstance(obs, dict):
            return f"{where or 'the observation'} is a {type(obs).__name__}, not a dict"
        for key, sub in space.spaces.items():
            if key not in obs:
                return f"{where}[{key!r}] is missing"
            found = _mismatch(sub, obs[key], f"{where}[{key!r}]")
            if found:
                return found
        return None
    if isinstance(space, gym.spaces.Tuple):
        if not isinstance(obs, tuple | list) or len(obs) != len(space.spaces):
            return f"{where or 'the observation'} is not a tuple of {len(space.spaces)} parts"
        for i, sub in enumerate(space.spaces):
            found = _mismatch(sub, obs[i], f"{where}[{i}]")
            if found:
                return found
        return None
    shape = np.shape(obs)
    if space.shape is not None and shape != space.shape:
        return (
            f"{where or 'the observation'} has shape {list(shape)} where its space {space} declares {list(space.shape)}"
        )
    return None


def unit_actions(env: gym.Env, env_id: str) -> gym.Env:
    """``env`` with its Box actions rescaled to [-1, 1] (gymnasium's RescaleAction: ``low + (a + 1) (high - low) / 2``);
    an env already in [-1, 1], or with other actions, as it is. Unbounded actions cannot be rescaled: a ValueError
    naming them."""
    space = env.action_space
    if not isinstance(space, gym.spaces.Box):
        return env
    if not (np.all(np.isfinite(space.low)) and np.all(np.isfinite(space.high))):
        raise ValueError(
            f"{env_id}: its actions {space} are unbounded; env.actions 'unit' rescales bounded actions to [-1, 1] "
            "(wrap the env with finite bounds, or set env.actions: env)"
        )
    if np.all(space.low == -1.0) and np.all(space.high == 1.0):
        return env
    return gym.wrappers.RescaleAction(env, np.float32(-1.0), np.float32(1.0))


class ParallelStepLatency(BaseParallelWrapper):  # type: ignore[misc]
    """:class:`StepLatency` for a PettingZoo parallel env: wall time added to every joint step; the rest delegated.
    A PettingZoo ``ParallelEnv`` itself (its own wrapper base), so the engines' PettingZoo wrappers take it."""

    def __init__(self, env: Any, latency_ms: float) -> None:
        super().__init__(env)
        self.latency_s = latency_ms / 1000.0

    def step(self, actions: dict[str, Any]) -> Any:
        time.sleep(self.latency_s)
        return self.env.step(actions)


def make_parallel_env(spec: EnvSpec, **overrides: Any) -> Any:
    """One multi-agent env (``spec.agents`` set): the PettingZoo module's ``parallel_env(**kwargs)``, then the
    latency wrapper when ``step_latency_ms`` > 0. Its agents are ``possible_agents``; per agent ``a``,
    ``observation_space(a)`` and ``action_space(a)``."""
    env = ParallelEnvGuard(
        pettingzoo_module(spec.id).parallel_env(**{**spec.kwargs, **overrides}),
        env_id=spec.id,
        nonfinite=spec.nonfinite,
    )
    return ParallelStepLatency(env, spec.step_latency_ms) if spec.step_latency_ms > 0 else env


def agent_spaces(env: Any) -> dict[str, tuple[gym.Space, gym.Space]]:
    """A parallel env's (observation space, action space) per possible agent, in its agent order."""
    return {a: (env.observation_space(a), env.action_space(a)) for a in env.possible_agents}


def native_vector(spec: EnvSpec) -> bool:
    """Whether crossrl steps the env's own vector class (:func:`make_vector_env`)."""
    if spec.step_latency_ms > 0 or spec.resolved_preprocessing != "none" or spec.actions == "unit":
        return False  # ale-py's AtariVectorEnv, for one, would skip crossrl's preprocessing (and any, RescaleAction)
    return registered_spec(spec.id).vector_entry_point is not None


class SerialVectorEnv(SyncVectorEnv):
    """gymnasium's SyncVectorEnv (NEXT_STEP autoreset, ``copy=False``) with a lean ``step`` for Box observations
    (other observation spaces take SyncVectorEnv's own ``step``).

    Same sub-envs, seeding, resets and results as SyncVectorEnv, step for step (tests/core/test_envs.py),
    but ``step`` writes each sub-env's results straight into the vector's arrays and returns those
    arrays themselves, all overwritten by the next step (callers copy what they keep), and
    returns no infos (crossrl reads none). SyncVectorEnv's generic path (``iterate`` over the batched
    action space, info merging, ``concatenate``, three copies) cost ~50-70 us of CPU per step with 16
    latency workers sharing 2 cores, a quarter of what a latency worker spent per step
    (``crossrl bench scaling --workers 16``, CPU us/step column; docs/performance.md).
    """

    def __init__(self, env_fns: Any) -> None:
        super().__init__(env_fns, copy=False, autoreset_mode=AutoresetMode.NEXT_STEP)
        self._lean = isinstance(self.single_observation_space, gym.spaces.Box)
        self._ended = [False] * self.num_envs  # the lean step's autoreset flags (SyncVectorEnv's _autoreset_envs)

    def reset(self, *, seed: Any = None, options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        if self._lean:  # SyncVectorEnv's own state, which the lean step does not keep: a reset_mask resets some envs
            self._autoreset_envs = np.array(self._ended, bool)
            self._env_obs = [row.copy() for row in cast(np.ndarray, self._observations)]
        out: tuple[Any, dict[str, Any]] = super().reset(seed=seed, options=options)
        self._ended = [bool(x) for x in self._autoreset_envs]
        return out

    def step(self, actions: Any) -> tuple[Any, Any, Any, Any, dict[str, Any]]:
        if not self._lean:
            return super().step(actions)
        obs = cast(np.ndarray, self._observations)
        rewards, terms, truncs, ended = self._rewards, self._terminations, self._truncations, self._ended
        for i, env in enumerate(self.envs):
            if ended[i]:
                obs[i], _ = env.reset()
                rewards[i], terms[i], truncs[i], ended[i] = 0.0, False, False, False
            else:
                obs[i], rewards[i], term, trunc, _ = env.step(actions[i])
                terms[i], truncs[i], ended[i] = term, trunc, term or trunc
        return obs, rewards, terms, truncs, {}


def make_vector_env(spec: EnvSpec, num_envs: int) -> gym.vector.VectorEnv:
    """``num_envs`` copies stepped in this process, autoresetting on the next step after an episode ends.

    Uses the env's native vector implementation where it has one and neither latency nor preprocessing
    is added (CartPole has one: several times faster than SyncVectorEnv), otherwise
    :class:`SerialVectorEnv` over :func:`make_env`.
    Latency envs are stepped one after another, so each worker pays ``num_envs x latency`` per step,
    as a worker driving a real simulator per env would. The observations come back in the vector
    env's own buffer, overwritten by the next step (callers copy what they keep; a deep copy per step
    cost ~9 us of CPU per step, a tenth of a latency worker's CPU per step in ``crossrl bench scaling``).
    """
    if native_vector(spec):
        vec = gym.make_vec(spec.id, num_envs=num_envs, vectorization_mode="vector_entry_point", **spec.kwargs)
        return VectorEnvGuard(vec, env_id=spec.id, nonfinite=spec.nonfinite)
    return SerialVectorEnv([lambda: make_env(spec) for _ in range(num_envs)])


def check_env(spec: EnvSpec) -> str | None:
    """Build the env once as the engines do; the problem on one line, or None when it works.

    Builds :func:`make_env` (what RLlib and TorchRL step: the spec's kwargs and crossrl's wrappers),
    resets it with seed 0 and takes one random step (without the simulated latency), then, where the
    env has its own vector class, builds and resets that too (what crossrl steps, see
    :func:`make_vector_env`); so kwargs the env does not accept fail before any trial starts.
    A multi-agent env (:func:`make_parallel_env`) is built, reset and stepped likewise, then its agents
    and their spaces are checked against the spec's policy mapping (:func:`env_problems` has one line per
    problem; here they are joined on one line).
    """
    problems = env_problems(spec)
    return "; ".join(problems) if problems else None


def env_problems(spec: EnvSpec) -> list[str]:
    """:func:`check_env`'s problems, one line each (a multi-agent spec's mapping may have several)."""
    if spec.multi_agent:
        return _parallel_env_problems(spec)
    kwargs = ", **kwargs" if spec.kwargs else ""
    problem = _try_env(f"gymnasium.make({spec.id!r}{kwargs})", lambda: make_env(spec), step=True)
    if problem is None and native_vector(spec):
        what = f"gymnasium.make_vec({spec.id!r}, num_envs=1{kwargs})"
        problem = _try_env(what, lambda: make_vector_env(spec, 1), step=False)
    return [f"env: {problem}; check env.id and env.kwargs"] if problem else []


def _parallel_env_problems(spec: EnvSpec) -> list[str]:
    kwargs = "**kwargs" if spec.kwargs else ""
    what = f"{spec.id.replace(':', '.')}.parallel_env({kwargs})"
    found: dict[str, Any] = {}

    def build() -> Any:
        env = make_parallel_env(spec.model_copy(update={"step_latency_ms": 0.0}))
        found["agents"], found["spaces"] = list(env.possible_agents), agent_spaces(env)
        return _ParallelProbe(env)

    problem = _try_env(what, build, step=True)
    if problem:
        return [f"env: {problem}; check env.id and env.kwargs"]
    return mapping_problems(spec, found["agents"], found["spaces"])


class _ParallelProbe:
    """A parallel env as :func:`_try_env` drives an env: ``reset(seed=)``, one random joint step, ``close``."""

    def __init__(self, env: Any) -> None:
        self.env = env
        self.action_space = self  # _try_env seeds and samples "the action space": every agent's

    def reset(self, *, seed: int) -> Any:
        out = self.env.reset(seed=seed)
        for i, a in enumerate(self.env.possible_agents):
            self.env.action_space(a).seed(seed + i)
        return out

    def seed(self, seed: int) -> None:  # seeded in reset
        pass

    def sample(self) -> dict[str, Any]:
        return {a: self.env.action_space(a).sample() for a in self.env.agents}

    def step(self, actions: dict[str, Any]) -> Any:
        return self.env.step(actions)

    def close(self) -> None:
        self.env.close()


def _try_env(what: str, build: Callable[[], Any], *, step: bool) -> str | None:
    # A constructor that fails can leave a half-built env whose __del__ raises when it is freed, which
    # Python prints as a traceback (gymnasium 1.2's CartPoleVectorEnv does): such reports are silenced
    # until the env is freed (collected, after a failure). Warnings (deprecations, the env checker's
    # advice) are not problems of the spec either.
    problem = None
    hook = sys.unraisablehook
    sys.unraisablehook = lambda _: None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                env = build()
            except Exception as e:
                problem = f"{what} failed: {first_line(e)}"
                return problem
            try:
                env.reset(seed=0)
                if step:
                    inner = env.env if isinstance(env, StepLatency) else env
                    inner.action_space.seed(0)
                    inner.step(inner.action_space.sample())
            except Exception as e:
                problem = f"{what}: {'reset/step' if step else 'reset'} failed: {first_line(e)}"
            finally:
                try:
                    env.close()
                except Exception:
                    pass
                del env
        return problem
    finally:
        if problem:
            gc.collect()
        sys.unraisablehook = hook


def random_returns(spec: EnvSpec, *, episodes: int, seed: int = 0) -> tuple[list[float], dict[str, list[float]]]:
    """Random play's returns: ``episodes`` episodes of uniformly random actions, episode ``i`` reset with
    seed ``seed + i``, on the env every engine steps (:func:`make_env`, or :func:`make_parallel_env` for a
    multi-agent env, without the simulated latency).

    Returns each episode's return (a multi-agent env's team return: the sum over its agents) and, for a
    multi-agent env, each agent's returns (empty for a single-agent env). The baseline a learning row is
    read against: what an engine's policy scores before it learns anything.
    """
    if episodes < 1:
        raise ValueError(f"random play: episodes={episodes} must be >= 1")
    quiet = spec.model_copy(update={"step_latency_ms": 0.0})
    team: list[float] = []
    per_agent: dict[str, list[float]] = {}
    if spec.multi_agent:
        env = make_parallel_env(quiet)
        per_agent = {a: [] for a in env.possible_agents}
        for i in range(episodes):
            env.reset(seed=seed + i)
            for k, (_, action_space) in enumerate(agent_spaces(env).values()):
                action_space.seed(1000 * (seed + i) + k)
            totals = dict.fromkeys(env.possible_agents, 0.0)
            while env.agents:
                _, rewards, _, _, _ = env.step({a: env.action_space(a).sample() for a in env.agents})
                for a, r in rewards.items():
                    totals[a] += float(r)
            for a, r in totals.items():
                per_agent[a].append(r)
            team.append(sum(totals.values()))
        env.close()
        return team, per_agent
    env = make_env(quiet)
    env.action_space.seed(seed)
    for i in range(episodes):
        env.reset(seed=seed + i)
        total, done = 0.0, False
        while not done:
            _, reward, terminated, truncated, _ = env.step(env.action_space.sample())
            total += float(reward)
            done = bool(terminated or truncated)
        team.append(total)
    env.close()
    return team, per_agent
