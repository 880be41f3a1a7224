"""dreamer (DreamerV3) in the suite's vocabulary: the spec takes it, its defaults resolve, every engine takes it
(`crossrl validate` passes; what one cannot run, MultiDiscrete actions or images, is refused in one line), and
`crossrl engines` shows the cells."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError
from typer.testing import CliRunner

from crossrl.adapters.registry import BUILTIN, unsupported
from crossrl.cli import app
from crossrl.scenarios.catalog import (
    CROSSRL_SETTINGS,
    DEFAULT_OPTIMIZER,
    HYPERPARAM_DEFAULTS,
    NATURAL_SCALING,
    VALID_OPTIMIZERS,
    batch_per_worker_key,
)
from crossrl.scenarios.loader import load
from crossrl.scenarios.spec import ScenarioSpec

RAW = {
    "name": "dreamer-test",
    "env": {"id": "CartPole-v1"},
    "algorithm": {"name": "dreamer"},
    "engines": ["crossrl", "rllib", "torchrl"],
    "budget": {"env_steps": 1000},
}


def test_the_spec_takes_dreamer_and_its_defaults_resolve() -> None:
    spec = ScenarioSpec.model_validate(RAW)
    hp = spec.algorithm.resolved_hyperparams()
    assert hp == HYPERPARAM_DEFAULTS["dreamer"]
    assert hp["model_size"] == "nano" and hp["training_ratio"] == 1024 and hp["gamma"] == 0.997
    assert (hp["batch_size_B"], hp["batch_length_T"], hp["horizon_H"]) == (16, 64, 15)
    assert DEFAULT_OPTIMIZER["dreamer"] in VALID_OPTIMIZERS["dreamer"] and NATURAL_SCALING["dreamer"] == "weak"
    assert CROSSRL_SETTINGS["dreamer"]["world_model_grad_clip"] == 1000.0  # the paper's, as RLlib's
    trials = spec.trials()
    assert {t.engine for t in trials} == {"crossrl", "rllib", "torchrl"}
    assert batch_per_worker_key("dreamer") in trials[0].hyperparams


def test_the_spec_checks_dreamers_values() -> None:
    with pytest.raises(ValidationError, match="model_size"):
        ScenarioSpec.model_validate({**RAW, "algorithm": {"name": "dreamer", "hyperparams": {"model_size": "tiny"}}})
    for size in ("nano", "micro", "mini", "XXS", "XS", "S", "M", "L", "XL"):
        hp = {"model_size": size, "training_ratio": 64}
        ScenarioSpec.model_validate({**RAW, "algorithm": {"name": "dreamer", "hyperparams": hp}})
    with pytest.raises(ValidationError, match=r"execution.scaling: dreamer"):
        ScenarioSpec.model_validate({**RAW, "execution": {"scaling": "strong"}})


def test_every_engine_takes_it() -> None:
    assert unsupported(ScenarioSpec.model_validate(RAW).trials()) == []
    for engine in ("crossrl", "rllib", "torchrl"):
        assert BUILTIN[engine].reason_unsupported("dreamer") is None, engine
    assert "Box (bounded)" in BUILTIN["torchrl"].spaces("dreamer")


def test_validate_passes_and_an_unrunnable_space_is_refused_in_one_line(tmp_path: Path) -> None:
    f = tmp_path / "d.yaml"
    f.write_text(yaml.safe_dump(RAW))
    out = CliRunner().invoke(app, ["validate", str(f)])
    assert out.exit_code == 0, out.output
    from crossrl.adapters.torchrl.learners import build_learner

    (trial,) = [t for t in ScenarioSpec.model_validate(RAW).trials() if t.engine == "torchrl"]
    with pytest.raises(ValueError, match=r"^torchrl: dreamer takes Discrete or Box actions; CartPole-v1 has Multi"):
        build_learner(trial=trial, obs_shape=(4,), nvec=(2, 3))


def test_engines_shows_the_dreamer_cells() -> None:
    out = CliRunner().invoke(app, ["engines"], env={"COLUMNS": "400"})
    assert out.exit_code == 0, out.output
    [row] = [line for line in out.stdout.splitlines() if line.lstrip("│ ").startswith("dreamer")]
    assert "no:" not in row and "yes: DreamerV3: RLlib's" in row and "yes: sync_replay over a sequence buffer" in row
    assert "yes: DreamerV3 from TorchRL's" in row


def test_the_builtin_scenario_runs_dreamer_on_every_engine() -> None:
    spec, _ = load("cartpole-dreamer")
    assert spec.algorithm.name == "dreamer" and spec.engines == ("crossrl", "rllib", "torchrl")
    assert unsupported(spec.trials()) == []


def test_resume_of_dreamer_runs_goes_to_the_store_on_every_engine(tmp_path: Path) -> None:
    """No engine refuses --resume of a dreamer run: with nothing stored, each is told there is no run to resume."""
    results = ["--no-report", "--results-dir", str(tmp_path / "r")]
    for engine in ("crossrl", "rllib", "torchrl"):
        out = CliRunner().invoke(app, ["run", "cartpole-dreamer", "--engines", engine, *results, "--resume", "latest"])
        assert out.exit_code == 2 and "no results for scenario 'cartpole-dreamer'" in out.stderr, out.output
