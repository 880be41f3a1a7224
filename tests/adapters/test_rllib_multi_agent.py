"""RLlib on multi-agent envs (crossrl.adapters.rllib.multi_agent): the ma-smoke trial (MPE simple_spread, 3 agents) in-process
with a shared policy, one policy per agent and named groups; the team return is the sum of the agents' returns, every
policy reports its losses, batches count env steps, and a policy's RLModule has crossrl's parameter count."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from ma_points import AGENTS, GROUPS, check_points
from ray_state import run_leaving_ray_as_found

from crossrl.adapters.base import ListSink
from crossrl.adapters.registry import BUILTIN, unsupported
from crossrl.adapters.rllib import adapter as R
from crossrl.adapters.rllib import multi_agent as RM
from crossrl.core import algorithms
from crossrl.core.envs import agent_spaces, make_parallel_env
from crossrl.scenarios.loader import load
from crossrl.scenarios.spec import Trial

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("ray_cluster")]


def ma_trial(agents: Any = "shared", *, workers: int = 1) -> Trial:
    overrides = {"env.agents": agents, "engines": ["rllib"], "execution.workers": [workers]}
    spec, _ = load("ma-smoke", overrides=overrides)
    [trial] = spec.trials()
    assert unsupported([trial]) == []
    return trial


def run_and_check(trial: Trial, policies: dict[str, list[str]]) -> ListSink:
    """Run the trial for real; check the multi-agent contract (team and agent returns, per-policy losses)."""
    sink = ListSink(trial)
    run_leaving_ray_as_found(R.RllibAdapter(), trial, sink)
    native = next(m["config"] for m in sink.messages if m["kind"] == "native_config")
    assert native["policies"] == policies
    assert native["count_steps_by"] == "env_steps" and native["_train_batch_size_per_learner"] == 400
    assert sorted(native["policies_to_train"]) == sorted(policies)
    assert (
        native["_model_config"]["fcnet_hiddens"] == [64, 64] and native["_model_config"]["fcnet_activation"] == "tanh"
    )
    assert "__all__" in native["episode_end"] and native["rollout_fragment_length"] == "auto"

    check_points(sink.points, budget=trial.budget.env_steps or 0, policies=policies)
    return sink


def test_registry_lists_ppo_only() -> None:
    assert set(BUILTIN["rllib"].multi_agent or {}) == {"ppo"}
    spec, _ = load("ma-smoke", overrides={"engines": ["rllib"], "algorithm.name": "impala"})
    assert "does not run impala on multi-agent envs" in (unsupported(spec.trials())[0][1] or "")


def test_shared_policy_one_worker() -> None:
    run_and_check(ma_trial("shared"), {"shared": list(AGENTS)})


def test_independent_policies_one_worker() -> None:
    run_and_check(ma_trial("independent"), {a: [a] for a in AGENTS})


def test_groups_one_worker() -> None:
    run_and_check(ma_trial({"groups": GROUPS}), GROUPS)


def test_env_creator_wraps_the_core_parallel_env_in_agent_order() -> None:
    from ray.rllib.env.wrappers.pettingzoo_env import ParallelPettingZooEnv

    trial = ma_trial("independent")
    env = R.env_creator({"env_spec": trial.env.model_dump(mode="json")})
    assert isinstance(env, ParallelPettingZooEnv)
    assert env.possible_agents == env.agents == list(AGENTS)
    obs, _ = env.reset(seed=0)
    _, rewards, terms, truncs, _ = env.step({a: 0 for a in obs})
    assert set(rewards) == set(AGENTS) and terms["__all__"] is False and truncs["__all__"] is False
    env.close()


@pytest.mark.parametrize("agents", ["shared", "independent"])
def test_a_policy_has_crossrls_parameter_count(agents: str) -> None:
    trial = ma_trial(agents)
    plan = R.plan_resources(algorithm="ppo", workers=1, available_cpus=2)
    config = R.build_config(trial, plan=plan, env_name="unused")
    multi = config.get_multi_rl_module_spec().build()
    env = make_parallel_env(trial.env)
    spaces = agent_spaces(env)
    env.close()
    groups = trial.env.policy_groups(AGENTS)
    assert set(multi.keys()) == set(groups)
    alg = algorithms.load("ppo")
    for pid, members in groups.items():
        obs_space, act_space = spaces[members[0]]
        crossrl_policy = alg.policy_cls(
            observation_space=obs_space,
            action_space=act_space,
            hyperparams=alg.hyperparams(trial.hyperparams),
            model=trial.model,
            seed=0,
        )
        crossrl_count = sum(w.size for w in crossrl_policy.get_weights().values())
        rllib_count = sum(p.numel() for p in multi[pid].parameters())
        assert rllib_count == crossrl_count == 11142  # (18*64+64 + 64*64+64) * 2 + 64*5+5 + 64+1
        assert len([m for m in multi[pid].modules() if type(m).__name__ == "Tanh"]) == 4  # 2 actor + 2 critic


class _Chunk:
    """A MultiAgentEpisode chunk as on_episode_end reads it: agent_episodes (get_return) and len (env steps)."""

    def __init__(self, returns: dict[str, float], length: int) -> None:
        self.agent_episodes = {a: SimpleNamespace(get_return=lambda r=r: r) for a, r in returns.items()}
        self.length = length

    def __len__(self) -> int:
        return self.length


def test_episode_records_sum_agents_and_survive_flattening() -> None:
    logged: list[Any] = []
    logger = SimpleNamespace(log_value=lambda key, value, reduce: logged.append((key, value, reduce)))
    first = _Chunk({"agent_1": -1.0, "agent_0": -2.0}, 10)
    last = _Chunk({"agent_0": -0.5}, 15)  # agent_1 was done before this chunk
    RM.episode_callback(AGENTS)(episode=last, prev_episode_chunks=[first], metrics_logger=logger)
    [(key, record, reduce)] = logged
    assert (key, reduce) == (RM.ITEM_KEY, "item_series")
    assert record == (-3.5, 25, -2.5, -1.0, 0.0)  # team, length, each agent's in env order (agent_2 never acted)
    assert RM.episode_records([record, list(record), *record], 5) == [record] * 3
