"""A test-only engine that misbehaves on purpose, to exercise the runner's FAILED/TIMEOUT/KILLED paths.

Registered by tests with CROSSRL_EXTRA_ENGINES="fault=fault_engine:FaultAdapter". What it does depends
on the trial's seed; it steps a real CartPole with random actions, so the points it reports are real.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import ClassVar

import gymnasium as gym

from crossrl.adapters.base import MetricSink
from crossrl.scenarios.spec import Trial

OK, CRASH, HANG, HARD_EXIT, SLOW = 0, 1, 2, 3, 4


class FaultAdapter:
    """Fault injection for runner tests (seed 0 ok, 1 raises, 2 hangs, 3 exits hard, 4 slow)."""

    engine: ClassVar[str] = "fault"
    algorithms: ClassVar[dict[str, str]] = {"ppo": "random actions", "dqn": "random actions"}

    def run(self, trial: Trial, sink: MetricSink) -> None:
        marker_dir = os.environ.get("CROSSRL_FAULT_DIR")
        if marker_dir:
            Path(marker_dir, f"started-{trial.seed}").write_text(str(os.getpid()))
        env = gym.make(trial.env.id)
        env.reset(seed=trial.seed)
        sink.tags(engine_version="0-test")
        sink.native_config({"behaviour": trial.seed, "env": trial.env.id, "model (unused)": {"hidden": [8]}})
        sink.start_clock()
        steps, ret, length, points = 0, 0.0, 0, 0
        returns: list[float] = []
        lengths: list[int] = []
        while not sink.exhausted:
            for _ in range(100):
                _, r, term, trunc, _ = env.step(env.action_space.sample())
                steps, ret, length = steps + 1, ret + float(r), length + 1
                if term or trunc:
                    returns.append(ret)
                    lengths.append(length)
                    ret, length = 0.0, 0
                    env.reset()
            sink.point(env_steps_sampled=steps, episode_returns=returns, episode_lengths=lengths)
            returns, lengths = [], []
            points += 1
            if trial.seed == CRASH and points == 3:
                raise RuntimeError(f"injected failure at {steps} env steps")
            if trial.seed == HANG:
                time.sleep(3600)
            if trial.seed == HARD_EXIT:
                os._exit(3)
            if trial.seed == SLOW:
                time.sleep(0.5)
