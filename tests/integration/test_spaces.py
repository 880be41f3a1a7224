"""The observation spaces users' envs have, on every engine (one `crossrl run`, three trials, about a minute).

A real CartPole whose observations come as a Dict (``{"pole": Box(2), "cart": Box(2)}``, tests/support/spaces_env.py)
runs FINISHED on every engine: every engine steps crossrl's ``make_env``, which flattens Dict and Tuple observations
into one float32 vector in one order (core/envs.py ``FlatObservations``), so each engine's model reads the same four
inputs and has the same parameter count (built here by each engine, and counted by hand). The flattening order
itself is held by tests/core/test_envs.py.
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


@pytest.mark.integration
@pytest.mark.long
def test_dict_observations_run_finished_on_every_engine(tmp_path: Path, results_dir: Path) -> None:
    spec = {
        "name": "dict-obs",
        "env": {"id": "spaces_env:DictCartPole-v0"},
        "algorithm": {"name": "ppo", "hyperparams": {"train_batch": 512, "minibatch": 256, "epochs": 1}},
        "engines": ["crossrl", "rllib", "torchrl"],
        "execution": {"workers": [1], "envs_per_worker": 2},
        "budget": {"env_steps": 1024},
        "seeds": [0],
    }
    path = tmp_path / "dict-obs.yaml"
    path.write_text(yaml.safe_dump(spec))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(SUPPORT), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run(
        [sys.executable, "-m", "crossrl.cli", "run", str(path), "--results-dir", str(results_dir), "--no-report"],
        capture_output=True, text=True, timeout=900, env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    loaded = ResultsStore(None, results_dir=results_dir).load(scenario="dict-obs")
    assert sorted(loaded.trials.engine) == ["crossrl", "rllib", "torchrl"]
    for row in loaded.trials.to_dict("records"):
        assert row["status"] == "FINISHED", row["reason"]
        hist = loaded.points[loaded.points.run_id == row["run_id"]]
        assert hist[hist.metric == M.ENV_STEPS_SAMPLED].value.max() >= 1024
