"""The search section of a spec (`crossrl tune`): its ranges and checks, the configurations it draws (the same for every
engine), the trials it makes, and how a search's results are ranked."""

from __future__ import annotations

from typing import Any

import pytest

from crossrl.orchestration.trials import TrialResult
from crossrl.orchestration.tuning import _within, best_of, bounds_of, rank_key, scheduler_for
from crossrl.scenarios.loader import SpecError, load_raw, validate
from crossrl.scenarios.spec import Distribution, SearchSpec

SPACE = {"lr": {"loguniform": [1e-4, 3e-3]}, "epochs": {"integer": [2, 6]}, "minibatch": {"choice": [64, 128]}}


def _spec(**search: Any) -> Any:
    raw, _, label = load_raw("cartpole-ppo")
    raw["search"] = {"space": SPACE, "env_steps": 20_000, **search}
    return validate(raw, label=label)


def _problems(**search: Any) -> list[str]:
    with pytest.raises(SpecError) as e:
        _spec(**search)
    return e.value.problems


def test_the_search_draws_the_same_configurations_for_every_engine_within_their_ranges() -> None:
    spec = _spec(configurations=12)
    by_engine = {e: spec.search_trials(e) for e in spec.engines}
    drawn = [{k: t.hyperparams[k] for k in SPACE} for t in by_engine["crossrl"]]
    for trials in by_engine.values():
        assert [{k: t.hyperparams[k] for k in SPACE} for t in trials] == drawn
    assert len(drawn) == 12 and len({tuple(d.values()) for d in drawn}) == 12
    for d in drawn:
        assert 1e-4 <= d["lr"] <= 3e-3 and d["epochs"] in range(2, 7) and d["minibatch"] in (64, 128)
        assert isinstance(d["epochs"], int) and isinstance(d["minibatch"], int)
    assert _spec(configurations=12, sample_seed=1).search.sample() != spec.search.sample()
    assert _spec(configurations=12).search.sample() == spec.search.sample()  # drawn from sample_seed alone


def test_search_trials_run_on_the_tuning_seeds_at_the_search_budget_named_by_configuration() -> None:
    spec = _spec(configurations=3, tuning_seeds=[100, 101])
    trials = spec.search_trials("rllib")
    assert [t.name for t in trials] == ["rllib-ppo-w2-s100-c00", "rllib-ppo-w2-s101-c01", "rllib-ppo-w2-s100-c02"]
    assert {t.budget.env_steps for t in trials} == {20_000} and {t.workers for t in trials} == {2}
    # Each configuration is its own set of conditions; the spec's own trials are untouched by the search.
    assert len({t.fingerprint for t in trials}) == 3
    raw, _, label = load_raw("cartpole-ppo")
    assert spec.fingerprint() == validate(raw, label=label).fingerprint()


def test_every_problem_of_a_search_is_one_line_naming_the_field() -> None:
    lines = _problems(space={"lrr": {"loguniform": [1e-4, 1e-3]}})
    assert len(lines) == 1 and "search.space" in lines[0] and "'lrr'" in lines[0] and "did you mean lr?" in lines[0], (
        lines
    )
    lines = _problems(space={"lr": {"loguniform": [0, 1e-3]}})
    assert len(lines) == 1 and "loguniform: low must be above 0" in lines[0], lines
    lines = _problems(space={"lr": {"uniform": [1e-3, 1e-4]}})
    assert len(lines) == 1 and "low (0.001) must be below high (0.0001)" in lines[0], lines
    lines = _problems(space={"lr": {"uniform": [1e-4, 1e-3], "choice": [1]}})
    assert len(lines) == 1 and "exactly one of" in lines[0], lines
    lines = _problems(tuning_seeds=[3], test_seeds=[1, 3])
    assert len(lines) == 1 and "share 3" in lines[0] and "disjoint" in lines[0], lines
    lines = _problems(space={"minibatch": {"choice": [128, 8192]}}, configurations=8)
    assert len(lines) == 1 and "minibatch" in lines[0] and "at most train_batch" in lines[0], lines
    lines = _problems(space={"gamma": {"uniform": [0.9, 1.5]}})
    assert len(lines) == 1 and "search.space.gamma" in lines[0] and "narrow the range" in lines[0], lines


def test_steps_to_target_needs_a_target() -> None:
    raw, _, label = load_raw("cartpole-ppo")
    raw["target"] = {}
    raw["search"] = {"space": SPACE, "env_steps": 1000, "metric": "steps_to_target"}
    with pytest.raises(SpecError) as e:
        validate(raw, label=label)
    assert any("steps_to_target needs target.episode_return_mean" in p for p in e.value.problems)


def test_scheduler_defaults_follow_the_budget() -> None:
    search = SearchSpec.model_validate({"space": SPACE, "env_steps": 160_000})
    assert search.scheduler == "asha" and search.grace_env_steps == 10_000 and search.asha.reduction_factor == 4
    assert search.interval_env_steps == 16_000 and search.pbt.quantile == 0.25 and search.pbt.factors == (0.8, 1.2)


def test_pbt_explore_is_held_to_the_search_ranges() -> None:
    search = SearchSpec.model_validate({"space": SPACE, "env_steps": 1000})
    bounds = bounds_of(search)
    assert bounds == {"lr": (1e-4, 3e-3), "epochs": (2, 6)}  # a choice stays in its list: PBT steps along it
    held = _within(bounds, {"lr": 5e-3, "epochs": 1, "minibatch": 64})
    assert held == {"lr": 3e-3, "epochs": 2, "minibatch": 64} and isinstance(held["epochs"], int)
    assert _within(bounds, {"lr": 2e-4, "epochs": 5}) == {"lr": 2e-4, "epochs": 5}


def test_a_distribution_draws_within_its_range() -> None:
    import numpy as np

    rng = np.random.default_rng(0)
    log = Distribution.model_validate({"loguniform": [1e-5, 1e-1]})
    values = [log.sample(rng) for _ in range(2000)]
    assert min(values) >= 1e-5 and max(values) <= 1e-1
    assert 0.4 < np.mean(np.log10(values) < -3) < 0.6  # even in log space: half below the middle decade
    ints = {Distribution.model_validate({"integer": [1, 3]}).sample(rng) for _ in range(200)}
    assert ints == {1, 2, 3}


def _result(
    spec: Any, label: str, *, status: str = "FINISHED", steps: int, final: float, to_target: float | None = None
) -> TrialResult:
    trial = spec.search_trials("crossrl")[0].model_copy(update={"label": label})
    summary: dict[str, float | None] = {"final_return_mean": final}
    if to_target is not None:
        summary["steps_to_target"] = to_target
    return TrialResult(trial=trial, run_id=label, status=status, points=[(steps, {})], summary=summary)


def test_the_best_configuration_ran_its_whole_budget_then_by_the_search_metric() -> None:
    spec = _spec()
    search = spec.search
    stopped_high = _result(spec, "c00", steps=5_000, final=400.0)  # ASHA stopped it early: ranked below whole runs
    whole_low = _result(spec, "c01", steps=20_000, final=200.0)
    whole_high = _result(spec, "c02", steps=20_000, final=300.0)
    failed = _result(spec, "c03", status="FAILED", steps=20_000, final=500.0)
    best = best_of([stopped_high, whole_low, whole_high, failed], search)
    assert best is whole_high
    assert rank_key(whole_high, search) < rank_key(whole_low, search) < rank_key(stopped_high, search)
    by_steps = search.model_copy(update={"metric": "steps_to_target"})
    fast = _result(spec, "c04", steps=9_000, final=460.0, to_target=9_000)  # stopped at its target: counts
    slow = _result(spec, "c05", steps=20_000, final=480.0, to_target=15_000)
    assert best_of([whole_high, slow, fast], by_steps) is fast
    assert best_of([failed], search) is None


def test_a_pbt_member_restarted_on_new_hosts_keeps_what_each_host_used() -> None:
    """Synchronous PBT restarts a member in a new host at each step; each host measures from zero. The member's run
    records the CPU seconds of all of them and the highest peak, not the last host's alone."""
    from crossrl.orchestration.tuning import Recorder, _Member

    class Rec:
        ended: dict[str, Any] = {}

        def record_end(self, **kw: Any) -> None:
            Rec.ended = kw

        @property
        def result(self) -> None:
            return None

    [trial] = _spec(configurations=1).search_trials("crossrl")
    member = _Member(trial=trial, rec=Rec(), started=0.0)  # type: ignore[arg-type]
    recorder = Recorder.__new__(Recorder)  # its store is not needed for a member's own restart
    recorder.results = []
    for used in ({"cpu_seconds": 30.0, "peak_rss": 500.0}, {"cpu_seconds": 20.0, "peak_rss": 700.0}):
        member.usage = used
        recorder._resumed(member, {"copy": False, "values": {"lr": 1e-3}})
    member.usage = {"cpu_seconds": 10.0, "peak_rss": 600.0}
    recorder.record(member)
    assert Rec.ended["cpu_seconds"] == 60.0 and Rec.ended["peak_rss"] == 700.0


def test_each_scheduler_is_ray_tunes_own_on_env_steps() -> None:
    from ray.tune.schedulers import AsyncHyperBandScheduler, PopulationBasedTraining

    assert scheduler_for(_spec(scheduler="random").search) is None
    asha = scheduler_for(_spec(scheduler="asha", asha={"grace_env_steps": 5_000}).search)
    assert isinstance(asha, AsyncHyperBandScheduler) and asha._time_attr == "env_steps"
    assert asha._max_t == 20_000 and asha._brackets[0]._rungs[-1][0] == 5_000  # the first rung at the grace
    pbt = scheduler_for(_spec(scheduler="pbt", pbt={"interval_env_steps": 4_000}).search)
    assert isinstance(pbt, PopulationBasedTraining) and pbt._synch and pbt._perturbation_interval == 4_000
    assert set(pbt._hyperparam_mutations) == set(SPACE)
