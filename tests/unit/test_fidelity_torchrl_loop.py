"""TorchRL's own PPO loop (crossrl.measure.fidelity.torchrl_loop) on a tiny CartPole trial, with the native config
crossrl's TorchRL adapter stores for the same trial; and its one-line refusals."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from crossrl.adapters.base import ListSink
from crossrl.adapters.torchrl.adapter import TorchrlAdapter
from crossrl.core import envguard
from crossrl.measure.fidelity import CONFIGS_ENV
from crossrl.measure.fidelity.torchrl_loop import TorchrlNativeLoop
from crossrl.orchestration.watch import TrialWatch
from crossrl.scenarios import metrics as M
from crossrl.scenarios.spec import ScenarioSpec, Trial

BATCH = 256


def make_trial(*, workers: int, env_steps: int, env_id: str = "CartPole-v1") -> Trial:
    spec = ScenarioSpec.model_validate(
        {
            "name": "fidelity-torchrl-loop",
            "env": {"id": env_id},
            "algorithm": {"name": "ppo", "hyperparams": {"train_batch": BATCH, "minibatch": 64, "epochs": 2}},
            "engines": ["torchrl"],
            "execution": {"workers": [workers], "envs_per_worker": 2},
            "budget": {"env_steps": env_steps},
            "seeds": [0],
        }
    )
    (trial,) = spec.trials()
    return trial


def store_adapter_config(workers: int, folder: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """What crossrl's TorchRL adapter reports as its native config for the trial (one batch of it is enough), written
    where the native loop reads it, as `crossrl fidelity` does."""
    sink = ListSink(make_trial(workers=workers, env_steps=BATCH))
    TorchrlAdapter().run(sink.trial, sink)
    config = next(m["config"] for m in sink.messages if m["kind"] == "native_config")
    (folder / "0.json").write_text(json.dumps(config))
    monkeypatch.setenv(CONFIGS_ENV, str(folder))
    return config


@pytest.mark.parametrize(
    "workers", [1, pytest.param(2, marks=pytest.mark.integration)], ids=["one-worker", "two-workers"]
)
def test_the_native_loop_trains_on_the_adapters_stored_settings(
    workers: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stored = store_adapter_config(workers, tmp_path, monkeypatch)
    trial = make_trial(workers=workers, env_steps=4 * BATCH)
    sink = ListSink(trial)
    TorchrlNativeLoop().run(trial, sink)

    kinds = [m["kind"] for m in sink.messages]
    assert kinds.index("native_config") < kinds.index("setup") < kinds.index("point")
    native = next(m["config"] for m in sink.messages if m["kind"] == "native_config")
    assert native["collector"]["class"] == stored["collector"]["class"]
    assert native["collector"]["num_workers"] == workers
    assert native["loss"]["kwargs"] == stored["loss"]["kwargs"]
    assert native["value_estimator"]["kwargs"] == stored["value_estimator"]["kwargs"]
    assert native["optimizer"] == stored["optimizer"] and native["grad_clip_norm"] == stored["grad_clip_norm"]

    steps = [p[M.ENV_STEPS_SAMPLED] for p in sink.points]
    assert steps == sorted(set(steps)) and steps[0] == BATCH, steps
    assert steps[-1] >= trial.budget.env_steps
    assert sink.exhausted
    for point in sink.points:
        for name in (M.POLICY_LOSS, M.VALUE_LOSS, M.ENTROPY):
            assert math.isfinite(point[name]), (name, point)
    assert sink.points[-1][M.EPISODES_TOTAL] > 0
    assert all(p[M.EPISODE_RETURN_MEAN] == p[M.EPISODE_LEN_MEAN] for p in sink.points if M.EPISODE_LEN_MEAN in p)


def test_without_the_stored_config_it_says_which_file_is_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(CONFIGS_ENV, str(tmp_path))
    trial = make_trial(workers=1, env_steps=BATCH)
    with pytest.raises(ValueError, match=f"no stored native config for seed 0 \\({tmp_path / '0.json'}\\)"):
        TorchrlNativeLoop().run(trial, ListSink(trial))


def test_a_continuous_action_env_is_refused_in_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = {
        "collector": {"class": "Collector", "kwargs": {"frames_per_batch": BATCH, "total_frames": -1}},
        "loss": {"class": "ClipPPOLoss", "kwargs": {}},
        "value_estimator": {"class": "GAE", "kwargs": {"gamma": 0.99, "lmbda": 0.95}},
        "optimizer": {"lr": 3e-4, "eps": 1e-8},
        "grad_clip_norm": 0.5,
    }
    (tmp_path / "0.json").write_text(json.dumps(config))
    monkeypatch.setenv(CONFIGS_ENV, str(tmp_path))
    trial = make_trial(workers=1, env_steps=BATCH, env_id="Pendulum-v1")
    with pytest.raises(ValueError, match="discrete-action envs"):
        TorchrlNativeLoop().run(trial, ListSink(trial))


def test_each_point_tells_the_stall_watchdog_that_envs_stepped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The native loop's envs are TorchRL's own, unguarded: its points are the watchdog's only sign of progress (else a
    trial training past budget.stall_seconds is ended FAILED as stalled)."""
    store_adapter_config(1, tmp_path, monkeypatch)
    watch = TrialWatch(tmp_path / "watch", stall_seconds=120)
    for name, value in watch.env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(envguard, "_channel", None)  # this process's channel, made anew with the watch folder
    watch.arm()
    trial = make_trial(workers=1, env_steps=2 * BATCH)
    TorchrlNativeLoop().run(trial, ListSink(trial))
    stepped = watch.last_step_at()
    assert stepped is not None and stepped >= watch.armed_at - 1  # type: ignore[operator]
    assert watch.stalled(now=stepped + 60) is None


def test_the_native_networks_start_as_the_specs_network_does() -> None:
    """Both sides of a fidelity check start from the same kind of network: orthogonal weights (gain sqrt(2) on the
    hidden layers, 0.01 on the policy's logits, 1.0 on the value), zero biases, as ``core.models.build_mlp``."""
    import torch

    from crossrl.measure.fidelity.torchrl_common import actor_critic

    _, _, policy_net, value_net = actor_critic(make_trial(workers=1, env_steps=BATCH))
    for net, out_gain in ((policy_net, 0.01), (value_net, 1.0)):
        linears = [m for m in net.modules() if isinstance(m, torch.nn.Linear)]
        assert [tuple(m.weight.shape) for m in linears] == [(64, 4), (64, 64), (2 if net is policy_net else 1, 64)]
        for i, layer in enumerate(linears):
            gain = out_gain if i == len(linears) - 1 else math.sqrt(2.0)
            w = layer.weight.detach()
            gram = w @ w.T if w.shape[0] <= w.shape[1] else w.T @ w  # orthogonal rows, or columns
            assert torch.allclose(gram, gain**2 * torch.eye(gram.shape[0]), atol=1e-4 * max(1.0, gain**2)), (i, gain)
            assert torch.count_nonzero(layer.bias) == 0
