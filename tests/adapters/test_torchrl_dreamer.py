"""TorchRL's DreamerV3 (``DreamerLearner``, adapters/torchrl/dreamer.py): it builds for Discrete (CartPole) and Box
(Pendulum) actions at nano, learns once B x T env steps are stored with finite losses under crossrl's core's names,
its replay holds the paper's entries in windows of one env each, a checkpoint round-trips the networks, the
optimizers, the return normalisation and the replay, and a tiny trial through the real adapter finishes with points
(the last one marked integration, as the other adapter runs)."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from tensordict import TensorDictBase

from crossrl.adapters.base import ListSink
from crossrl.adapters.checkpoints import checkpoints
from crossrl.adapters.registry import BUILTIN
from crossrl.adapters.torchrl.adapter import (
    TorchrlAdapter,
    export_policy,
    frames_per_batch,
    learner_dims,
    load_policy,
    make_torchrl_env,
    mapping_for,
    unmapped,
)
from crossrl.adapters.torchrl.algorithms import REPLAY_DIR
from crossrl.adapters.torchrl.dreamer import DreamerLearner
from crossrl.adapters.torchrl.learners import build_learner
from crossrl.core.dreamer_policy import DREAMER_SIZES
from crossrl.scenarios import metrics as M
from crossrl.scenarios.catalog import CROSSRL_SETTINGS
from crossrl.scenarios.spec import ScenarioSpec, Trial

# 4 windows of 16 entries per update, 4 replayed env steps per sampled one: an update per 16 env steps
TINY = {"model_size": "nano", "batch_size_B": 4, "batch_length_T": 16, "training_ratio": 4.0, "horizon_H": 5}
REPLAYED = 4 * 16
POINT = 100  # a point per 100 env steps (crossrl's steps_per_iteration, 500, lowered here)
# what crossrl's core's DreamerPolicy reports per update (core/dreamer_policy.py), and the replay's counts
CORE_NAMES = (
    M.POLICY_LOSS,
    M.VALUE_LOSS,
    M.ENTROPY,
    M.DIAG_WORLD_MODEL_LOSS,
    "diag.decoder_loss",
    "diag.reward_loss",
    "diag.continue_loss",
    "diag.kl",
    "diag.world_model_grad_norm",
    "diag.actor_grad_norm",
    "diag.critic_grad_norm",
    "diag.return_scale",
    "diag.imagined_return",
)


def make_trial(env_id: str = "CartPole-v1", *, env_steps: int = 300, checkpoint: int | None = None, **hp: Any) -> Trial:
    raw: dict[str, Any] = {
        "name": "torchrl-dreamer-test",
        "env": {"id": env_id},
        "algorithm": {"name": "dreamer", "hyperparams": {**TINY, **hp}},
        "engines": ["torchrl"],
        "execution": {"workers": [1], "envs_per_worker": 1},
        "budget": {"env_steps": env_steps},
        "seeds": [3],
    }
    if checkpoint:
        raw["checkpoint"] = {"every_env_steps": checkpoint}
    (trial,) = ScenarioSpec.model_validate(raw).trials()
    return trial


@pytest.fixture(autouse=True)
def one_torch_thread() -> Iterator[None]:
    """The adapter trains with one torch thread; closing a batched env can raise the count back (SAC's tests)."""
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(1)


@pytest.fixture(scope="module", autouse=True)
def points_every_100_env_steps() -> Iterator[None]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(CROSSRL_SETTINGS, "dreamer", {**CROSSRL_SETTINGS["dreamer"], "steps_per_iteration": POINT})
        yield


def learner_for(trial: Trial) -> DreamerLearner:
    learner = build_learner(trial=trial, **learner_dims(trial.env))
    assert isinstance(learner, DreamerLearner)
    return learner


def collect(learner: DreamerLearner, trial: Trial, steps: int, *, seed: int = 0) -> TensorDictBase:
    """``steps`` env steps of the learner's own recurrent policy on the adapter's env with the learner's transforms,
    as the collector batches them (``[1, steps]``)."""
    env = make_torchrl_env(trial.env, 1, transforms=learner.env_transforms)
    env.set_seed(seed)
    with torch.no_grad():
        data = env.rollout(steps, policy=learner.policy, break_when_any_done=False)
    env.close()
    torch.set_num_threads(1)
    return data


def world_model_weights(learner: DreamerLearner) -> list[torch.Tensor]:
    return [p.detach().clone() for p in learner.params["world_model"]]


# -- building and learning ------------------------------------------------------------------------------------------


def test_every_shared_dreamer_hyperparameter_is_mapped() -> None:
    assert unmapped("dreamer") == []
    assert mapping_for("dreamer")["free_bits"].torchrl == "DreamerV3ModelLoss(free_bits=)"
    assert BUILTIN["torchrl"].reason_unsupported("dreamer") is None
    assert "Box (bounded)" in BUILTIN["torchrl"].spaces("dreamer")
    # crossrl's core's fragment: B x T / training_ratio env steps per collector batch
    assert frames_per_batch(make_trial()) == 16
    assert frames_per_batch(make_trial(training_ratio=1024.0)) == 1


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1"])
def test_it_learns_once_b_x_t_env_steps_are_stored(env_id: str) -> None:
    trial = make_trial(env_id)
    learner = learner_for(trial)
    size = DREAMER_SIZES["nano"]
    assert learner.state_dim == size.categoricals * size.classes and learner.size.gru_units == size.gru_units
    assert learner.discrete == (env_id == "CartPole-v1")
    data = collect(learner, trial, REPLAYED + 16)
    before = world_model_weights(learner)
    trained, stats = learner.learn(data[:, : REPLAYED - 16])
    assert trained == 0 and learner.updates == 0 and stats[M.DIAG_UPDATES] == 0.0
    assert all(torch.equal(a, b) for a, b in zip(before, world_model_weights(learner), strict=True))
    # the batch that brings the stored env steps to B x T: an update per 16 env steps from there on
    trained, stats = learner.learn(data[:, REPLAYED - 16 :])
    assert learner.updates == 2 and trained == 2 * REPLAYED
    for name in CORE_NAMES:
        assert name in stats and math.isfinite(stats[name]), name
    assert stats[M.DIAG_UPDATES] == 2.0 and stats[M.DIAG_REPLAY_SIZE] == len(learner.buffer) > REPLAYED + 16
    assert any(not torch.equal(a, b) for a, b in zip(before, world_model_weights(learner), strict=True))


def test_the_replay_holds_the_papers_entries_in_windows_of_one_env() -> None:
    trial = make_trial()
    learner = learner_for(trial)
    data = collect(learner, trial, 200)
    learner.store(data)
    done = int(data["next", "done"].sum())
    held = learner.buffer[: len(learner.buffer)]
    # an episode of n steps is n + 1 entries: its first observation (no action, reward 0), then one per step
    assert len(held) == 200 + 1 + done
    first = held["is_first"].squeeze(-1)
    assert int(first.sum()) == 1 + done and int(held["is_terminal"].sum()) == done  # CartPole: terminations only
    assert (held["prev_action"][first] == 0).all() and (held["reward"][first] == 0).all()
    assert (held["prev_action"][~first].sum(-1) == 1).all()  # one-hot actions
    assert torch.equal(held["observation"][0], data["observation"][0, 0])
    for _ in range(5):
        window = learner.buffer.sample().reshape(4, 16)
        assert ((window["step"][:, 1:] - window["step"][:, :-1]) == 1).all()


def test_the_continuous_actor_learns_through_the_imagined_dynamics() -> None:
    trial = make_trial("Pendulum-v1")
    learner = learner_for(trial)
    learner.store(collect(learner, trial, REPLAYED))
    with torch.no_grad():  # a reward head that predicts something: the returns then depend on the actions
        for p in learner.reward_net.parameters():
            p.normal_(0.0, 0.5)
    stats = learner.update()
    assert stats["diag.actor_grad_norm"] > 0.0
    act = learner.act_fn(deterministic=True)
    action = act(collect(learner, trial, 1)["observation"][0, 0].numpy())
    assert action.shape == (1,) and -2.0 <= float(action[0]) <= 2.0


def test_image_observations_are_refused_in_one_line() -> None:
    trial = make_trial()
    with pytest.raises(ValueError, match=r"^torchrl: dreamer takes flat vector observations; CartPole-v1") as err:
        build_learner(trial=trial, obs_shape=(84, 84, 3), n_actions=2)
    assert "\n" not in str(err.value)


# -- checkpoints ----------------------------------------------------------------------------------------------------


def test_save_and_restore_round_trip_the_weights_and_the_replay(tmp_path: Path) -> None:
    trial = make_trial()
    learner = learner_for(trial)
    # one batch that brings the stored env steps past B x T owes its every env step (crossrl's core's rule):
    # 96 x 4 replayed / 64 per update
    learner.learn(collect(learner, trial, REPLAYED + 32))
    assert learner.updates == 6
    info = learner.save(tmp_path)
    assert info["files"] == ["learner.pt", REPLAY_DIR] and info["replay_size"] == len(learner.buffer)

    other = learner_for(make_trial())
    other.restore(tmp_path)
    for name, net in learner.networks().items():
        mine, theirs = net.state_dict(), other.networks()[name].state_dict()
        assert mine.keys() == theirs.keys()
        assert all(torch.equal(mine[k], theirs[k]) for k in mine), name
    slow, restored = learner.value_loss.target_value_model_params, other.value_loss.target_value_model_params
    assert all(torch.equal(slow.get(k), restored.get(k)) for k in slow.keys(True, True))
    assert torch.equal(learner.actor_loss.retnorm.high, other.actor_loss.retnorm.high)
    assert (
        learner.optims["world_model"].state_dict()["state"].keys()
        == other.optims["world_model"].state_dict()["state"].keys()
    )
    assert (other.updates, other._sampled, other._owed) == (learner.updates, learner._sampled, learner._owed)
    assert len(other.buffer) == len(learner.buffer)
    held, back = learner.buffer[: len(learner.buffer)], other.buffer[: len(other.buffer)]
    assert all(torch.equal(held[k], back[k]) for k in held.keys(True, True))
    # it trains on from there: the next 16 env steps owe one update
    trained, _ = other.learn(collect(other, trial, 16, seed=1))
    assert trained == REPLAYED and other.updates == 7


def test_a_checkpoint_without_the_replay_waits_for_b_x_t_entries(tmp_path: Path) -> None:
    trial = make_trial()
    learner = learner_for(trial)
    learner.learn(collect(learner, trial, REPLAYED))
    learner.save(tmp_path)
    other = learner_for(trial)
    other.restore(tmp_path, replay=False)
    assert len(other.buffer) == 0 and other.updates == 4  # 64 x 4 replayed / 64
    assert other.learn(collect(other, trial, 16, seed=1))[0] == 0  # 17 entries: not yet B x T
    assert other.learn(collect(other, trial, REPLAYED, seed=2))[0] > 0


# -- a tiny trial through the adapter -------------------------------------------------------------------------------


@pytest.mark.integration
@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1"])
def test_a_tiny_trial_finishes_with_points(env_id: str, tmp_path: Path) -> None:
    trial = make_trial(env_id, checkpoint=150).model_copy(update={"checkpoint_dir": str(tmp_path / "ck")})
    sink = ListSink(trial)
    TorchrlAdapter().run(trial, sink)  # returns: the trial finished
    points = sink.points
    # a point at the first collector batch (16 env steps) past each 100, the last at the budget's batch
    assert [p[M.ENV_STEPS_SAMPLED] for p in points] == [112, 224, 304], sink.messages[-3:]
    last = points[-1]
    for name in CORE_NAMES:
        assert math.isfinite(last[name]), name
    # learning starts with the batch that brings the env steps to B x T; then one update of 64 replayed entries
    # per 16 sampled
    assert last[M.DIAG_UPDATES] == (304 - REPLAYED) // 16 + 1
    assert last[M.ENV_STEPS_TRAINED] == last[M.DIAG_UPDATES] * REPLAYED
    native = next(m["config"] for m in sink.messages if m["kind"] == "native_config")
    assert native["collector"]["class"] == "Collector" and native["collector"]["kwargs"]["frames_per_batch"] == 16
    assert native["model_loss"]["kwargs"]["kl_mode"] == "separate"
    assert native["model_loss"]["kwargs"]["lambda_continue"] == 1.0
    assert set(native["hyperparams"]) == set(trial.hyperparams)
    if env_id == "CartPole-v1":
        assert any(M.EPISODE_RETURN_MEAN in p for p in points)
    # the final checkpoint plays through its recurrent state (crossrl evaluate), and export refuses it
    folders = sorted(checkpoints(Path(trial.checkpoint_dir or "")))
    assert folders
    act = load_policy(trial, folders[-1])
    env = make_torchrl_env(trial.env, 1)
    obs = env.reset()["observation"][0].numpy()
    env.close()
    act.reset()  # type: ignore[attr-defined]
    action = act(obs)
    assert isinstance(action, int) if env_id == "CartPole-v1" else action.shape == (1,)
    with pytest.raises(ValueError, match="recurrent state"):
        export_policy(trial, folders[-1])
