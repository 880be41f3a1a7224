"""The observation and action spaces users' envs have, on every engine that takes them (one `crossrl run`, three
trials, about a minute).

A real CartPole whose observations come as a Dict (``{"pole": Box(2), "cart": Box(2)}``, tests/support/spaces_env.py)
runs FINISHED on every engine: every engine steps crossrl's ``make_env``, which flattens Dict and Tuple observations
into one float32 vector in one order (core/envs.py ``FlatObservations``), so each engine's model reads the same four
inputs and has the same parameter count (built here by each engine, and counted by hand). The flattening order
itself is held by tests/core/test_envs.py. A CartPole pushed by two controls at once (``MultiDiscrete([2, 3])``) runs
FINISHED on every engine (a factored categorical head: one categorical per dimension over its slice of one logits
vector, log-probabilities and entropies summed; the same parameter count). One run checks both on every engine: a
CartPole with Dict observations and the two controls (``DictMultiDiscreteCartPole-v0``).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from crossrl.reports.store import ResultsStore
from crossrl.scenarios import metrics as M
from crossrl.scenarios.spec import ScenarioSpec

SUPPORT = Path(__file__).parents[1] / "support"
# By hand, 4 flattened inputs, hidden [64, 64], 2 actions: policy 4*64+64 + 64*64+64 + 64*2+2 = 4610, value 4545.
PPO_PARAMS = 4610 + 4545
# MultiDiscrete([2, 3]): the policy's head has 2 + 3 logits: 4*64+64 + 64*64+64 + 64*5+5 = 4805, value 4545.
MULTI_PPO_PARAMS = 4805 + 4545


def _spec(tmp_path: Path, name: str, env_id: str) -> Path:
    """A one-seed PPO spec on a spaces_env env, every engine, one worker x 2 envs, 1,024 env steps."""
    spec = {
        "name": name,
        "env": {"id": f"spaces_env:{env_id}"},
        "algorithm": {"name": "ppo", "hyperparams": {"train_batch": 512, "minibatch": 256, "epochs": 1}},
        "engines": ["crossrl", "rllib", "torchrl"],
        "execution": {"workers": [1], "envs_per_worker": 2},
        "budget": {"env_steps": 1024},
        "seeds": [0],
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def _crossrl(*args: str | Path) -> subprocess.CompletedProcess[str]:
    """The CLI in a fresh process that imports tests/support's envs."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(SUPPORT), os.environ.get("PYTHONPATH")]))}
    cmd = [sys.executable, "-m", "crossrl.cli", *map(str, args)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env)


def test_every_engine_builds_the_same_model_on_dict_observations() -> None:
    from engine_models import count, crossrl_nets, rllib_module, torchrl_model

    spec = ScenarioSpec.model_validate(
        {"name": "dict-obs", "env": {"id": "spaces_env:DictCartPole-v0"}, "algorithm": {"name": "ppo"},
         "budget": {"env_steps": 100}}
    )  # fmt: skip
    by_engine = {t.engine: t for t in spec.trials()}
    _, ours = crossrl_nets(by_engine["crossrl"])
    counts = {
        "crossrl": count(ours),
        "torchrl": count(torchrl_model(by_engine["torchrl"])),
        "rllib": count([rllib_module(by_engine["rllib"])]),
    }
    assert counts == dict.fromkeys(counts, PPO_PARAMS)


def test_every_engine_builds_the_same_factored_head_on_multidiscrete_actions() -> None:
    from engine_models import count, crossrl_nets, rllib_module, torchrl_model

    spec = ScenarioSpec.model_validate(
        {"name": "md", "env": {"id": "spaces_env:MultiDiscreteCartPole-v0"}, "algorithm": {"name": "ppo"},
         "budget": {"env_steps": 100}}
    )  # fmt: skip
    by_engine = {t.engine: t for t in spec.trials()}
    _, ours = crossrl_nets(by_engine["crossrl"])
    counts = {
        "crossrl": count(ours),
        "torchrl": count(torchrl_model(by_engine["torchrl"])),
        "rllib": count([rllib_module(by_engine["rllib"])]),
    }
    assert counts == dict.fromkeys(counts, MULTI_PPO_PARAMS)


@pytest.mark.integration
@pytest.mark.long
def test_dict_observations_and_multidiscrete_actions_validate_and_run_finished_on_every_engine(
    tmp_path: Path, results_dir: Path
) -> None:
    path = _spec(tmp_path, "dict-md", "DictMultiDiscreteCartPole-v0")
    checked = _crossrl("validate", path)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    proc = _crossrl("run", path, "--results-dir", str(results_dir), "--no-report")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    loaded = ResultsStore(None, results_dir=results_dir).load(scenario="dict-md")
    assert sorted(loaded.trials.engine) == ["crossrl", "rllib", "torchrl"]
    for row in loaded.trials.to_dict("records"):
        assert row["status"] == "FINISHED", row["reason"]
        hist = loaded.points[loaded.points.run_id == row["run_id"]]
        assert hist[hist.metric == M.ENV_STEPS_SAMPLED].value.max() >= 1024
