"""TorchRL's own DreamerV3 loop (crossrl.measure.fidelity.torchrl_dreamer, run by TorchrlNativeLoop for dreamer) on a
tiny CartPole trial at the nano model, with the native config crossrl's TorchRL adapter stores for the same trial; its
acting state across episodes; and its one-line refusals."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path
from typing import Any

import pytest

from crossrl.adapters.base import ListSink
from crossrl.adapters.torchrl.adapter import TorchrlAdapter, frames_per_batch
from crossrl.measure.fidelity import CONFIGS_ENV, torchrl_dreamer
from crossrl.measure.fidelity.torchrl_loop import TorchrlNativeLoop
from crossrl.scenarios import metrics as M
from crossrl.scenarios.spec import ScenarioSpec, Trial

B, T = 4, 16  # 64 replayed transitions per update
RATIO = 16.0  # one update per 4 env steps: the adapter's frames_per_batch is B x T / ratio = 4
BUFFER = 400  # below the budget: the replay must hold the stored capacity, not every transition
BUDGET = 600  # points at 500 env steps (the stored point_env_steps) and at the budget
CRITIC_LR = 7.0e-5  # written over the stored critic lr: the loop must take it from the stored config, not the trial


def make_trial(*, env_steps: int, workers: int = 1) -> Trial:
    spec = ScenarioSpec.model_validate(
        {
            "name": "fidelity-torchrl-dreamer",
            "env": {"id": "CartPole-v1"},
            "algorithm": {
                "name": "dreamer",
                "hyperparams": {
                    "model_size": "nano",
                    "batch_size_B": B,
                    "batch_length_T": T,
                    "horizon_H": 5,
                    "training_ratio": RATIO,
                    "buffer_size": BUFFER,
                },
            },
            "engines": ["torchrl"],
            "execution": {"workers": [workers], "envs_per_worker": 1},
            "budget": {"env_steps": env_steps},
            "seeds": [0],
        }
    )
    (trial,) = spec.trials()
    return trial


def store_adapter_config(folder: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """What crossrl's TorchRL adapter reports as its native config for the trial (one collector batch of it is
    enough: the config is reported before training), written where the native loop reads it, as `crossrl fidelity`
    does, with the critic's lr changed to :data:`CRITIC_LR`."""
    trial = make_trial(env_steps=frames_per_batch(make_trial(env_steps=1)))
    sink = ListSink(trial)
    TorchrlAdapter().run(trial, sink)
    config = next(m["config"] for m in sink.messages if m["kind"] == "native_config")
    config["optimizers"]["critic"]["lr"] = CRITIC_LR
    (folder / "0.json").write_text(json.dumps(config))
    monkeypatch.setenv(CONFIGS_ENV, str(folder))
    return config


def expected_updates(batches: int, batch_frames: int, learning_starts: int) -> list[int]:
    """Updates after each batch by the adapter's rule: none before ``learning_starts`` env steps, then
    ``B x T`` replayed transitions owed per ``B x T / RATIO`` env steps sampled, the fraction carried."""
    owed, updates, out = 0.0, 0, []
    for i in range(1, batches + 1):
        if i * batch_frames >= learning_starts:
            owed += batch_frames * RATIO
            while owed >= B * T:
                owed -= B * T
                updates += 1
        out.append(updates)
    return out


def test_the_native_dreamer_loop_trains_on_the_adapters_stored_settings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stored = store_adapter_config(tmp_path, monkeypatch)
    fpb = stored["collector"]["kwargs"]["frames_per_batch"]
    assert stored["collector"]["class"] == "Collector" and fpb == B * T / RATIO == 4
    assert stored["learning_starts_env_steps"] == B * T and stored["training_ratio"] == RATIO
    trial = make_trial(env_steps=BUDGET)
    sink = ListSink(trial)
    beats: list[int] = []
    monkeypatch.setattr(torchrl_dreamer, "beat", lambda: beats.append(1))
    TorchrlNativeLoop().run(trial, sink)

    kinds = [m["kind"] for m in sink.messages]
    assert kinds.index("native_config") < kinds.index("setup") < kinds.index("point")
    native = next(m["config"] for m in sink.messages if m["kind"] == "native_config")
    collector_kwargs = dict(stored["collector"]["kwargs"])
    assert native["collector"] == {
        "class": "Collector",
        "num_workers": collector_kwargs.pop("num_workers", 1),
        "kwargs": collector_kwargs,
    }
    for part in ("prior", "posterior", "mlp"):
        assert native["world_model"][part] == stored["world_model"][part], part
    assert native["world_model"]["prior"]["hidden_dim"] == 16 and native["world_model"]["mlp"]["depth"] == 1  # nano
    # the same networks on both sides: TorchRL's modules at the stored widths, as many parameters as the adapter's
    assert native["params"] == {"world_model": stored["world_model"]["params"], "actor": stored["actor"]["params"],
                                "critic": stored["value_loss"]["params"]}  # fmt: skip
    model_kwargs = native["model_loss"]["kwargs"]
    assert {k: model_kwargs[k] for k in stored["model_loss"]["kwargs"]} == stored["model_loss"]["kwargs"]
    assert model_kwargs["kl_mode"] == "separate" and model_kwargs["lambda_continue"] == 1.0
    assert native["actor_loss"]["kwargs"] == stored["actor_loss"]["kwargs"]
    assert native["actor_loss"]["kwargs"]["imagination_horizon"] == 5
    assert native["actor_loss"]["value_estimator"]["gamma"] == stored["actor_loss"]["value_estimator"]["gamma"]
    assert native["actor_loss"]["value_estimator"]["lmbda"] == stored["actor_loss"]["value_estimator"]["lmbda"]
    value_kwargs = native["value_loss"]["kwargs"]
    assert {k: value_kwargs[k] for k in stored["value_loss"]["kwargs"]} == stored["value_loss"]["kwargs"]
    assert native["value_loss"]["slow_critic"] == stored["value_loss"]["slow_critic"]
    assert native["optimizers"] == stored["optimizers"]  # read from the optimizers built
    assert native["optimizers"]["critic"]["lr"] == CRITIC_LR != trial.hyperparams["critic_lr"]
    assert native["optimizers"]["world_model"]["grad_clip_norm"] == 1000.0
    assert native["replay_buffer"]["storage"] == stored["replay_buffer"]["storage"] == f"LazyTensorStorage({BUFFER})"
    assert native["replay_buffer"]["windows"] == B and f"slice_len={T}," in native["replay_buffer"]["sampler"]
    assert native["point_env_steps"] == stored["point_env_steps"] == 500

    points = sink.points
    steps = [p[M.ENV_STEPS_SAMPLED] for p in points]
    assert steps == [500, BUDGET] and sink.exhausted, steps
    updates = expected_updates(BUDGET // fpb, fpb, B * T)
    at_points = [updates[int(s) // fpb - 1] for s in steps]
    assert at_points == [110, 135]  # one update per 4 env steps from the 64th
    assert [p[M.DIAG_UPDATES] for p in points] == at_points
    # the stall watchdog hears from every update, not only from each point: the first batch past learning_starts
    # owes the updates of every env step stored so far (a native trial ended FAILED as stalled in that catch-up)
    assert len(beats) >= at_points[-1] + len(points)
    assert [p[M.ENV_STEPS_TRAINED] for p in points] == [B * T * n for n in at_points]
    assert [p[M.DIAG_REPLAY_SIZE] for p in points] == [min(s, BUFFER) for s in steps]
    for point in points:
        for name in (M.VALUE_LOSS, M.POLICY_LOSS, M.ENTROPY, M.DIAG_WORLD_MODEL_LOSS):
            assert math.isfinite(point[name]), (name, point)
        assert 0 < point[M.ENTROPY] <= math.log(2) + 1e-6  # two actions
        assert 8 <= point[M.EPISODE_LEN_MEAN] <= 500
    episodes = sum(p[M.EPISODES_THIS_POINT] for p in points)
    assert episodes == points[-1][M.EPISODES_TOTAL] > 5  # each finished episode in one point
    assert points[-1][M.DIAG_WORLD_MODEL_LOSS] < points[0][M.DIAG_WORLD_MODEL_LOSS]  # the world model learns


def test_the_acting_state_is_carried_and_reset_at_each_episode_start() -> None:
    """The env's primer carries the policy's recurrent state from step to step and zeroes it at a reset; the policy
    writes the next ``previous_action`` (the one-hot action it took)."""
    import torch

    from crossrl.measure.fidelity.torchrl_dreamer import make_dreamer_env

    env = make_dreamer_env("CartPole-v1", {}, 1, state_dim=16, belief_dim=16, act_dim=2)
    try:
        td = env.reset()
        assert bool(td["is_init"].all()) and torch.count_nonzero(td["belief"]) == 0
        td["action"] = torch.tensor([[1, 0]])
        td["belief"] = torch.ones(1, 16)
        td["previous_action"] = torch.tensor([[1.0, 0.0]])
        out = env.step(td)["next"]
        assert not bool(out["is_init"].any())
        assert torch.equal(out["belief"], torch.ones(1, 16))  # carried to the next step
        assert out["previous_action"].tolist() == [[1.0, 0.0]]
        again = env.reset()
        assert torch.count_nonzero(again["belief"]) == 0 and bool(again["is_init"].all())
    finally:
        env.close(raise_if_closed=False)


def _stored_config() -> dict[str, Any]:
    """The shape of the adapter's stored dreamer config, for one local worker."""
    adam = {"class": "torch.optim.Adam", "lr": 1e-4, "eps": 1e-8, "grad_clip_norm": 100.0}
    return {
        "collector": {"class": "Collector", "kwargs": {"frames_per_batch": 4, "total_frames": -1}},
        "world_model": {
            "prior": {"class": "RSSMPriorV3", "recurrent_model": "block_gru", "num_blocks": 8, "hidden_dim": 16,
                      "rnn_hidden_dim": 16, "num_categoricals": 4, "num_classes": 4, "unimix": 0.01,
                      "prior_num_layers": 1},
            "posterior": {"class": "RSSMPosteriorV3", "use_rms_norm": True, "unimix": 0.01, "hidden_dim": 16,
                          "rnn_hidden_dim": 16, "obs_embed_dim": 16, "num_layers": 1, "num_categoricals": 4,
                          "num_classes": 4},
            "mlp": {"class": "DreamerV3MLP", "depth": 1, "num_cells": 16, "two_hot_bins": 255},
            "params": 1,
        },
        "model_loss": {"class": "DreamerV3ModelLoss", "kwargs": {"kl_mode": "separate"}},
        "actor": {"class": "DreamerV3DiscreteActor", "distribution": "OneHotCategorical, 1 % uniform", "params": 1},
        "actor_loss": {"class": "DreamerV3ActorLoss", "kwargs": {"imagination_horizon": 5},
                       "value_estimator": {"class": "TDLambdaEstimator", "gamma": 0.997, "lmbda": 0.95}},
        "value_loss": {"class": "DreamerV3ValueLoss", "kwargs": {"value_loss": "two_hot", "slow_critic_regularization": 1.0},
                       "slow_critic": {"class": "SoftUpdate", "eps": 0.98}, "params": 1},
        "optimizers": {name: dict(adam) for name in ("world_model", "actor", "critic")},
        "replay_buffer": {"class": "ReplayBuffer", "storage": "LazyTensorStorage(400)",
                          "sampler": "SliceSampler(slice_len=16, traj_key='stream', step_key='step', fragmented=True, "
                                     "init_key=None, truncated_key=None, strict_length=True)", "windows": 4},
        "training_ratio": RATIO,
        "learning_starts_env_steps": 64,
        "point_env_steps": 500,
    }  # fmt: skip


@pytest.mark.parametrize(
    ("change", "says"),
    [
        (
            lambda c: c["collector"].update({"class": "MultiAsyncCollector"}),
            "dreamer runs on Collector or MultiSyncCollector, the stored collector is 'MultiAsyncCollector'",
        ),
        (
            lambda c: c["actor"].update({"class": "ProbabilisticTensorDictSequential"}),
            "needs the stored actor.class DreamerV3DiscreteActor",
        ),
        (lambda c: c["world_model"].pop("mlp"), "no world_model.mlp"),
        (
            lambda c: c["replay_buffer"].update({"sampler": "RandomSampler"}),
            "cannot read the stored replay_buffer.storage or its fragmented SliceSampler",
        ),
        (lambda c: c.pop("training_ratio"), "no training_ratio"),
        (lambda c: None, "builds networks of"),  # the stored parameter counts are not the native networks'
    ],
    ids=["async-collector", "box-actor", "old-config", "another-sampler", "no-ratio", "other-networks"],
)
def test_a_stored_config_it_cannot_run_is_refused_in_one_line(
    change: Any, says: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = copy.deepcopy(_stored_config())
    change(config)
    (tmp_path / "0.json").write_text(json.dumps(config))
    monkeypatch.setenv(CONFIGS_ENV, str(tmp_path))
    trial = make_trial(env_steps=4)
    sink = ListSink(trial)
    with pytest.raises(ValueError, match="torchrl-native") as raised:
        TorchrlNativeLoop().run(trial, sink)
    message = str(raised.value)
    assert says in message and str(tmp_path / "0.json") in message and "\n" not in message, message
    assert sink.messages == []  # refused before anything started
