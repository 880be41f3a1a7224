"""Ray RLlib 2.60 on multi-agent envs (``EnvSpec.agents`` set): PPO as IPPO, one RLModule per crossrl policy id.

The env is crossrl's :func:`~crossrl.core.envs.make_parallel_env` wrapped in RLlib's ``ParallelPettingZooEnv``
(:func:`parallel_env`); :func:`multi_agent_config` declares one policy (RLModule) per policy id of
``EnvSpec.policy_groups`` ("shared", each agent id, or the group names), each module built from the same
``DefaultModelConfig`` as a single-agent trial's, with its agents' spaces, and maps every agent to its policy.
Independent learners: each module has its own actor and critic over its own agents' observations (no centralised
critic). ``train_batch`` counts env steps (``count_steps_by="env_steps"``), as crossrl does.

Episode statistics come from :func:`on_episode_end`, which logs each finished episode's team return, length and
every agent's return (earlier chunks included) as one unreduced ``item_series`` entry, so the team return and the
agents' returns are those of the very same episodes (RLlib's own ``env_runners/agent_episode_returns_mean`` is a
smoothed window over past iterations, like ``episode_return_mean``).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any, Final

from crossrl.scenarios import metrics as M
from crossrl.scenarios.spec import EnvSpec, ModelSpec

ITEM_KEY: Final = "crossrl_ma_episodes"  # (team return, length, agent returns...) per finished episode

# What RLlib 2.60 does at episode ends and with agent order (stored in the native config, see docs/multi_agent.md).
EPISODE_END: Final = (
    "ParallelPettingZooEnv.step sets terminateds['__all__'] = all(terminated) and truncateds['__all__'] = "
    "all(truncated), each over the agents in that step's dicts; the vector env resets a sub-env on the step after "
    "either __all__ is True (that step is not an env step). A MultiAgentEpisode also ends when its agents end "
    "mixed (some terminated, the others truncated), but then neither __all__ is set and the sub-env is not reset. "
    "With simple_spread every agent is truncated at max_cycles at once, so an "
    "episode ends as in crossrl: when every agent is done. ParallelPettingZooEnv keeps agent ids in a set; crossrl "
    "sets its agents/possible_agents to PettingZoo's order (parallel_env)."
)
MINIBATCHES: Final = (
    "RLlib's MiniBatchCyclicIterator takes minibatch_size rows of every module per minibatch, until every module "
    "has covered num_epochs (an epoch counts once a minibatch reaches the end of the module's rows): a module with "
    "fewer rows per batch cycles through more epochs. ma-smoke with groups a (2 agents) and b (1 agent), "
    "train_batch 400, minibatch 200, epochs 2: 9 minibatches of 200 rows of each module per iteration (measured), "
    "about 2 epochs over a's ~830 rows and 4.3 over b's ~415 (800 and 400 agent steps plus RLlib's masked bootstrap "
    "row per episode chunk); crossrl trains each policy num_epochs over its own rows"
)


def parallel_env(spec: EnvSpec) -> Any:
    """RLlib's ``ParallelPettingZooEnv`` over the spec's env (:func:`~crossrl.core.envs.make_parallel_env`).

    ParallelPettingZooEnv (2.60) derives ``agents``/``possible_agents`` from a set of agent ids (no fixed order);
    here they are set to the PettingZoo env's own order, so every process lists the agents alike.
    """
    from ray.rllib.env.wrappers.pettingzoo_env import ParallelPettingZooEnv

    from crossrl.core.envs import make_parallel_env

    par_env = make_parallel_env(spec)
    env = ParallelPettingZooEnv(par_env)
    env.possible_agents = list(par_env.possible_agents)
    env.agents = list(par_env.agents)  # after the reset in its __init__: every agent, in order
    return env


def policy_layout(spec: EnvSpec) -> tuple[list[str], dict[str, tuple[str, ...]], dict[str, tuple[Any, Any]]]:
    """(possible agents in the env's order, policy id -> its agents, policy id -> (observation space, action
    space)): the env built once without its latency, each policy with its first agent's spaces."""
    from crossrl.core.envs import agent_spaces, make_parallel_env

    env = make_parallel_env(spec.model_copy(update={"step_latency_ms": 0.0}))
    try:
        agents = list(env.possible_agents)
        spaces = agent_spaces(env)
    finally:
        env.close()
    groups = spec.policy_groups(agents)
    return agents, groups, {pid: spaces[members[0]] for pid, members in groups.items()}


def map_agent(agent_id: Any, episode: Any = None, *, policy_of: Mapping[str, str], **_: Any) -> str:
    """RLlib's ``policy_mapping_fn(agent_id, episode, **kwargs)``: the agent's policy id."""
    return policy_of[str(agent_id)]


def multi_agent_config(config: Any, *, env_spec: EnvSpec, model: ModelSpec) -> Any:
    """``config`` with one policy per policy id of the spec's mapping, every agent mapped to its policy, and
    ``count_steps_by="env_steps"``; each RLModuleSpec has its policy's spaces and, left unset, the config's
    ``model_config`` (RLlib fills it in as for a single-agent module)."""
    from ray.rllib.core.rl_module.multi_rl_module import MultiRLModuleSpec
    from ray.rllib.core.rl_module.rl_module import RLModuleSpec
    from ray.rllib.policy.policy import PolicySpec

    if model.conv:
        raise ValueError("rllib: conv models are for pixel envs; a multi-agent env takes an MLP (model.hidden)")
    _, groups, spaces = policy_layout(env_spec)
    policy_of = {a: pid for pid, members in groups.items() for a in members}
    return config.multi_agent(
        policies={pid: PolicySpec(observation_space=o, action_space=a) for pid, (o, a) in spaces.items()},
        policy_mapping_fn=functools.partial(map_agent, policy_of=policy_of),
        policies_to_train=list(groups),
        count_steps_by="env_steps",
    ).rl_module(
        rl_module_spec=MultiRLModuleSpec(
            rl_module_specs={pid: RLModuleSpec(observation_space=o, action_space=a) for pid, (o, a) in spaces.items()}
        )
    )


def episode_callback(agents: Sequence[str]) -> Any:
    """The ``on_episode_end`` callback for an env whose possible agents are ``agents`` (in order)."""
    return functools.partial(on_episode_end, agents=tuple(agents))


def on_episode_end(
    *,
    agents: tuple[str, ...],
    episode: Any,
    prev_episode_chunks: Any = None,
    metrics_logger: Any = None,
    **_: Any,
) -> None:
    """Log the finished MultiAgentEpisode's (team return, length, each agent's return) over all of its chunks,
    unreduced. An agent without steps in the episode gets 0 (as in crossrl); the team return is the sum."""
    chunks = [*(prev_episode_chunks or []), episode]
    returns = dict.fromkeys(agents, 0.0)
    for chunk in chunks:
        for aid, sa_episode in chunk.agent_episodes.items():
            returns[str(aid)] = returns.get(str(aid), 0.0) + float(sa_episode.get_return())
    length = int(sum(len(c) for c in chunks))
    per_agent = [returns[a] for a in agents]
    metrics_logger.log_value(ITEM_KEY, (float(sum(per_agent)), length, *per_agent), reduce="item_series")


def episode_records(items: Any, width: int) -> list[tuple[float, ...]]:
    """The ``crossrl_ma_episodes`` entries as tuples of ``width`` numbers; entries RLlib chained into
    consecutive scalars (seen once with single-agent pairs) are regrouped."""
    if not isinstance(items, list | tuple):
        return []
    out: list[tuple[float, ...]] = []
    pending: list[float] = []
    for item in items:
        if isinstance(item, list | tuple) and len(item) == width:
            out.append(tuple(float(x) for x in item))
        elif isinstance(item, int | float) or hasattr(item, "__float__"):
            pending.append(float(item))
            if len(pending) == width:
                out.append(tuple(pending))
                pending = []
    return out


def learner_values(
    result: Mapping[str, Any], policies: Sequence[str], *, loss_keys: Mapping[str, tuple[str, ...]], diag_keys: Any
) -> dict[str, float]:
    """Per policy (``learners/<policy id>/...``): its losses and entropy as ``policy.<id>.<name>`` and its learner
    diagnostics as ``policy.<id>.diag.<name>``; the headline names are the mean over the policies reporting them."""
    from crossrl.adapters.rllib.results import first_number, result_get

    out: dict[str, float] = {}
    per_name: dict[str, list[float]] = {}
    for pid in policies:
        stats = result_get(result, "learners", pid) or {}
        found = {name: first_number(stats, keys) for name, keys in loss_keys.items()}
        found |= {name: first_number(stats, (key,)) for name, key in diag_keys.items()}
        for name, value in found.items():
            if value is not None:
                out[M.policy_metric(pid, name)] = value
                per_name.setdefault(name, []).append(value)
    out |= {name: sum(vs) / len(vs) for name, vs in per_name.items()}
    return out


# crossrl diag name -> the key RLlib's PPO learner logs under learners/<module id>/.
LEARNER_DIAG_KEYS: Final[dict[str, str]] = {
    M.DIAG_APPROX_KL: "mean_kl_loss",
    M.DIAG_POLICY_LAG: "diff_num_grad_updates_vs_sampler_policy",
    M.DIAG_GRAD_NORM: "gradients_default_optimizer_global_norm",
}


def result_to_point(result: Mapping[str, Any], *, agents: Sequence[str], policies: Sequence[str]) -> dict[str, Any]:
    """One multi-agent PPO ``train()`` result -> the keyword arguments of :meth:`MetricSink.point`.

    ``episode_returns`` are team returns (the sum over agents) of the episodes finished in the iteration, and
    ``values`` each agent's mean return over the same episodes (from :func:`on_episode_end`'s records, not
    RLlib's smoothed ``env_runners/agent_episode_returns_mean``), each policy's losses and the mean over policies.
    """
    from crossrl.adapters.rllib.results import LOSS_KEYS, env_steps_sampled, result_get, timing_values

    records = episode_records(result_get(result, "env_runners", ITEM_KEY), 2 + len(agents))
    agent_returns = {a: [r[2 + i] for r in records] for i, a in enumerate(agents)}
    values: dict[str, float | None] = {
        **learner_values(result, policies, loss_keys=LOSS_KEYS, diag_keys=LEARNER_DIAG_KEYS),
        **M.agent_return_values(agent_returns),
        **timing_values(result),
    }
    return {
        "env_steps_sampled": env_steps_sampled(result),
        "env_steps_trained": None,  # PPO trains on every sampled env step
        "episode_returns": [r[0] for r in records],
        "episode_lengths": [int(r[1]) for r in records],
        "values": {k: v for k, v in values.items() if v is not None},
    }
