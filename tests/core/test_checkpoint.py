"""crossrl's core saves and restores its whole training state: a checkpoint written during a trial, loaded into a
freshly built optimizer, gives back bit-identical weights, Adam moments, target network, replay buffer and counters;
a trial resumed from it continues at the checkpoint's env step and ends at its budget."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from crossrl_trials import make_trial

from crossrl.adapters import checkpoints
from crossrl.adapters.base import ListSink
from crossrl.adapters.crossrl import CrossrlAdapter, load_policy, load_state, start_core
from crossrl.core import algorithms
from crossrl.core.envs import make_env
from crossrl.scenarios import metrics as M
from crossrl.scenarios.spec import CheckpointSpec, Trial

pytestmark = pytest.mark.usefixtures("ray_cluster")

CASES = {  # algorithm, optimizer, env steps, checkpoint interval, hyperparameters
    "ppo": ("ppo", None, 3000, 1000, {"train_batch": 1000, "minibatch": 250, "epochs": 2}),
    "impala": ("impala", None, 4000, 1500, {"train_batch": 500}),
    "dqn": ("dqn", None, 2000, 700, {"learning_starts": 300, "buffer_size": 5000}),
    "apex": ("apex", None, 2000, 700, {"learning_starts": 300, "buffer_size": 5000}),
    "a3c": ("a3c", None, 3000, 1000, {"train_batch": 200}),
    # DreamerV3: the sequence buffer's streams, three Adam optimizers, the return scale; one update per 16 env steps
    "dreamer": ("dreamer", None, 1200, 400, {"batch_size_B": 4, "batch_length_T": 16, "training_ratio": 4.0}),
}


def same(a: Any, b: Any, where: str = "state") -> None:
    """``a`` and ``b`` hold the same values, bit for bit (arrays, tensors, generators and buffers inside)."""
    if isinstance(a, dict):
        assert isinstance(b, dict) and set(a) == set(b), f"{where}: keys {sorted(a)} vs {sorted(b)}"
        for k in a:
            same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, list | tuple):
        assert len(a) == len(b), f"{where}: lengths {len(a)} vs {len(b)}"
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            same(x, y, f"{where}[{i}]")
    elif isinstance(a, torch.Tensor):
        assert torch.equal(a, b), f"{where}: tensors differ"
    elif isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and np.array_equal(a, b), f"{where}: arrays differ"
    elif isinstance(a, np.random.Generator):
        same(a.bit_generator.state, b.bit_generator.state, f"{where}.rng")
    elif hasattr(a, "__dict__") and not isinstance(a, type):
        assert type(a) is type(b), f"{where}: {type(a).__name__} vs {type(b).__name__}"
        same(vars(a), vars(b), f"{where}.{type(a).__name__}")
    else:
        assert a == b or (isinstance(a, float) and np.isnan(a) and np.isnan(b)), f"{where}: {a!r} vs {b!r}"


def checkpointed(case: str, tmp_path: Path, **update: Any) -> Trial:
    algorithm, optimizer, steps, every, hp = CASES[case]
    trial = make_trial(algorithm, env_steps=steps, optimizer=optimizer, **hp)
    return trial.model_copy(
        update={
            "checkpoint": CheckpointSpec(every_env_steps=every, keep=5),
            "checkpoint_dir": str(tmp_path / "ck"),
            **update,
        }
    )


def run(trial: Trial) -> ListSink:
    sink = ListSink(trial)
    CrossrlAdapter().run(trial, sink)
    return sink


def fresh_optimizer(trial: Trial) -> Any:
    alg = algorithms.load(trial.algorithm)
    return start_core(
        env_spec=trial.env,
        workers=trial.workers,
        envs_per_worker=trial.envs_per_worker,
        policy_cls=alg.policy_cls,
        hyperparams=alg.hyperparams(trial.hyperparams),
        model=trial.model,
        optimizer=trial.optimizer,
        seed=trial.seed,
        remote_num_cpus=0.5,
    )


@pytest.mark.parametrize("case", list(CASES))
def test_a_checkpoint_restores_bit_identical_state_and_a_resumed_trial_continues(case: str, tmp_path: Path) -> None:
    trial = checkpointed(case, tmp_path)
    sink = run(trial)
    saved = [m for m in sink.messages if m["kind"] == "checkpoint"]
    assert saved, "no checkpoint was written"
    assert saved[-1]["env_step"] == sink.points[-1][M.ENV_STEPS_SAMPLED]  # the final one, or one just written
    assert all(m["bytes"] > 0 and m["write_s"] > 0 for m in saved)
    folders = checkpoints.checkpoints(Path(trial.checkpoint_dir or ""))
    assert [f.name for f in folders] == sorted({Path(m["path"]).name for m in saved}, reverse=True)
    middle = Path(saved[0]["path"])
    meta = checkpoints.read_meta(middle)
    assert meta["trial"] == trial.name and meta["fingerprint"] == trial.fingerprint and not meta["final"]
    state = load_state(middle / checkpoints.ENGINE_DIR)
    assert state["num_steps_sampled"] == meta["env_steps_sampled"] == saved[0]["env_step"]
    if case in ("dqn", "dreamer"):
        assert len(state["buffer"]) > 0
    if case == "apex":
        assert sum(len(b) for b in state["shards"]) > 0
    # restored into a freshly built optimizer: the same state back, bit for bit
    evaluators, optimizer = fresh_optimizer(trial)
    try:
        optimizer.set_state(state)
        same(state, optimizer.get_state())
    finally:
        optimizer.stop()
        evaluators.stop()
    # resumed from the middle checkpoint: continues at its env step, ends at the budget
    resumed = run(trial.model_copy(update={"resume_from": str(middle), "checkpoint_dir": str(tmp_path / "ck2")}))
    setup = next(m for m in resumed.messages if m["kind"] == "setup")
    assert setup["resumed_env_step"] == meta["env_steps_sampled"]
    first, last = resumed.points[0], resumed.points[-1]
    assert (
        meta["env_steps_sampled"] < first[M.ENV_STEPS_SAMPLED] < meta["env_steps_sampled"] + 2 * (CASES[case][3] + 1000)
    )
    assert first[M.WALL_TIME_S] > meta["train_s"]  # training time continues, too
    assert first[M.EPISODES_TOTAL] >= meta["episodes"]
    assert last[M.ENV_STEPS_SAMPLED] >= trial.budget.env_steps


def test_lr_of_the_resumed_trial_is_applied_over_the_checkpoints(tmp_path: Path) -> None:
    """Population Based Training perturbs the learning rate between a save and a restore."""
    trial = checkpointed("ppo", tmp_path)
    run(trial)
    folder = checkpoints.checkpoints(Path(trial.checkpoint_dir or ""))[0]
    state = load_state(folder / checkpoints.ENGINE_DIR)
    changed = trial.model_copy(update={"hyperparams": {**trial.hyperparams, "lr": 1.234e-4}})
    evaluators, optimizer = fresh_optimizer(changed)
    try:
        optimizer.set_state(state)
        opt = evaluators.local.policy.optimizer
        assert {g["lr"] for g in opt.param_groups} == {1.234e-4}
        saved_steps = [s["step"] for s in state["policy"]["optimizer"]["state"].values()]
        assert [s["step"] for s in opt.state_dict()["state"].values()] == saved_steps  # the moments came back
    finally:
        optimizer.stop()
        evaluators.stop()


def test_the_reloaded_policy_acts_as_the_trained_one(tmp_path: Path) -> None:
    trial = checkpointed("dqn", tmp_path)
    run(trial)
    folder = checkpoints.checkpoints(Path(trial.checkpoint_dir or ""))[0]
    act = load_policy(trial, folder / checkpoints.ENGINE_DIR, greedy=True)
    state = load_state(folder / checkpoints.ENGINE_DIR)["policy"]
    env = make_env(trial.env)
    obs, _ = env.reset(seed=1)
    q = {k: v for k, v in state["weights"].items() if not k.startswith("target")}
    assert q  # the online network's weights
    for _ in range(20):
        a = act(obs)
        assert env.action_space.contains(int(a))
        obs, _, done, trunc, _ = env.step(int(a))
        if done or trunc:
            obs, _ = env.reset()
    env.close()
    sampled = load_policy(trial, folder / checkpoints.ENGINE_DIR, greedy=False)
    assert env.action_space.contains(int(sampled(obs)))
