"""TorchRL's own SAC loop (crossrl.measure.fidelity.torchrl_sac, run by TorchrlNativeLoop for sac) on a tiny Pendulum
trial, with the native config crossrl's TorchRL adapter stores for the same trial; its envs and networks; and its
one-line refusals."""

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

FRAGMENT = 50  # one env per worker: a collector batch of 50 env steps per worker
LEARNING_STARTS = 300  # a whole number of batches: the collector's init_random_frames as stored
TRAIN_BATCH = 32
BUFFER = 2000  # below the budget: the replay must hold the stored capacity, not every transition
UPDATES_PER_STEP = 0.125  # 6.25 updates per batch: the fraction carried (6, 6, 6, 7, ...), exact in floats
EPISODE = 200  # Pendulum-v1's TimeLimit


def make_trial(*, workers: int, env_steps: int) -> Trial:
    spec = ScenarioSpec.model_validate(
        {
            "name": "fidelity-torchrl-sac",
            "env": {"id": "Pendulum-v1"},
            "algorithm": {
                "name": "sac",
                "hyperparams": {
                    "learning_starts": LEARNING_STARTS,
                    "train_batch": TRAIN_BATCH,
                    "buffer_size": BUFFER,
                    "updates_per_step": UPDATES_PER_STEP,
                    "rollout_fragment": FRAGMENT,
                    "alpha_lr": 3.0e-3,
                },
                "model": {"hidden": [32, 32], "activation": "relu"},
            },
            "engines": ["torchrl"],
            "execution": {"workers": [workers], "envs_per_worker": 1},
            "budget": {"env_steps": env_steps},
            "seeds": [0],
        }
    )
    (trial,) = spec.trials()
    return trial


def store_adapter_config(workers: int, folder: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """What crossrl's TorchRL adapter reports as its native config for the trial (one collector batch of it is
    enough: the config is reported before training), written where the native loop reads it, as `crossrl fidelity`
    does."""
    sink = ListSink(make_trial(workers=workers, env_steps=FRAGMENT * workers))
    TorchrlAdapter().run(sink.trial, sink)
    config = next(m["config"] for m in sink.messages if m["kind"] == "native_config")
    (folder / "0.json").write_text(json.dumps(config))
    monkeypatch.setenv(CONFIGS_ENV, str(folder))
    return config


def expected_updates(batches: int, batch_frames: int) -> list[int]:
    """Updates after each batch by the adapter's rule: none before ``LEARNING_STARTS`` env steps, then
    ``UPDATES_PER_STEP`` per new env step, the fraction carried."""
    owed, updates, out = 0.0, 0, []
    for i in range(1, batches + 1):
        if i * batch_frames >= LEARNING_STARTS:
            owed += batch_frames * UPDATES_PER_STEP * TRAIN_BATCH
            while owed >= TRAIN_BATCH:
                owed -= TRAIN_BATCH
                updates += 1
        out.append(updates)
    return out


def test_the_native_sac_loop_trains_on_the_adapters_stored_settings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stored = store_adapter_config(1, tmp_path, monkeypatch)
    assert stored["collector"]["class"] == "Collector"
    assert stored["collector"]["kwargs"]["init_random_frames"] == LEARNING_STARTS
    budget = 2500  # points at 1000 and 2000 env steps (crossrl's replay interval) and at the budget
    trial = make_trial(workers=1, env_steps=budget)
    sink = ListSink(trial)
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
    assert native["loss"]["class"] == "SACLoss" and native["loss"]["kwargs"] == stored["loss"]["kwargs"]
    assert native["loss"]["target_entropy"] == stored["loss"]["target_entropy"] == -1.0  # 'auto': -(action dims)
    assert native["value_estimator"] == {"class": "TD0Estimator", "kwargs": stored["value_estimator"]["kwargs"]}
    assert native["target_network"]["kwargs"] == stored["target_network"]["kwargs"] == {"tau": 0.005}
    assert native["optimizers"] == stored["optimizers"]
    assert native["optimizers"]["alpha"]["lr"] == 3.0e-3 and native["grad_clip_norm"] is None
    replay = {k: native["replay_buffer"][k] for k in ("storage", "batch_size", "keys")}
    assert replay == {k: stored["replay_buffer"][k] for k in ("storage", "batch_size", "keys")}
    assert replay["storage"] == f"LazyTensorStorage({BUFFER})" and replay["batch_size"] == TRAIN_BATCH
    assert native["init_random_frames"] == LEARNING_STARTS
    assert native["updates_per_step"] == stored["updates_per_step"] == UPDATES_PER_STEP
    assert native["actor"]["scale"] == stored["actor"]["scale"]
    assert "ActionScaling()" in native["env"]  # env.actions: unit, as the adapter's env

    points = sink.points
    steps = [p[M.ENV_STEPS_SAMPLED] for p in points]
    assert steps == [1000, 2000, budget] and sink.exhausted, steps
    updates = expected_updates(budget // FRAGMENT, FRAGMENT)
    at_points = [updates[int(s) // FRAGMENT - 1] for s in steps]
    assert [p[M.DIAG_UPDATES] for p in points] == at_points
    assert [p[M.ENV_STEPS_TRAINED] for p in points] == [TRAIN_BATCH * n for n in at_points]
    assert updates[LEARNING_STARTS // FRAGMENT - 2] == 0 < updates[LEARNING_STARTS // FRAGMENT - 1]
    assert [p[M.DIAG_REPLAY_SIZE] for p in points] == [min(s, BUFFER) for s in steps]
    for point in points:
        for name in (M.VALUE_LOSS, M.POLICY_LOSS, M.ENTROPY, M.DIAG_ALPHA, M.DIAG_ALPHA_LOSS):
            assert math.isfinite(point[name]), (name, point)
        assert 0 < point[M.DIAG_ALPHA] < 1.0  # the temperature is learned down from alpha_init 1
        assert point[M.EPISODE_LEN_MEAN] == EPISODE
    assert points[-1][M.DIAG_ALPHA] < points[0][M.DIAG_ALPHA]
    assert points[-1][M.EPISODES_TOTAL] == budget // EPISODE
    assert sum(p[M.EPISODES_THIS_POINT] for p in points) == budget // EPISODE  # each episode in one point


def test_the_env_maps_the_policys_unit_actions_to_the_envs_bounds() -> None:
    """The policy acts in [-1, 1] and TorchRL's ``ActionScaling`` maps its actions to Pendulum's [-2, 2] (as
    gymnasium's RescaleAction does on the adapter's side); the batch keeps the policy's action."""
    import torch

    from crossrl.measure.fidelity.torchrl_sac import make_sac_env

    env = make_sac_env("Pendulum-v1", {}, 1, True)
    try:
        spec = env.action_spec
        assert spec.space.low.flatten().tolist() == [-1.0] and spec.space.high.flatten().tolist() == [1.0]
        assert env.base_env.action_spec.space.high.flatten().tolist() == [2.0]
        td = env.reset()
        td["action"] = torch.full(spec.shape, 0.5)
        out = env.step(td)
        assert out["action"].flatten().tolist() == [0.5]
        assert env.transform[0].scale.flatten().tolist() == [2.0] and env.transform[0].loc.flatten().tolist() == [0]
    finally:
        env.close(raise_if_closed=False)


def test_the_native_networks_start_as_the_adapters_and_sacloss_keeps_both_critics() -> None:
    """The actor and each critic initialised as the spec's network (orthogonal, gain sqrt(2) hidden, 0.01 on the
    actor's output, 1.0 on a critic's, zero biases); the two critics handed to SACLoss as a list keep those weights
    (handed one critic, SACLoss would re-sample both copies uniformly)."""
    import torch
    from torchrl.objectives import SACLoss

    from crossrl.measure.fidelity.torchrl_sac import actor_critics

    actor, critics, actor_mlp, critic_mlps = actor_critics(make_trial(workers=1, env_steps=FRAGMENT), (-5.0, 2.0))
    for net, out_gain, shapes in (
        (actor_mlp, 0.01, [(32, 3), (32, 32), (2, 32)]),
        (critic_mlps[0], 1.0, [(32, 4), (32, 32), (1, 32)]),
        (critic_mlps[1], 1.0, [(32, 4), (32, 32), (1, 32)]),
    ):
        linears = [m for m in net.modules() if isinstance(m, torch.nn.Linear)]
        assert [tuple(m.weight.shape) for m in linears] == shapes
        for i, layer in enumerate(linears):
            gain = out_gain if i == len(linears) - 1 else math.sqrt(2.0)
            w = layer.weight.detach()
            gram = w @ w.T if w.shape[0] <= w.shape[1] else w.T @ w
            assert torch.allclose(gram, gain**2 * torch.eye(gram.shape[0]), atol=1e-4 * max(1.0, gain**2)), (i, gain)
            assert torch.count_nonzero(layer.bias) == 0
    loss = SACLoss(actor, critics, num_qvalue_nets=2, delay_qvalue=True)
    first = [m for m in critic_mlps[0].modules() if isinstance(m, torch.nn.Linear)][0].weight
    second = [m for m in critic_mlps[1].modules() if isinstance(m, torch.nn.Linear)][0].weight
    stacked = next(v for k, v in loss.qvalue_network_params.flatten_keys().items() if k.endswith("0.weight"))
    assert torch.equal(stacked[0], first.detach()) and torch.equal(stacked[1], second.detach())
    assert not torch.equal(first, second)


def _stored_config() -> dict[str, Any]:
    """The shape of the adapter's stored SAC config, for one local worker."""
    return {
        "collector": {
            "class": "Collector",
            "kwargs": {"frames_per_batch": FRAGMENT, "total_frames": -1, "init_random_frames": LEARNING_STARTS},
        },
        "loss": {"class": "SACLoss", "kwargs": {"num_qvalue_nets": 2, "loss_function": "l2"}},
        "value_estimator": {"class": "TD0Estimator", "kwargs": {"gamma": 0.99}},
        "target_network": {"class": "SoftUpdate", "kwargs": {"tau": 0.005}},
        "actor": {"distribution": "TanhNormal(low=-1, high=1)", "scale": "exp(clamp(log_std, -5.0, 2.0))"},
        "replay_buffer": {"class": "ReplayBuffer", "storage": "LazyTensorStorage(2000)", "sampler": "RandomSampler",
                          "batch_size": TRAIN_BATCH, "keys": ["observation", "action"]},
        "updates_per_step": 1.0,
        "optimizers": {name: {"class": "torch.optim.Adam", "lr": 3e-4, "eps": 1e-8}
                       for name in ("actor", "critic", "alpha")},
        "grad_clip_norm": None,
    }  # fmt: skip


@pytest.mark.parametrize(
    ("change", "says"),
    [
        (
            lambda c: c["collector"].update({"class": "MultiAsyncCollector"}),
            "sac runs on Collector or MultiSyncCollector, the stored collector is 'MultiAsyncCollector'",
        ),
        (
            lambda c: c["replay_buffer"].update({"sampler": "PrioritizedSampler(alpha=0.6, beta=0.4)"}),
            "samples its replay uniformly (RandomSampler)",
        ),
        (lambda c: c["optimizers"]["critic"].update({"class": "torch.optim.RMSprop"}), "optimizers.critic.class"),
        (lambda c: c.update({"grad_clip_norm": 10.0}), "the stored grad_clip_norm is 10.0"),
        (lambda c: c["collector"]["kwargs"].pop("init_random_frames"), "no collector.kwargs.init_random_frames"),
    ],
    ids=["async-collector", "prioritized-replay", "another-optimizer", "grad-clip", "no-random-frames"],
)
def test_a_stored_config_it_cannot_run_is_refused_in_one_line(
    change: Any, says: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = copy.deepcopy(_stored_config())
    change(config)
    (tmp_path / "0.json").write_text(json.dumps(config))
    monkeypatch.setenv(CONFIGS_ENV, str(tmp_path))
    trial = make_trial(workers=1, env_steps=FRAGMENT)
    sink = ListSink(trial)
    with pytest.raises(ValueError, match="torchrl-native") as raised:
        TorchrlNativeLoop().run(trial, sink)
    message = str(raised.value)
    assert says in message and str(tmp_path / "0.json") in message and "\n" not in message, message
    assert sink.messages == []  # refused before anything started
