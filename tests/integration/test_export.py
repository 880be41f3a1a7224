"""`crossrl export` end to end: a tiny PPO (CartPole, Discrete actions) and a tiny SAC (Pendulum, bounded Box actions)
trained on every engine, exported, and the files loaded in a fresh interpreter that imports torch, numpy and json only;
their actions on fixed observations are each engine's own greedy actions (its policy_loader, in this process): equal
for Discrete, allclose for Box (SAC acts in [-1, 1], the file in Pendulum's [-2, 2]: gymnasium's RescaleAction). And
a target that names nothing: one line, exit 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

pytestmark = pytest.mark.integration
CLI = [sys.executable, "-m", "crossrl.cli"]
ENGINES = ["crossrl", "rllib", "torchrl"]
CASES = {  # algorithm -> env, hyperparameters, env steps: the smallest runs that end with a checkpoint
    "ppo": ("CartPole-v1", {"train_batch": 500, "minibatch": 250, "epochs": 1}, 1000),
    "sac": ("Pendulum-v1", {"learning_starts": 400, "updates_per_step": 0.05, "train_batch": 32}, 1000),
}

# The deployer's side: torch, numpy and json only (nothing of crossrl, Ray or TorchRL), one action batch per file.
LOADER = """
import json, sys
import numpy as np
import torch
files, obs = json.loads(sys.argv[1]), np.load(sys.argv[2])
out = {}
for name, path in files.items():
    module = torch.jit.load(path)
    with torch.no_grad():
        out[name] = module(torch.from_numpy(obs)).tolist()
banned = [m for m in ("crossrl", "ray", "torchrl", "gymnasium") if m in sys.modules]
print(json.dumps({"actions": out, "banned": banned}))
"""


def _train(tmp_path: Path, results: Path, algorithm: str) -> str:
    env_id, hp, steps = CASES[algorithm]
    spec = {
        "name": f"export-{algorithm}",
        "env": {"id": env_id},
        "algorithm": {"name": algorithm, "hyperparams": hp, "model": {"hidden": [32]}},
        "engines": ENGINES,
        "budget": {"env_steps": steps, "wall_seconds": 240},
    }
    path = tmp_path / f"{algorithm}.yaml"
    path.write_text(yaml.safe_dump(spec))
    out = subprocess.run(
        [*CLI, "run", str(path), "--results-dir", str(results), "--no-report"],
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return str(spec["name"])


def _export(results: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, "export", *args, "--results-dir", str(results)], capture_output=True, text=True, timeout=300
    )


def _engine_actions(results: Path, scenario: str, obs: np.ndarray) -> dict[str, np.ndarray]:
    """Each trial's greedy actions as its engine computes them (``crossrl evaluate``'s policy loader)."""
    from crossrl.adapters import checkpoints
    from crossrl.orchestration.evaluate import newest_checkpoint, policy_loader, trials_to_evaluate
    from crossrl.reports.store import ResultsStore

    store = ResultsStore(None, results_dir=results)
    out = {}
    for trial, run in trials_to_evaluate(store, scenario):
        folder, _ = newest_checkpoint(trial, run)
        act = policy_loader(trial.engine)(trial, folder / checkpoints.ENGINE_DIR, greedy=True)
        out[trial.engine] = np.stack([np.asarray(act(o)) for o in obs])
    return out


@pytest.mark.system  # a whole run on every engine first: about a minute each
@pytest.mark.parametrize("algorithm", list(CASES))
def test_exported_policies_act_as_each_engine_without_it(algorithm: str, tmp_path: Path, results_dir: Path) -> None:
    import gymnasium as gym

    scenario = _train(tmp_path, results_dir, algorithm)
    out_dir = tmp_path / "exported"
    done = _export(results_dir, scenario, "--out", str(out_dir))
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stdout + done.stderr
    sidecars = {p.stem: json.loads(p.read_text()) for p in out_dir.glob("*.json")}
    by_engine = {info["engine"]: info for info in sidecars.values()}
    assert sorted(by_engine) == ENGINES, sidecars.keys()

    env = gym.make(CASES[algorithm][0])
    rng = np.random.default_rng(3)
    obs = np.clip(rng.standard_normal((32, *env.observation_space.shape)), env.observation_space.low,
                  env.observation_space.high).astype(np.float32)  # fmt: skip
    np.save(tmp_path / "obs.npy", obs)
    files = {engine: str(out_dir / info["file"]) for engine, info in by_engine.items()}
    fresh = subprocess.run(
        [sys.executable, "-c", LOADER, json.dumps(files), str(tmp_path / "obs.npy")],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,  # not the repository: nothing of crossrl importable by accident
    )
    assert fresh.returncode == 0, fresh.stderr[-3000:]
    loaded = json.loads(fresh.stdout.strip().splitlines()[-1])
    assert loaded["banned"] == []

    expected = _engine_actions(results_dir, scenario, obs)
    for engine in ENGINES:
        info, got = by_engine[engine], np.asarray(loaded["actions"][engine])
        assert info["algorithm"] == algorithm and info["checkpoint"]["env_steps_sampled"] >= CASES[algorithm][2]
        assert info["run_id"] and info["trial"].startswith(f"{engine}-{algorithm}")
        assert info["input"] == {**info["input"], "dtype": "float32", "shape": ["B", *env.observation_space.shape]}
        if algorithm == "ppo":
            assert info["output"]["dtype"] == "int64" and info["output"]["action_space"]["n"] == 2
            np.testing.assert_array_equal(got, expected[engine].reshape(-1), err_msg=engine)
        else:
            assert info["output"]["rescaled_from_unit"] is True and info["output"]["action_space"]["low"] == [-2.0]
            low, high = env.action_space.low, env.action_space.high
            unit = expected[engine].reshape(len(obs), -1)
            np.testing.assert_allclose(got, low + (unit + 1.0) * (high - low) / 2.0, rtol=1e-5, atol=1e-5,
                                       err_msg=engine)  # fmt: skip
            assert np.all(np.abs(got) <= 2.0) and np.ptp(got) > 0  # actions that differ: a comparison that tells


def test_a_target_that_names_nothing_is_one_line(results_dir: Path) -> None:
    out = _export(results_dir, "no-such-scenario")
    assert out.returncode == 2 and "Traceback" not in out.stderr
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "no-such-scenario" in lines[0] and lines[0].startswith("error: "), lines
