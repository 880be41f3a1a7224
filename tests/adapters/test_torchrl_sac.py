"""TorchRL's SAC (``SACLearner``): tiny real trials on Pendulum-v1 through the adapter (counts, losses, diagnostics),
networks equal to crossrl's core SACPolicy's, checkpoints that restore bit for bit and resume where they left off,
``load_policy``'s mean action, and a diverged critic or actor that ends the trial naming it.

One trial with checkpoints is shared by the tests that read it (a module-scoped fixture)."""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from tensordict import TensorDictBase

import crossrl.adapters.torchrl.adapter as torchrl_adapter
from crossrl.adapters.base import ListSink, TrainingDiverged
from crossrl.adapters.checkpoints import ENGINE_DIR, Resumed, checkpoints, read_meta
from crossrl.adapters.torchrl.adapter import (
    TorchrlAdapter,
    init_random_frames,
    learner_dims,
    load_policy,
    make_torchrl_env,
    mapping_for,
    unmapped,
)
from crossrl.adapters.torchrl.algorithms import (
    REPLAY_DIR,
    SAC_REPLAY_KEYS,
    SACLearner,
    build_learner,
    learned_state,
    read_state,
)
from crossrl.core import algorithms
from crossrl.core.envs import make_env
from crossrl.core.models import count_params
from crossrl.core.sac_policy import NonFiniteError, SACPolicy
from crossrl.scenarios import metrics as M
from crossrl.scenarios.catalog import CROSSRL_SETTINGS
from crossrl.scenarios.spec import ScenarioSpec, Trial

BUDGET = 500
EVERY = 250  # checkpoints at env steps 250 and 500
POINT = 50  # a point per 50 env steps (crossrl's steps_per_iteration, lowered from 1000 here)
LEARNING_STARTS = 100
BATCH = 32
HIDDEN = [16, 16]


def make_trial(
    *, env: dict[str, Any] | None = None, budget: int = BUDGET, replay_buffer: bool = True, **hp: Any
) -> Trial:
    spec = ScenarioSpec.model_validate(
        {
            "name": "torchrl-sac-test",
            "env": env or {"id": "Pendulum-v1"},
            "algorithm": {
                "name": "sac",
                "hyperparams": {"learning_starts": LEARNING_STARTS, "train_batch": BATCH, "buffer_size": 5000, **hp},
                "model": {"hidden": HIDDEN},
            },
            "engines": ["torchrl"],
            "execution": {"workers": [1], "envs_per_worker": 1},
            "budget": {"env_steps": budget},
            "seeds": [3],
            "checkpoint": {"every_env_steps": EVERY, "replay_buffer": replay_buffer},
        }
    )
    (trial,) = spec.trials()
    return trial


@pytest.fixture(scope="module", autouse=True)
def points_every_50_env_steps() -> Iterator[None]:
    """The learner reports a point per ``steps_per_iteration`` env steps (crossrl-only, 1000): 50 here, for every
    test of the module (the shared trial's too)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(CROSSRL_SETTINGS, "sac", {**CROSSRL_SETTINGS["sac"], "steps_per_iteration": POINT})
        yield


@contextmanager
def learners_built(plant: Any = None) -> Iterator[list[Any]]:
    """Every learner the adapter builds meanwhile (the live objects a run trains); ``plant(learner)`` alters each
    one as it is built."""
    made: list[Any] = []
    real_build = torchrl_adapter.build_learner

    def build(**kwargs: Any) -> Any:
        made.append(real_build(**kwargs))
        if plant is not None:
            plant(made[-1])
        return made[-1]

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(torchrl_adapter, "build_learner", build)
        yield made


@dataclass
class Run:
    trial: Trial
    sink: ListSink
    learner: Any  # the live learner, as the run left it
    folders: list[Path]  # its checkpoints, oldest first


def run_trial(trial: Trial) -> Run:
    sink = ListSink(trial)
    with learners_built() as made:
        TorchrlAdapter().run(trial, sink)
    assert len(made) == 1
    folders = sorted(checkpoints(Path(trial.checkpoint_dir))) if trial.checkpoint_dir else []
    return Run(trial, sink, made[0], folders)


def native_config(sink: ListSink) -> dict[str, Any]:
    return next(m["config"] for m in sink.messages if m["kind"] == "native_config")


def pendulum_batch(trial: Trial, steps: int) -> TensorDictBase:
    """``steps`` transitions of uniformly random actions, as the adapter's collector batches them ([1, steps])."""
    env = make_torchrl_env(trial.env, 1)
    env.set_seed(0)
    data = env.rollout(steps, break_when_any_done=False)
    env.close()
    # one torch thread, as the adapter trains: TorchRL 0.14.1's SerialEnv.close (BatchedEnvBase.close) raises the
    # count back to two, and two made each update ~10x slower on the loaded 2-core machine (measured)
    torch.set_num_threads(1)
    return data


@pytest.fixture(scope="module")
def sac(tmp_path_factory: pytest.TempPathFactory) -> Run:
    trial = make_trial().model_copy(update={"checkpoint_dir": str(tmp_path_factory.mktemp("sac") / "ck")})
    return run_trial(trial)


# -- the mapping ----------------------------------------------------------------------------------------------------


def test_every_shared_sac_hyperparameter_is_mapped() -> None:
    assert unmapped("sac") == []
    sac = mapping_for("sac")
    assert sac["target_entropy"].torchrl == "SACLoss(target_entropy=)"
    assert sac["n_step"].torchrl == "- (must be 1)"


# -- a trial ----------------------------------------------------------------------------------------------------------


def test_sac_trial_counts_and_losses(sac: Run) -> None:
    points = sac.sink.points
    steps = [p[M.ENV_STEPS_SAMPLED] for p in points]
    # rollout_fragment 1: a batch per env step, a point per POINT env steps (the batches' episodes and mean losses)
    assert steps == list(range(POINT, BUDGET + 1, POINT))
    native = native_config(sac.sink)
    assert native["collector"]["class"] == "Collector"
    assert native["collector"]["kwargs"]["frames_per_batch"] == 1
    assert native["collector"]["kwargs"]["init_random_frames"] == LEARNING_STARTS
    assert native["loss"]["class"] == "SACLoss"
    assert native["loss"]["kwargs"]["loss_function"] == "l2" and native["loss"]["kwargs"]["num_qvalue_nets"] == 2
    assert native["loss"]["target_entropy"] == -1.0  # 'auto': -(action dims)
    assert set(native["hyperparams"]) == set(sac.trial.hyperparams)
    # random actions and no update before learning_starts; then one update per env step, as crossrl's core counts
    # them (the first at learning_starts itself)
    early = [p for p in points if p[M.ENV_STEPS_SAMPLED] < LEARNING_STARTS]
    assert all(p[M.ENV_STEPS_TRAINED] == 0 and p[M.DIAG_EPSILON] == 1.0 and M.VALUE_LOSS not in p for p in early)
    last = points[-1]
    assert last[M.DIAG_UPDATES] == BUDGET - LEARNING_STARTS + 1 == sac.learner.updates
    assert last[M.ENV_STEPS_TRAINED] == last[M.DIAG_UPDATES] * BATCH
    assert all(p[M.DIAG_REPLAY_SIZE] == p[M.ENV_STEPS_SAMPLED] for p in points)
    learning = [p for p in points if p[M.ENV_STEPS_SAMPLED] >= LEARNING_STARTS]
    assert len(learning) == (BUDGET - LEARNING_STARTS) // POINT + 1
    for key in (M.POLICY_LOSS, M.VALUE_LOSS, M.ENTROPY, M.DIAG_ALPHA, M.DIAG_ALPHA_LOSS, M.DIAG_Q_MEAN):
        assert all(math.isfinite(p[key]) for p in learning), key
    assert learning[0][M.DIAG_ALPHA] == 1.0 > last[M.DIAG_ALPHA] > 0  # initial_alpha, then learned
    returns = [p[M.EPISODE_RETURN_MEAN] for p in points if M.EPISODE_RETURN_MEAN in p]
    assert len(returns) == 2 and all(-2000 < r < 0 for r in returns)  # two 200-step Pendulum episodes
    assert all(p[M.EPISODE_LEN_MEAN] == 200 for p in points if M.EPISODE_LEN_MEAN in p)


def test_fractional_updates_per_step_carry_over() -> None:
    trial = make_trial(updates_per_step=0.5)
    learner = build_learner(trial=trial, **learner_dims(trial.env))
    data = pendulum_batch(trial, 300)
    trained = [learner.learn(data[:, i : i + 1])[0] for i in range(300)]
    assert sum(trained[: LEARNING_STARTS - 1]) == 0
    assert learner.updates == (300 - LEARNING_STARTS + 1) // 2 == sum(trained) // BATCH
    assert len(learner.buffer) == 300
    assert set(learner.buffer[:].keys(True, True)) == set(SAC_REPLAY_KEYS)  # only what SACLoss reads


# -- networks ---------------------------------------------------------------------------------------------------------


def test_networks_equal_crossrls_sac_policy() -> None:
    """The same parameter counts, and with the same seed the same initial weights: actor and both critics."""
    trial = make_trial()
    env = make_env(trial.env)
    core = SACPolicy(
        observation_space=env.observation_space,
        action_space=env.action_space,
        hyperparams=algorithms.load("sac").hyperparams(trial.hyperparams),
        model=trial.model,
        seed=11,
    )
    env.close()
    nets = core._nets()
    torch.manual_seed(11)
    learner = build_learner(trial=trial, **learner_dims(trial.env))
    assert isinstance(learner, SACLearner)
    actor = learner.loss.actor_network_params.flatten_keys(".")
    critics = learner.loss.qvalue_network_params.flatten_keys(".")  # the two critics stacked: [2, ...]
    assert sum(p.numel() for p in actor.values()) == count_params(learner.actor_net) == count_params(nets.actor)
    assert sum(p[0].numel() for p in critics.values()) == count_params(nets.critics[0]) == count_params(nets.critics[1])
    assert count_params(learner.loss) == count_params(nets.actor) + 2 * count_params(nets.critics[0]) + 1  # log_alpha
    # by crossrl's names: actor.<layer>.weight, q1.<layer>.bias ... (the layer index and the tensor end each key)
    ours = {f"actor.{layer(k)}": v for k, v in actor.items()}
    for i, name in enumerate(("q1", "q2")):
        ours |= {f"{name}.{layer(k)}": v[i] for k, v in critics.items()}
    weights = core.get_weights()
    assert set(ours) == {k for k in weights if k.split(".")[0] in ("actor", "q1", "q2")}
    for key, value in ours.items():
        assert np.array_equal(value.detach().numpy(), weights[key]), key


def layer(key: str) -> str:
    """``module.net.2.weight`` -> ``2.weight``."""
    return ".".join(key.split(".")[-2:])


# -- checkpoints ------------------------------------------------------------------------------------------------------


def test_sac_restores_bit_identical(sac: Run, tmp_path: Path) -> None:
    assert [read_meta(f)["env_steps_sampled"] for f in sac.folders] == [EVERY, BUDGET]
    live, newest = sac.learner, sac.folders[-1]
    engine = newest / ENGINE_DIR
    assert (engine / REPLAY_DIR).is_dir()  # the replay buffer is saved
    meta = read_meta(newest)["engine_state"]
    assert meta["updates"] == live.updates and meta["replay_size"] == len(live.buffer) == BUDGET
    restored = build_learner(trial=sac.trial, **learner_dims(sac.trial.env))
    assert isinstance(restored, SACLearner)
    restored.restore(engine)
    for a, b in zip(learned_state(live.loss).values(), learned_state(restored.loss).values(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)  # actor, critics, target critics
    assert torch.equal(live.loss.log_alpha, restored.loss.log_alpha) and meta["alpha"] < 1.0
    for name, optim in live.optims.items():
        ours, theirs = optim.state_dict()["state"], restored.optims[name].state_dict()["state"]
        assert ours.keys() == theirs.keys()
        assert all(torch.equal(ours[i][k], theirs[i][k]) for i in ours for k in ours[i]), name
    assert (restored._sampled, restored._owed, restored.updates) == (live._sampled, live._owed, live.updates)
    assert len(restored.buffer) == len(live.buffer)
    assert (live.buffer[:] == restored.buffer[:]).all()
    # what is on disk is what the live learner holds
    for a, b in zip(read_state(engine)["loss"].values(), learned_state(live.loss).values(), strict=True):
        assert torch.equal(a, b)


def test_sac_resumes_from_its_checkpoint(sac: Run, tmp_path: Path) -> None:
    first = sac.folders[0]
    trial = sac.trial.model_copy(update={"resume_from": str(first), "checkpoint_dir": str(tmp_path / "ck")})
    resumed = run_trial(trial)
    setup = next(m for m in resumed.sink.messages if m["kind"] == "setup")
    assert setup["resumed_env_step"] == EVERY
    points = resumed.sink.points
    assert [p[M.ENV_STEPS_SAMPLED] for p in points] == list(range(EVERY + POINT, BUDGET + 1, POINT))
    # past learning_starts: no random actions left, the replay buffer came back, the updates count on
    assert native_config(resumed.sink)["collector"]["kwargs"]["init_random_frames"] == 0
    assert points[0][M.DIAG_REPLAY_SIZE] == EVERY + POINT
    assert points[0][M.DIAG_UPDATES] == read_meta(first)["engine_state"]["updates"] + POINT
    assert points[-1][M.DIAG_UPDATES] == BUDGET - LEARNING_STARTS + 1 == sac.sink.points[-1][M.DIAG_UPDATES]
    # the point's alpha is the mean over its 50 updates, the first of which starts from the saved one
    assert points[0][M.DIAG_ALPHA] == pytest.approx(read_meta(first)["engine_state"]["alpha"], rel=0.05)
    assert points[0][M.ENV_STEPS_TRAINED] == read_meta(first)["env_steps_trained"] + POINT * BATCH


def test_a_checkpoint_without_the_buffer_refills_it_before_training(tmp_path: Path) -> None:
    """checkpoint.replay_buffer: false: the checkpoints hold no replay buffer; a trial resumed from one starts with
    an empty buffer, acts with the restored policy and makes no update until it holds learning_starts transitions."""
    trial = make_trial(replay_buffer=False).model_copy(update={"checkpoint_dir": str(tmp_path / "ck")})
    ran = run_trial(trial)
    first = ran.folders[0]
    assert not (first / ENGINE_DIR / REPLAY_DIR).exists() and read_meta(first)["engine_state"]["replay_size"] == 0
    saved = read_meta(first)["engine_state"]["updates"]
    resumed = run_trial(trial.model_copy(update={"resume_from": str(first), "checkpoint_dir": str(tmp_path / "ck2")}))
    points = resumed.sink.points
    assert native_config(resumed.sink)["collector"]["kwargs"]["init_random_frames"] == 0  # the policy acts
    assert [p[M.DIAG_REPLAY_SIZE] for p in points[:2]] == [POINT, 2 * POINT]
    # nothing trained while the buffer held fewer than learning_starts (100); from the batch that fills it, one
    # update per env step again
    assert points[0][M.DIAG_UPDATES] == saved and points[1][M.DIAG_UPDATES] == saved + 1
    assert points[-1][M.DIAG_UPDATES] == saved + (BUDGET - EVERY - LEARNING_STARTS) + 1


def test_random_actions_left_for_a_resumed_trial() -> None:
    """What is left of learning_starts, rounded up to whole collector batches (here 8 env steps)."""
    trial = make_trial(rollout_fragment=8)

    def at(steps: int) -> Resumed:
        return Resumed.of(Path("ckpt"), {"env_steps_sampled": steps, "env_steps_trained": 0, "iterations": 0,
                                          "episodes": 0, "train_s": 0.0})  # fmt: skip

    assert init_random_frames(trial, None) == 104
    assert init_random_frames(trial, at(40)) == 64
    assert init_random_frames(trial, at(400)) == 0
    assert init_random_frames(trial.model_copy(update={"algorithm": "dqn"}), None) is None  # dqn never acts at random


def test_sac_resume_takes_the_trials_learning_rates(sac: Run, tmp_path: Path) -> None:
    """From the checkpoint at the budget: nothing left to do, only the restore (PBT perturbed the rates between)."""
    lrs = {"actor_lr": 1.1e-4, "critic_lr": 2.2e-4, "alpha_lr": 3.3e-4}
    trial = sac.trial.model_copy(
        update={
            "hyperparams": {**sac.trial.hyperparams, **lrs},
            "resume_from": str(sac.folders[-1]),
            "checkpoint_dir": str(tmp_path / "ck"),
        }
    )
    resumed = run_trial(trial)
    assert resumed.sink.points == []
    for name, optim in resumed.learner.optims.items():
        assert [g["lr"] for g in optim.param_groups] == [lrs[f"{name}_lr"]]
    assert len(resumed.learner.buffer) == BUDGET


def test_sac_load_policy_gives_the_mean_action(sac: Run) -> None:
    greedy = load_policy(sac.trial, sac.folders[-1])
    sample = load_policy(sac.trial, sac.folders[-1] / ENGINE_DIR, greedy=False)
    env = make_env(sac.trial.env)
    obs, _ = env.reset(seed=0)
    for _ in range(5):
        action = greedy(obs)
        assert action.shape == (1,) and action.dtype == np.float32 and -1.0 <= action[0] <= 1.0
        with torch.no_grad():
            loc = sac.learner.actor_net(torch.as_tensor(obs)[None])[0, :1]
        np.testing.assert_allclose(action, torch.tanh(loc).numpy(), rtol=0, atol=1e-6)  # tanh(loc), not a sample
        samples = np.array([sample(obs)[0] for _ in range(20)])
        assert np.all(np.abs(samples) <= 1.0) and samples.std() > 0
        obs, *_ = env.step(action)
    env.close()


# -- refusals and divergence --------------------------------------------------------------------------------------


def test_n_step_and_unscaled_actions_are_refused() -> None:
    trial = make_trial(n_step=3)
    with pytest.raises(NotImplementedError, match="n_step 1 only.*MultiStep"):
        TorchrlAdapter().run(trial, ListSink(trial))
    trial = make_trial(env={"id": "Pendulum-v1", "actions": "env"})  # Pendulum's own bounds, [-2, 2]
    with pytest.raises(ValueError, match=r"in \[-1, 1\].*env.actions: unit"):
        TorchrlAdapter().run(trial, ListSink(trial))


def test_a_nan_critic_fails_the_trial_naming_the_value_loss() -> None:
    def nan_critic(learner: Any) -> None:
        with torch.no_grad():
            next(iter(learner.loss.qvalue_network_params.values(True, True)))[0].view(-1)[0] = math.nan

    trial = make_trial(budget=200)
    sink = ListSink(trial)
    with learners_built(nan_critic), pytest.raises(TrainingDiverged, match="value_loss is nan"):
        TorchrlAdapter().run(trial, sink)
    # the point holding the first update failed: the one before it, all random actions, was the last
    assert sink.points[-1][M.ENV_STEPS_SAMPLED] == LEARNING_STARTS - POINT


def test_a_nan_action_fails_before_the_env_is_stepped() -> None:
    def nan_actor(learner: Any) -> None:
        with torch.no_grad():
            learner.actor_net[0].bias[0] = math.nan

    trial = make_trial(budget=50, learning_starts=0)
    with learners_built(nan_actor), pytest.raises(NonFiniteError, match="policy's action is not finite"):
        TorchrlAdapter().run(trial, ListSink(trial))
