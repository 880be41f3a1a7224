"""TorchRL checkpoints: a trial saves its learner's whole state (networks, target network, Adam, counters, DQN's
replay buffer and epsilon), a fresh learner restores it bit for bit, a resumed trial counts on from the checkpoint,
``load_policy`` acts from it, and a resumed trial takes the trial's (perhaps perturbed) learning rate.

Tiny CartPole trials, one worker; each run is shared by the tests of its algorithm (module-scoped fixtures)."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import crossrl.adapters.torchrl.adapter as torchrl_adapter
import crossrl.adapters.torchrl.multi_agent as torchrl_multi
from crossrl.adapters.base import ListSink
from crossrl.adapters.checkpoints import ENGINE_DIR, checkpoints, read_meta
from crossrl.adapters.registry import load_adapter
from crossrl.adapters.torchrl.adapter import TorchrlAdapter, collector_seed, frames_per_batch, load_policy
from crossrl.adapters.torchrl.algorithms import LEARNER_FILE, REPLAY_DIR, build_learner, learned_state, read_state
from crossrl.core.envs import make_env
from crossrl.scenarios import metrics as M
from crossrl.scenarios.loader import load
from crossrl.scenarios.spec import CheckpointSpec, ScenarioSpec, Trial

pytestmark = pytest.mark.integration

BUDGET = 1024
EVERY = 512  # checkpoints at env steps 512 and 1024
HYPERPARAMS: dict[str, dict[str, Any]] = {
    "ppo": {"train_batch": 256, "minibatch": 128, "epochs": 1},
    "dqn": {"learning_starts": 200, "buffer_size": 5000, "target_update": 500},
}


def make_trial(algorithm: str, root: Path, **hp: Any) -> Trial:
    spec = ScenarioSpec.model_validate(
        {
            "name": "torchrl-ckpt-test",
            "env": {"id": "CartPole-v1"},
            "algorithm": {"name": algorithm, "hyperparams": {**HYPERPARAMS[algorithm], **hp}},
            "engines": ["torchrl"],
            "execution": {"workers": [1], "envs_per_worker": 2},
            "budget": {"env_steps": BUDGET},
            "seeds": [3],
            "checkpoint": {"every_env_steps": EVERY},
        }
    )
    (trial,) = spec.trials()
    return trial.model_copy(update={"checkpoint_dir": str(root / "ck")})


@contextmanager
def learners_built() -> Iterator[list[Any]]:
    """Every learner the adapters build meanwhile (the live objects a run trains)."""
    made: list[Any] = []
    real_build, real_ma = torchrl_adapter.build_learner, torchrl_multi.MultiAgentLearner

    def build(**kwargs: Any) -> Any:
        made.append(real_build(**kwargs))
        return made[-1]

    class Recorded(real_ma):  # type: ignore[misc, valid-type]
        def __init__(self, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            made.append(self)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(torchrl_adapter, "build_learner", build)
        mp.setattr(torchrl_multi, "MultiAgentLearner", Recorded)
        yield made


@dataclass
class Run:
    trial: Trial
    sink: ListSink
    learner: Any  # the live learner, as the run left it
    folders: list[Path]  # its checkpoints, oldest first


def run_trial(trial: Trial, *, multi_agent: bool = False) -> Run:
    sink = ListSink(trial)
    with learners_built() as made:
        if multi_agent:
            load_adapter("torchrl", multi_agent=True).run(trial, sink)
        else:
            TorchrlAdapter().run(trial, sink)
    assert len(made) == 1
    folders = sorted(checkpoints(Path(trial.checkpoint_dir))) if trial.checkpoint_dir else []
    return Run(trial, sink, made[0], folders)


def resume(run: Run, folder: Path, root: Path, *, multi_agent: bool = False, **update: Any) -> Run:
    trial = run.trial.model_copy(update={"resume_from": str(folder), "checkpoint_dir": str(root), **update})
    return run_trial(trial, multi_agent=multi_agent)


def assert_identical(a: Any, b: Any, where: str = "") -> None:
    """Nested dicts / lists of tensors and numbers: the same keys, bit-identical tensors, equal values."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape, where
        torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True, msg=where)
    elif isinstance(a, Mapping):
        assert isinstance(b, Mapping) and set(a) == set(b), f"{where}: {sorted(a)} != {sorted(b)}"
        for k in a:
            assert_identical(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, list | tuple):
        assert isinstance(b, list | tuple) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_identical(x, y, f"{where}[{i}]")
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


def fresh_learner(trial: Trial) -> Any:
    return build_learner(trial=trial, obs_shape=(4,), n_actions=2)


def check_checkpoints(run: Run) -> None:
    """Checkpoints at every EVERY env steps (the last one at the budget, so no final one), each a good one."""
    steps = [read_meta(f)["env_steps_sampled"] for f in run.folders]
    assert steps == [EVERY, BUDGET]
    written = [m for m in run.sink.messages if m["kind"] == "checkpoint"]
    assert [m["env_step"] for m in written] == steps and all(m["bytes"] > 0 for m in written)
    assert (run.folders[0] / ENGINE_DIR / LEARNER_FILE).is_file()


def adam_moments(optim: torch.optim.Optimizer) -> list[torch.Tensor]:
    return [s["exp_avg_sq"] for s in optim.state_dict()["state"].values()]


def cartpole_obs(trial: Trial, n: int = 5) -> list[np.ndarray]:
    env = make_env(trial.env)
    obs, _ = env.reset(seed=0)
    out = [obs]
    for _ in range(n - 1):
        obs, _, term, trunc, _ = env.step(env.action_space.sample())
        out.append(obs if not (term or trunc) else env.reset()[0])
    env.close()
    return out


# -- PPO ----------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ppo(tmp_path_factory: pytest.TempPathFactory) -> Run:
    return run_trial(make_trial("ppo", tmp_path_factory.mktemp("ppo")))


def test_ppo_restores_bit_identical(ppo: Run) -> None:
    check_checkpoints(ppo)
    live, newest = ppo.learner, ppo.folders[-1]
    meta = read_meta(newest)
    assert meta["engine_state"]["grad_steps"] == live.grad_steps == 8  # 4 batches x 1 epoch x 2 minibatches
    restored = fresh_learner(ppo.trial)
    assert not torch.equal(restored.actor_net[0].weight, live.actor_net[0].weight)
    restored.restore(newest / ENGINE_DIR)
    assert_identical(learned_state(live.loss), learned_state(restored.loss), "loss")
    assert_identical(live.actor_net.state_dict(), restored.actor_net.state_dict(), "actor")  # what acts
    assert_identical(live.critic_net.state_dict(), restored.critic_net.state_dict(), "critic")
    assert_identical(live.optim.state_dict(), restored.optim.state_dict(), "adam")
    assert all(m.abs().sum() > 0 for m in adam_moments(restored.optim))
    assert restored.grad_steps == live.grad_steps
    # and what is on disk is what the live learner holds
    assert_identical(read_state(newest / ENGINE_DIR)["loss"], learned_state(live.loss), "file")


def test_ppo_resumes_from_its_checkpoint(ppo: Run, tmp_path: Path) -> None:
    first = ppo.folders[0]
    resumed = resume(ppo, first, tmp_path / "ck")
    setup = next(m for m in resumed.sink.messages if m["kind"] == "setup")
    assert setup["resumed_from"] == str(first) and setup["resumed_env_step"] == EVERY
    steps = [p[M.ENV_STEPS_SAMPLED] for p in resumed.sink.points]
    fpb = frames_per_batch(ppo.trial)
    assert EVERY < steps[0] <= EVERY + fpb
    assert BUDGET <= steps[-1] < BUDGET + fpb
    trained = [p[M.ENV_STEPS_TRAINED] for p in resumed.sink.points]
    assert trained[0] > read_meta(first)["env_steps_trained"]
    # it continued from the checkpoint's state: 2 more batches of 2 minibatches on top of its 4 gradient steps
    assert resumed.learner.grad_steps == read_meta(first)["engine_state"]["grad_steps"] + 4 == 8
    assert collector_seed(resumed.trial, None) == 3 != collector_seed(resumed.trial, resumed.sink.resumed())


def test_ppo_load_policy_acts(ppo: Run) -> None:
    newest = ppo.folders[-1]
    greedy, sample = load_policy(ppo.trial, newest), load_policy(ppo.trial, newest / ENGINE_DIR, greedy=False)
    for obs in cartpole_obs(ppo.trial):
        with torch.no_grad():
            want = int(torch.argmax(ppo.learner.actor_net(torch.as_tensor(obs)[None])[0]))
        assert greedy(obs) == want
        assert sample(obs) in (0, 1)


def test_ppo_resume_takes_the_trials_lr(ppo: Run, tmp_path: Path) -> None:
    """From the checkpoint at the budget: no more iterations, only the restore (PBT perturbed lr between)."""
    newest = ppo.folders[-1]
    trial = ppo.trial.model_copy(update={"hyperparams": {**ppo.trial.hyperparams, "lr": 1.234e-3}})
    resumed = resume(Run(trial, ppo.sink, None, []), newest, tmp_path / "ck")
    assert resumed.sink.points == [] and resumed.folders == []  # nothing left to do, nothing new to save
    optim = resumed.learner.optim
    assert [g["lr"] for g in optim.param_groups] == [1.234e-3]
    saved = read_state(newest / ENGINE_DIR)["optim"]
    assert saved["param_groups"][0]["lr"] == 3.0e-4
    assert_identical(saved["state"], optim.state_dict()["state"], "adam")  # moments kept, only lr changed


# -- DQN ----------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def dqn(tmp_path_factory: pytest.TempPathFactory) -> Run:
    return run_trial(make_trial("dqn", tmp_path_factory.mktemp("dqn")))


def test_dqn_restores_bit_identical(dqn: Run, tmp_path: Path) -> None:
    check_checkpoints(dqn)
    live, newest = dqn.learner, dqn.folders[-1]
    state = read_meta(newest)["engine_state"]
    assert state["replay_size"] == len(live.buffer) == BUDGET  # under capacity: every transition sampled
    assert (newest / ENGINE_DIR / REPLAY_DIR).is_dir()
    restored = fresh_learner(dqn.trial)
    restored.restore(newest / ENGINE_DIR)
    # Q-network, its target copy, the network that acts
    assert_identical(learned_state(live.loss), learned_state(restored.loss), "loss")
    assert_identical(live.qnet.state_dict(), restored.qnet.state_dict(), "qnet")
    online = restored.loss.value_network_params.flatten_keys()
    target = restored.loss.target_value_network_params.flatten_keys()
    assert any(not torch.equal(online[k], target[k]) for k in online.keys())  # noqa: SIM118 - a TensorDict: the target lags
    assert_identical(live.optim.state_dict(), restored.optim.state_dict(), "adam")
    assert all(m.abs().sum() > 0 for m in adam_moments(restored.optim))
    # epsilon and counters
    assert float(restored.greedy.eps) == float(live.greedy.eps) == state["epsilon"]
    assert state["epsilon"] < 1.0
    for name in ("_sampled", "_last_target", "_owed", "grad_steps"):
        assert getattr(restored, name) == getattr(live, name), name
    assert restored._last_target == 1008  # target copies at 504 and 1008 env steps (target_update 500)
    assert restored.target.counter == live.target.counter
    # the replay buffer: the same transitions in the same slots, the same write cursor
    assert len(restored.buffer) == len(live.buffer)
    n = len(live.buffer)
    assert_identical(
        live.buffer.storage.get(slice(0, n)).to_dict(), restored.buffer.storage.get(slice(0, n)).to_dict(), "replay"
    )
    assert restored.buffer.writer.state_dict() == live.buffer.writer.state_dict()
    # a restored learner saves what it restored
    restored.save(tmp_path)
    assert_identical(read_state(tmp_path)["loss"], read_state(newest / ENGINE_DIR)["loss"], "resave")
    # the next target update copies the online network (TorchRL's HardUpdate: on every call, see DQNLearner)
    restored.target.step()
    synced = restored.loss.target_value_network_params.flatten_keys().to_dict()
    assert_identical(restored.loss.value_network_params.flatten_keys().to_dict(), synced, "sync")


def test_dqn_resumes_with_its_replay_and_epsilon(dqn: Run, tmp_path: Path) -> None:
    first = dqn.folders[0]
    meta = read_meta(first)
    resumed = resume(dqn, first, tmp_path / "ck")
    points = resumed.sink.points
    fpb = frames_per_batch(dqn.trial)
    assert EVERY < points[0][M.ENV_STEPS_SAMPLED] <= EVERY + fpb
    assert BUDGET <= points[-1][M.ENV_STEPS_SAMPLED] < BUDGET + fpb
    assert points[0][M.ENV_STEPS_TRAINED] > meta["env_steps_trained"]
    # the replay buffer came back (not refilled from empty) and epsilon went on annealing from where it was
    assert all(p[M.DIAG_REPLAY_SIZE] == p[M.ENV_STEPS_SAMPLED] for p in points)
    assert meta["engine_state"]["epsilon"] > points[0][M.DIAG_EPSILON] > points[-1][M.DIAG_EPSILON]
    eps_live = [p[M.DIAG_EPSILON] for p in dqn.sink.points if p[M.ENV_STEPS_SAMPLED] > EVERY]
    assert [p[M.DIAG_EPSILON] for p in points] == pytest.approx(eps_live)  # the same schedule as uninterrupted


def test_dqn_load_policy_acts_greedily(dqn: Run) -> None:
    for greedy in (True, False):  # DQN acts greedily either way
        act = load_policy(dqn.trial, dqn.folders[-1], greedy=greedy)
        for obs in cartpole_obs(dqn.trial):
            with torch.no_grad():
                want = int(torch.argmax(dqn.learner.qnet(torch.as_tensor(obs)[None])[0]))
            assert act(obs) == want


def test_dqn_resume_takes_the_trials_lr(dqn: Run, tmp_path: Path) -> None:
    trial = dqn.trial.model_copy(update={"hyperparams": {**dqn.trial.hyperparams, "lr": 2.0e-3}})
    resumed = resume(Run(trial, dqn.sink, None, []), dqn.folders[-1], tmp_path / "ck")
    assert [g["lr"] for g in resumed.learner.optim.param_groups] == [2.0e-3]
    assert len(resumed.learner.buffer) == BUDGET


def test_load_policy_refuses_another_algorithm(ppo: Run, dqn: Run) -> None:
    with pytest.raises(ValueError, match="'dqn' learner's, not 'ppo'"):
        load_policy(ppo.trial, dqn.folders[-1])


# -- multi-agent --------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ma(tmp_path_factory: pytest.TempPathFactory) -> Run:
    spec, _ = load("ma-smoke", overrides={"engines": ["torchrl"], "execution.workers": [1]})
    [trial] = spec.trials()
    trial = trial.model_copy(
        update={
            "budget": trial.budget.model_copy(update={"env_steps": 800}),
            "checkpoint": CheckpointSpec(every_env_steps=400),
            "checkpoint_dir": str(tmp_path_factory.mktemp("ma") / "ck"),
        }
    )
    return run_trial(trial, multi_agent=True)


def test_multi_agent_restores_and_resumes(ma: Run, tmp_path: Path) -> None:
    assert [read_meta(f)["env_steps_sampled"] for f in ma.folders] == [400, 800]
    live = ma.learner
    restored = torchrl_multi.MultiAgentLearner(trial=ma.trial, dims={p: g.dims for p, g in live.groups.items()})
    restored.restore(ma.folders[-1] / ENGINE_DIR)
    for pid, g in live.groups.items():
        r = restored.groups[pid]
        assert_identical(learned_state(g.loss), learned_state(r.loss), pid)
        assert_identical(g.optim.state_dict(), r.optim.state_dict(), f"{pid}.adam")
        assert r.grad_steps == g.grad_steps > 0
    engine_state = json.loads((ma.folders[-1] / "crossrl.json").read_text())["engine_state"]
    assert engine_state["grad_steps"] == {pid: g.grad_steps for pid, g in live.groups.items()}

    resumed = resume(ma, ma.folders[0], tmp_path / "ck", multi_agent=True)
    steps = [p[M.ENV_STEPS_SAMPLED] for p in resumed.sink.points]
    assert steps == [800]
    with pytest.raises(ValueError, match="single-agent"):
        load_policy(ma.trial, ma.folders[-1])
