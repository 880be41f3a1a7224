"""TorchRL on multi-agent envs (crossrl.adapters.torchrl.multi_agent): the ma-smoke trial (MPE simple_spread, 3 agents)
in-process with a shared policy, one policy per agent and named groups; the team return is the sum of the agents'
returns, every policy reports its losses, and a policy's networks have crossrl's parameter count."""

from __future__ import annotations

from typing import Any

import psutil
import pytest
import torch
from ma_points import AGENTS, GROUPS, check_points
from tensordict import TensorDict

from crossrl.adapters.base import ListSink
from crossrl.adapters.registry import BUILTIN, load_adapter, unsupported
from crossrl.adapters.torchrl.adapter import frames_per_batch
from crossrl.adapters.torchrl.multi_agent import GroupLearner, completed_ma_episodes, ma_env_dims
from crossrl.core import algorithms
from crossrl.core.envs import agent_spaces, make_parallel_env
from crossrl.core.models import build_mlp, count_params
from crossrl.scenarios.loader import load
from crossrl.scenarios.spec import Trial

pytestmark = pytest.mark.integration


def ma_trial(agents: Any = "shared", *, workers: int = 1, algorithm: str = "ppo") -> Trial:
    overrides: dict[str, Any] = {"env.agents": agents, "engines": ["torchrl"], "execution.workers": [workers]}
    if algorithm != "ppo":
        overrides |= {"algorithm.name": algorithm, "algorithm.hyperparams": {"lr": 3.0e-4, "train_batch": 400}}
    spec, _ = load("ma-smoke", overrides=overrides)
    [trial] = spec.trials()
    assert unsupported([trial]) == []
    return trial


def run_and_check(trial: Trial, policies: dict[str, list[str]]) -> ListSink:
    """Run the trial for real; check the multi-agent contract (team and agent returns, per-policy losses)."""
    sink = ListSink(trial)
    load_adapter("torchrl", multi_agent=True).run(trial, sink)
    native = next(m["config"] for m in sink.messages if m["kind"] == "native_config")
    assert native["policies"] == policies
    assert native["collector"]["class"] == ("Collector" if trial.workers == 1 else "MultiSyncCollector")
    assert native["collector"]["kwargs"]["frames_per_batch"] == frames_per_batch(trial) == 400  # env steps
    assert "done_on_any=False" in native["env"] and "all agents are done" in native["episode_end"]

    check_points(sink.points, budget=trial.budget.env_steps or 0, policies=policies)
    return sink


def test_shared_policy_one_worker() -> None:
    run_and_check(ma_trial("shared"), {"shared": list(AGENTS)})


def test_independent_policies_one_worker() -> None:
    run_and_check(ma_trial("independent"), {a: [a] for a in AGENTS})


def test_groups_one_worker() -> None:
    sink = run_and_check(ma_trial({"groups": GROUPS}), GROUPS)
    native = next(m["config"] for m in sink.messages if m["kind"] == "native_config")
    assert native["learners"]["a"]["loss"]["keys"]["reward"] == ["a", "reward"]


def test_groups_two_workers() -> None:
    run_and_check(ma_trial({"groups": GROUPS}, workers=2), GROUPS)
    live = [p for p in psutil.Process().children(recursive=True) if "resource_tracker" not in " ".join(p.cmdline())]
    assert not [p for p in live if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


def test_a2c_shared_one_worker() -> None:
    assert set(BUILTIN["torchrl"].multi_agent or {}) == {"ppo", "a2c"}
    sink = run_and_check(ma_trial("shared", algorithm="a2c"), {"shared": list(AGENTS)})
    native = next(m["config"] for m in sink.messages if m["kind"] == "native_config")
    assert native["learners"]["shared"]["loss"]["class"] == "A2CLoss"


@pytest.mark.parametrize("agents", ["shared", "independent"])
def test_a_policy_has_crossrls_parameter_count(agents: str) -> None:
    trial = ma_trial(agents)
    env = make_parallel_env(trial.env)
    spaces = agent_spaces(env)
    env.close()
    policy_cls = algorithms.load("ppo").policy_cls
    for pid, dims in ma_env_dims(trial.env).items():
        obs_space, act_space = spaces[dims.agents[0]]
        crossrl_policy = policy_cls(
            observation_space=obs_space,
            action_space=act_space,
            hyperparams=algorithms.load("ppo").hyperparams(trial.hyperparams),
            model=trial.model,
            seed=0,
        )
        crossrl_count = sum(w.size for w in crossrl_policy.get_weights().values())
        learner = GroupLearner(trial=trial, pid=pid, dims=dims)
        assert learner.param_count() == crossrl_count == 11142  # (18*64+64 + 64*64+64) * 2 + 64*5+5 + 64+1
        # MultiAgentMLP(share_params=True): one MLP's parameters however many agents share it
        mlp = build_mlp(in_dim=dims.obs_dim, out_dim=dims.n_actions, model=trial.model)
        assert count_params(learner.actor_net) == count_params(mlp)


def test_completed_episodes_sum_every_group_in_episode_order() -> None:
    done = torch.tensor([[False, True, False], [False, False, True]]).unsqueeze(-1)
    reward_a = torch.arange(12.0).reshape(2, 3, 2, 1)  # [env, time, agents of group a, 1]
    reward_b = -torch.arange(6.0).reshape(2, 3, 1, 1)
    data = TensorDict(
        {
            "next": {
                "done": done,
                "step_count": torch.tensor([[1, 2, 1], [1, 2, 3]]).unsqueeze(-1),
                "a": TensorDict({"episode_reward": reward_a}, batch_size=[2, 3, 2]),
                "b": TensorDict({"episode_reward": reward_b}, batch_size=[2, 3, 1]),
            }
        },
        batch_size=[2, 3],
    )
    team, lengths, per_agent = completed_ma_episodes(data, {"a": ("agent_0", "agent_1"), "b": ("agent_2",)})
    assert lengths == [2, 3]
    assert per_agent == {"agent_0": [2.0, 10.0], "agent_1": [3.0, 11.0], "agent_2": [-1.0, -5.0]}
    assert team == [4.0, 16.0]
