"""Scenario specs: validation errors for every class of bad input, fingerprints, trial expansion."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from crossrl.adapters.registry import unsupported
from crossrl.scenarios.loader import SpecError, builtin, load, validate

GOOD = {
    "name": "t",
    "env": {"id": "CartPole-v1"},
    "algorithm": {"name": "ppo", "hyperparams": {"lr": 0.001}},
    "engines": ["crossrl", "rllib"],
    "execution": {"workers": [1, 2], "envs_per_worker": 2},
    "budget": {"env_steps": 1000},
    "seeds": [0, 1, 2],
}


def problems(raw: dict, label: str = "x.yaml") -> list[str]:
    with pytest.raises(SpecError) as e:
        validate(raw, label=label)
    return e.value.problems


def with_(path: str, value: object) -> dict:
    raw = yaml.safe_load(yaml.safe_dump(GOOD))
    node = raw
    *parents, leaf = path.split(".")
    for p in parents:
        node = node.setdefault(p, {})
    node[leaf] = value
    return raw


def test_every_builtin_scenario_is_valid() -> None:
    names = set(builtin())
    assert {"smoke", "cartpole-ppo", "cartpole-a2c", "cartpole-a3c", "cartpole-impala", "cartpole-dqn"} <= names
    assert {"cartpole-apex", "pendulum-ppo"} <= names
    for name in names:
        spec, _ = load(name)
        assert spec.name == name


def test_bad_literal_names_field_value_and_choices() -> None:
    [line] = problems(with_("algorithm.name", "ppo2"), "smoke.yaml")
    assert (
        line
        == "smoke.yaml: algorithm.name: 'ppo2' is not one of ppo, a2c, a3c, impala, dqn, apex, sac, dreamer; did you mean ppo?"
    )


def test_unknown_key_is_an_error() -> None:
    [line] = problems(with_("algorithm.hyperparams.learning_rate", 0.1))
    assert "algorithm.hyperparams.learning_rate: unknown field" in line


def test_wrong_type_and_impossible_values() -> None:
    [line] = problems(with_("budget.env_steps", "lots"))
    assert line.startswith("x.yaml: budget.env_steps: 'lots'")
    [line] = problems(with_("execution.workers", [-1]))
    assert "execution.workers" in line and "-1" in line
    [line] = problems(with_("algorithm.hyperparams.gamma", 1.5))
    assert line == "x.yaml: algorithm.hyperparams.gamma: 1.5 must be at most 1"


def test_missing_required_field() -> None:
    raw = dict(GOOD)
    del raw["budget"]
    assert problems(raw) == ["x.yaml: budget: required field is missing"]


def test_unknown_engine_and_env_are_caught() -> None:
    [line] = problems(with_("engines", ["crossrl", "stable-baselines"]))
    assert "engines: 'stable-baselines' is not one of crossrl, rllib, torchrl" in line
    [line] = problems(with_("env.id", "CartPole-v9"))
    assert line.startswith("x.yaml: env.id: 'CartPole-v9' is not a registered gymnasium env")


def test_all_problems_are_reported_together() -> None:
    raw = with_("algorithm.name", "ppo2")
    raw["budget"]["env_steps"] = 0
    raw["env"]["id"] = "NoSuchEnv-v0"
    lines = problems(raw)
    assert len(lines) == 3
    assert any("algorithm.name" in s for s in lines)
    assert any("budget.env_steps" in s for s in lines)
    assert any("env.id" in s for s in lines)


def test_invalid_optimizer_pair_lists_valid_ones() -> None:
    [line] = problems(with_("execution.optimizer", "sync_replay"))
    assert "'sync_replay' cannot run ppo; valid: sync_samples, async_gradients" in line


def test_yaml_syntax_error_gives_the_line(tmp_path: Path) -> None:
    f = tmp_path / "broken.yaml"
    f.write_text("name: broken\nenv: {id: CartPole-v1\nbudget: {env_steps: 10}\n")
    with pytest.raises(SpecError) as e:
        load(str(f))
    [line] = e.value.problems
    assert line.startswith("broken.yaml: line 3, column") and "YAML syntax error" in line


def test_unknown_scenario_name_lists_builtins() -> None:
    with pytest.raises(SpecError) as e:
        load("no-such-scenario")
    assert "built-in:" in e.value.problems[0] and "smoke" in e.value.problems[0]


def test_fingerprint_is_stable_and_sensitive() -> None:
    a = validate(GOOD, label="a")
    reordered = dict(reversed(list(GOOD.items())))
    assert validate(reordered, label="b").fingerprint() == a.fingerprint()
    # the trial axes and labels do not change the conditions of a trial
    assert validate(with_("seeds", [5]), label="c").fingerprint() == a.fingerprint()
    assert validate(with_("engines", ["rllib"]), label="c").fingerprint() == a.fingerprint()
    assert validate(with_("name", "other"), label="c").fingerprint() == a.fingerprint()
    # writing a default explicitly is the same spec; changing a value is not
    assert validate(with_("algorithm.hyperparams.clip", 0.2), label="d").fingerprint() == a.fingerprint()
    assert validate(with_("algorithm.hyperparams.lr", 0.002), label="e").fingerprint() != a.fingerprint()
    assert validate(with_("env.step_latency_ms", 1), label="f").fingerprint() != a.fingerprint()
    assert len(a.fingerprint()) == 16


def test_trials_expand_engines_workers_seeds() -> None:
    spec = validate(GOOD, label="a")
    trials = spec.trials()
    assert len(trials) == 2 * 2 * 3
    assert [t.name for t in trials[:4]] == [
        "crossrl-ppo-w1-s0",
        "rllib-ppo-w1-s0",
        "crossrl-ppo-w1-s1",
        "rllib-ppo-w1-s1",
    ]
    assert all(t.hyperparams["lr"] == 0.001 and t.hyperparams["clip"] == 0.2 for t in trials)
    assert {t.fingerprint for t in trials} == {spec.fingerprint()}
    assert spec.algorithm.hyperparams.clip is None  # defaults are derived, never written back


def test_unsupported_combinations_are_listed_with_what_is_supported() -> None:
    spec = validate(with_("algorithm.name", "a2c"), label="a")
    bad = unsupported(spec.trials())
    assert {t.engine for t, _ in bad} == {"rllib"}
    assert "RLlib 2.60 has no A2C" in bad[0][1] and "rllib supports: ppo, impala, dqn, sac" in bad[0][1]


def test_spec_is_immutable() -> None:
    spec = validate(GOOD, label="a")
    with pytest.raises(ValidationError):
        spec.budget.env_steps = 5  # type: ignore[misc]


def test_cli_validate_three_mistakes_three_lines_exit_2(tmp_path: Path) -> None:
    raw = with_("algorithm.name", "ppo2")
    raw["execution"]["workers"] = [0]
    raw["seeds"] = "zero"
    f = tmp_path / "three.yaml"
    f.write_text(yaml.safe_dump(raw))
    out = subprocess.run([sys.executable, "-m", "crossrl.cli", "validate", str(f)], capture_output=True, text=True)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 3, out.stderr
    assert all(line.startswith("error: three.yaml: ") for line in lines)
    assert "Traceback" not in out.stderr + out.stdout


def test_cli_run_refuses_unsupported_before_storing(tmp_path: Path) -> None:
    raw = with_("algorithm.name", "a2c")
    f = tmp_path / "a2c.yaml"
    f.write_text(yaml.safe_dump(raw))
    out = subprocess.run(
        [sys.executable, "-m", "crossrl.cli", "run", str(f), "--results-dir", str(tmp_path / "res")],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 2
    assert "rllib-a2c-w1-s0: RLlib 2.60 has no A2C" in out.stderr
    assert "--skip-unsupported" in out.stderr
    assert not (tmp_path / "res" / "mlflow.db").exists()


def test_regress_tolerances_are_checked() -> None:
    [line] = problems(with_("regress", {"throughput": 0.1}))
    assert "regress.throughput: unknown field" in line
    assert validate(with_("regress", {"throughput_drop": 0.3}), label="r").regress.throughput_drop == 0.3


def test_stop_at_target_changes_the_fingerprint_only_when_set() -> None:
    """Left out of the canonical form at its default, so baselines made before the field existed still match."""
    import json

    spec = validate(GOOD, label="x.yaml")
    assert "stop_at_target" not in spec.canonical()["budget"]
    stopping = validate(with_("budget.stop_at_target", True), label="x.yaml")
    assert stopping.fingerprint() != spec.fingerprint()
    baseline = json.loads((Path(__file__).parents[2] / "reports" / "baselines" / "smoke.json").read_text())
    assert load("smoke")[0].fingerprint() == baseline["fingerprint"]


# -- pixels: the env's preprocessing and the conv model ----------------------------------------------

NATURE_CNN = [[32, 8, 4], [64, 4, 2], [64, 3, 1]]


def test_preprocessing_is_chosen_from_the_id_unless_given() -> None:
    from crossrl.scenarios.spec import EnvSpec

    assert EnvSpec(id="ALE/Breakout-v5").resolved_preprocessing == "atari"
    assert EnvSpec(id="MinAtar/Breakout-v1").resolved_preprocessing == "minatar"
    assert EnvSpec(id="CartPole-v1").resolved_preprocessing == "none"
    assert EnvSpec(id="ALE/Breakout-v5", preprocessing="none").resolved_preprocessing == "none"
    [line] = problems(with_("env.preprocessing", "nature"))
    assert line == "x.yaml: env.preprocessing: 'nature' is not one of none, atari, minatar; did you mean minatar?"


def test_pixel_fields_leave_mlp_fingerprints_alone_and_count_when_set() -> None:
    """Left out of the canonical form at their defaults (baselines made before them still match); a null
    preprocessing and the one it resolves to are the same conditions, so the same fingerprint."""
    spec = validate(GOOD, label="x.yaml")
    assert "conv" not in spec.canonical()["algorithm"]["model"] and "preprocessing" not in spec.canonical()["env"]
    conv = validate(with_("algorithm.model.conv", [[16, 3, 1]]), label="x.yaml")
    assert conv.fingerprint() != spec.fingerprint()
    minatar = {**GOOD, "env": {"id": "MinAtar/Breakout-v1"}}
    stated = {**GOOD, "env": {"id": "MinAtar/Breakout-v1", "preprocessing": "minatar"}}
    assert validate(minatar, label="x.yaml").fingerprint() == validate(stated, label="x.yaml").fingerprint()
    assert validate(minatar, label="x.yaml").canonical()["env"]["preprocessing"] == "minatar"


def test_conv_layers_are_positive_triples() -> None:
    assert validate(with_("algorithm.model.conv", NATURE_CNN), label="x.yaml").algorithm.model.conv[0] == (32, 8, 4)
    [line] = problems(with_("algorithm.model.conv", [[32, 8, 4], [64, 0, 2]]))
    assert line == "x.yaml: algorithm.model.conv: layer 2 [64, 0, 2]: filters, kernel and stride must each be >= 1"
    [line] = problems(with_("algorithm.model.conv", [[32, 8, 4], [32, 8]]))
    assert line == "x.yaml: algorithm.model.conv: layer 2 [32, 8]: give each layer as [filters, kernel, stride]"
    [line] = problems(with_("algorithm.model.conv", [32, 8, 4]))
    assert line == "x.yaml: algorithm.model.conv: layer 1 32: give each layer as [filters, kernel, stride]"
    [line] = problems(with_("algorithm.model.conv", [[32, "big", 4]]))
    assert line.startswith("x.yaml: algorithm.model.conv.0.1: 'big' is not a whole number")


def test_a_conv_stack_that_shrinks_the_frames_below_1x1_is_refused_at_load() -> None:
    """MinAtar's frames are 10x10 and Atari's 84x84 after preprocessing: known before any env is built."""
    minatar = {**with_("algorithm.model.conv", NATURE_CNN), "env": {"id": "MinAtar/Breakout-v1"}}
    [line] = problems(minatar, "m.yaml")
    assert line == (
        "m.yaml: algorithm.model.conv: layer 2 [64, 4, 2] shrinks the 10x10 frames below 1x1 (its input is 1x1); "
        "use smaller kernels or strides, or fewer layers (MinAtar/Breakout-v1)"
    )
    atari = {**with_("algorithm.model.conv", NATURE_CNN), "env": {"id": "ALE/Breakout-v5"}}
    assert validate(atari, label="a.yaml").algorithm.model.conv == tuple(tuple(x) for x in NATURE_CNN)


def test_a_budget_in_training_seconds() -> None:
    spec = validate(with_("budget", {"train_seconds": 3600}), label="x.yaml")
    assert spec.budget.env_steps is None and spec.budget.wall_seconds == 3600 + 600  # the TIMEOUT guard follows it
    both = validate(with_("budget", {"env_steps": 5000, "train_seconds": 60, "wall_seconds": 120}), label="x.yaml")
    assert (both.budget.env_steps, both.budget.train_seconds) == (5000, 60)
    assert (
        both.fingerprint()
        != validate(with_("budget", {"env_steps": 5000, "wall_seconds": 120}), label="x").fingerprint()
    )
    assert "train_seconds" not in validate(GOOD, label="x.yaml").canonical()["budget"]  # older fingerprints hold
    [line] = problems(with_("budget", {"wall_seconds": 100}))
    assert line == "x.yaml: budget: give env_steps, train_seconds or both: a trial needs a budget"
    [line] = problems(with_("budget", {"train_seconds": 100, "wall_seconds": 50}))
    assert line.startswith("x.yaml: budget: wall_seconds (50) must exceed train_seconds (100)")
    [line] = problems(with_("budget", {"train_seconds": -1}))
    assert "budget.train_seconds" in line


def test_each_engines_layout_rides_on_its_trials_and_leaves_the_fingerprint_alone() -> None:
    a = validate(GOOD, label="a")
    laid = validate(with_("execution.layout", {"torchrl": {"env": "SerialEnv"}, "rllib": {"vectorize": "ASYNC"}}),
                    label="b")  # fmt: skip
    assert laid.fingerprint() == a.fingerprint()  # the same envs and steps in another layout stay comparable
    by_engine = {t.engine: t.layout for t in validate({**GOOD, "engines": ["crossrl", "rllib", "torchrl"]}, label="c")
                 .model_copy(update={"execution": laid.execution}).trials()}  # fmt: skip
    assert by_engine == {"crossrl": {}, "rllib": {"vectorize": "ASYNC"}, "torchrl": {"env": "SerialEnv"}}


def test_a_bad_layout_names_the_field_and_the_choices() -> None:
    [line] = problems(with_("execution.layout", {"torchrl": {"env": "ParallelEnv"}}), "l.yaml")
    assert line.startswith("l.yaml: execution.layout.torchrl.env: 'ParallelEnv' is not one of gym_sync, SerialEnv, ")
    [line] = problems(with_("execution.layout", {"jax": {}}), "l.yaml")
    assert "execution.layout.jax" in line
    raw = with_("execution.layout", {"torchrl": {"env": "gym_sync"}})
    raw["env"] = {"id": "mpe2:simple_spread_v3", "agents": "shared"}
    lines = [p for p in problems(raw, "ma.yaml") if "layout" in p]
    assert lines == ["ma.yaml: execution.layout.torchrl.env: 'gym_sync' is for single-agent envs; TorchRL steps a "
                     "multi-agent env (env.agents) in SerialEnv: leave it out"]  # fmt: skip


def _scaled(algorithm: str, scaling: str | None, hyperparams: dict | None = None) -> dict[int, dict]:
    raw = with_("algorithm", {"name": algorithm, "hyperparams": hyperparams or {}})
    raw["execution"] = {"workers": [1, 4, 32], "envs_per_worker": 2, "scaling": scaling}
    raw["engines"] = ["crossrl"]
    spec = validate(raw, label="s")
    return {t.workers: {**t.hyperparams, "scaling": t.batch_scaling} for t in spec.trials()}


def test_each_algorithm_runs_its_own_batch_scaling_when_the_spec_is_silent_and_the_fingerprint_holds() -> None:
    for algorithm, own in (("ppo", "strong"), ("impala", "strong"), ("a3c", "weak"), ("dqn", "weak")):
        trials = _scaled(algorithm, None)
        assert {t["scaling"] for t in trials.values()} == {own}
        assert trials[1] == trials[4] == trials[32]  # the spec's own hyperparameters at every worker count
        silent = with_("algorithm", {"name": algorithm})
        said = yaml.safe_load(yaml.safe_dump(silent))
        said["execution"]["scaling"] = own
        other = yaml.safe_load(yaml.safe_dump(silent))
        other["execution"]["scaling"] = "weak" if own == "strong" else "strong"
        fp = validate(silent, label="s").fingerprint()
        assert validate(said, label="s").fingerprint() == fp != validate(other, label="s").fingerprint()


def test_weak_scaling_grows_the_synchronous_batch_and_strong_splits_the_per_worker_one() -> None:
    ppo = _scaled("ppo", "weak", {"train_batch": 500, "minibatch": 100})
    assert [ppo[w]["train_batch"] for w in (1, 4, 32)] == [500, 2000, 16000]
    assert {ppo[w]["minibatch"] for w in ppo} == {100}  # minibatches keep their size: more of them
    impala = _scaled("impala", "weak", {"train_batch": 500})
    assert [impala[w]["train_batch"] for w in (1, 4, 32)] == [500, 2000, 16000]
    assert {impala[w]["rollout_fragment"] for w in impala} == {50}
    a3c = _scaled("a3c", "strong", {"train_batch": 100})
    assert [a3c[w]["train_batch"] for w in (1, 4, 32)] == [100, 25, 4]  # ceil(100 / 32)
    dqn = _scaled("dqn", "strong", {"rollout_fragment": 8})
    assert [dqn[w]["rollout_fragment"] for w in (1, 4, 32)] == [8, 2, 1]  # never below one step per env
    assert {dqn[w]["train_batch"] for w in dqn} == {32}


def test_an_unknown_batch_scaling_is_one_line() -> None:
    assert problems(with_("execution.scaling", "linear")) == [
        "x.yaml: execution.scaling: 'linear' is not one of strong, weak"
    ]
