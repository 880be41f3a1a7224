"""`crossrl fidelity` end to end on the real engines: the spec's trial through crossrl's adapter, then the same seed
through the engine's own loop (RLlib: build_algo() + train() on the adapter's stored config; TorchRL: its PPO
reference loop), both in one parent run of kind `fidelity`, compared in a report."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from crossrl.reports.fidelity import FIDELITY_KIND, load_fidelity
from crossrl.reports.store import NATIVE_CONFIG_ARTIFACT, ResultsStore

CLI = [sys.executable, "-m", "crossrl.cli"]


def _spec(tmp_path: Path, algorithm: str = "ppo") -> Path:
    spec = {
        "name": "fidelity-tiny",
        "env": {"id": "CartPole-v1"},
        "algorithm": {
            "name": algorithm,
            "hyperparams": {"train_batch": 250, "minibatch": 125, "epochs": 2, "lr": 1e-3}
            if algorithm == "ppo"
            else {},
        },
        "execution": {"workers": [1], "envs_per_worker": 2},
        "budget": {"env_steps": 1000, "wall_seconds": 300},
        "target": {"episode_return_mean": 30},
        "seeds": [3],
    }
    path = tmp_path / "fidelity-tiny.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


@pytest.mark.integration
@pytest.mark.system
@pytest.mark.parametrize("engine", ["rllib", "torchrl"])
def test_fidelity_runs_the_adapter_then_the_engines_own_loop_on_the_same_seed(
    engine: str, results_dir: Path, tmp_path: Path
) -> None:
    out = subprocess.run(
        [*CLI, "fidelity", str(_spec(tmp_path)), "--engine", engine, "--results-dir", str(results_dir)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "Traceback" not in out.stderr
    report = results_dir / "reports" / "fidelity-tiny" / f"fidelity-{engine}.md"
    assert report.is_file() and "| env steps / s |" in report.read_text()

    store = ResultsStore(None, results_dir=results_dir)
    data = load_fidelity(store, "fidelity-tiny", engine=engine)
    trials = data.trials.set_index("role")
    assert set(trials.index) == {"adapter", "native"}
    assert list(trials.status) == ["FINISHED", "FINISHED"] and list(trials.seed) == [3, 3]
    assert (trials.env_steps_per_s > 0).all()
    # one parent run of kind fidelity: per seed the adapter's trial, then the engine's own loop's
    exp = store.experiment_id("fidelity-tiny", create=False)
    (parent,) = store.client.search_runs([exp], filter_string=f"tags.`crossrl.kind` = '{FIDELITY_KIND}'")
    assert parent.data.tags["fidelity.engine"] == engine and parent.info.run_id == data.parent_id
    by_engine = {r.data.tags["engine"]: r for r in store.children(parent)}
    assert set(by_engine) == {engine, f"{engine}-native"}
    assert by_engine[engine].info.start_time < by_engine[f"{engine}-native"].info.start_time
    native = json.loads(store.artifact_bytes(by_engine[f"{engine}-native"].info.run_id, NATIVE_CONFIG_ARTIFACT))
    if engine == "rllib":  # the settings crossrl chose, taken from the adapter's stored config
        applied = native["settings_from_stored_config"]
        assert applied["lr"] == pytest.approx(1e-3) and applied["num_epochs"] == 2
        assert "env" not in applied and "callbacks_on_episode_end" not in applied
    # the adapter side (kind fidelity) stays out of the scenario's own runs
    assert store.parent_runs("fidelity-tiny") == []


@pytest.mark.integration
def test_fidelity_refuses_what_it_cannot_compare_in_one_line(results_dir: Path, tmp_path: Path) -> None:
    for algorithm, engine, says in (
        ("ppo", "crossrl", "fidelity compares rllib or torchrl with its own loop"),
        ("dqn", "rllib", "rllib-native runs ppo, impala, sac, dreamer, not dqn"),
    ):
        out = subprocess.run(
            [*CLI, "fidelity", str(_spec(tmp_path, algorithm)), "--engine", engine, "--results-dir", str(results_dir)],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert out.returncode == 2, out.stdout + out.stderr
        assert says in out.stderr and "Traceback" not in out.stderr
