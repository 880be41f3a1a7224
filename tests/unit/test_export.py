"""`crossrl export`'s pure parts: each engine's policy (crossrl's core, TorchRL's learners, RLlib's RLModules; PPO
on Discrete and Box actions, DQN, SAC) written as TorchScript from a checkpoint's engine folder acts as the engine's
own greedy policy (its policy_loader); the sidecar says the I/O; the heads' maths; an engine without an exporter is
one line. (Trained runs on every engine, loaded with torch alone: tests/integration/test_export.py.)"""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from crossrl.adapters import checkpoints
from crossrl.adapters.crossrl import STATE_FILE
from crossrl.adapters.exported import EnvActions, GreedyPolicy
from crossrl.core import algorithms
from crossrl.core.envs import make_env
from crossrl.orchestration.export import ExportError, example_observations, export_policy, policy_exporter
from crossrl.scenarios.spec import ScenarioSpec, Trial

pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.load` is deprecated:DeprecationWarning")
CASES = {  # case -> env, algorithm
    "ppo-discrete": ("CartPole-v1", "ppo"),
    "ppo-box": ("Pendulum-v1", "ppo"),
    "dqn": ("CartPole-v1", "dqn"),
    "sac": ("Pendulum-v1", "sac"),
}


def _trial(env_id: str, algorithm: str, engine: str = "crossrl") -> Trial:
    spec = ScenarioSpec.model_validate(
        {
            "name": f"export-{algorithm}",
            "env": {"id": env_id},
            "algorithm": {"name": algorithm, "model": {"hidden": [16]}},
            "engines": [engine],
            "budget": {"env_steps": 1000},
        }
    )
    return spec.trials()[0]


def _checkpoint(trial: Trial, root: Path) -> Path:
    """A checkpoint folder whose engine folder holds the trial's freshly built policy, its weights scaled up (the
    initial policy's means are ~0.01: the Box cases must reach the bounds)."""
    if trial.engine == "torchrl":
        return _torchrl_checkpoint(trial, root)
    if trial.engine == "rllib":
        return _rllib_checkpoint(trial, root)
    alg = algorithms.load(trial.algorithm)
    env = make_env(trial.env)
    policy = alg.policy_cls(observation_space=env.observation_space, action_space=env.action_space,
                            hyperparams=alg.hyperparams(trial.hyperparams), model=trial.model, seed=trial.seed)  # fmt: skip
    env.close()
    weights = {k: v * (300.0 if v.ndim == 2 and v.shape[0] <= 4 else 1.0) for k, v in policy.get_weights().items()}
    engine = root / checkpoints.ENGINE_DIR
    engine.mkdir(parents=True)
    with open(engine / STATE_FILE, "wb") as f:
        pickle.dump({"policy": {"weights": weights}}, f)
    return root


def _torchrl_checkpoint(trial: Trial, root: Path) -> Path:
    """As :func:`_checkpoint`, a TorchRL learner's state (its last layer's weights scaled up)."""
    from crossrl.adapters.torchrl.adapter import learner_dims
    from crossrl.adapters.torchrl.algorithms import build_learner

    learner: Any = build_learner(trial=trial, **learner_dims(trial.env))
    net = learner.qnet if hasattr(learner, "qnet") else learner.actor_net
    with torch.no_grad():
        net[-1].weight.mul_(300.0)
    engine = root / checkpoints.ENGINE_DIR
    engine.mkdir(parents=True)
    learner.save(engine)
    return root


def _rllib_checkpoint(trial: Trial, root: Path) -> Path:
    """As :func:`_checkpoint`, an RLlib RLModule built from the trial's config and saved where its learner saves it
    (``save_to_path``), its weight matrices scaled up."""
    from ray.rllib.core import COMPONENT_LEARNER, COMPONENT_LEARNER_GROUP, COMPONENT_RL_MODULE, DEFAULT_MODULE_ID

    from crossrl.adapters.rllib import adapter as R

    config = R.build_config(trial, plan=R.ResourcePlan(1, 1.0, 0, ""), env_name="unused")
    env = make_env(trial.env)
    spec = config.get_rl_module_spec(spaces={DEFAULT_MODULE_ID: (env.observation_space, env.action_space)},
                                     inference_only=False)  # fmt: skip
    env.close()
    module: Any = spec.build()
    with torch.no_grad():
        for p in module.parameters():
            if p.ndim == 2:
                p.mul_(4.0)
    folder = root / checkpoints.ENGINE_DIR / COMPONENT_LEARNER_GROUP / COMPONENT_LEARNER / COMPONENT_RL_MODULE
    module.save_to_path(folder / DEFAULT_MODULE_ID)
    return root


@pytest.mark.parametrize("engine", ["crossrl", "torchrl", "rllib"])
@pytest.mark.parametrize("case", list(CASES))
def test_policy_exports_its_greedy_actions(case: str, engine: str, tmp_path: Path) -> None:
    """crossrl's core policies, TorchRL's learners and RLlib's RLModules, from a checkpoint's engine folder."""
    from crossrl.orchestration.evaluate import policy_loader

    trial = _trial(*CASES[case], engine=engine)
    folder = _checkpoint(trial, tmp_path / "ckpt")
    done = export_policy(trial, "run123", folder, {"env_steps_sampled": 1234}, tmp_path / "out")
    module = torch.jit.load(str(done.path))
    env = make_env(trial.env)
    raw = make_env(trial.env.model_copy(update={"actions": "env"}))
    obs = example_observations(env.observation_space, 64, seed=7) * 3
    act = policy_loader(engine)(trial, folder / checkpoints.ENGINE_DIR, greedy=True)
    expected = np.stack([np.asarray(act(o)) for o in obs])
    with torch.no_grad():
        got = module(torch.from_numpy(obs)).numpy()
    info = json.loads(done.sidecar.read_text())
    assert info["engine"] == engine and info["algorithm"] == trial.algorithm and info["run_id"] == "run123"
    assert info["checkpoint"]["env_steps_sampled"] == 1234 and info["trial"] == trial.name
    assert info["input"]["shape"] == ["B", *env.observation_space.shape] and info["input"]["dtype"] == "float32"
    if trial.algorithm in ("ppo", "dqn") and case != "ppo-box":
        assert got.dtype == np.int64 and info["output"] == {**info["output"], "dtype": "int64", "shape": ["B"]}
        assert info["output"]["action_space"]["n"] == 2
        np.testing.assert_array_equal(got, expected)
        assert len(set(got.tolist())) == 2  # both actions occur: the comparison means something
        return
    low, high = raw.action_space.low, raw.action_space.high
    if trial.algorithm == "sac":  # the policy acts in [-1, 1] (env.actions: unit); the file in the env's bounds
        assert info["output"]["rescaled_from_unit"] is True
        expected = low + (expected + 1.0) * (high - low) / 2.0
    else:  # the evaluators clip every action to the bounds before stepping the env
        expected = np.clip(expected, low, high)
    assert got.dtype == np.float32 and got.shape == (64, 1)
    assert info["output"]["action_space"]["low"] == [-2.0] and info["output"]["shape"] == ["B", 1]
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    assert np.all(got >= low) and np.all(got <= high)
    assert np.any(np.abs(got) > 1.0) and np.any(np.abs(got) < 1.0)  # far from 0 and inside the bounds


def test_greedy_policy_heads() -> None:
    net = torch.nn.Identity()
    x = torch.tensor([[0.5, -3.0, 9.0, 9.0], [-0.2, 0.1, 9.0, 9.0]])
    assert GreedyPolicy(net)(x).tolist() == [2, 2]
    box = GreedyPolicy(net, act_dim=2, low=[-1.0, -1.0], high=[1.0, 1.0])(x)
    assert box.tolist() == [[0.5, -1.0], [pytest.approx(-0.2), pytest.approx(0.1)]]
    sac = GreedyPolicy(net, act_dim=2, squash=True, mid=[1.0, 0.0], scale=[2.0, 1.0])(x)
    torch.testing.assert_close(sac, torch.stack([1.0 + 2.0 * torch.tanh(x[:, 0]), torch.tanh(x[:, 1])], dim=1))
    scaled = EnvActions(GreedyPolicy(net, act_dim=2, unit_clip=True), [-2.0, 0.0], [2.0, 10.0])(x)
    torch.testing.assert_close(scaled, torch.tensor([[1.0, 0.0], [-0.4, 5.5]]))


def test_an_engine_without_an_exporter_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CROSSRL_EXTRA_ENGINES", "faulty=fault_engine:FaultAdapter")
    with pytest.raises(ExportError, match=r"engine 'faulty' cannot export a policy; export takes trials of crossrl"):
        policy_exporter("faulty")


def test_example_observations_stay_in_the_bounds() -> None:
    import gymnasium as gym

    space = gym.spaces.Box(np.array([-0.1, -np.inf], np.float32), np.array([0.1, np.inf], np.float32))
    x: Any = example_observations(space, 100)
    assert x.dtype == np.float32 and x.shape == (100, 2)
    assert np.all(np.abs(x[:, 0]) <= 0.1) and np.abs(x[:, 1]).max() < 10


def test_a_checkpoint_the_engine_cannot_read_is_one_line(tmp_path: Path) -> None:
    trial = _trial("CartPole-v1", "ppo", engine="torchrl")
    (tmp_path / checkpoints.ENGINE_DIR).mkdir()
    with pytest.raises(ExportError) as e:
        export_policy(trial, "run", tmp_path, {}, tmp_path / "out")
    assert str(e.value).startswith(f"{trial.name}: ") and "\n" not in str(e.value), str(e.value)
    assert not (tmp_path / "out").exists()
