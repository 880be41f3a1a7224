"""The pixel sampling bench: the limit contestant on a real MinAtar env, the conv model pixel envs default to, and
the table's two headline ratios (crossrl / the faster of RLlib and TorchRL, crossrl / the limit) and peak RSS."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from crossrl.measure.bench import commands
from crossrl.measure.bench.contestants import setup_limit
from crossrl.measure.bench.results import SpeedTable, print_speed_table, speed_rows
from crossrl.measure.bench.samplers import DEFAULT_MODEL, SamplerResult, default_model
from crossrl.scenarios import catalog
from crossrl.scenarios.loader import load
from crossrl.scenarios.spec import EnvSpec, ModelSpec

MINATAR = EnvSpec(id="MinAtar/Breakout-v1")
ATARI = EnvSpec(id="ALE/Breakout-v5")


def test_limit_contestant_steps_a_minatar_vector_env_through_the_conv_net() -> None:
    c = setup_limit(env_spec=MINATAR, workers=2, envs_per_worker=3, model=default_model(MINATAR), fragment=40)
    try:
        counts = [c.step() for _ in range(3)]
        # transitions: every env's steps but the autoreset steps after an episode ended (short with random play)
        assert all(0 < n <= 2 * 3 * 40 for n in counts) and sum(counts) > 2 * 3 * 40
        assert len(c.worker_pids()) == 2 and "build_net" in c.info["policy"]
    finally:
        c.close()


def test_limit_contestant_acts_for_an_mlp_and_refuses_a_multi_agent_env() -> None:
    c = setup_limit(env_spec=EnvSpec(id="Pendulum-v1"), workers=1, envs_per_worker=2, model=DEFAULT_MODEL, fragment=8)
    try:
        assert c.step() == 16  # Pendulum's episodes last 200 steps: no autoreset step in the first 8
        assert "numpy for an MLP" in c.info["policy"]
    finally:
        c.close()
    c = setup_limit(env_spec=EnvSpec(id="CartPole-v1"), workers=2, envs_per_worker=2, model=DEFAULT_MODEL, fragment=30)
    try:  # categorical actions (Gumbel-max on the numpy actor's logits); CartPole's episodes end within 30 steps
        counts = [c.step() for _ in range(3)]
        assert all(0 < n <= 2 * 2 * 30 for n in counts) and sum(counts) > 2 * 2 * 30
    finally:
        c.close()
    spread = EnvSpec(id="mpe2:simple_spread_v3", kwargs={"N": 3}, agents="shared")
    with pytest.raises(ValueError, match="multi-agent"):
        setup_limit(env_spec=spread, workers=1, envs_per_worker=1, model=DEFAULT_MODEL, fragment=8)


def test_pixel_envs_default_to_the_suites_conv_models() -> None:
    assert default_model(MINATAR) == ModelSpec(conv=((16, 3, 1),), hidden=(128,), activation="relu")
    assert default_model(ATARI) == ModelSpec(
        conv=((32, 8, 4), (64, 4, 2), (64, 3, 1)), hidden=(512,), activation="relu"
    )
    assert default_model(EnvSpec(id="CartPole-v1")) == DEFAULT_MODEL
    assert default_model(EnvSpec(id="MinAtar/Breakout-v1", preprocessing="none")) == DEFAULT_MODEL
    # one place: the built-in pixel scenarios use the catalog's models
    for name, kind in [("minatar-smoke", "minatar"), ("minatar-breakout-ppo", "minatar"), ("atari-smoke", "atari")]:
        spec, _ = load(name)
        assert spec.algorithm.model == ModelSpec.model_validate(catalog.PIXEL_MODELS[kind]), name


def test_bench_sampling_without_a_model_samples_a_pixel_env_with_the_conv_model(monkeypatch: Any) -> None:
    asked: list[dict[str, Any]] = []

    def fake_measure(engine: str, **kw: Any) -> SamplerResult:
        asked.append({"engine": engine, **kw})
        speed = {"limit": 1000.0, "crossrl": 900.0, "rllib": 300.0, "torchrl": 400.0, "raw": 5000.0}[engine]
        rss = [300.0, 310.0] if engine != "torchrl" else [500.0, 505.0]
        return SamplerResult(engine, kw["workers"], kw["envs_per_worker"], [speed], peak_rss_mb=rss, fragment=250)

    monkeypatch.setattr(commands, "measure", fake_measure)
    table = commands.bench_sampling(env_id="MinAtar/Breakout-v1", workers=(2,), repeat=1, seconds=0.1)
    assert [a["engine"] for a in asked] == list(commands.SAMPLING_ENGINES)  # limit among the defaults
    assert all(a["model"] == default_model(MINATAR) and a["rss"] for a in asked)
    assert table.conditions["model"]["conv"] == [[16, 3, 1]]
    assert table.conditions["network"] == "conv [[16, 3, 1]] hidden [128] relu"  # in the table's title
    (h,) = table.headlines()
    assert h.faster_other == "torchrl" and h.ratio_to_faster_other == pytest.approx(900 / 400)
    assert h.ratio_to_limit == pytest.approx(0.9)


def test_the_table_prints_both_ratios_and_peak_rss_per_worker(tmp_path: Path) -> None:
    from rich.console import Console

    def r(engine: str, speed: float, rss: list[float]) -> SamplerResult:
        return SamplerResult(engine, 2, 8, [speed], peak_rss_mb=rss, fragment=250)

    results = [
        r("limit", 2000.0, [250.0, 251.0]),
        r("crossrl", 1700.0, [380.0, 390.0]),
        r("rllib", 600.0, [700.0, 710.0]),
        r("torchrl", 800.0, [450.0, 460.0]),
        r("crossrl", 1800.0, [385.0, 388.0]),  # a second round: the median, and each worker's highest RSS
    ]
    table = SpeedTable(kind="sampling", env_id="MinAtar/Breakout-v1", rows=speed_rows(results))
    crossrl = table.row("crossrl", 2)
    assert crossrl.median == 1750.0 and crossrl.peak_rss_mb == [385.0, 390.0]
    assert crossrl.ratio_to_limit == pytest.approx(0.875)
    con = Console(record=True, width=300)
    print_speed_table(table, console=con)
    text = con.export_text()
    assert "x limit" in text and "peak RSS MiB per worker" in text and "385, 390" in text and "700, 710" in text
    assert "crossrl / faster of rllib, torchrl (torchrl): 2.19" in text and "crossrl / limit: 0.88" in text
    metrics = table.metrics()
    assert metrics["crossrl.w2.ratio_to_limit"] == pytest.approx(0.875)
    assert metrics["crossrl.w2.ratio_to_faster_other"] == pytest.approx(1750 / 800)
    assert metrics["rllib.w2.peak_rss_mb_max"] == 710.0
    doc = table.to_dict()
    assert doc["headlines"][0]["faster_other"] == "torchrl"
    assert table.to_json(tmp_path / "t.json").exists()


def test_crossrl_conv_acting_gives_the_batch_stepwise_acting_gives(monkeypatch: Any) -> None:
    """The conv fragment actor (actor per step, noise per fragment, values after the loop in batches) samples the same
    actions as ``compute_actions`` step by step for the same seed, with the same columns and values."""
    import numpy as np

    from crossrl.core.actor_critic import ActorCriticPolicy, ConvFragmentActor
    from crossrl.core.algorithms.ppo import PPOPolicy
    from crossrl.core.evaluator import PolicyEvaluator
    from crossrl.core.policy import Policy, PolicySpec, StepwiseActor

    hp = {**catalog.CROSSRL_SETTINGS["ppo"], **catalog.HYPERPARAM_DEFAULTS["ppo"]}
    factory = PolicySpec(policy_cls=PPOPolicy, hyperparams=hp, model=default_model(MINATAR))

    def batches() -> list[Any]:
        ev = PolicyEvaluator(env_spec=MINATAR, num_envs=3, policy_factory=factory, seed=7, worker_index=0)
        return [ev.sample(num_steps=40) for _ in range(3)]  # episodes end inside: autoreset rows too

    assert isinstance(factory(**_spaces(), seed=0).fragment_actor(num_steps=2, num_envs=3), ConvFragmentActor)
    new = batches()
    monkeypatch.setattr(ActorCriticPolicy, "fragment_actor", Policy.fragment_actor)
    assert isinstance(factory(**_spaces(), seed=0).fragment_actor(num_steps=2, num_envs=3), StepwiseActor)
    old = batches()
    for a, b in zip(new, old, strict=True):
        assert sorted(a) == sorted(b)
        assert a["obs"].dtype == np.uint8 and a["obs"].shape == (40, 3, 10, 10, 4)
        for k in b:
            assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape, k
            if b[k].dtype.kind in "biu":
                np.testing.assert_array_equal(a[k], b[k], err_msg=k)
            else:
                np.testing.assert_allclose(a[k], b[k], rtol=1e-5, atol=1e-6, err_msg=k)
        assert a.episode_returns == b.episode_returns


def _spaces() -> dict[str, Any]:
    from crossrl.core.envs import make_env

    env = make_env(MINATAR)
    return {"observation_space": env.observation_space, "action_space": env.action_space}


@pytest.mark.parametrize("kind", ["minatar", "atari", "mlp"])
def test_inference_forward_is_the_modules_forward_bit_for_bit(kind: str) -> None:
    import torch

    from crossrl.core.models import build_net, inference_forward

    if kind == "mlp":
        shape, model, x = (6,), ModelSpec(hidden=(16, 16), activation="tanh"), torch.randn(5, 6)
    else:
        shape = (10, 10, 4) if kind == "minatar" else (84, 84, 4)
        model = ModelSpec.model_validate(catalog.PIXEL_MODELS[kind])
        x = torch.randint(0, 256, (3, *shape), dtype=torch.uint8)
    net = build_net(obs_shape=shape, out_dim=4, model=model)
    forward = inference_forward(net)
    with torch.inference_mode():
        assert torch.equal(forward(x), net(x))
        with torch.no_grad():  # new weights loaded into the module apply
            for p in net.parameters():
                p.add_(0.01)
        assert torch.equal(forward(x), net(x))
