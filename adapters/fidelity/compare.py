"""`crossrl fidelity SCENARIO --engine rllib|torchrl`: the scenario's trials on ``engine`` through crossrl's adapter,
then the same seeds through the engine's own loop (``crossrl.adapters.fidelity``), each side a parent run of kind
``fidelity`` in the store, then the comparison (``crossrl.reports.fidelity``).

The native side runs only after the adapter side: its settings are the native config the adapter stored for the same
seed (an artifact of each adapter trial), written to a folder the native loops read (``CROSSRL_NATIVE_CONFIGS``).
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from crossrl.adapters.fidelity import CONFIGS_ENV, LOOPS, native_id
from crossrl.adapters.runner import RunOutcome, run_scenario
from crossrl.reports.fidelity import FIDELITY_KIND
from crossrl.reports.store import NATIVE_CONFIG_ARTIFACT, ResultsStore
from crossrl.scenarios.loader import SpecError
from crossrl.scenarios.spec import ScenarioSpec

EXTRA_ENGINES_ENV = "CROSSRL_EXTRA_ENGINES"


@dataclass
class FidelityOutcome:
    key: str
    engine: str
    adapter: RunOutcome
    native: RunOutcome | None = None
    missing_configs: list[int] = field(default_factory=list)  # adapter trials that stored no native config

    @property
    def interrupted(self) -> bool:
        return self.adapter.interrupted or (self.native is not None and self.native.interrupted)


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


def write_native_configs(store: ResultsStore, parent_id: str, folder: Path) -> list[int]:
    """Each adapter trial's stored native config as ``<seed>.json`` in ``folder``; the seeds that had none."""
    folder.mkdir(parents=True, exist_ok=True)
    missing = []
    for run in store.children(store.parent_run(parent_id)):
        seed = int(run.data.tags.get("seed", "-1"))
        try:
            config = json.loads(store.artifact_bytes(run.info.run_id, NATIVE_CONFIG_ARTIFACT))
        except Exception:  # noqa: BLE001 - a trial that failed before its engine was built stored none
            missing.append(seed)
            continue
        (folder / f"{seed}.json").write_text(json.dumps(config, indent=1))
    return missing


def run_fidelity(
    spec: ScenarioSpec,
    *,
    engine: str,
    store: ResultsStore,
    results_dir: Path,
    progress: Callable[..., Any] | None = None,
    spec_path: Path | None = None,
    command: str = "",
) -> FidelityOutcome:
    """Both sides of the comparison, one after the other (they never share the machine)."""
    problems = fidelity_problems(spec, engine)
    if problems:
        raise SpecError(problems)
    key = uuid.uuid4().hex[:12]
    tags = {"fidelity.key": key, "fidelity.engine": engine}
    side = spec.with_config({}, engines=[engine])
    adapter = run_scenario(
        side, store=store, spec_path=spec_path, progress=progress, command=command, kind=FIDELITY_KIND
    )
    store.set_tags(adapter.parent_id, {**tags, "fidelity.role": "adapter"})
    outcome = FidelityOutcome(key=key, engine=engine, adapter=adapter)
    if adapter.interrupted:
        return outcome
    if adapter.unsent:
        raise SpecError([f"the store does not have the adapter side's runs yet ({adapter.unsent} writes unsent); "
                         "`crossrl sync`, then run `crossrl fidelity` again"])  # fmt: skip
    folder = results_dir / "fidelity" / key
    outcome.missing_configs = write_native_configs(store, store.resolve(adapter.parent_id), folder)
    register_native(engine)
    os.environ[CONFIGS_ENV] = str(folder.resolve())
    native_side = spec.with_config({}, engines=[native_id(engine)])
    outcome.native = run_scenario(
        native_side, store=store, spec_path=spec_path, progress=progress, command=command, kind=FIDELITY_KIND
    )
    store.set_tags(
        outcome.native.parent_id, {**tags, "fidelity.role": "native", "fidelity.adapter_run": adapter.parent_id}
    )
    return outcome
