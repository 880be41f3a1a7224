"""`crossrl export` checked on a trained trial: its files loaded in a fresh interpreter that imports torch, numpy and
json only, their actions on fixed observations compared with the engine's own greedy actions (its policy_loader, in
this process): equal for Discrete, allclose for Box (SAC acts in [-1, 1], the file in the env's own bounds: gymnasium's
RescaleAction). Used by tests/faults/test_checkpoint_resume.py on the trials it trains (PPO on CartPole, SAC on
Pendulum, every engine), so no run trains for export alone."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np

CLI = [sys.executable, "-m", "crossrl.cli"]

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


def export(results: Path, *args: str) -> subprocess.CompletedProcess[str]:
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


def check_exports(results: Path, scenario: str, *, engines: list[str], algorithm: str, env_id: str,
                  env_steps: int, tmp_path: Path) -> None:  # fmt: skip
    """`crossrl export SCENARIO` writes a file and sidecar per trial whose actions, without crossrl, are the engine's."""
    import gymnasium as gym

    out_dir = tmp_path / "exported"
    done = export(results, scenario, "--out", str(out_dir))
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stdout + done.stderr
    sidecars = {p.stem: json.loads(p.read_text()) for p in out_dir.glob("*.json")}
    by_engine = {info["engine"]: info for info in sidecars.values()}
    assert sorted(by_engine) == sorted(engines), sidecars.keys()

    env = gym.make(env_id)
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

    expected = _engine_actions(results, scenario, obs)
    for engine in engines:
        info, got = by_engine[engine], np.asarray(loaded["actions"][engine])
        assert info["algorithm"] == algorithm and info["checkpoint"]["env_steps_sampled"] >= env_steps
        assert info["run_id"] and info["trial"].startswith(f"{engine}-{algorithm}")
        assert info["input"] == {**info["input"], "dtype": "float32", "shape": ["B", *env.observation_space.shape]}
        if isinstance(env.action_space, gym.spaces.Discrete):
            assert info["output"]["dtype"] == "int64" and info["output"]["action_space"]["n"] == env.action_space.n
            np.testing.assert_array_equal(got, expected[engine].reshape(-1), err_msg=engine)
        else:
            low, high = env.action_space.low, env.action_space.high
            assert info["output"]["action_space"]["low"] == low.tolist()
            if algorithm == "sac":  # a tanh policy in [-1, 1], mapped back to the env's bounds by the file
                assert info["output"]["rescaled_from_unit"] is True
                unit = expected[engine].reshape(len(obs), -1)
                want = low + (unit + 1.0) * (high - low) / 2.0
            else:
                want = expected[engine].reshape(len(obs), -1)
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=engine)
            assert np.all((got >= low - 1e-6) & (got <= high + 1e-6)) and np.ptp(got) > 0  # actions that differ
