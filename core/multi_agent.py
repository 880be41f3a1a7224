"""Multi-agent evaluation (RLlib paper, section 3: a policy graph per policy, a mapping from agents to policies).

A :class:`MultiAgentEvaluator` is a :class:`~crossrl.core.evaluator.PolicyEvaluator` over ``num_envs`` copies
of a PettingZoo parallel env (``EnvSpec.agents`` set) and a :class:`PolicyMap`: one policy per group of
agents (``EnvSpec.policy_groups``: one ``shared`` policy, one per agent, or named groups). At every env step
each policy acts for all of its agents in all env copies in one batched pass, through the same fragment
actor a single-agent evaluator uses (its "envs" are then the (env copy, agent) pairs: ``num_envs x k`` rows
for a policy with ``k`` agents, env-major). ``sample`` returns one :class:`SampleBatch` that holds each
policy's time-major sub-batch, postprocessed by that policy (GAE), as ``<policy id>/<column>`` columns, and
an env-level VALID column, so the batch counts env steps, concatenates along the env axis and travels like a
single-agent batch: optimizers (``sync_samples``) run on it unchanged, and :meth:`PolicyMap.learn_on_batch`
hands each policy its own sub-batch (independent learners: IPPO, no centralised critic).

Episodes: each agent gets its own reward; an episode ends when the env has no agents left (every agent
terminated or truncated). Its ``episode_returns`` are team returns (the sum over agents),
``agent_returns`` each agent's. gymnasium's NEXT_STEP autoreset is mimicked per env copy: the step after an
episode ends only resets that copy, and its rows are not transitions (``VALID == False``), their OBS the
final observations (what a truncated episode bootstraps on, see
:func:`~crossrl.core.actor_critic.next_values_from`). An agent done before the others keeps its final
observation in the rows after, none of them valid.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np

from crossrl.core import maths
from crossrl.core import sample_batch as sb
from crossrl.core.envs import agent_spaces, make_parallel_env
from crossrl.core.evaluator import PolicyEvaluator, single_thread
from crossrl.core.policy import Policy, PolicyFactory
from crossrl.core.sample_batch import SampleBatch
from crossrl.scenarios import metrics as M
from crossrl.scenarios.spec import EnvSpec

SEP = "/"
"""Between a policy id and a column name in a multi-agent batch (``shared/obs``); also in :meth:`PolicyMap.get_weights`."""


class PolicyMap:
    """Policy id -> policy, with the :class:`~crossrl.core.policy.Policy` methods an evaluator and the
    ``sync_samples`` optimizer call on their policy (weights, exploration, learning), each applied to every
    policy on its own part. Gradients (``async_gradients``) and replay (``sync_replay``) are not mapped yet."""

    def __init__(self, policies: Mapping[str, Policy]) -> None:
        self.policies = dict(policies)

    def __getitem__(self, pid: str) -> Policy:
        return self.policies[pid]

    def items(self) -> Any:
        return self.policies.items()

    def get_weights(self) -> dict[str, np.ndarray]:
        return {f"{pid}{SEP}{k}": v for pid, p in self.policies.items() for k, v in p.get_weights().items()}

    def acting_weights(self) -> dict[str, np.ndarray]:
        return {f"{pid}{SEP}{k}": v for pid, p in self.policies.items() for k, v in p.acting_weights().items()}

    def set_weights(self, weights: Mapping[str, np.ndarray]) -> None:
        for pid, part in split(weights).items():
            self.policies[pid].set_weights(part)

    def set_epsilon(self, epsilon: float) -> None:
        for p in self.policies.values():
            p.set_epsilon(epsilon)

    def get_state(self) -> dict[str, Any]:
        return {pid: p.get_state() for pid, p in self.policies.items()}

    def set_state(self, state: Mapping[str, Any]) -> None:
        for pid, part in state.items():
            self.policies[pid].set_state(part)

    def learn_on_batch(self, batch: SampleBatch) -> dict[str, float]:
        """Each policy learns on its own sub-batch; see :func:`merge_stats` for the stats."""
        parts = split_batch(batch)
        return merge_stats({pid: p.learn_on_batch(parts[pid]) for pid, p in self.policies.items()})


def split(columns: Mapping[str, np.ndarray]) -> dict[str, dict[str, np.ndarray]]:
    """``<policy id>/<name>`` entries grouped by policy id (names without the id); other entries left out."""
    out: dict[str, dict[str, np.ndarray]] = {}
    for key, value in columns.items():
        pid, sep, name = key.rpartition(SEP)
        if sep:
            out.setdefault(pid, {})[name] = value
    return out


def split_batch(batch: SampleBatch) -> dict[str, SampleBatch]:
    """A multi-agent batch's per-policy sub-batches (each with its own VALID: the agent rows that are transitions)."""
    return {pid: SampleBatch(cols, time_major=batch.time_major) for pid, cols in split(batch).items()}


def merge_stats(stats: Mapping[str, Mapping[str, float]]) -> dict[str, float]:
    """Learning stats of several policies: each name's mean over the policies that report it, and with more than
    one policy each policy's own as ``policy.<id>.<name>``."""
    out = maths.mean_stats([dict(s) for s in stats.values()])
    if len(stats) > 1:
        for pid, s in stats.items():
            out.update({M.policy_metric(pid, k): v for k, v in s.items()})
    return out


class MultiAgentEvaluator(PolicyEvaluator):
    """``num_envs`` copies of a PettingZoo parallel env + a :class:`PolicyMap`; ``worker_index`` as a
    PolicyEvaluator's. Built from the same arguments, so an :class:`~crossrl.core.evaluator.EvaluatorSet` makes
    either (``evaluator_cls``, see :func:`evaluator_class`); the policy factory builds each policy for its
    agents' spaces, policy ``j`` with seed ``seed + 7919 * j``."""

    def __init__(
        self,
        *,
        env_spec: EnvSpec,
        num_envs: int,
        policy_factory: PolicyFactory,
        seed: int,
        worker_index: int,
    ) -> None:
        single_thread(worker_index)
        self.worker_index = worker_index
        self.num_envs = num_envs
        self.envs = [make_parallel_env(env_spec) for _ in range(num_envs)]
        self.agents: list[str] = list(self.envs[0].possible_agents)
        spaces = agent_spaces(self.envs[0])
        self.groups = env_spec.policy_groups(self.agents)
        self.policy = PolicyMap(  # type: ignore[assignment]  # a map of policies where a PolicyEvaluator has one
            {
                pid: policy_factory(
                    observation_space=spaces[members[0]][0], action_space=spaces[members[0]][1], seed=seed + 7919 * j
                )
                for j, (pid, members) in enumerate(self.groups.items())
            }
        )
        # Agent -> (its policy, its row in env copy 0); env copy e's row is e * k + i for a policy of k agents.
        self._slot = {a: (pid, i) for pid, members in self.groups.items() for i, a in enumerate(members)}
        self._index = {a: n for n, a in enumerate(self.agents)}
        self._obs: dict[str, np.ndarray] = {}
        self._clips: dict[str, tuple[Any, Any] | None] = {}
        for pid, members in self.groups.items():
            obs_space, act_space = spaces[members[0]]
            assert isinstance(obs_space, gym.spaces.Box), f"{pid}: observation space {obs_space} is not a Box"
            self._obs[pid] = np.zeros((num_envs * len(members), *obs_space.shape), obs_space.dtype)
            self._clips[pid] = (act_space.low, act_space.high) if isinstance(act_space, gym.spaces.Box) else None
        for e, env in enumerate(self.envs):
            obs, _ = env.reset(seed=seed + e)
            self._write_obs(e, obs)
        self._autoreset = np.zeros(num_envs, bool)
        self._ep_return = np.zeros((num_envs, len(self.agents)))
        self._ep_len = np.zeros(num_envs, np.int64)
        self.weights_version = -1

    def _write_obs(self, e: int, obs: Mapping[str, Any], *, reset: bool = True) -> None:
        if reset:  # agents absent after a reset observe zeros
            for pid, members in self.groups.items():
                k = len(members)
                self._obs[pid][e * k : (e + 1) * k] = 0
        for a, o in obs.items():
            pid, i = self._slot[a]
            self._obs[pid][e * len(self.groups[pid]) + i] = o

    def sample(
        self,
        num_steps: int,
        weights: dict[str, np.ndarray] | bytes | None = None,
        version: int | None = None,
        epsilon: float | None = None,
    ) -> SampleBatch:
        """As :meth:`PolicyEvaluator.sample`, over every policy: ``num_steps`` joint steps of each env copy;
        returns the multi-agent batch described in this module's docstring."""
        if num_steps < 1:
            raise ValueError(f"sample: num_steps={num_steps} must be >= 1")
        if weights is not None and (version is None or version != self.weights_version):
            self.set_weights(weights, version)
        if epsilon is not None:
            self.policy.set_epsilon(epsilon)
        T, N = num_steps, self.num_envs
        sizes = {pid: len(members) for pid, members in self.groups.items()}
        obs_buf = {pid: np.empty((T, *o.shape), o.dtype) for pid, o in self._obs.items()}
        rewards = {pid: np.zeros((T, N * k), np.float32) for pid, k in sizes.items()}
        terms = {pid: np.zeros((T, N * k), bool) for pid, k in sizes.items()}
        truncs = {pid: np.zeros((T, N * k), bool) for pid, k in sizes.items()}
        valid = {pid: np.zeros((T, N * k), bool) for pid, k in sizes.items()}
        env_valid = np.zeros((T, N), bool)
        actors = {pid: p.fragment_actor(num_steps=T, num_envs=N * sizes[pid]) for pid, p in self.policy.items()}
        team_returns: list[float] = []
        lengths: list[int] = []
        agent_returns: dict[str, list[float]] = {a: [] for a in self.agents}
        slot, index = self._slot, self._index
        for t in range(T):
            actions = {}
            for pid, act in actors.items():
                obs_buf[pid][t] = self._obs[pid]
                a = act(self._obs[pid], t)
                clip = self._clips[pid]
                actions[pid] = np.clip(a, *clip) if clip is not None else a
            for e, env in enumerate(self.envs):
                if self._autoreset[e]:  # the step after an episode ended: a reset, not a transition
                    obs, _ = env.reset()
                    self._write_obs(e, obs)
                    self._autoreset[e] = False
                    continue
                env_valid[t, e] = True
                live = list(env.agents)
                joint = {}
                for agent in live:
                    pid, i = slot[agent]
                    joint[agent] = actions[pid][e * sizes[pid] + i]
                obs, rew, term, trunc, _ = env.step(joint)
                self._ep_len[e] += 1
                for agent in live:
                    pid, i = slot[agent]
                    row = e * sizes[pid] + i
                    r = float(rew.get(agent, 0.0))
                    valid[pid][t, row] = True
                    rewards[pid][t, row] = r
                    terms[pid][t, row] = bool(term.get(agent, False))
                    truncs[pid][t, row] = bool(trunc.get(agent, False))
                    self._ep_return[e, index[agent]] += r
                self._write_obs(e, obs, reset=False)
                if not env.agents:  # every agent is done: the episode ends
                    team_returns.append(float(self._ep_return[e].sum()))
                    lengths.append(int(self._ep_len[e]))
                    for agent, n in index.items():
                        agent_returns[agent].append(float(self._ep_return[e, n]))
                    self._ep_return[e] = 0.0
                    self._ep_len[e] = 0
                    self._autoreset[e] = True
        cols: dict[str, np.ndarray] = {sb.VALID: env_valid}
        for pid, p in self.policy.items():
            part = actors[pid].columns()
            part.update(
                {
                    sb.OBS: obs_buf[pid],
                    sb.NEXT_OBS: np.concatenate([obs_buf[pid][1:], self._obs[pid][None]], axis=0),
                    sb.REWARDS: rewards[pid],
                    sb.TERMINATEDS: terms[pid],
                    sb.TRUNCATEDS: truncs[pid],
                    sb.VALID: valid[pid],
                }
            )
            processed = p.postprocess_trajectory(SampleBatch(part, time_major=True))
            cols.update({f"{pid}{SEP}{k}": v for k, v in processed.items()})
        return SampleBatch(
            cols,
            time_major=True,
            episode_returns=team_returns,
            episode_lengths=lengths,
            agent_returns={a: r for a, r in agent_returns.items() if r},
        )


def evaluator_class(env_spec: EnvSpec) -> type[PolicyEvaluator]:
    """The evaluator an :class:`~crossrl.core.evaluator.EvaluatorSet` builds for ``env_spec`` (its
    ``evaluator_cls``): this module's for a multi-agent env, else :class:`PolicyEvaluator`."""
    return MultiAgentEvaluator if env_spec.multi_agent else PolicyEvaluator
