"""`best` layouts: the fastest of an engine's layouts in the newest stored sweep of the env and envs, per worker count;
refused with the command to run when none is stored and measuring is off; never reaching an engine unresolved."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from crossrl.measure.bench import best_layout
from crossrl.orchestration.probes import in_default_layout
from crossrl.orchestration.runner import plan_trials, with_layouts
from crossrl.reports.layouts import fastest_layout
from crossrl.reports.store import ResultsStore
from crossrl.scenarios.loader import SpecError
from crossrl.scenarios.spec import ScenarioSpec


def _spec(
    layout: dict[str, Any], *, workers: list[int] | None = None, engines: list[str] | None = None
) -> ScenarioSpec:
    return ScenarioSpec.model_validate(
        {
            "name": "best-layout",
            "env": {"id": "CartPole-v1"},
            "algorithm": {"name": "ppo"},
            "engines": engines or ["crossrl", "rllib", "torchrl"],
            "execution": {"workers": workers or [2], "envs_per_worker": 4, "layout": layout},
            "budget": {"env_steps": 1000},
            "seeds": [0],
        }
    )


def _sweep(total: int, points: list[tuple[str, str, float, bool]], run: str = "sweep1") -> dict[str, Any]:
    """A stored `bench sampling --sweep` result (bench.json's fields the choice reads); each point: engine, label,
    median env steps/s, whether it is the engine's fixed layout."""
    return {
        "bench": "sampling-sweep",
        "env_id": "CartPole-v1",
        "conditions": {"total_envs": total},
        "points": [
            {"engine": e, "label": label, "steps_per_s": {"median": v}, "fixed": fixed} for e, label, v, fixed in points
        ],
        "run_id": run,
        "start_time": 1_764_288_000_000,
    }


TORCHRL_8 = [
    ("torchrl", "MultiSync 2 x SerialEnv(4), 4000 frames", 4_600.0, True),
    ("torchrl", "MultiSync 2 x gym Sync(4), 4000 frames", 9_100.0, False),
    ("torchrl", "MultiSync 2 x gym Async(4), 4000 frames", 3_000.0, False),
    ("torchrl", "MultiSync 2 x gym Sync(4), 2000 frames", 20_000.0, False),  # another batch: not a candidate
    ("torchrl", "MultiAsync 2 x gym Sync(4), 4000 frames", 12_900.0, False),  # another collector: not a knob value
]
RLLIB_8 = [
    ("rllib", "2 runners x 4 SYNC, fragment 500", 5_000.0, True),
    ("rllib", "2 runners x 4 native vector, fragment 500", 6_500.0, False),
    ("rllib", "local runner x 8 SYNC, fragment 500", 7_000.0, False),  # another runner count: not a knob value
]


def test_the_fastest_candidate_at_the_sweeps_main_batch_wins() -> None:
    (trial,) = [t for t in _spec({"torchrl": {"env": "best"}}).trials() if t.engine == "torchrl"]
    cands = best_layout.candidates(trial)
    assert cands == {
        "gym_sync": "MultiSync 2 x gym Sync(4)",
        "SerialEnv": "MultiSync 2 x SerialEnv(4)",
        "gym_async": "MultiSync 2 x gym Async(4)",
    }
    choice = fastest_layout("torchrl", workers=2, total_envs=8, candidates=cands, sweeps=[_sweep(8, TORCHRL_8)])
    assert choice is not None and choice.value == "gym_sync" and choice.steps_per_s == 9_100.0
    assert choice.others == {"SerialEnv": 4_600.0, "gym_async": 3_000.0}
    # a sweep of other total envs, or of another engine only, chooses nothing
    assert fastest_layout("torchrl", workers=2, total_envs=8, candidates=cands, sweeps=[_sweep(16, TORCHRL_8)]) is None
    assert fastest_layout("torchrl", workers=2, total_envs=8, candidates=cands, sweeps=[_sweep(8, RLLIB_8)]) is None
    # the newest sweep that timed the engine decides
    newer = _sweep(8, [("torchrl", "MultiSync 2 x SerialEnv(4), 4000 frames", 9_500.0, True), *TORCHRL_8[1:]], "s2")
    choice = fastest_layout("torchrl", workers=2, total_envs=8, candidates=cands, sweeps=[newer, _sweep(8, TORCHRL_8)])
    assert choice is not None and choice.value == "SerialEnv" and choice.sweep_run == "s2"


def test_rllibs_candidates_leave_out_the_native_vector_where_rewards_are_clipped() -> None:
    (trial,) = [t for t in _spec({"rllib": {"vectorize": "best"}}).trials() if t.engine == "rllib"]
    assert best_layout.candidates(trial) == {
        "SYNC": "2 runners x 4 SYNC",
        "ASYNC": "2 runners x 4 ASYNC",
        "VECTOR_ENTRY_POINT": "2 runners x 4 native vector",
    }
    clipped = trial.model_copy(update={"env": trial.env.model_copy(update={"reward_clip": True})})
    assert "VECTOR_ENTRY_POINT" not in best_layout.candidates(clipped)


def test_a_run_takes_each_workers_choice_from_the_store_and_says_where_none_is(tmp_path: Path) -> None:
    store = ResultsStore(None, results_dir=tmp_path / "results")
    spec = _spec({"torchrl": {"env": "best"}, "rllib": {"vectorize": "best"}}, workers=[1, 2])
    with pytest.raises(ValueError, match="no stored layout sweep of CartPole-v1") as err:
        best_layout.resolve(spec, store, measure=False)
    assert "crossrl bench sampling --sweep --env CartPole-v1 --workers 1 --envs-per-worker 4" in str(err.value)

    one_worker = [
        ("torchrl", "Collector SerialEnv(4), 2000 frames", 6_000.0, False),
        ("torchrl", "Collector gym Sync(4), 2000 frames", 5_000.0, True),
        ("rllib", "1 runner x 4 SYNC, fragment 500", 3_000.0, True),
    ]
    for data in (_sweep(8, TORCHRL_8 + RLLIB_8), _sweep(4, one_worker)):
        store.log_bench("sampling-sweep", data=data, metrics={"x": 1.0})
    resolved = best_layout.resolve(spec, store, measure=False)
    assert resolved.layouts == {
        ("torchrl", 1): {"env": "SerialEnv"},
        ("torchrl", 2): {"env": "gym_sync"},
        ("rllib", 1): {"vectorize": "SYNC"},
        ("rllib", 2): {"vectorize": "VECTOR_ENTRY_POINT"},
    }
    assert resolved.measured_s == 0.0
    lines = [best_layout.describe(c) for c in resolved.choices]
    assert any(line.startswith("torchrl at 2 worker(s): env gym_sync (MultiSync 2 x gym Sync(4)") for line in lines)

    trials, _ = plan_trials(
        spec, ray_address=None, skip_unsupported=False, parallel=1, placement="node", layouts=resolved.layouts
    )
    by = {(t.engine, t.workers): t.layout for t in trials}
    assert by[("torchrl", 1)] == {"env": "SerialEnv"} and by[("rllib", 2)] == {"vectorize": "VECTOR_ENTRY_POINT"}
    assert by[("crossrl", 1)] == {}  # an engine without the knob is left as it was


def test_best_never_reaches_an_engine_unresolved_and_validates_in_the_default_layout() -> None:
    spec = _spec({"torchrl": {"env": "best"}})
    assert spec.execution.layout.best_engines() == ["torchrl"]
    with pytest.raises(SpecError, match="'best' for torchrl is resolved by `crossrl run`"):
        with_layouts(spec.trials(), None)
    (trial,) = [t for t in spec.trials() if t.engine == "torchrl"]
    assert in_default_layout(trial).layout == {}  # the knob left out: its default
    from crossrl.adapters.torchrl.adapter import batched_env

    with pytest.raises(ValueError, match="unresolved"):
        batched_env(trial.layout)


def test_best_on_a_multi_agent_env_is_refused_like_any_layout() -> None:
    with pytest.raises(Exception, match="execution.layout.torchrl.env: 'best' is for single-agent envs"):
        ScenarioSpec.model_validate(
            {
                "name": "ma",
                "env": {"id": "mpe2:simple_spread_v3", "agents": "shared"},
                "algorithm": {"name": "ppo"},
                "engines": ["torchrl"],
                "execution": {"layout": {"torchrl": {"env": "best"}}},
                "budget": {"env_steps": 1000},
                "seeds": [0],
            }
        )
