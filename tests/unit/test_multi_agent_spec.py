"""Multi-agent specs (env.agents): the mapping's forms, every bad mapping refused with one line naming the field
(at load, or where the env is first built: `crossrl validate` exits 2), single-agent fingerprints unchanged."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from crossrl.adapters.registry import unsupported
from crossrl.core.envs import check_env, env_problems
from crossrl.scenarios.loader import SpecError, builtin, load, validate
from crossrl.scenarios.spec import AgentGroups, EnvSpec

SPREAD = {"id": "mpe2:simple_spread_v3", "kwargs": {"N": 3, "max_cycles": 25, "continuous_actions": False}}
ADVERSARY = {"id": "mpe2:simple_adversary_v3", "kwargs": {"N": 2, "max_cycles": 25}}  # adversary_0, agent_0, agent_1


def raw_spec(agents: object, env: dict = SPREAD) -> dict:
    return {
        "name": "ma",
        "env": {**env, "agents": agents},
        "algorithm": {"name": "ppo"},
        "engines": ["crossrl"],
        "budget": {"env_steps": 100},
    }


def problems(raw: dict) -> list[str]:
    with pytest.raises(SpecError) as e:
        validate(raw, label="ma.yaml")
    return e.value.problems


@pytest.mark.parametrize(
    ("agents", "groups"),
    [
        ("shared", {"shared": ("agent_0", "agent_1", "agent_2")}),
        ("independent", {"agent_0": ("agent_0",), "agent_1": ("agent_1",), "agent_2": ("agent_2",)}),
        ({"groups": {"a": ["agent_0", "agent_2"], "b": ["agent_1"]}}, {"a": ("agent_0", "agent_2"), "b": ("agent_1",)}),
    ],
)
def test_mapping_forms(agents: object, groups: dict) -> None:
    spec = validate(raw_spec(agents), label="ma.yaml")
    assert spec.env.multi_agent and spec.env.policy_groups(["agent_0", "agent_1", "agent_2"]) == groups
    assert env_problems(spec.env) == [] and check_env(spec.env) is None


@pytest.mark.parametrize(
    ("agents", "expected"),
    [
        ("sharde", ["env.agents: 'sharde' is not a policy mapping; give 'shared', 'independent' or {groups: {name:"]),
        ({"group": {"a": ["x"]}}, ["env.agents: {'group': {'a': ['x']}} is not a policy mapping; give"]),
        ({"groups": {}}, ["env.agents: groups: {} must map group names to lists of agent ids"]),
        ({"groups": {"a": []}}, ["env.agents: group 'a': [] must be a non-empty list of agent ids"]),
        ({"groups": {"a b": ["agent_0"]}}, ["env.agents: group name 'a b' must be letters, digits and '_.-'"]),
        (
            {"groups": {"a": ["agent_0", "agent_1"], "b": ["agent_1", "agent_2", "agent_2"]}},
            [
                "env.agents: agent 'agent_1' is in groups 'a' and 'b'; an agent is in exactly one group",
                "env.agents: agent 'agent_2' is twice in group 'b'; list it once",
            ],
        ),
    ],
)
def test_bad_mapping_shapes_one_line_each_at_load(agents: object, expected: list[str]) -> None:
    lines = problems(raw_spec(agents))
    assert len(lines) == len(expected), lines
    for line, start in zip(lines, expected, strict=True):
        assert line.startswith(f"ma.yaml: {start}"), line


def test_pixel_preprocessing_is_single_agent_only() -> None:
    raw = raw_spec("shared")
    raw["env"]["preprocessing"] = "atari"
    [line] = problems(raw)
    assert line.startswith("ma.yaml: env: preprocessing: 'atari' is for single-agent gymnasium envs")


def test_a_module_without_parallel_env_is_refused() -> None:
    [line] = problems(raw_spec("shared", {"id": "mpe2:no_such_v1"}))
    assert line.startswith("ma.yaml: env.id: 'mpe2:no_such_v1' is not a PettingZoo env module (No module named")


@pytest.mark.parametrize(
    ("env", "agents", "expected"),
    [
        (
            SPREAD,
            {"groups": {"a": ["agent_0", "agent_1", "agent_9"], "b": ["agent_2"]}},
            ["env.agents: group 'a': 'agent_9' is not an agent of mpe2:simple_spread_v3 (its agents: agent_0, "],
        ),
        (
            SPREAD,
            {"groups": {"a": ["agent_0", "agent_1"]}},
            ["env.agents: 'agent_2' is in no group; every agent needs a policy: add each to a group"],
        ),
        (
            ADVERSARY,
            "shared",
            ["env.agents: 'shared' needs one observation space, but adversary_0 has Box(-inf, inf, (8,), float32) "],
        ),
        (
            ADVERSARY,
            {"groups": {"all": ["agent_0", "adversary_0", "agent_1"]}},
            ["env.agents: group 'all' needs one observation space, but agent_0 has Box(-inf, inf, (10,), float32)"],
        ),
        (
            SPREAD,
            {"groups": {"a": ["agent_0", "agent_x"], "b": ["agent_1"]}},
            ["env.agents: group 'a': 'agent_x' is not an agent", "env.agents: 'agent_2' is in no group"],
        ),
    ],
)
def test_mapping_checked_against_the_env_one_line_each(env: dict, agents: object, expected: list[str]) -> None:
    spec = validate(raw_spec(agents, env), label="ma.yaml")  # the mapping's shape is fine; the env decides
    found = env_problems(spec.env)
    assert len(found) == len(expected), found
    for line, start in zip(found, expected, strict=True):
        assert line.startswith(start) and "\n" not in line, line


def test_groups_by_spaces_pass_on_the_env_nobody_tuned() -> None:
    groups = {"groups": {"adversary": ["adversary_0"], "good": ["agent_0", "agent_1"]}}
    spec = validate(raw_spec(groups, ADVERSARY), label="ma.yaml")
    assert isinstance(spec.env.agents, AgentGroups) and check_env(spec.env) is None
    assert validate(raw_spec("independent", ADVERSARY), label="ma.yaml").env.agents == "independent"


@pytest.mark.parametrize(
    ("agents", "start"),
    [
        ({"groups": {"a": ["agent_0", "agent_1"], "b": ["agent_1", "agent_2"]}}, "agent 'agent_1' is in groups"),
        ({"groups": {"a": ["agent_0", "agent_9"], "b": ["agent_1", "agent_2"]}}, "group 'a': 'agent_9' is not an"),
        ({"groups": {"a": ["agent_0", "agent_1"]}}, "'agent_2' is in no group"),
        ("sharde", "'sharde' is not a policy mapping"),
    ],
)
def test_cli_validate_exits_2_with_one_line(tmp_path: Path, agents: object, start: str) -> None:
    f = tmp_path / "ma.yaml"
    f.write_text(yaml.safe_dump(raw_spec(agents)))
    out = subprocess.run([sys.executable, "-m", "crossrl.cli", "validate", str(f)], capture_output=True, text=True)
    assert out.returncode == 2, out.stdout + out.stderr
    [line] = out.stderr.strip().splitlines()
    assert line.startswith(f"error: ma.yaml: env.agents: {start}"), line
    assert "Traceback" not in out.stderr + out.stdout


def test_cli_validate_shows_the_spaces_that_differ(tmp_path: Path) -> None:
    f = tmp_path / "adv.yaml"
    f.write_text(yaml.safe_dump(raw_spec("shared", ADVERSARY)))
    out = subprocess.run([sys.executable, "-m", "crossrl.cli", "validate", str(f)], capture_output=True, text=True)
    assert out.returncode == 2
    [line] = out.stderr.strip().splitlines()
    assert line.startswith("error: adv.yaml: env.agents: 'shared' needs one observation space, but adversary_0 has")


def test_single_agent_fingerprints_leave_the_mapping_out() -> None:
    """The field is left out of the canonical form at its default, so every earlier fingerprint still matches."""
    for name in builtin():
        spec, _ = load(name)
        assert ("agents" in spec.canonical()["env"]) == spec.env.multi_agent, name
    assert load("smoke")[0].fingerprint() == "6ecebdc51c2d37a0"  # the smoke baseline's (reports/baselines)
    shared = validate(raw_spec("shared"), label="a")
    independent = validate(raw_spec("independent"), label="b")
    assert shared.canonical()["env"]["agents"] == "shared"
    assert shared.fingerprint() != independent.fingerprint()


def test_what_each_engine_runs_on_multi_agent_envs() -> None:
    raw = raw_spec("shared")
    raw["engines"] = ["crossrl", "rllib", "torchrl"]
    assert unsupported(validate(raw, label="a").trials()) == []  # PPO: every engine
    raw["algorithm"] = {"name": "dqn"}
    bad = dict((t.engine, reason) for t, reason in unsupported(validate(raw, label="a").trials()))
    assert set(bad) == {"crossrl", "rllib", "torchrl"}
    assert bad["rllib"].startswith("rllib does not run dqn on multi-agent envs (env.agents) yet; it runs: ppo")
    assert bad["torchrl"].startswith("torchrl does not run dqn on multi-agent envs (env.agents) yet; it runs: ppo, a2c")
    raw["algorithm"] = {"name": "impala"}
    bad = dict((t.engine, reason) for t, reason in unsupported(validate(raw, label="a").trials()))
    assert set(bad) == {"rllib", "torchrl"}  # crossrl: async_samples over its policy map
    raw["algorithm"] = {"name": "ppo"}
    raw["execution"] = {"optimizer": "async_gradients"}
    bad = dict((t.engine, reason) for t, reason in unsupported(validate(raw, label="a").trials()))
    assert (
        "crossrl runs multi-agent envs on sync_samples, async_samples only yet, not async_gradients" in bad["crossrl"]
    )


def test_ma_smoke_is_a_multi_agent_builtin() -> None:
    spec, _ = load("ma-smoke")
    assert spec.env.multi_agent and check_env(spec.env) is None
    assert unsupported(spec.trials()) == []
    assert EnvSpec(id="CartPole-v1").multi_agent is False


def test_cli_random_return_prints_team_and_agents(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "crossrl.cli", "random-return"]
    out = subprocess.run([*cmd, "ma-smoke", "--episodes", "3"], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.strip().splitlines()
    assert lines[0] == "mpe2:simple_spread_v3, random actions, seeds 0-2"
    assert lines[1].startswith("team return (sum over agents): -") and "3 episodes" in lines[1]
    assert [ln.split(":")[0].strip() for ln in lines[2:]] == ["agent_0", "agent_1", "agent_2"]
    team = float(lines[1].split(": ")[1].split()[0])
    assert team == pytest.approx(sum(float(ln.split(": ")[1].split()[0]) for ln in lines[2:]), abs=0.03)
    f = tmp_path / "bad.yaml"
    f.write_text(yaml.safe_dump(raw_spec("sharde")))
    bad = subprocess.run([*cmd, str(f)], capture_output=True, text=True)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr and len(bad.stderr.strip().splitlines()) == 1
