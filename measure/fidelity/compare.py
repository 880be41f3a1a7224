"""`crossrl fidelity SCENARIO --engine rllib|torchrl`: one parent run of kind ``fidelity`` holding, seed by seed, the
trial on ``engine`` through crossrl's adapter and right after it the same trial through the engine's own loop
(``crossrl.measure.fidelity``); then the comparison (``crossrl.reports.fidelity``).

Each native trial's settings are the native config the adapter trial of its seed reported (the runner passes it on as
a ``native_config`` event, and it is stored as that trial's artifact), written to a folder the native loops read
(``CROSSRL_NATIVE_CONFIGS``). The two trials of a seed run back to back, so the machine's load is as alike as it gets
for the pair the speed ratio compares.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from crossrl.measure.fidelity import CONFIGS_ENV, LOOPS, native_id
from crossrl.orchestration.runner import RunOutcome, run_scenario
from crossrl.reports.fidelity import FIDELITY_KIND
from crossrl.reports.store import ResultsStore
from crossrl.scenarios.loader import SpecError
from crossrl.scenarios.spec import ScenarioSpec

EXTRA_ENGINES_ENV = "CROSSRL_EXTRA_ENGINES"


@dataclass
class FidelityOutcome:
    key: str
    engine: str
    run: RunOutcome

    @property
    def interrupted(self) -> bool:
        return self.run.interrupted


def register_native(engine: str) -> None:
    """Make ``<engine>-native`` an engine of this process and of the trial processes it starts."""
    entry = f"{native_id(engine)}={LOOPS[engine]}"
    current = [e for e in os.environ.get(EXTRA_ENGINES_ENV, "").split(",") if e.strip()]
    if entry not in current:
        os.environ[EXTRA_ENGINES_ENV] = ",".join([*current, entry])


def fidelity_problems(spec: ScenarioSpec, engine: str) -> list[str]:
    """Why ``spec`` cannot be compared on ``engine``'s own loop (empty: it can)."""
    if engine not in LOOPS:
        return [f"--engine {engine}: fidelity compares rllib or torchrl with its own loop"]
    from crossrl.adapters.registry import load_target

    algorithms = getattr(load_target(LOOPS[engine]), "algorithms", {})
    problems = []
    if spec.algorithm.name not in algorithms:
        problems.append(f"{spec.name}: {native_id(engine)} runs {', '.join(algorithms)}, not {spec.algorithm.name}")
    if spec.env.multi_agent or spec.algorithm.model.conv:
        problems.append(f"{spec.name}: the native loops run single-agent envs with an MLP policy (not {spec.env.id})")
    return problems


def run_fidelity(
    spec: ScenarioSpec,
    *,
    engine: str,
    store: ResultsStore,
    results_dir: Path,
    progress: Callable[[str, dict[str, Any]], None] | None = None,
    spec_path: Path | None = None,
    command: str = "",
) -> FidelityOutcome:
    """Both sides of the comparison, seed by seed in one parent run (tags ``fidelity.key``, ``fidelity.engine``)."""
    problems = fidelity_problems(spec, engine)
    if problems:
        raise SpecError(problems)
    key = uuid.uuid4().hex[:12]
    folder = (results_dir / "fidelity" / key).resolve()
    folder.mkdir(parents=True, exist_ok=True)
    register_native(engine)
    os.environ[CONFIGS_ENV] = str(folder)

    def relay(name: str, payload: dict[str, Any]) -> None:
        if name == "native_config" and payload["trial"].engine == engine:
            (folder / f"{payload['trial'].seed}.json").write_text(json.dumps(payload["config"], indent=1))
        if name == "start":
            store.set_tags(payload["parent_id"], {"fidelity.key": key, "fidelity.engine": engine})
        if progress is not None:
            progress(name, payload)

    both = spec.with_config({}, engines=[engine, native_id(engine)])  # trials interleave engines inside a seed
    run = run_scenario(both, store=store, spec_path=spec_path, progress=relay, command=command, kind=FIDELITY_KIND)
    return FidelityOutcome(key=key, engine=engine, run=run)
