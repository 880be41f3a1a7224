"""`crossrl validate` accepts what `crossrl run` runs: table specs, every problem of a spec in one pass (one line
each, naming file and field, exit 2), exit 2 when no trial can run, spaces against the algorithm and the model,
batch sizes, unread hyperparameters (a warning), "did you mean", the suite's own wording, scientific notation,
and `--show`'s resolved settings.

The command runs in-process (typer's CliRunner), so RLlib is imported once for the module; one test runs it as a
new user would, in a fresh process.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from crossrl.cli import app
from crossrl.orchestration.probes import validate_probes
from crossrl.scenarios.catalog import ALGORITHMS, CROSSRL_SETTINGS, HYPERPARAM_DEFAULTS
from crossrl.scenarios.checks import check_scenario, check_table, hyperparams_read, unread_hyperparams
from crossrl.scenarios.loader import SpecError, load, validate
from crossrl.scenarios.spec import AlgorithmSpec

SPREAD = {"id": "mpe2:simple_spread_v3", "kwargs": {"N": 3, "max_cycles": 25, "continuous_actions": False}}


def spec(**fields: Any) -> dict[str, Any]:
    """A valid spec (PPO on CartPole, crossrl only: no RLlib import unless a test asks for it), ``fields`` set."""
    raw: dict[str, Any] = {
        "name": "t",
        "env": {"id": "CartPole-v1"},
        "algorithm": {"name": "ppo"},
        "engines": ["crossrl"],
        "budget": {"env_steps": 1000},
    }
    raw.update(fields)
    return raw


def write(tmp_path: Path, raw: dict[str, Any] | str, name: str = "t.yaml") -> str:
    f = tmp_path / name
    f.write_text(raw if isinstance(raw, str) else yaml.safe_dump(raw, sort_keys=False))
    return str(f)


def cli(*args: str) -> Any:
    result = CliRunner().invoke(app, list(args))
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in result.output
    return result


def errors(result: Any, label: str = "t.yaml") -> list[str]:
    """The error lines, each checked to be one line naming the file."""
    lines = result.stderr.strip().splitlines()
    found = [line for line in lines if line.startswith("error: ")]
    for line in found:
        assert line.startswith(f"error: {label}"), line
    return found


# -- table specs ---------------------------------------------------------------------------------------------------

TABLE = """kind: table
name: tv
rows: [CartPole-v1, Acrobot-v1]
columns: [{algorithm: ppo, workers: 1}, {algorithm: a2c, workers: 2}]
engines: [crossrl, torchrl]
budget: {env_steps: 1e4}
"""


def test_a_table_spec_validates_and_lists_its_cells(tmp_path: Path) -> None:
    out = cli("validate", write(tmp_path, TABLE))
    assert out.exit_code == 0, out.output
    lines = out.stdout.splitlines()
    assert lines[0].endswith("t.yaml: ok, table tv, 4 cells (2 rows x 2 columns), 8 trials")
    cells = [line.split(":")[0].strip() for line in lines[1:] if line.startswith("  tv.")]
    assert cells == ["tv.cartpole.ppo-w1", "tv.cartpole.a2c-w2", "tv.acrobot.ppo-w1", "tv.acrobot.a2c-w2"]
    checked = check_table(write(tmp_path, TABLE), validate_probes())
    assert [c.spec.budget.env_steps for c in checked.cells if c.spec] == [10_000] * 4  # 1e4, a whole number


def test_the_builtin_table_validates_as_table_run_takes_it() -> None:
    checked = check_table("atari-seed-table", validate_probes())
    assert checked.problems == [] and len(checked.cells) == 12
    # RLlib has no A2C or A3C: listed (table run records them SKIPPED), not problems
    refused = {(t.engine, t.algorithm) for cell in checked.cells for t, _ in cell.unsupported}
    assert refused == {("rllib", "a2c"), ("rllib", "a3c")}


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (("rows:", "rowz:"), ["rowz: unknown field; did you mean rows? (rows is required)"]),
        (("engines: [crossrl, torchrl]", "engines: [crossrl, torchrl, rlib]"), ["engines: 'rlib' is not one of"]),
        (("columns: [", "columns: [{algorithm: dqn, workers: 1}, "), []),  # DQN on CartPole and Acrobot: fine
        (("kind: table\n", "kind: tabel\n"), ["kind: 'tabel' is no kind of spec"]),
    ],
)
def test_a_bad_table_gets_one_line_per_problem(tmp_path: Path, change: tuple[str, str], expected: list[str]) -> None:
    out = cli("validate", write(tmp_path, TABLE.replace(*change)))
    assert out.exit_code == (2 if expected else 0), out.output
    lines = errors(out)
    assert len(lines) == len(expected), lines
    for line, start in zip(lines, expected, strict=True):
        assert start in line, line
    if "rlib" in change[1]:  # the same mistake in every cell: one line that counts them
        assert lines[0].endswith("did you mean rllib? (and 3 more cells)"), lines


def test_a_table_none_of_whose_trials_can_run_exits_2(tmp_path: Path) -> None:
    text = TABLE.replace("engines: [crossrl, torchrl]", "engines: [rllib]").replace("ppo", "a3c")
    lines = errors(out := cli("validate", write(tmp_path, text)))
    assert out.exit_code == 2
    assert len(lines) == 2 and all("no trial of this table can run; rllib: RLlib 2.60 has no A" in ln for ln in lines)


# -- trials that cannot run ------------------------------------------------------------------------------------


def test_no_trial_can_run_exits_2_one_line_per_engine(tmp_path: Path) -> None:
    raw = spec(env={**SPREAD, "agents": "shared"}, algorithm={"name": "dqn"}, engines=["crossrl", "rllib", "torchrl"])
    out = cli("validate", write(tmp_path, raw))
    assert out.exit_code == 2 and "ok" not in out.stdout
    lines = errors(out)
    assert [line.split("; ")[1].split()[0] for line in lines] == ["crossrl", "rllib", "torchrl"]
    assert all("engines: no trial of this spec can run; " in line for line in lines)
    assert "does not run dqn on multi-agent envs" in lines[0]


def test_a_trial_run_refuses_makes_validate_exit_2_unless_it_is_skipped(tmp_path: Path) -> None:
    """validate = run: `crossrl run` refuses an A2C spec listing RLlib (exit 2), so validate does too, naming the
    trial; with --skip-unsupported (as `run --skip-unsupported` would) it is ok and the skipped trial listed."""
    path = write(tmp_path, spec(algorithm={"name": "a2c"}, engines=["crossrl", "rllib"]))
    out = cli("validate", path)
    assert out.exit_code == 2 and "ok" not in out.stdout, out.output
    assert errors(out)[0].endswith("t.yaml: unsupported: rllib-a2c-w1-s0: RLlib 2.60 has no A2C (removed from RLlib; "
                                   "rllib_contrib only); rllib supports: ppo, impala, dqn, sac, dreamer")  # fmt: skip
    assert "--skip-unsupported" in errors(out)[-1]
    out = cli("validate", path, "--skip-unsupported")
    assert out.exit_code == 0, out.output
    assert "ok, fingerprint" in out.stdout and "2 trials" in out.stdout
    assert "  unsupported: rllib-a2c-w1-s0: RLlib 2.60 has no A2C" in out.stdout


def test_trials_an_engine_refuses_once_started_are_listed(tmp_path: Path) -> None:
    """Every engine runs PPO on Pendulum's Box actions (the built-in lists all three); RLlib's own config check
    refuses a train batch its fragments cannot fill (num_env_runners x envs x rollout_fragment within 10 % of it)."""
    checked = check_scenario("pendulum-ppo", validate_probes())
    assert checked.problems == [] and checked.unsupported == [] and checked.failing == []
    assert {t.engine for t in checked.spec.trials()} == {"crossrl", "rllib", "torchrl"}
    raw = spec(
        engines=["crossrl", "rllib"],
        algorithm={"name": "ppo", "hyperparams": {"train_batch": 1000, "minibatch": 100}},
        execution={"workers": [2], "envs_per_worker": 3},
    )
    out = cli("validate", write(tmp_path, raw))
    assert out.exit_code == 2, out.output  # the engine would refuse it at start: validate says so, as run does
    [line] = [ln for ln in errors(out) if "would fail:" in ln]
    assert "t.yaml: would fail: rllib-ppo-w2-s0: rllib: " in line and "rollout_fragment_length" in line
    out = cli("validate", write(tmp_path, raw), "--skip-unsupported")
    assert out.exit_code == 0, out.output
    [line] = [ln for ln in out.stdout.splitlines() if "would fail:" in ln]
    assert line.startswith("  would fail: rllib-ppo-w2-s0: rllib: ") and "rollout_fragment_length" in line
    assert "rollout_fragment_length is algorithm.hyperparams.rollout_fragment" in line
    out = cli("validate", write(tmp_path, {**raw, "engines": ["rllib"]}))
    assert out.exit_code == 2 and len(errors(out)) == 1


def test_run_and_tune_refuse_what_validate_refuses_before_anything_starts(tmp_path: Path) -> None:
    """A train batch RLlib's fragments cannot fill: validate exits 2, and so do `run` and `tune` before a store or a
    Ray Tune trial exists (`tune` would otherwise start every configuration's trial and see each fail)."""
    raw = spec(
        engines=["crossrl", "rllib"],
        algorithm={"name": "ppo", "hyperparams": {"train_batch": 400, "minibatch": 100}},
        execution={"workers": [1], "envs_per_worker": 2},
        seeds=[0],
        search={"space": {"lr": {"loguniform": [1e-4, 1e-3]}}, "configurations": 2, "env_steps": 500},
    )
    path = write(tmp_path, raw)
    results = tmp_path / "results"
    for command in ("run", "tune"):
        out = cli(command, path, "--results-dir", str(results))
        assert out.exit_code == 2, (command, out.output)
        lines = errors(out)
        assert "t.yaml: would fail: rllib-ppo-w1-s" in lines[0] and "rollout_fragment_length" in lines[0], lines
        assert "--skip-unsupported" in lines[-1]
        assert not results.exists(), command  # nothing stored, nothing started


# -- spaces, batch sizes, the target ----------------------------------------------------------------------------


def test_an_algorithm_that_needs_discrete_actions_on_a_continuous_env(tmp_path: Path) -> None:
    for name in ("dqn", "apex"):
        [line] = errors(
            out := cli("validate", write(tmp_path, spec(env={"id": "Pendulum-v1"}, algorithm={"name": name})))
        )
        assert out.exit_code == 2
        assert (
            line.startswith(f"error: t.yaml: algorithm.name: {name} needs discrete actions") and "Pendulum-v1" in line
        )
    assert cli("validate", write(tmp_path, spec(env={"id": "Pendulum-v1"}))).exit_code == 0  # PPO takes Box actions


def test_sac_needs_bounded_continuous_actions_and_an_mlp(tmp_path: Path) -> None:
    [line] = errors(out := cli("validate", write(tmp_path, spec(algorithm={"name": "sac"}))))
    assert out.exit_code == 2
    assert (
        line.startswith("error: t.yaml: algorithm.name: sac needs continuous (Box) actions") and "CartPole-v1" in line
    )
    assert "use dqn, ppo" in line and "Pendulum-v1" in line  # what fits instead, both ways
    conv = {"name": "sac", "model": {"conv": [[16, 3, 1]]}}
    lines = errors(out := cli("validate", write(tmp_path, spec(env={"id": "Pendulum-v1"}, algorithm=conv))))
    assert out.exit_code == 2 and any("sac runs MLP models only" in line for line in lines), lines
    ok = cli("validate", write(tmp_path, spec(env={"id": "Pendulum-v1"}, algorithm={"name": "sac"})))
    assert ok.exit_code == 0, ok.output


def test_a_conv_model_against_the_observations(tmp_path: Path) -> None:
    conv = {"name": "ppo", "model": {"conv": [[16, 3, 1]]}}
    [line] = errors(out := cli("validate", write(tmp_path, spec(algorithm=conv))))
    assert out.exit_code == 2
    assert line == (
        "error: t.yaml: algorithm.model.conv: a conv stack needs image observations [H, W, C], but CartPole-v1 gives "
        "shape [4]; remove conv (the MLP reads flat observations)"
    )
    minatar = spec(env={"id": "MinAtar/Breakout-v1"}, algorithm=conv)
    assert cli("validate", write(tmp_path, minatar)).exit_code == 0


@pytest.mark.parametrize(
    ("algorithm", "start"),
    [
        ({"name": "ppo", "hyperparams": {"minibatch": 100000, "train_batch": 64}}, "minibatch: 100000 is larger than"),
        # the default minibatch (128) with a smaller train batch: named by the field the spec sets
        ({"name": "ppo", "hyperparams": {"train_batch": 64}}, "train_batch: 64 is smaller than minibatch"),
        ({"name": "a2c", "hyperparams": {"minibatch": 600}}, "minibatch: 600 is larger than train_batch"),
        ({"name": "dqn", "hyperparams": {"train_batch": 64, "buffer_size": 32}}, "train_batch: 64 is larger than"),
    ],
)
def test_batch_sizes_against_each_other(algorithm: dict[str, Any], start: str) -> None:
    with pytest.raises(SpecError) as e:
        validate(spec(algorithm=algorithm), label="t.yaml")
    [line] = e.value.problems
    assert line.startswith(f"t.yaml: algorithm.hyperparams.{start}"), line
    if "hyperparams" in algorithm and "minibatch" not in algorithm["hyperparams"] and algorithm["name"] == "ppo":
        assert f"({HYPERPARAM_DEFAULTS['ppo']['minibatch']}, ppo's default)" in line
    # A2C's minibatch is crossrl's whole batch (None) unless a spec sets one: the defaults are consistent
    assert validate(spec(algorithm={"name": algorithm["name"]}), label="t.yaml")


def test_stop_at_target_needs_a_target(tmp_path: Path) -> None:
    """Refused by `validate` and `run` (a spec object may still be built so: the sink then stops at the budget)."""
    stopping = {"env_steps": 1000, "stop_at_target": True}
    path = write(tmp_path, spec(budget=stopping))
    for command in (["validate", path], ["run", path, "--results-dir", str(tmp_path / "r"), "--no-report"]):
        out = cli(*command)
        assert out.exit_code == 2
        assert errors(out) == [
            "error: t.yaml: budget.stop_at_target: true ends a trial at target.episode_return_mean, which is not set; "
            "set target.episode_return_mean, or remove stop_at_target"
        ]
    assert not (tmp_path / "r").exists()
    assert cli("validate", write(tmp_path, spec(budget=stopping, target={"episode_return_mean": 450}))).exit_code == 0


# -- hyperparameters the algorithm does not read ---------------------------------------------------------------


def test_unread_hyperparameters_are_a_warning_naming_them(tmp_path: Path) -> None:
    raw = spec(algorithm={"name": "ppo", "hyperparams": {"buffer_size": 1000, "epsilon_final": 0.1, "lr": 1e-3}})
    out = cli("validate", write(tmp_path, raw))
    assert out.exit_code == 0, out.output
    [line] = out.stderr.strip().splitlines()
    assert line.startswith(
        "warning: t.yaml: algorithm.hyperparams: ppo does not read buffer_size (read by dqn, apex, sac, dreamer)"
    )
    assert "epsilon_final" in line and "lr" not in line.replace("remove", "")
    # RLlib refuses a trial with a name it does not map: that trial would fail, so it is listed
    out = cli("validate", write(tmp_path, {**raw, "engines": ["crossrl", "rllib"]}), "--skip-unsupported")
    assert out.exit_code == 0
    assert "  would fail: rllib-ppo-w1-s0: rllib has no setting for buffer_size, epsilon_final" in out.stdout


def test_conditional_hyperparameters() -> None:
    prioritized = AlgorithmSpec(name="dqn", hyperparams={"priority_alpha": 0.5, "num_replay_shards": 2})
    assert set(unread_hyperparams(prioritized, "sync_replay")) == {"priority_alpha", "num_replay_shards"}
    assert unread_hyperparams(prioritized, "async_replay") == {}
    on = AlgorithmSpec(name="dqn", hyperparams={"priority_alpha": 0.5, "prioritized_replay": True})
    assert unread_hyperparams(on, "sync_replay") == {}
    vtrace = AlgorithmSpec(name="impala", hyperparams={"gae_lambda": 0.9, "vtrace_clip_c": 0.9, "epochs": 2})
    assert list(unread_hyperparams(vtrace, "async_samples")) == ["gae_lambda"]
    # a default written out (as `crossrl init`'s template writes every one) is no news
    defaults = HYPERPARAM_DEFAULTS["dqn"]
    written = AlgorithmSpec(name="dqn", hyperparams={k: defaults[k] for k in ("priority_alpha", "priority_beta")})
    assert unread_hyperparams(written, "sync_replay") == {}
    impala = AlgorithmSpec(name="impala", hyperparams={"gae_lambda": HYPERPARAM_DEFAULTS["impala"]["gae_lambda"]})
    assert unread_hyperparams(impala, "async_samples") == {}


def test_engines_prints_each_cell_as_the_engines_write_it() -> None:
    """Square brackets in an engine's text ("critics as MLPs on [obs, action]") are text, not rich markup."""
    from crossrl.adapters.registry import engines as all_engines

    out = " ".join(cli("engines").stdout.split())  # the table wraps its cells: compare the words
    assert "critics as MLPs on [obs, action], uniform warm-up" in " ".join(
        all_engines()["rllib"].supported["sac"].split()
    )
    for word in ("[obs,", "action],"):
        assert word in out, out[:2000]
    # the spaces each engine runs each algorithm on, as validate holds them: every engine's PPO takes Discrete,
    # MultiDiscrete (a factored categorical head: tests/integration/test_spaces.py) and Box actions
    infos = all_engines()
    assert all(info.spaces("ppo").startswith("actions Discrete or MultiDiscrete or Box;") for info in infos.values())
    assert infos["rllib"].spaces("sac").startswith("actions Box (bounded);")
    assert all(info.spaces("dqn").startswith("actions Discrete;") for info in infos.values())
    runnable = sum(info.reason_unsupported(a) is None for info in infos.values() for a in ALGORITHMS)
    assert out.count("(actions") == runnable and out.count("observations") == runnable  # one per runnable cell


def test_what_each_algorithm_reads_agrees_with_the_engines() -> None:
    """Every name an engine maps for an algorithm is one it reads; every name it has a default for is read, except
    those each engine documents as unused (V-trace's lambda); crossrl's own settings with a shared name too."""
    from crossrl.adapters.rllib import adapter as rllib

    for alg, names in rllib.HYPERPARAM_MAP.items():
        assert set(names) <= hyperparams_read(alg), alg
        unused = {n for n, (value, _) in rllib.NOT_EQUALIZABLE[alg].items() if value is None}
        assert set(HYPERPARAM_DEFAULTS[alg]) - hyperparams_read(alg) == unused, alg
    for alg in HYPERPARAM_DEFAULTS:
        shared = {
            n for n in CROSSRL_SETTINGS[alg] if n in AlgorithmSpec.model_fields["hyperparams"].annotation.model_fields
        }
        assert shared <= hyperparams_read(alg), alg


# -- every problem in one pass, in the suite's words -----------------------------------------------------------


def test_three_mapping_problems_three_lines(tmp_path: Path) -> None:
    """One found when the spec loads (an agent twice), two once the env is built (an unknown agent, one in no
    group): all three in one run."""
    agents = {"groups": {"a": ["agent_0", "agent_0"], "b": ["agent_1", "nobody"]}}
    out = cli("validate", write(tmp_path, spec(env={**SPREAD, "agents": agents})))
    assert out.exit_code == 2
    lines = errors(out)
    starts = [
        "agent 'agent_0' is twice in group 'a'",
        "group 'b': 'nobody' is not an agent",
        "'agent_2' is in no group",
    ]
    assert len(lines) == 3, lines
    for line, start in zip(lines, starts, strict=True):
        assert line.startswith(f"error: t.yaml: env.agents: {start}"), line


def test_every_problem_of_a_spec_in_one_pass(tmp_path: Path) -> None:
    raw = spec(
        env={"id": "Pendulum-v1"},
        algorithm={"name": "dqn", "hyperparams": {"clip": 0.2, "train_batch": 100000}},
        engines=["crossrl", "rlib"],
        budget={"env_steps": 1000, "stop_at_target": True},
        seed=[0],
    )
    out = cli("validate", write(tmp_path, raw))
    assert out.exit_code == 2
    fields = [line.split(": ")[2] for line in errors(out)]
    assert sorted(fields) == sorted(
        ["engines", "seed", "algorithm.hyperparams.train_batch", "budget.stop_at_target", "algorithm.name"]
    )
    assert out.stderr.count("warning: t.yaml: algorithm.hyperparams: dqn does not read clip (read by ppo)") == 1


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [
        ("seed", [0], "seed: unknown field; did you mean seeds?"),
        (
            "engines",
            ["crossrl", "torchlr"],
            "engines: 'torchlr' is not one of crossrl, rllib, torchrl; did you mean torchrl?",
        ),
        (
            "algorithm",
            {"name": "dqm"},
            "algorithm.name: 'dqm' is not one of ppo, a2c, a3c, impala, dqn, apex, sac, dreamer; did you mean dqn?",
        ),
        (
            "algorithm",
            {"name": "ppo", "hyperparams": {"learning_rate": 0.1}},
            "learning_rate: unknown field; did you mean lr?",
        ),
        (
            "algorithm",
            {"name": "ppo", "hyperparams": {"entropy_coef": 0.1}},
            "entropy_coef: unknown field; did you mean entropy_coeff?",
        ),
        (
            "env",
            {"id": "CartPol-v1"},
            "env.id: 'CartPol-v1' is not a registered gymnasium env; did you mean CartPole-v1",
        ),
        ("env", {"id": "acrobot-v1"}, "did you mean Acrobot-v1?"),
        ("env", {"id": "mpe2:simple_sprad_v3", "agents": "shared"}, "did you mean mpe2:simple_spread_v3 or"),
        ("budget", {"env_step": 10}, "budget.env_step: unknown field; did you mean env_steps?"),
        (
            "execution",
            {"optimizer": "sync_sample"},
            "'sync_sample' cannot run ppo; valid: sync_samples, async_gradients; did you mean sync_samples?",
        ),
        (
            "algorithm",
            {"name": "ppo", "hyperparams": {"zzz": 1}},
            "zzz: unknown field; the fields here are: lr, gamma,",
        ),
    ],
)
def test_did_you_mean(field: str, value: Any, expected: str) -> None:
    with pytest.raises(SpecError) as e:
        validate(spec(**{field: value}), label="t.yaml")
    assert any(expected in line for line in e.value.problems), e.value.problems


def test_messages_in_the_suites_words() -> None:
    raw = spec(
        name="bad name!",
        algorithm={"name": "ppo", "model": {"hidden": 64}, "hyperparams": {"gamma": 1.5, "epochs": 0, "lr": "fast"}},
        execution={"workers": "two", "envs_per_worker": 2.5},
        env={"id": "CartPole-v1", "step_latency_ms": -1},
        seeds=0,
        budget="lots",
    )
    with pytest.raises(SpecError) as e:
        validate(raw, label="t.yaml")
    lines = e.value.problems
    assert len(lines) == 10, lines
    for line in lines:
        assert "Input should" not in line and "should match" not in line and "^[" not in line, line
    expected = [
        "t.yaml: name: 'bad name!' must start with a letter or digit and hold only letters, digits, '_', '.' and '-'",
        "t.yaml: algorithm.model.hidden: 64 is not a list; give a list such as [64, 64]",
        "t.yaml: algorithm.hyperparams.gamma: 1.5 must be at most 1",
        "t.yaml: algorithm.hyperparams.epochs: 0 must be at least 1",
        "t.yaml: algorithm.hyperparams.lr: 'fast' is not a number",
        "t.yaml: execution.workers: 'two' is not a list; give a list such as [1, 2]",
        "t.yaml: execution.envs_per_worker: 2.5 is not a whole number",
        "t.yaml: env.step_latency_ms: -1 must be at least 0",
        "t.yaml: seeds: 0 is not a list; give a list such as [0, 1, 2]",
        "t.yaml: budget: 'lots' is not a mapping of fields",
    ]
    for start in expected:
        assert sum(line.startswith(start) for line in lines) == 1, (start, lines)


# -- scientific notation -------------------------------------------------------------------------------------------


def test_scientific_notation_wherever_a_number_is_expected(tmp_path: Path) -> None:
    text = yaml.safe_dump(spec(), sort_keys=False).replace("env_steps: 1000", "env_steps: 1e3")
    text = text.replace("name: ppo", "name: ppo\n  hyperparams: {lr: 3e-4, train_batch: 2.048e3, gamma: 9.9E-1}")
    assert "1e3" in text and "3e-4" in text
    s, _ = load(write(tmp_path, text))
    assert s.budget.env_steps == 1000 and isinstance(s.budget.env_steps, int)
    assert s.algorithm.hyperparams.lr == pytest.approx(3e-4) and s.algorithm.hyperparams.train_batch == 2048
    assert s.algorithm.hyperparams.gamma == pytest.approx(0.99)
    assert (
        s.fingerprint()
        == load(write(tmp_path, text.replace("1e3", "1000").replace("2.048e3", "2048")))[0].fingerprint()
    )
    with pytest.raises(SpecError) as e:
        load(write(tmp_path, text.replace("env_steps: 1e3", "env_steps: 1.5e0")))
    assert e.value.problems == ["t.yaml: budget.env_steps: 1.5 is not a whole number; give one such as 1000 (or 1e3)"]
    assert load(write(tmp_path, text.replace("name: t", "name: '1e3'")))[0].name == "1e3"  # quoted: text


# -- --show, and run --------------------------------------------------------------------------------------------


def test_show_prints_the_resolved_trials_and_each_engines_settings(tmp_path: Path) -> None:
    hp = {"lr": 1e-3, "train_batch": 512, "minibatch": 64}
    raw = spec(
        algorithm={"name": "ppo", "hyperparams": hp},
        engines=["crossrl", "rllib", "torchrl"],
        execution={"workers": [1, 2], "envs_per_worker": 2},
        seeds=[0, 1],
    )
    out = cli("validate", write(tmp_path, raw), "--show")
    assert out.exit_code == 0, out.output
    lines = out.stdout.splitlines()
    assert lines[1] == "resolved trials (12: engine x workers x seed):"
    assert lines[2] == "  crossrl-ppo-w1-s0: 1 worker x 2 envs, seed 0"
    assert sum(line.startswith("  ") and "-ppo-w" in line for line in lines) == 12
    blocks = [line for line in lines[2:] if not line.startswith(" ")]
    assert [b.split(" (")[0] for b in blocks] == [
        f"{e}, {w}" for w in ("1 worker", "2 workers") for e in ("crossrl", "rllib", "torchrl")
    ]
    text = out.stdout
    # crossrl: the spec's values over the catalog's defaults and crossrl's own settings
    adam_eps = CROSSRL_SETTINGS["ppo"]["adam_eps"]
    assert (
        f"adam_eps={adam_eps:g}" in text
        and "lr=0.001" in text
        and f"clip={HYPERPARAM_DEFAULTS['ppo']['clip']:g}" in text
    )
    # rllib: its own setting names, from the config its adapter builds
    assert "minibatch_size=64" in text and "train_batch_size_per_learner=512" in text and "lambda_=0.95" in text
    assert "num_env_runners=2, num_envs_per_env_runner=2" in text
    assert text.count("  hyperparams: ") == 4  # crossrl and torchrl, per worker count


def test_run_refuses_what_validate_refuses_before_storing(tmp_path: Path) -> None:
    results = tmp_path / "results"
    path = write(tmp_path, spec(env={"id": "Pendulum-v1"}, algorithm={"name": "dqn"}))
    out = cli("run", path, "--results-dir", str(results), "--no-report")
    assert out.exit_code == 2
    [line] = errors(out)
    assert "algorithm.name: dqn needs discrete actions" in line
    assert not results.exists()


def test_in_a_fresh_process_a_new_user_gets_lines_not_a_traceback(tmp_path: Path) -> None:
    path = write(tmp_path, spec(algorithm={"name": "ppo", "hyperparams": {"minibatch": 100000, "train_batch": 64}}))
    out = subprocess.run([sys.executable, "-m", "crossrl.cli", "validate", path], capture_output=True, text=True)
    assert out.returncode == 2 and "Traceback" not in out.stderr + out.stdout
    assert out.stderr.splitlines() == [
        "error: t.yaml: algorithm.hyperparams.minibatch: 100000 is larger than train_batch (64); a minibatch is cut "
        "from the train batch: make minibatch at most train_batch"
    ]


def test_the_checks_learn_envs_and_engines_from_their_probes() -> None:
    """scenarios/ imports nothing above it: what an env's spaces are and what an engine refuses come in as Probes."""
    from gymnasium import spaces

    from crossrl.scenarios.checks import EnvSpaces, Probes, check_raw

    box = EnvSpaces({"": (spaces.Box(0, 1, (3,)), spaces.Box(-1, 1, (2,)))})  # CartPole, as this probe says
    probes = Probes(
        engine_ids=["crossrl", "toy"],
        env_problems=lambda env: [],
        env_spaces=lambda env: box,
        unsupported=lambda trials: [(t, "toy runs nothing") for t in trials if t.engine == "toy"],
    )
    checked = check_raw(spec(engines=["crossrl", "toy"], algorithm={"name": "dqn"}), probes, label="t.yaml")
    assert checked.problems == [
        "t.yaml: algorithm.name: dqn needs discrete actions (one Q-value per action), but CartPole-v1 has "
        "Box(-1.0, 1.0, (2,), float32); use sac (continuous actions), ppo, a2c, a3c or impala (they take continuous actions too), or an env "
        "with discrete actions"
    ]
    checked = check_raw(spec(engines=["crossrl", "toy"]), probes, label="t.yaml")
    assert checked.problems == [] and [t.name for t in checked.runnable] == ["crossrl-ppo-w1-s0"]
    assert [(t.name, why) for t, why in checked.unsupported] == [("toy-ppo-w1-s0", "toy runs nothing")]
    checked = check_raw(spec(engines=["toy"]), probes, label="t.yaml")
    assert checked.problems == ["t.yaml: engines: no trial of this spec can run; toy runs nothing"]


@pytest.mark.parametrize("algorithm", ["ppo", "impala", "dqn"])
def test_the_init_template_validates_without_a_warning(tmp_path: Path, algorithm: str) -> None:
    """`crossrl init` writes every default out: none of them is news to `crossrl validate`."""
    from crossrl.scenarios.template import spec_template

    path = write(tmp_path, spec_template(name="try", env_id="Acrobot-v1", algorithm=algorithm))
    checked = check_scenario(path, validate_probes())
    assert checked.problems == [] and checked.warnings == [] and checked.failing == []


def test_an_observation_dtype_outside_its_space_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """float64 observations from a float32 Box (gymnasium's Box.contains refuses them): validate builds and steps the
    env inside the guard every engine's envs step through, and says which dtype, which space and what to do."""
    support = str(Path(__file__).parents[1] / "support")
    monkeypatch.syspath_prepend(support)
    raw = spec(env={"id": "faulty_env:FaultyCartPole-v0", "kwargs": {"fault": "float64", "at": 1}})
    result = cli("validate", write(tmp_path, raw))
    assert result.exit_code == 2, result.output
    [line] = errors(result)
    assert "an observation of dtype float64 where its observation space Box(" in line and "float32" in line, line
    assert "obs.astype(np.float32)" in line, line
