"""Each sampler returns positive throughput for 1 worker x 2 envs over about 1 s, in its own process."""

from __future__ import annotations

import pytest

from crossrl.measure.bench.contestants import time_windows
from crossrl.measure.bench.samplers import SAMPLERS, BenchError, measure
from crossrl.scenarios.spec import EnvSpec

CARTPOLE = EnvSpec(id="CartPole-v1")


def _check(engine: str, **kw: object) -> None:
    res = SAMPLERS[engine](env_spec=CARTPOLE, workers=1, envs_per_worker=2, seconds=1.0, warmup_s=0.2, **kw)
    assert res.engine == engine and (res.workers, res.envs_per_worker) == (1, 2)
    assert len(res.steps_per_s) == 1 and res.steps_per_s[0] > 0


def test_time_windows_counts_whole_iterations() -> None:
    calls = []

    def step() -> int:
        calls.append(1)
        return 10

    rates = time_windows(step, warmup_s=0.0, seconds=0.01, windows=2)
    assert len(rates) == 2 and all(r > 0 for r in rates)
    assert len(calls) >= 3  # one warm-up call, then at least one per window


def test_raw_sampler() -> None:
    _check("raw")


def test_failing_measurement_reports_its_log() -> None:
    with pytest.raises(BenchError, match="unknown contestant"):
        measure("nope", env_spec=CARTPOLE, workers=1, envs_per_worker=2, seconds=1.0)


@pytest.mark.integration
def test_crossrl_sampler_and_rss() -> None:
    res = measure("crossrl", env_spec=CARTPOLE, workers=1, envs_per_worker=2, seconds=1.0, warmup_s=0.2, rss=True)
    assert res.steps_per_s[0] > 0
    assert res.peak_rss_mb is not None and len(res.peak_rss_mb) == 1 and 50 < res.peak_rss_mb[0] < 2000


@pytest.mark.integration
@pytest.mark.parametrize("transport", ["calls", "stream"])
def test_crossrl_async_sampler(transport: str) -> None:
    res = measure("crossrl", env_spec=CARTPOLE, workers=2, envs_per_worker=2, seconds=1.0, warmup_s=0.2,
                  optimizer="async_samples", transport=transport)  # fmt: skip
    assert res.steps_per_s[0] > 0 and res.info["transport"] == transport
    assert res.label == ("crossrl/async_samples+calls" if transport == "calls" else "crossrl/async_samples")


def test_the_learner_alone_learns_on_one_stored_batch_per_step() -> None:
    """The end-to-end bench's learner part: the scenario's epochs and minibatches on one batch of valid steps."""
    res = measure("learner", env_spec=CARTPOLE, workers=1, envs_per_worker=2, seconds=1.0, warmup_s=0.2,
                  fragment=100, hyperparams={"epochs": 2, "minibatch": 50})  # fmt: skip
    assert res.steps_per_s[0] > 0
    assert res.info["epochs"] == 2 and res.info["minibatch"] == 50
    assert 100 < res.info["train_batch"] <= 200  # 2 envs x 100 steps, autoreset rows not counted


@pytest.mark.integration
def test_rllib_sampler() -> None:
    _check("rllib")


@pytest.mark.integration  # no Ray, but importing torchrl alone takes ~15 s on the busy shared machine
def test_torchrl_sampler() -> None:
    _check("torchrl")


SPREAD = EnvSpec(
    id="mpe2:simple_spread_v3", kwargs={"N": 3, "max_cycles": 25, "continuous_actions": False}, agents="shared"
)


def test_raw_multi_agent_contestant_counts_joint_steps() -> None:
    """A multi-agent env's raw contestant: PettingZoo envs stepped with random joint actions, one env step per
    joint step of one env copy, across episode ends (25 steps each here)."""
    from crossrl.measure.bench.contestants import setup_raw
    from crossrl.measure.bench.samplers import DEFAULT_MODEL

    c = setup_raw(env_spec=SPREAD, workers=2, envs_per_worker=3, model=DEFAULT_MODEL, fragment=40)
    try:
        assert [c.step() for _ in range(3)] == [2 * 3 * 40] * 3
        assert len(c.worker_pids()) == 2
        assert "make_parallel_env" in c.info["vector_env"]
    finally:
        c.close()


@pytest.mark.integration
@pytest.mark.parametrize("engine", ["crossrl", "rllib", "torchrl"])
def test_multi_agent_samplers(engine: str) -> None:
    res = measure(engine, env_spec=SPREAD, workers=1, envs_per_worker=2, seconds=1.0, warmup_s=0.2, fragment=50)
    assert res.steps_per_s[0] > 0
