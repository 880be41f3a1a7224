"""The multi-agent evaluator (crossrl.core.multi_agent): a policy map over PettingZoo parallel envs, one batched
pass per policy, one sub-batch per policy, team and per-agent returns, agents that leave early; and sync_samples
learning on its batches unchanged."""

from __future__ import annotations

import sys
import types
from typing import Any

import gymnasium as gym
import numpy as np
import pytest

from crossrl.core import algorithms
from crossrl.core import sample_batch as sb
from crossrl.core.evaluator import EvaluatorSet, pack_weights
from crossrl.core.multi_agent import MultiAgentEvaluator, evaluator_class, split_batch
from crossrl.core.optimizers.sync_samples import SyncSamplesOptimizer
from crossrl.core.policy import PolicySpec
from crossrl.core.sample_batch import concat
from crossrl.scenarios import metrics as M
from crossrl.scenarios.catalog import HYPERPARAM_DEFAULTS
from crossrl.scenarios.spec import EnvSpec, ModelSpec


class TwoAgents:
    """A PettingZoo-style parallel env: agent ``a`` earns 1 per step for 4 steps (then all are truncated), agent
    ``b`` 10 per step and terminates after 2 steps. Observations ``[step, agent index]``."""

    possible_agents = ["a", "b"]

    def __init__(self) -> None:
        self.agents: list[str] = []
        self.t = 0

    def observation_space(self, agent: str) -> gym.Space:
        return gym.spaces.Box(-10.0, 10.0, (2,), np.float32)

    def action_space(self, agent: str) -> gym.Space:
        return gym.spaces.Discrete(2)

    def _obs(self, agents: list[str]) -> dict[str, np.ndarray]:
        return {x: np.array([self.t, self.possible_agents.index(x)], np.float32) for x in agents}

    def reset(self, seed: int | None = None, options: Any = None) -> tuple[dict, dict]:
        self.t, self.agents = 0, list(self.possible_agents)
        return self._obs(self.agents), {x: {} for x in self.agents}

    def step(self, actions: dict[str, Any]) -> tuple[dict, dict, dict, dict, dict]:
        assert set(actions) == set(self.agents), (actions, self.agents)
        self.t += 1
        acting = list(self.agents)
        rew = {x: (1.0 if x == "a" else 10.0) for x in acting}
        term = {x: x == "b" and self.t == 2 for x in acting}
        trunc = {x: self.t == 4 for x in acting}
        self.agents = [x for x in acting if not (term[x] or trunc[x])]
        return self._obs(acting), rew, term, trunc, {x: {} for x in acting}

    def close(self) -> None:
        pass


@pytest.fixture(autouse=True)
def fake_module(monkeypatch: pytest.MonkeyPatch) -> None:
    module = types.ModuleType("crossrl_test_two_agents")
    module.parallel_env = lambda **kwargs: TwoAgents()  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "crossrl_test_two_agents", module)


def ppo_factory(**hp: Any) -> PolicySpec:
    alg = algorithms.load("ppo")
    return PolicySpec(
        policy_cls=alg.policy_cls,
        hyperparams=alg.hyperparams({**HYPERPARAM_DEFAULTS["ppo"], "minibatch": 64, "epochs": 1, **hp}),
        model=ModelSpec(hidden=(16,)),
    )


def evaluator(agents: Any, num_envs: int = 1, env_id: str = "crossrl_test_two_agents") -> MultiAgentEvaluator:
    spec = EnvSpec(id=env_id, agents=agents)
    return MultiAgentEvaluator(env_spec=spec, num_envs=num_envs, policy_factory=ppo_factory(), seed=0, worker_index=0)


def test_independent_policies_episodes_and_agents_that_leave_early() -> None:
    ev = evaluator("independent")
    batch = ev.sample(10)
    # t 0-3 episode 1, t 4 its autoreset row, t 5-8 episode 2, t 9 autoreset
    assert batch.num_env_steps() == 8
    assert batch.episode_returns == [24.0, 24.0] and batch.episode_lengths == [4, 4]
    assert batch.agent_returns == {"a": [4.0, 4.0], "b": [20.0, 20.0]}
    parts = split_batch(batch)
    assert set(parts) == {"a", "b"}
    a, b = parts["a"], parts["b"]
    assert a[sb.VALID][:, 0].tolist() == [True] * 4 + [False] + [True] * 4 + [False]
    assert b[sb.VALID][:, 0].tolist() == [True, True, False, False, False, True, True, False, False, False]
    assert b[sb.TERMINATEDS][:, 0].nonzero()[0].tolist() == [1, 6]
    assert a[sb.TRUNCATEDS][:, 0].nonzero()[0].tolist() == [3, 8]
    assert b[sb.OBS][2, 0].tolist() == [2.0, 1.0]  # b's final observation stays in the rows after it left
    assert b[sb.REWARDS][:, 0].sum() == 40.0 and a.num_env_steps() == 8 and b.num_env_steps() == 4
    assert sb.ADVANTAGES in a and sb.NEXT_OBS not in a  # postprocessed (GAE) per policy
    assert (a[sb.ADVANTAGES][~a[sb.VALID]] == 0).all()


def test_shared_policy_acts_for_every_agent_in_one_pass_and_learns() -> None:
    ev = evaluator("shared", num_envs=3)
    assert list(ev.policy.policies) == ["shared"]
    batch = concat([ev.sample(6), ev.sample(6)])
    shared = split_batch(batch)["shared"]
    assert shared[sb.OBS].shape == (6, 2 * 3 * 2, 2)  # [T, 2 batches x 3 envs x 2 agents, obs]
    assert batch[sb.VALID].shape == (6, 6)
    assert shared[sb.OBS][0, :2, 1].tolist() == [0.0, 1.0]  # env-major rows: env 0's agents a, b
    stats = ev.learn_on_batch(batch)
    assert {M.POLICY_LOSS, M.VALUE_LOSS, M.ENTROPY} <= set(stats)
    assert not any(k.startswith(M.POLICY_PREFIX) for k in stats)  # one policy: no per-policy copies


def test_weights_round_trip_per_policy() -> None:
    src, dst = evaluator("independent"), evaluator("independent")
    w = src.get_weights()
    assert {k.split("/")[0] for k in w} == {"a", "b"}
    dst.sample(3)  # a sampling copy keeps numpy weights and its numpy nets
    dst.set_weights(pack_weights({k: v + 1.0 for k, v in w.items()}), 5)
    got = dst.get_weights()
    assert dst.weights_version == 5 and all(np.allclose(got[k], w[k] + 1.0) for k in w)


def test_sync_samples_runs_unchanged_on_a_real_mpe_env() -> None:
    spec = EnvSpec(
        id="mpe2:simple_spread_v3", kwargs={"N": 3, "max_cycles": 25, "continuous_actions": False}, agents="independent"
    )
    factory = ppo_factory(train_batch=100)
    with pytest.raises(TypeError, match="is a multi-agent env"):
        EvaluatorSet(env_spec=spec, num_envs=2, policy_factory=factory, num_remote=0, seed=0)
    evaluators = EvaluatorSet(
        env_spec=spec, num_envs=2, policy_factory=factory, num_remote=0, seed=0, evaluator_cls=evaluator_class(spec)
    )
    opt = SyncSamplesOptimizer(evaluators, hyperparams=factory.hyperparams)
    stats = [opt.step() for _ in range(3)]
    assert sum(s.env_steps_sampled for s in stats) == opt.num_steps_sampled > 0
    episodes = [r for s in stats for r in s.episode_returns]
    assert len(episodes) >= 2
    values = stats[-1].common_values()
    assert {M.agent_metric(a) for a in ("agent_0", "agent_1", "agent_2")} <= set(values)
    assert M.policy_metric("agent_1", M.VALUE_LOSS) in values and M.POLICY_LOSS in values
    last = stats[-1]
    team = np.mean(last.episode_returns)
    per_agent = sum(np.mean(r) for r in last.agent_returns.values())
    assert team == pytest.approx(per_agent)  # the team return is the sum over agents
