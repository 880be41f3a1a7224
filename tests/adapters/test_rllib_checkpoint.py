"""RLlib checkpoints: a trial writes them through the sink, a restored algorithm is bit-identical to the saved one
(weights, Adam's moments, counters) with the trial's lr re-applied, a resumed trial counts on from the checkpoint, and
load_policy acts from a checkpoint without Ray.

One local Ray cluster for the module (a trial's adapter joins it and leaves it running) and one checkpointed CartPole
PPO trial shared by the tests, to keep them short on a 2-core machine.
"""

from __future__ import annotations

import copy
import time
import uuid
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest

from crossrl.adapters import checkpoints
from crossrl.adapters.base import ListSink
from crossrl.adapters.rllib import adapter as R
from crossrl.scenarios import metrics as M
from crossrl.scenarios.spec import ScenarioSpec, Trial

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("ray_cluster")]

BATCH = 256  # env steps per PPO iteration
EVERY = 512  # a checkpoint every 2 iterations
BUDGET = 1024


def make_trial(algorithm: str = "ppo", *, env_steps: int = BUDGET, hyperparams: dict[str, Any] | None = None) -> Trial:
    hp = hyperparams or {"train_batch": BATCH, "minibatch": 64, "epochs": 2, "rollout_fragment": 64}
    spec = ScenarioSpec.model_validate(
        {
            "name": "rllib-ckpt-test",
            "env": {"id": "CartPole-v1"},
            "algorithm": {"name": algorithm, "hyperparams": hp, "model": {"hidden": [32, 16], "activation": "relu"}},
            "engines": ["rllib"],
            "execution": {"workers": [1]},
            "budget": {"env_steps": env_steps},
            "checkpoint": {"every_env_steps": EVERY},
            "seeds": [3],
        }
    )
    return spec.trials()[0]


class Trained:
    def __init__(self, trial: Trial, sink: ListSink, states: dict[int, dict[str, Any]]) -> None:
        self.trial, self.sink, self.states = trial, sink, states

    @property
    def root(self) -> Path:
        return Path(self.trial.checkpoint_dir or "")

    def folder(self, step: int) -> Path:
        return self.root / checkpoints.folder_name(step)


def run(trial: Trial) -> Trained:
    """``trial`` through the adapter; the learner's state (weights, optimizer) copied after every iteration (after
    the sink's checkpoint, before the next train())."""
    sink = ListSink(trial)
    states: dict[int, dict[str, Any]] = {}

    def capture(_i: int, algo: Any) -> None:
        # get_state's numpy arrays share the tensors' memory, which the next update changes in place: copy
        states[sink.env_steps_sampled] = copy.deepcopy(algo.learner_group.get_state()["learner"])

    R.RllibAdapter(on_iteration=capture).run(trial, sink)
    return Trained(trial, sink, states)


@pytest.fixture(scope="module")
def trained(ray_cluster: None, tmp_path_factory: pytest.TempPathFactory) -> Trained:
    """The PPO trial run once, with a checkpoint every 512 env steps."""
    import torch

    torch.set_num_threads(1)
    return run(make_trial().model_copy(update={"checkpoint_dir": str(tmp_path_factory.mktemp("rllib") / "ck")}))


def build(trial: Trial) -> Any:
    from ray.tune.registry import register_env

    from crossrl.core.cluster import free_cpus

    plan = R.plan_resources(algorithm=trial.algorithm, workers=trial.workers, available_cpus=free_cpus())
    name = f"crossrl-ckpt-{uuid.uuid4().hex[:8]}"
    register_env(name, R.env_creator)
    return R.build_config(trial, plan=plan, env_name=name).build_algo()


def busy(_runner: Any) -> None:
    time.sleep(2.0)


def assert_same(saved: Any, restored: Any, path: str = "") -> None:
    """Bit-identical nested state (dicts, lists, numpy arrays, scalars)."""
    if isinstance(saved, dict):
        assert set(saved) == set(restored), path
        for k in saved:
            assert_same(saved[k], restored[k], f"{path}/{k}")
    elif isinstance(saved, list | tuple):
        assert len(saved) == len(restored), path
        for i, (a, b) in enumerate(zip(saved, restored, strict=True)):
            assert_same(a, b, f"{path}/{i}")
    elif isinstance(saved, np.ndarray) or hasattr(saved, "numpy"):
        a, b = np.asarray(saved), np.asarray(restored)
        assert a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b), path
    else:
        assert saved == restored, path


def observations(n: int, seed: int = 0) -> list[np.ndarray]:
    env = gym.make("CartPole-v1")
    obs, _ = env.reset(seed=seed)
    out = []
    rng = np.random.default_rng(seed)
    for _ in range(n):
        out.append(obs)
        obs, _, done, trunc, _ = env.step(int(rng.integers(2)))
        if done or trunc:
            obs, _ = env.reset()
    env.close()
    return out


def test_trial_writes_checkpoints_through_the_sink(trained: Trained) -> None:
    written = [m for m in trained.sink.messages if m["kind"] == "checkpoint"]
    # due at 512 and 1024; no final one: the last was written at the budget's last step
    assert [m["env_step"] for m in written] == [EVERY, BUDGET]
    assert all(m["bytes"] > 10_000 and m["write_s"] >= 0 for m in written)
    assert [p.name for p in checkpoints.checkpoints(trained.root)] == [
        checkpoints.folder_name(BUDGET),
        checkpoints.folder_name(EVERY),
    ]
    meta = checkpoints.read_meta(trained.folder(EVERY))
    assert meta["env_steps_sampled"] == meta["env_steps_trained"] == EVERY and meta["iterations"] == 2
    state = meta["engine_state"]
    assert state["rllib"] == "Algorithm.save_to_path" and {"env_runner", "learner_group"} <= set(state["components"])
    assert state["rllib_env_steps_sampled"] == EVERY and "replay_buffer" not in state  # PPO: none
    engine = trained.folder(EVERY) / checkpoints.ENGINE_DIR
    assert (engine / "learner_group" / "learner" / "rl_module" / "default_policy").is_dir()
    # training time leaves the writes out
    assert trained.sink.checkpoint_s > 0


def test_restore_is_bit_identical_and_reapplies_lr(trained: Trained) -> None:
    from ray.rllib.core import COMPONENT_OPTIMIZER, COMPONENT_RL_MODULE

    old_lr = trained.trial.hp("lr")
    new_lr = old_lr * 3.0  # as Population Based Training would perturb it between the save and the restore
    trial = trained.trial.model_copy(update={"hyperparams": {**trained.trial.hyperparams, "lr": new_lr}})
    engine = trained.folder(EVERY) / checkpoints.ENGINE_DIR
    saved = trained.states[EVERY]
    algo = build(trial)
    try:
        assert R.learning_rates(algo) == [new_lr]  # the config's
        # as on a loaded machine: an earlier set_state still in flight, so RLlib's own weight sync is dropped
        algo.env_runner_group.foreach_env_runner_async_fetch_ready(busy, tag="set_state")
        done = R.restore(algo, engine, lr=new_lr)
        assert done["lr"] == [new_lr] and R.learning_rates(algo) == [new_lr]
        assert done["env_runners_synced"] == 2  # the remote env runner and the local one
        restored = algo.learner_group.get_state()["learner"]
        assert_same(saved[COMPONENT_RL_MODULE], restored[COMPONENT_RL_MODULE], "rl_module")
        (name,) = saved[COMPONENT_OPTIMIZER]
        opt_saved, opt_restored = (
            saved[COMPONENT_OPTIMIZER][name]["state"],
            restored[COMPONENT_OPTIMIZER][name]["state"],
        )
        moments = opt_saved["state"]
        assert moments and all({"exp_avg", "exp_avg_sq", "step"} <= set(m) for m in moments.values())
        assert all(np.abs(np.asarray(m["exp_avg"])).sum() > 0 for m in moments.values())  # Adam had stepped
        assert_same(moments, opt_restored["state"], "adam")  # Adam's moments and step counts, bit for bit
        for g_saved, g_restored in zip(opt_saved["param_groups"], opt_restored["param_groups"], strict=True):
            assert {**g_saved, "lr": new_lr} == g_restored  # all but the lr, which is the trial's
        assert saved["weights_seq_no"] == restored["weights_seq_no"] > 0

        # the counters: RLlib's lifetime counters and iteration come back with its metrics logger
        assert R.engine_counters(algo, algorithm="ppo", epochs=2) == (EVERY, None)
        assert algo.iteration == 2
        # every env runner acts with the restored weights and counts on from the checkpoint's env steps
        learner_w = algo.learner_group.get_weights(["default_policy"])["default_policy"]
        runner_w = algo.env_runner_group.foreach_env_runner(lambda r: r.module.get_state(), local_env_runner=False)
        assert runner_w and all(
            set(w) <= set(learner_w) and all(np.array_equal(np.asarray(w[k]), np.asarray(learner_w[k])) for k in w)
            for w in runner_w
        )
        counts = algo.env_runner_group.foreach_env_runner(lambda r: r.num_env_steps_sampled_lifetime)
        assert counts == [EVERY, EVERY]

        # load_policy (no Ray, no env runners) acts as the restored algorithm's greedy policy
        act = R.load_policy(trial, engine, greedy=True)
        reference = R.greedy_act(algo)
        obs = observations(40)
        assert [act(o) for o in obs] == [reference(o) for o in obs]

        # RLlib's restore_from_path alone brings back the saved lr (Adam's load_state_dict): why restore re-applies it
        algo.restore_from_path(engine.resolve())
        assert R.learning_rates(algo) == [old_lr]
    finally:
        algo.stop()


def test_resumed_trial_counts_on_from_the_checkpoint(trained: Trained, tmp_path: Path) -> None:
    folder = trained.folder(EVERY)
    trial = trained.trial.model_copy(update={"checkpoint_dir": str(tmp_path / "ck"), "resume_from": str(folder)})
    sink = ListSink(trial)
    R.RllibAdapter().run(trial, sink)
    (setup,) = [m for m in sink.messages if m["kind"] == "setup"]
    assert setup["resumed_env_step"] == EVERY
    points = sink.points
    steps = [int(p[M.ENV_STEPS_SAMPLED]) for p in points]
    assert steps == [EVERY + BATCH, BUDGET]  # just above the checkpoint's, never from 0, never twice
    assert [int(p[M.ENV_STEPS_TRAINED]) for p in points] == steps
    episodes_at_checkpoint = checkpoints.read_meta(folder)["episodes"]
    assert points[0][M.EPISODES_TOTAL] > episodes_at_checkpoint
    assert all(p[M.SAMPLE_THROUGHPUT] > 0 for p in points)
    # a resumed trial samples from seeds of its own (not the trial's start over again)
    (native,) = [m["config"] for m in sink.messages if m["kind"] == "native_config"]
    assert native["seed"] == R.resume_seed(trial, sink.resumed()) != trial.seed
    # it goes on checkpointing: the final state at the budget (512 steps after the one it resumed from)
    assert [p.name for p in checkpoints.checkpoints(tmp_path / "ck")] == [checkpoints.folder_name(BUDGET)]


def test_load_policy_acts_without_ray(trained: Trained) -> None:
    folder = checkpoints.checkpoints(trained.root)[0]  # the checkpoint folder itself is taken too
    greedy = R.load_policy(trained.trial, folder)
    sampled = R.load_policy(trained.trial, folder, greedy=False)
    env = gym.make("CartPole-v1")
    obs, _ = env.reset(seed=5)
    for _ in range(50):
        a = greedy(obs)
        assert isinstance(a, int) and env.action_space.contains(a) and greedy(obs) == a  # deterministic
        assert env.action_space.contains(sampled(obs))
        obs, _, done, trunc, _ = env.step(a)
        if done or trunc:
            obs, _ = env.reset()
    env.close()
    with pytest.raises(ValueError, match="no RLlib RLModule"):
        R.load_policy(trained.trial, trained.root)


def test_dqn_checkpoint_holds_its_replay_buffer_and_target_network(ray_cluster: None, tmp_path: Path) -> None:
    from ray.rllib.core import COMPONENT_OPTIMIZER, COMPONENT_RL_MODULE

    hp = {"learning_starts": 200, "rollout_fragment": 8, "replay_ratio": 1.0}
    trial = make_trial("dqn", env_steps=1000, hyperparams=hp)
    done_run = run(trial.model_copy(update={"checkpoint_dir": str(tmp_path / "ck")}))
    newest = checkpoints.checkpoints(done_run.root)[0]
    meta = checkpoints.read_meta(newest)
    step = meta["env_steps_sampled"]
    assert step >= 1000 and meta["env_steps_trained"] > 0
    engine_state = meta["engine_state"]
    assert engine_state["replay_buffer"] == R.REPLAY_FILE and 0 < engine_state["replay_env_steps"] <= step
    saved = done_run.states[step]
    assert any(k.startswith("_target") for k in saved[COMPONENT_RL_MODULE]["default_policy"])

    algo = build(trial)
    try:
        done = R.restore(algo, newest / checkpoints.ENGINE_DIR, lr=trial.hp("lr"))
        assert done["replay_env_steps"] == engine_state["replay_env_steps"]
        restored = algo.learner_group.get_state()["learner"]
        assert_same(saved[COMPONENT_RL_MODULE], restored[COMPONENT_RL_MODULE], "rl_module")  # target network too
        assert_same(saved[COMPONENT_OPTIMIZER], restored[COMPONENT_OPTIMIZER], "optimizer")  # the same lr
        assert R.engine_counters(algo, algorithm="dqn", epochs=1) == (step, meta["env_steps_trained"])

        act = R.load_policy(trial, newest, greedy=True)
        reference = R.greedy_act(algo)
        obs = observations(40)
        assert [act(o) for o in obs] == [reference(o) for o in obs]  # the argmax of the Q-values
        explore = R.load_policy(trial, newest, greedy=False)  # epsilon-greedy at the checkpoint's epsilon
        assert all(explore(o) in (0, 1) for o in obs)
    finally:
        algo.stop()


def test_step_offsets_count_on_when_rllib_forgets_its_counters() -> None:
    """Were RLlib's lifetime counters not restored (0 after the restore), the points still go on from the
    checkpoint's env steps."""
    resumed = checkpoints.Resumed.of(
        Path("x"),
        {"env_steps_sampled": 512, "env_steps_trained": 500, "iterations": 2, "episodes": 9, "train_s": 1.0},
    )
    forgot = R.StepOffsets.at_restore(resumed, engine_sampled=0, engine_trained=None)
    point = forgot.apply({"env_steps_sampled": 256, "env_steps_trained": 240, "values": {}})
    assert (point["env_steps_sampled"], point["env_steps_trained"]) == (768, 740)
    # RLlib 2.60 restores them: nothing to add (its trained count absent too: DQN before learning starts, PPO)
    kept = R.StepOffsets.at_restore(resumed, engine_sampled=512, engine_trained=500)
    assert kept == R.StepOffsets() == R.StepOffsets.at_restore(resumed, engine_sampled=512, engine_trained=None)
    point = kept.apply({"env_steps_sampled": 768, "env_steps_trained": None})
    assert point == {"env_steps_sampled": 768, "env_steps_trained": None}
