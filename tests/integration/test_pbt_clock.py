"""Synchronous PBT on Ray Tune stops every member at every decision point, though members write their decision
checkpoints a little past each multiple of the interval and not all at the same env step: `pbt_clock` is the time
crossrl's Tune trials report. A real Tune run of two members that only report (no engine: what is checked is Tune's
scheduler on the times crossrl hands it).

The raw env steps (what crossrl reported before `pbt_clock`) are not tested here: what Tune does with them depends on
the order its results arrive, so a test of them cannot be made to pass or fail reliably (docs/tuning.md, "Findings")."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import ray
from ray import tune

from crossrl.core import cluster
from crossrl.orchestration.tuning import pbt_clock

pytestmark = [pytest.mark.integration, pytest.mark.system]  # a PBT search end to end

INTERVAL = 100_000
# the env steps of each member's decision checkpoints: member a writes its second one at 200,500, less than an
# interval after either member's first (the step Tune completes last sets every member's last perturbation time)
STEPS = {"a": [100_600, 200_500, 300_700], "b": [100_900, 201_200, 301_000]}


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[None]:
    cluster.connect(None, num_cpus=2)
    yield
    ray.shutdown()


def _member(config: dict[str, Any], log: str) -> None:
    name = tune.get_context().get_trial_name()
    start = tune.get_checkpoint()
    done = json.loads((Path(start.path) / "k.json").read_text())["k"] + 1 if start else 0
    for k, step in enumerate(STEPS[name][done:], start=done):
        with open(log, "a") as f:
            f.write(json.dumps({"member": name, "start": done, "step": step}) + "\n")
        ckpt = Path(log).parent / f"{name}-{k}-{step}"
        ckpt.mkdir(exist_ok=True)
        (ckpt / "k.json").write_text(json.dumps({"k": k}))
        tune.report(
            {"score": config["x"], "env_steps": pbt_clock(step, INTERVAL)},
            checkpoint=tune.Checkpoint.from_directory(str(ckpt)),
        )


def _run(tmp_path: Path) -> list[dict[str, Any]]:
    from ray.tune.schedulers import PopulationBasedTraining

    log = tmp_path / "reports.jsonl"
    names = iter(STEPS)
    tune.Tuner(
        tune.with_resources(tune.with_parameters(_member, log=str(log)), {"cpu": 1}),
        param_space={"x": tune.grid_search([0.2, 0.8])},
        tune_config=tune.TuneConfig(
            scheduler=PopulationBasedTraining(
                time_attr="env_steps",
                metric="score",
                mode="max",
                perturbation_interval=INTERVAL,
                hyperparam_mutations={"x": tune.uniform(0.0, 1.0)},
                synch=True,
            ),
            trial_name_creator=lambda t: next(names),
            reuse_actors=False,
        ),
        run_config=tune.RunConfig(storage_path=str(tmp_path / "tune"), name="clock", verbose=0),
    ).fit()
    return [json.loads(line) for line in log.read_text().splitlines()]


def _past_a_decision(reports: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Reports made by a member after a decision point in the same start: PBT let it train on past the step."""
    return [r for r in reports if STEPS[r["member"]].index(r["step"]) > r["start"]]


@pytest.mark.usefixtures("ray_cluster")
@pytest.mark.long
def test_every_member_stops_at_every_decision_point(tmp_path: Path) -> None:
    reports = _run(tmp_path)
    assert sorted((r["member"], r["step"]) for r in reports) == sorted((m, s) for m, ss in STEPS.items() for s in ss)
    assert _past_a_decision(reports) == []
