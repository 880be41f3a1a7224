"""The spec's engine-native settings (``native``): what the spec itself checks (engine names, sections, crossrl's own
settings), where they go (each engine's trials), the fingerprint, and `crossrl validate` on them: one line per bad key
naming it and the engine, exit 2, never a traceback; a section for an engine the run leaves out is unused."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from crossrl.adapters.base import NATIVE_SETTINGS_KEY, ListSink
from crossrl.cli import app
from crossrl.orchestration.probes import _native_problems
from crossrl.scenarios.loader import SpecError, validate
from crossrl.scenarios.spec import native_text


def spec(native: Any, engines: tuple[str, ...] = ("crossrl", "rllib", "torchrl"), **fields: Any) -> dict[str, Any]:
    return {
        "name": "nat",
        "env": {"id": "CartPole-v1"},
        "algorithm": {"name": "ppo"},
        "engines": list(engines),
        "budget": {"env_steps": 1000},
        "native": native,
        **fields,
    }


def problems(raw: dict[str, Any]) -> list[str]:
    with pytest.raises(SpecError) as e:
        validate(raw, label="x.yaml")
    return e.value.problems


def test_native_settings_reach_each_engines_trials_only() -> None:
    native = {"rllib": {"training": {"vf_clip_param": 5.0}}, "crossrl": {"settings": {"adam_eps": 1.0e-7}}}
    s = validate(spec(native), label="x.yaml")
    by_engine = {t.engine: t.native for t in s.trials()}
    assert by_engine == {"crossrl": native["crossrl"], "rllib": native["rllib"], "torchrl": {}}
    assert native_text(by_engine["rllib"]) == "training.vf_clip_param=5.0"


def test_fingerprint_changes_with_native_settings_only_when_set() -> None:
    plain = validate(spec({}), label="x.yaml")
    assert "native" not in plain.canonical()  # the fingerprints of specs from before the field stay
    native = validate(spec({"torchrl": {"optimizer": {"eps": 1.0e-5}}}), label="x.yaml")
    assert native.fingerprint() != plain.fingerprint()


def test_an_unknown_engine_is_one_line_with_a_suggestion() -> None:
    assert problems(spec({"rlib": {"training": {}}})) == [
        "x.yaml: native.rlib: 'rlib' is no engine (engines: crossrl, rllib, torchrl); did you mean rllib?"
    ]


def test_sections_and_crossrl_settings_are_checked() -> None:
    found = problems(
        spec({"torchrl": {"losss": {}}, "crossrl": {"settings": {"adam_ep": 1.0, "lr": 0.1}, "hyper": {}}})
    )
    assert found == [
        "x.yaml: native.torchrl.losss: torchrl has no native section 'losss'; its sections: loss, optimizer, "
        "collector; did you mean loss?",
        "x.yaml: native.crossrl.settings.adam_ep: crossrl's ppo has no setting 'adam_ep'; its settings: adam_eps, "
        "normalize_advantages, iteration_env_steps, queue_per_worker; did you mean adam_eps?",
        "x.yaml: native.crossrl.settings.lr: lr is a shared hyperparameter; set it in algorithm.hyperparams (every "
        "engine then gets it)",
        "x.yaml: native.crossrl.hyper: crossrl has no native section 'hyper'; its sections: settings",
    ]


def test_a_section_that_is_no_mapping_is_named() -> None:
    (line,) = problems(spec({"rllib": {"training": 5}}))
    assert line.startswith("x.yaml: native.rllib.training: 5 is not a mapping")


def test_a_section_for_an_engine_left_out_is_not_checked() -> None:
    # --engines crossrl: the rllib and torchrl sections are unused, and neither engine is even imported to check them
    bad = {"rllib": {"trainin": {"x": 1}}, "torchrl": {"loss": {"nope": 1}}}
    s = validate(spec(bad, engines=("crossrl",)), label="x.yaml")
    assert _native_problems(s) == []


def test_the_sink_records_the_native_settings_in_the_native_config() -> None:
    s = validate(spec({"crossrl": {"settings": {"adam_eps": 1.0e-7}}}, engines=("crossrl",)), label="x.yaml")
    (trial,) = s.trials()
    sink = ListSink(trial)
    sink.native_config({"engine": "crossrl"})
    (msg,) = [m for m in sink.messages if m["kind"] == "native_config"]
    assert msg["config"][NATIVE_SETTINGS_KEY] == {"settings": {"adam_eps": 1.0e-7}}


def test_validate_names_each_bad_engine_keyword_and_exits_2(tmp_path: Path) -> None:
    bad = {
        "rllib": {"trainin": {"x": 1}, "training": {"vf_clip_parm": 5.0}},
        "torchrl": {"loss": {"clip_valu": 0.5}, "optimizer": {"epss": 1.0}},
    }
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump(spec(bad)))
    result = CliRunner().invoke(app, ["validate", str(path)])
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    lines = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(lines) == 4, lines
    assert lines[0].startswith("error: t.yaml: native.rllib.trainin: 'trainin' of RLlib's PPOConfig is no method;")
    assert lines[0].endswith("did you mean training?")
    assert lines[1] == (
        "error: t.yaml: native.rllib.training.vf_clip_parm: RLlib's PPOConfig.training() takes no keyword "
        "'vf_clip_parm'; did you mean vf_clip_param or clip_param?"
    )
    assert lines[2] == (
        "error: t.yaml: native.torchrl.loss.clip_valu: TorchRL's ClipPPOLoss (ppo's loss) takes no keyword "
        "'clip_valu'; did you mean clip_value?"
    )
    assert lines[3] == (
        "error: t.yaml: native.torchrl.optimizer.epss: torch's Adam (ppo's optimizer) takes no keyword 'epss'; did "
        "you mean eps?"
    )
    # the same spec with the two engines left out validates
    ok = CliRunner().invoke(app, ["validate", str(path), "--set", "engines=[crossrl]"])
    assert ok.exit_code == 0, ok.output
