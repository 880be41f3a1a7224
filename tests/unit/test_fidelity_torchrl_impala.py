"""TorchRL's own IMPALA loop (crossrl.measure.fidelity.torchrl_impala, run by TorchrlNativeLoop for impala) on a
tiny CartPole trial, with the native config crossrl's TorchRL adapter stores for the same trial; and its one-line
refusals."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path
from typing import Any

import pytest

from crossrl.adapters.base import ListSink
from crossrl.adapters.torchrl.adapter import TorchrlAdapter
from crossrl.measure.fidelity import CONFIGS_ENV
from crossrl.measure.fidelity.torchrl_loop import TorchrlNativeLoop
from crossrl.scenarios import metrics as M
from crossrl.scenarios.spec import ScenarioSpec, Trial

ENVS, FRAGMENT = 2, 50
WORKER_BATCH = ENVS * FRAGMENT  # the MultiAsyncCollector's frames_per_batch: one worker's batch
TRAIN_BATCH = 150  # not a multiple of the worker batch: the learner batch is 2 worker batches (200 env steps)
LEARNER_BATCH = 2 * WORKER_BATCH


def make_trial(*, workers: int, env_steps: int) -> Trial:
    spec = ScenarioSpec.model_validate(
        {
            "name": "fidelity-torchrl-impala",
            "env": {"id": "CartPole-v1"},
            "algorithm": {"name": "impala", "hyperparams": {"train_batch": TRAIN_BATCH, "rollout_fragment": FRAGMENT}},
            "engines": ["torchrl"],
            "execution": {"workers": [workers], "envs_per_worker": ENVS},
            "budget": {"env_steps": env_steps},
            "seeds": [0],
        }
    )
    (trial,) = spec.trials()
    return trial


def store_adapter_config(workers: int, folder: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """What crossrl's TorchRL adapter reports as its native config for the trial (one learner batch of it is
    enough), written where the native loop reads it, as `crossrl fidelity` does."""
    sink = ListSink(make_trial(workers=workers, env_steps=LEARNER_BATCH))
    TorchrlAdapter().run(sink.trial, sink)
    config = next(m["config"] for m in sink.messages if m["kind"] == "native_config")
    (folder / "0.json").write_text(json.dumps(config))
    monkeypatch.setenv(CONFIGS_ENV, str(folder))
    return config


def test_the_native_impala_loop_trains_on_the_adapters_stored_settings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    workers = 2
    stored = store_adapter_config(workers, tmp_path, monkeypatch)
    assert stored["collector"]["class"] == "MultiAsyncCollector"  # what the native loop must be given
    trial = make_trial(workers=workers, env_steps=3 * LEARNER_BATCH)
    sink = ListSink(trial)
    TorchrlNativeLoop().run(trial, sink)

    kinds = [m["kind"] for m in sink.messages]
    assert kinds.index("native_config") < kinds.index("setup") < kinds.index("point")
    native = next(m["config"] for m in sink.messages if m["kind"] == "native_config")
    collector_kwargs = dict(stored["collector"]["kwargs"])
    assert native["collector"] == {
        "class": "MultiAsyncCollector",
        "num_workers": collector_kwargs.pop("num_workers"),
        "kwargs": collector_kwargs,
    }
    assert native["collector"]["num_workers"] == workers
    assert native["loss"] == {"class": "A2CLoss", "kwargs": stored["loss"]["kwargs"]}
    assert native["value_estimator"]["class"] == "VTrace"
    assert native["value_estimator"]["kwargs"] == stored["value_estimator"]["kwargs"]
    assert native["optimizer"] == stored["optimizer"] and native["grad_clip_norm"] == stored["grad_clip_norm"]
    assert native["learner_batch"]["train_batch"] == stored["hyperparams"]["train_batch"]["value"] == TRAIN_BATCH
    assert native["learner_batch"]["worker_batches"] == 2 and native["learner_batch"]["env_steps"] == LEARNER_BATCH

    points = sink.points
    steps = [p[M.ENV_STEPS_SAMPLED] for p in points]
    assert steps == [WORKER_BATCH * (i + 1) for i in range(len(points))], steps  # a point per worker batch
    assert steps[-1] >= trial.budget.env_steps and sink.exhausted
    trained = [p[M.ENV_STEPS_TRAINED] for p in points]
    assert trained == [LEARNER_BATCH * ((i + 1) // 2) for i in range(len(points))], trained  # every batch learned
    updates = [p for p in points if M.POLICY_LOSS in p]
    assert len(updates) == len(points) // 2 >= 3
    for point in updates:
        for name in (M.POLICY_LOSS, M.VALUE_LOSS, M.ENTROPY, M.DIAG_GRAD_NORM):
            assert math.isfinite(point[name]), (name, point)
        assert 0 < point[M.ENTROPY] <= math.log(2) + 1e-6  # a categorical over CartPole's 2 actions
    assert points[-1][M.EPISODES_TOTAL] > 0
    assert all(p[M.EPISODE_RETURN_MEAN] == p[M.EPISODE_LEN_MEAN] for p in points if M.EPISODE_LEN_MEAN in p)


def _stored_config() -> dict[str, Any]:
    """The shape of the adapter's stored IMPALA config, for one local worker."""
    return {
        "collector": {
            "class": "MultiAsyncCollector",
            "kwargs": {"frames_per_batch": WORKER_BATCH, "total_frames": -1, "num_workers": 1},
        },
        "loss": {"class": "A2CLoss", "kwargs": {"entropy_coeff": 0.01, "critic_coeff": 0.5}},
        "value_estimator": {"class": "VTrace", "kwargs": {"gamma": 0.99}},
        "optimizer": {"class": "torch.optim.Adam", "lr": 5e-4, "eps": 1e-8},
        "grad_clip_norm": 40.0,
        "hyperparams": {"train_batch": {"value": TRAIN_BATCH}},
    }


@pytest.mark.parametrize(
    ("change", "says"),
    [
        (
            lambda c: c["collector"].update({"class": "MultiSyncCollector"}),
            "impala runs on MultiAsyncCollector, the stored collector is 'MultiSyncCollector'",
        ),
        (lambda c: c.pop("hyperparams"), "the stored native config has no hyperparams.train_batch.value"),
        (lambda c: c["optimizer"].update({"class": "torch.optim.RMSprop"}), "optimizer torch.optim.Adam, not"),
    ],
    ids=["sync-collector", "no-train-batch", "another-optimizer"],
)
def test_a_stored_config_it_cannot_run_is_refused_in_one_line(
    change: Any, says: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = copy.deepcopy(_stored_config())
    change(config)
    (tmp_path / "0.json").write_text(json.dumps(config))
    monkeypatch.setenv(CONFIGS_ENV, str(tmp_path))
    trial = make_trial(workers=1, env_steps=LEARNER_BATCH)
    sink = ListSink(trial)
    with pytest.raises(ValueError, match="torchrl-native") as raised:
        TorchrlNativeLoop().run(trial, sink)
    message = str(raised.value)
    assert says in message and str(tmp_path / "0.json") in message and "\n" not in message, message
    assert sink.messages == []  # refused before anything started
