"""The env guard (core/envguard.py), the trial watch (orchestration/watch.py) and the sink's divergence check, in-process
with small envs of the tests' own; tests/faults/test_env_faults.py runs the same faults through every real engine."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest

from crossrl.adapters.base import ListSink, TrainingDiverged
from crossrl.core import envguard
from crossrl.core.envguard import WATCH_DIR_ENV, EnvFault, EnvGuard, ParallelEnvGuard, VectorEnvGuard
from crossrl.orchestration.watch import TrialWatch
from crossrl.scenarios import metrics as M
from crossrl.scenarios.spec import ScenarioSpec

SUPPORT = Path(__file__).parents[1] / "support"


class Broken(gym.Env):
    """A 3-number Box env that misbehaves at step ``at`` in the way ``how`` says."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, how: str = "none", at: int = 3) -> None:
        self.how, self.at, self.t = how, at, 0

    def reset(self, *, seed: int | None = None, options: Any = None) -> Any:
        self.t = 0
        return np.zeros(3, np.float32), {}

    def step(self, action: Any) -> Any:
        self.t += 1
        obs, reward = np.zeros(3, np.float32), 1.0
        if self.t >= self.at:
            if self.how == "raise":
                raise ValueError("bad physics")
            if self.how == "nan_reward":
                reward = math.nan
            if self.how == "inf_obs":
                obs[1] = np.inf
            if self.how == "shape":
                obs = np.zeros(5, np.float32)
            if self.how == "dtype":
                obs = np.zeros(3, np.complex64)
            if self.how == "float64":  # what np.array([...]) of Python floats gives: gymnasium's Box refuses it
                obs = np.zeros(3, np.float64)
        return obs, reward, False, False, {}


@pytest.fixture
def watch_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The guard's channel pointed at a fresh folder (a new channel for this process)."""
    d = tmp_path / "watch"
    monkeypatch.setenv(WATCH_DIR_ENV, str(d))
    monkeypatch.setattr(envguard, "_channel", None)
    monkeypatch.setattr(envguard, "_stacks_file", None)
    return d


def _steps(env: gym.Env, n: int) -> None:
    env.reset(seed=0)
    for _ in range(n):
        env.step(0)


@pytest.mark.parametrize(
    ("how", "words"),
    [
        ("raise", ["env broken-v0 raised ValueError: bad physics in step()", "at env step 2"]),
        ("nan_reward", ["non-finite reward (nan)", "at env step 3"]),
        ("inf_obs", ["non-finite observation (element 1) (inf)", "at env step 3"]),
        ("shape", ["observation of shape (5,)", "declares shape (3,)"]),
        ("dtype", ["dtype complex64", "declares float32"]),
        (
            "float64",
            [
                "dtype float64 where its observation space Box(-1.0, 1.0, (3,), float32) declares float32",
                "obs.astype(np.float32)",
            ],
        ),
    ],
)
def test_the_guard_names_each_fault_and_reports_it_to_the_watch(how: str, words: list[str], watch_dir: Path) -> None:
    env = EnvGuard(Broken(how), env_id="broken-v0")
    with pytest.raises(EnvFault) as err:
        _steps(env, 5)
    for w in words:
        assert w in str(err.value)
    verdict = TrialWatch(watch_dir, stall_seconds=60).fault()
    assert verdict is not None and verdict.reason == str(err.value) and verdict.name == "traceback.txt"
    if how == "raise":
        assert "ValueError: bad physics" in verdict.detail


def test_a_healthy_env_passes_unchanged_and_beats(watch_dir: Path) -> None:
    env = EnvGuard(Broken("none"), env_id="ok-v0")
    _steps(env, 10)
    watch = TrialWatch(watch_dir, stall_seconds=60)
    assert watch.fault() is None and watch.last_step_at() is not None
    assert abs(time.time() - (watch.last_step_at() or 0)) < 30


def test_warn_lets_a_nonfinite_value_through_with_one_warning(watch_dir: Path, capsys: pytest.CaptureFixture) -> None:
    env = EnvGuard(Broken("nan_reward"), env_id="nan-v0", nonfinite="warn")
    env.reset(seed=0)
    rewards = [env.step(0)[1] for _ in range(6)]
    assert sum(math.isnan(r) for r in rewards) == 4  # steps 3..6 pass through
    assert capsys.readouterr().err.count("warning: env nan-v0 returned a non-finite reward") == 1
    watch = TrialWatch(watch_dir, stall_seconds=60)
    assert watch.fault() is None
    (msg,) = watch.warnings()
    assert "non-finite reward (nan)" in msg and watch.warnings() == []  # each warning once


def test_without_a_watch_folder_the_guard_only_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(WATCH_DIR_ENV, raising=False)
    monkeypatch.setattr(envguard, "_channel", None)
    with pytest.raises(EnvFault, match="raised ValueError"):
        _steps(EnvGuard(Broken("raise"), env_id="x"), 5)


class BrokenVector(gym.vector.VectorEnv):
    def __init__(self) -> None:
        self.num_envs = 2
        self.single_observation_space = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
        self.single_action_space = gym.spaces.Discrete(2)
        self.observation_space = gym.vector.utils.batch_space(self.single_observation_space, 2)
        self.action_space = gym.vector.utils.batch_space(self.single_action_space, 2)
        self.t = 0

    def reset(self, *, seed: Any = None, options: Any = None) -> Any:
        return np.zeros((2, 3), np.float32), {}

    def step(self, actions: Any) -> Any:
        self.t += 1
        obs, rewards = np.zeros((2, 3), np.float32), np.ones(2)
        if self.t == 2:
            rewards[1] = -np.inf
        if self.t == 3:
            obs[1, 2] = np.nan
        return obs, rewards, np.zeros(2, bool), np.zeros(2, bool), {}


def test_the_vector_guard_names_the_copy_and_the_element(watch_dir: Path) -> None:
    env = VectorEnvGuard(BrokenVector(), env_id="vec-v0")
    env.reset(seed=0)
    env.step(np.zeros(2, int))
    with pytest.raises(EnvFault, match=r"non-finite reward \(vector copy 1\) \(-inf\)"):
        env.step(np.zeros(2, int))
    warn = VectorEnvGuard(BrokenVector(), env_id="vec-v0", nonfinite="warn")
    warn.reset(seed=0)
    warn.step(np.zeros(2, int))
    warn.step(np.zeros(2, int))
    env = VectorEnvGuard(BrokenVector(), env_id="vec-v0")
    env.env.t = 2  # type: ignore[attr-defined]
    with pytest.raises(EnvFault, match=r"observation \(vector copy 1, element 2\) \(nan\)"):
        env.step(np.zeros(2, int))


def test_the_parallel_guard_names_the_agent() -> None:
    from pettingzoo import ParallelEnv

    class TwoAgents(ParallelEnv):  # type: ignore[misc]
        metadata: dict[str, Any] = {"name": "two"}
        possible_agents = ["a", "b"]

        def __init__(self) -> None:
            self.agents = list(self.possible_agents)

        def observation_space(self, agent: str) -> gym.Space:
            return gym.spaces.Box(-1.0, 1.0, (2,), np.float32)

        def action_space(self, agent: str) -> gym.Space:
            return gym.spaces.Discrete(2)

        def reset(self, seed: Any = None, options: Any = None) -> Any:
            return {a: np.zeros(2, np.float32) for a in self.agents}, {a: {} for a in self.agents}

        def step(self, actions: Any) -> Any:
            obs = {a: np.zeros(2, np.float32) for a in self.agents}
            obs["b"] = np.zeros(4, np.float32)
            zeros = dict.fromkeys(self.agents, False)
            return obs, dict.fromkeys(self.agents, 0.0), zeros, zeros, {a: {} for a in self.agents}

    env = ParallelEnvGuard(TwoAgents(), env_id="two-v0")
    env.reset(seed=0)
    with pytest.raises(EnvFault, match=r"agent 'b' an observation of shape \(4,\)"):
        env.step({"a": 0, "b": 0})


def test_the_watch_arms_at_set_up_and_fails_a_trial_that_stops_stepping(tmp_path: Path) -> None:
    watch = TrialWatch(tmp_path / "w", stall_seconds=10)
    now = time.time()
    assert watch.stalled(now + 1000) is None  # set-up may take long: no stall before it is done
    watch.arm()
    assert watch.stalled(now + 5) is None
    (tmp_path / "w" / "beat-1").touch()
    os.utime(tmp_path / "w" / "beat-1", (now + 20, now + 20))  # an env stepped at now + 20
    assert watch.stalled(now + 25) is None
    verdict = watch.stalled(now + 31)
    assert verdict is not None and verdict.reason.startswith("no env step for 11 s") and verdict.name == "stacks.txt"


def test_a_watch_that_needs_a_beat_waits_for_one(tmp_path: Path) -> None:
    watch = TrialWatch(tmp_path / "w", stall_seconds=10, require_beat=True)
    watch.arm()
    assert watch.stalled(time.time() + 100) is None


def test_the_watch_collects_the_python_stacks_of_a_stuck_process(tmp_path: Path) -> None:
    d = tmp_path / "w"
    code = textwrap.dedent(
        """
        import time
        from crossrl.core.envguard import register_stacks
        register_stacks()
        def stuck_in_here():
            print("ready", flush=True)  # said from inside, so the dump cannot catch the module level
            while True:
                time.sleep(0.1)
        stuck_in_here()
        """
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code], env={**os.environ, WATCH_DIR_ENV: str(d)}, stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        text = TrialWatch(d, stall_seconds=1).stacks(wait_s=20)  # a loaded machine may schedule it late
    finally:
        proc.kill()
        proc.wait()
    assert f"== process {proc.pid} ==" in text and "stuck_in_here" in text


def _sink() -> ListSink:
    spec = ScenarioSpec.model_validate(
        {"name": "t", "env": {"id": "CartPole-v1"}, "algorithm": {"name": "ppo"}, "budget": {"env_steps": 100}}
    )
    return ListSink(spec.trials()[0])


@pytest.mark.parametrize("key", [M.POLICY_LOSS, M.VALUE_LOSS, M.DIAG_GRAD_NORM, M.policy_metric("p0", M.VALUE_LOSS)])
def test_a_nonfinite_loss_or_gradient_norm_is_training_that_diverged(key: str) -> None:
    sink = _sink()
    sink.point(env_steps_sampled=10, values={key: 1.0})
    sink.point(env_steps_sampled=20, values={key: 2.0})
    with pytest.raises(TrainingDiverged, match=rf"training diverged at iteration 3: {key} is inf"):
        sink.point(env_steps_sampled=30, values={key: math.inf})


def test_other_nonfinite_values_are_left_out_of_the_point() -> None:
    sink = _sink()
    sink.point(env_steps_sampled=10, values={M.ENTROPY: math.nan, M.DIAG_APPROX_KL: math.nan, M.POLICY_LOSS: 0.5})
    assert M.ENTROPY not in sink.points[0] and sink.points[0][M.POLICY_LOSS] == 0.5


def test_the_raw_speed_probe_ends_a_hanging_env_and_reports_a_crashing_one(monkeypatch: pytest.MonkeyPatch) -> None:
    from crossrl.orchestration.runner import raw_speed_probe
    from crossrl.scenarios.spec import EnvSpec

    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(SUPPORT), os.environ.get("PYTHONPATH")])))
    t0 = time.monotonic()
    hang = EnvSpec(id="faulty_env:FaultyCartPole-v0", kwargs={"fault": "hang", "at": 10})
    speed, problem = raw_speed_probe(hang, num_envs=2, limit_s=8)
    assert speed == 0 and "within 8 s" in problem and time.monotonic() - t0 < 30
    crash = EnvSpec(id="faulty_env:FaultyCartPole-v0", kwargs={"fault": "raise", "at": 10})
    speed, problem = raw_speed_probe(crash, num_envs=2)
    assert speed == 0 and "EnvFault" in problem and "the simulator crashed" in problem
    speed, problem = raw_speed_probe(EnvSpec(id="CartPole-v1"), num_envs=2, seconds=0.2)
    assert speed > 0 and problem == ""


def test_rllib_nan_losses_reach_the_sink_and_fail_the_trial() -> None:
    """RLlib's result translation keeps a NaN loss (it used to drop non-finite values, hiding divergence)."""
    pytest.importorskip("ray.rllib")
    from crossrl.adapters.rllib.adapter import result_to_point

    result = {
        "env_runners": {"num_env_steps_sampled_lifetime": 512},
        "learners": {"default_policy": {"policy_loss": 0.1, "vf_loss": math.nan, "entropy": 0.6}},
    }
    point = result_to_point(result, algorithm="ppo")
    assert math.isnan(point["values"][M.VALUE_LOSS])
    sink = _sink()
    with pytest.raises(TrainingDiverged, match="iteration 1: value_loss is nan"):
        sink.point(**point)
