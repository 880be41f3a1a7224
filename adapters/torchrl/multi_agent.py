"""TorchRL 0.14 on multi-agent envs (``env.agents`` set): independent PPO (IPPO) and A2C, one learner per policy.

The env is crossrl's own PettingZoo parallel env (:func:`crossrl.core.envs.make_parallel_env`, the factory every
engine uses) in ``PettingZooWrapper(group_map=..., categorical_actions=True, done_on_any=False)``: one TorchRL
group per crossrl policy id (``EnvSpec.policy_groups``: ``shared``, one per agent, or the spec's named groups),
its agents stacked in the spec's order. ``done_on_any=False``: the env's root ``done`` is the AND over every
agent, so an episode ends (and the collector resets that env) when all agents are done, as on crossrl's engine.
Each worker steps ``envs_per_worker`` of them in a ``SerialEnv`` with ``StepCounter`` and ``RewardSum`` (one
running return per agent), under the same collectors as single-agent trials; ``frames_per_batch`` counts env
steps (one frame = one joint step of every agent), as crossrl's ``train_batch``.

Per group (= policy): a ``MultiAgentMLP(share_params=True, centralized=False)`` actor (one set of weights for
all of the group's agents, each acting on its own observation) under a categorical ``ProbabilisticActor``, a
critic of the same kind on the agent's own observation (no centralised critic), ``GAE`` and ``ClipPPOLoss`` /
``A2CLoss`` with every key set to the group's, and its own Adam optimiser and gradient clip: independent
learners, as crossrl's ``PolicyMap``.

Checkpoints: every group's actor and critic weights, Adam state and gradient-step count in one file
(:meth:`MultiAgentLearner.save`); a resumed trial continues as a single-agent one does
(:func:`crossrl.adapters.torchrl.adapter.train_loop`).
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.nn import TensorDictModule, TensorDictSequential
from torchrl.data import Categorical as CategoricalSpec
from torchrl.envs import Compose, EnvBase, PettingZooWrapper, RewardSum, SerialEnv, StepCounter, TransformedEnv
from torchrl.modules import MultiAgentMLP, ProbabilisticActor, ValueOperator
from torchrl.objectives import A2CLoss, ClipPPOLoss
from torchrl.objectives.value import GAE

from crossrl.adapters.base import MetricSink
from crossrl.adapters.torchrl.algorithms import (
    LEARNER_FILE,
    STATE_FORMAT,
    adam,
    check_algorithm,
    learned_state,
    load_learned_state,
    load_optimizer,
    loss_step,
    native_kwargs,
    optimizer_lr,
    read_state,
    save_state,
)
from crossrl.core.envs import make_parallel_env
from crossrl.core.maths import mean_stats
from crossrl.core.models import activation_class, count_params, init_linears_
from crossrl.scenarios import metrics as M
from crossrl.scenarios.spec import EnvSpec, ModelSpec, Trial

ALGORITHMS = ("ppo", "a2c")
OBS, LOGITS, ACTION, LOG_PROB = "observation", "logits", "action", "action_log_prob"
VALUE, ADVANTAGE, VALUE_TARGET = "state_value", "advantage", "value_target"
EPISODE_REWARD = "episode_reward"  # RewardSum's running return, per agent

# ClipPPOLoss(normalize_advantage=True) standardises the advantage over every element of the minibatch, agents
# included: intended (crossrl's core normalises over a policy's minibatch rows, one per agent and env step), so
# its advice to keep the agent dimension apart (normalize_advantage_exclude_dims) is silenced.
warnings.filterwarnings("ignore", message="You requested advantage normalization and the advantage key has more")


# -- env ---------------------------------------------------------------------------------------------------------


def group_map(env_spec: EnvSpec, possible_agents: list[str]) -> dict[str, list[str]]:
    """TorchRL's ``group_map``: crossrl's policy id -> its agents (``EnvSpec.policy_groups``), in the spec's order."""
    return {pid: list(members) for pid, members in env_spec.policy_groups(possible_agents).items()}


def _pettingzoo_env(env_spec: EnvSpec) -> PettingZooWrapper:
    env = make_parallel_env(env_spec)
    return PettingZooWrapper(
        env, group_map=group_map(env_spec, list(env.possible_agents)), categorical_actions=True, done_on_any=False
    )


def make_ma_env(env_spec: EnvSpec, num_envs: int, *, worker_process: bool = False) -> EnvBase:
    """``num_envs`` PettingZooWrapper(make_parallel_env(spec)) stepped serially, with an env-step counter and each
    agent's running return (``RewardSum`` over every group's reward).

    Module-level (not a closure) so collector worker processes started with spawn can unpickle it.
    """
    if worker_process:
        from crossrl.adapters.torchrl.adapter import allow_slow_weight_sync

        torch.set_num_threads(1)
        allow_slow_weight_sync()
    base = SerialEnv(
        num_envs, functools.partial(_pettingzoo_env, env_spec), serial_for_single=True, mp_start_method=None
    )
    groups = [key[0] for key in base.reward_keys]
    rewards = RewardSum(
        in_keys=[(g, "reward") for g in groups],
        out_keys=[(g, EPISODE_REWARD) for g in groups],
        reset_keys=[(g, "_reset") for g in groups],
    )
    return TransformedEnv(base, Compose(StepCounter(), rewards))


ENV_DESCRIPTION = (
    "TransformedEnv(SerialEnv({n} x PettingZooWrapper(make_parallel_env({id}), group_map=<policies>, "
    "categorical_actions=True, done_on_any=False)), Compose(StepCounter(), RewardSum(<each group's reward>)))"
)


@dataclass(frozen=True)
class GroupDims:
    """One group's (policy's) agents, flat observation size and number of discrete actions."""

    agents: tuple[str, ...]
    obs_dim: int
    n_actions: int


def ma_env_dims(env_spec: EnvSpec) -> dict[str, GroupDims]:
    """Policy id -> its :class:`GroupDims`, as TorchRL sees the spec's env."""
    probe = _pettingzoo_env(env_spec)
    try:
        out = {}
        for pid, agents in probe.group_map.items():
            obs_shape = probe.observation_spec[pid, OBS].shape[1:]  # [agents, *obs]
            if len(obs_shape) != 1:
                raise ValueError(
                    f"torchrl multi-agent: {pid!r} observes shape {list(obs_shape)}; only flat (vector) "
                    "observations are supported (MultiAgentMLP), no conv models"
                )
            action = probe.full_action_spec[pid, ACTION]
            if not isinstance(action, CategoricalSpec):
                raise ValueError(
                    f"torchrl multi-agent: {pid!r} has {type(action).__name__} actions; only discrete actions are "
                    "supported yet (set the env's continuous_actions: false where it has one)"
                )
            out[pid] = GroupDims(tuple(agents), int(obs_shape[0]), int(action.space.n))
        return out
    finally:
        probe.close()


# -- collectors --------------------------------------------------------------------------------------------------


def ma_local_collector(
    env_spec: EnvSpec,
    *,
    workers: int,
    envs_per_worker: int,
    policy: Any,
    frames_per_batch: int,
    native: Mapping[str, Any] | None = None,
) -> tuple[Any, dict[str, Any]]:
    """As :func:`crossrl.adapters.torchrl.adapter.local_collector` (sync only) over :func:`make_ma_env`: ``Collector`` for
    one worker (envs stepped in this process), else ``MultiSyncCollector`` over ``workers`` processes."""
    from torchrl.collectors import Collector, MultiSyncCollector

    from crossrl.adapters.torchrl.adapter import worker_init

    common = {"frames_per_batch": frames_per_batch, "total_frames": -1, "auto_register_policy_transforms": False}
    if workers == 1:
        common |= native or {}
        collector = Collector(make_ma_env(env_spec, envs_per_worker), policy, **common)
        return collector, {"class": "Collector", "kwargs": common}
    env_fn = functools.partial(make_ma_env, env_spec, envs_per_worker, worker_process=True)
    multi: dict[str, Any] = {**common, "num_threads": 1, "num_sub_threads": 1, "cat_results": "stack", **(native or {})}
    collector = MultiSyncCollector([env_fn] * workers, policy, init_fn=worker_init, **multi)
    return collector, {"class": "MultiSyncCollector", "kwargs": {**multi, "num_workers": workers}}


def build_ma_collector(*, trial: Trial, policy: Any) -> tuple[Any, dict[str, Any]]:
    """The trial's collector (``RayCollector`` when it names a Ray cluster) and how it was built."""
    from crossrl.adapters.torchrl.adapter import UNBOUNDED_FRAMES, allow_slow_weight_sync, ceil_to, frames_per_batch

    fpb = frames_per_batch(trial)
    if trial.ray_address:
        from torchrl.collectors import Collector
        from torchrl.collectors.distributed import RayCollector

        from crossrl.core.cluster import available_cpus

        allow_slow_weight_sync()
        remote = {"num_cpus": min(1.0, available_cpus() / trial.workers), "num_gpus": 0}
        env_fn = functools.partial(make_ma_env, trial.env, trial.envs_per_worker, worker_process=True)
        total = ceil_to(trial.budget.env_steps or UNBOUNDED_FRAMES, fpb) + fpb * trial.workers
        ray_kwargs = {
            "frames_per_batch": fpb, "total_frames": total, "num_collectors": trial.workers, "sync": True,
            "collector_class": Collector,
            "collector_kwargs": {"auto_register_policy_transforms": False, **native_kwargs(trial, "collector")},
            "remote_configs": remote,
        }  # fmt: skip
        collector = RayCollector([env_fn] * trial.workers, policy, **ray_kwargs)  # type: ignore[arg-type]
        return collector, {"class": "RayCollector", "kwargs": ray_kwargs, "ray_address": trial.ray_address}
    return ma_local_collector(
        trial.env,
        workers=trial.workers,
        envs_per_worker=trial.envs_per_worker,
        policy=policy,
        frames_per_batch=fpb,
        native=native_kwargs(trial, "collector"),
    )


def completed_ma_episodes(
    data: TensorDictBase, groups: dict[str, tuple[str, ...]]
) -> tuple[list[float], list[int], dict[str, list[float]]]:
    """Team returns (the sum over every agent), lengths and each agent's returns of the episodes that ended
    inside ``data``, in the same episode order (``RewardSum`` / ``StepCounter`` where the root ``done`` is set)."""
    done = data["next", "done"].squeeze(-1)
    lengths = [int(n) for n in data["next", "step_count"].squeeze(-1)[done]]
    team = torch.zeros(len(lengths))
    agent_returns: dict[str, list[float]] = {}
    for pid, agents in groups.items():
        returns = data["next", pid, EPISODE_REWARD][done].reshape(len(lengths), len(agents))  # [episodes, agents]
        team += returns.sum(-1)
        for i, agent in enumerate(agents):
            agent_returns[agent] = [float(r) for r in returns[:, i]]
    return [float(r) for r in team], lengths, agent_returns


# -- models and learners -----------------------------------------------------------------------------------------


def build_group_mlp(*, dims: GroupDims, out_dim: int, model: ModelSpec, out_gain: float) -> MultiAgentMLP:
    """One network shared by the group's agents (``share_params=True``), each agent on its own observation
    (``centralized=False``): the spec's MLP, initialised as crossrl's ``build_mlp`` (orthogonal, gain sqrt(2) on
    hidden layers and ``out_gain`` on the output layer, zero biases)."""
    if model.conv:
        raise ValueError("torchrl multi-agent: model.conv is not supported (MultiAgentMLP takes flat observations)")
    net = MultiAgentMLP(
        n_agent_inputs=dims.obs_dim,
        n_agent_outputs=out_dim,
        n_agents=len(dims.agents),
        centralized=False,
        share_params=True,
        depth=len(model.hidden),
        num_cells=list(model.hidden),
        activation_class=activation_class(model.activation),
    )
    stateful = net.get_stateful_net()
    init_linears_(stateful, out_gain=out_gain)
    net.from_stateful_net(stateful)
    return net


def build_group_actor(*, pid: str, dims: GroupDims, model: ModelSpec) -> tuple[ProbabilisticActor, MultiAgentMLP]:
    """The group's categorical policy (logits scaled by 0.01 at init, as single-agent) and its network."""
    net = build_group_mlp(dims=dims, out_dim=dims.n_actions, model=model, out_gain=0.01)
    actor = ProbabilisticActor(
        TensorDictModule(net, in_keys=[(pid, OBS)], out_keys=[(pid, LOGITS)]),
        in_keys=[(pid, LOGITS)],
        out_keys=[(pid, ACTION)],
        spec=CategoricalSpec(dims.n_actions, shape=(len(dims.agents),)),
        distribution_class=torch.distributions.Categorical,
        return_log_prob=True,
        log_prob_key=(pid, LOG_PROB),
    )
    return actor, net


def build_ma_policy(dims: dict[str, GroupDims], model: ModelSpec) -> TensorDictSequential:
    """Every group's actor, one after another: what the collectors run."""
    return TensorDictSequential(*(build_group_actor(pid=pid, dims=d, model=model)[0] for pid, d in dims.items()))


class GroupLearner:
    """One policy's actor, critic, GAE, loss and Adam; learns on its group's part of each batch."""

    def __init__(self, *, trial: Trial, pid: str, dims: GroupDims) -> None:
        self.trial, self.pid, self.dims = trial, pid, dims
        self.algo = trial.algorithm
        self.actor, self.actor_net = build_group_actor(pid=pid, dims=dims, model=trial.model)
        self.critic_net = build_group_mlp(dims=dims, out_dim=1, model=trial.model, out_gain=1.0)
        self.critic = ValueOperator(self.critic_net, in_keys=[(pid, OBS)], out_keys=[(pid, VALUE)])
        self.vf_coeff = float(trial.hp("vf_coeff"))
        common: dict[str, Any] = {
            "entropy_bonus": True,
            "entropy_coeff": float(trial.hp("entropy_coeff")),
            "critic_coeff": self.vf_coeff,
            "loss_critic_type": "l2",  # squared error, as crossrl's core (TorchRL defaults to smooth_l1)
        }
        self.loss: ClipPPOLoss | A2CLoss
        if self.algo == "ppo":
            self.loss_kwargs = {
                **common,
                "clip_epsilon": float(trial.hp("clip")),
                "clip_value": float(trial.hp("vf_clip")),
                "normalize_advantage": True,
            }
            self.loss_kwargs |= native_kwargs(trial, "loss")
            self.loss = ClipPPOLoss(self.actor, self.critic, **self.loss_kwargs)
        else:
            self.loss_kwargs = {**common, **native_kwargs(trial, "loss")}
            self.loss = A2CLoss(self.actor, self.critic, **self.loss_kwargs)
        # the raw critic loss is reported as loss_critic / critic_coeff: a native critic_coeff is the one applied
        self.vf_coeff = float(self.loss_kwargs.get("critic_coeff") or self.vf_coeff)
        self.keys = {
            "advantage": (pid, ADVANTAGE),
            "value_target": (pid, VALUE_TARGET),
            "value": (pid, VALUE),
            "reward": (pid, "reward"),
            "done": (pid, "done"),
            "terminated": (pid, "terminated"),
        }
        self.loss.set_keys(**self.keys, action=(pid, ACTION), sample_log_prob=(pid, LOG_PROB))
        self.estimator_kwargs = {"gamma": float(trial.hp("gamma")), "lmbda": float(trial.hp("gae_lambda"))}
        self.estimator = GAE(value_network=self.critic, **self.estimator_kwargs)
        self.estimator.set_keys(**self.keys)
        self.params = list(self.loss.parameters())
        self.optim = adam(self.params, trial=trial, lr=float(trial.hp("lr")))
        self.grad_clip = float(trial.hp("grad_clip"))
        self.grad_steps = 0

    def learn(self, data: TensorDictBase) -> dict[str, float]:
        """GAE over the group's part of the whole batch, then PPO's epochs of shuffled minibatches (or one A2C step).

        A minibatch is ``minibatch`` agent rows of this policy, as crossrl's core (a policy of k agents gets k
        rows per env step, so k times the minibatches per epoch). The rows are shuffled across env steps and
        agents, then stacked k at a time (``share_params`` and decentralised networks make the agent slot
        irrelevant): each minibatch holds ``minibatch`` rows rounded up to a multiple of k.
        """
        with torch.no_grad():
            data = self.estimator(data)
        k = len(self.dims.agents)
        rows = data.get(self.pid).reshape(-1)  # every (env step, agent) row of this group
        if self.algo != "ppo":
            return self._step(TensorDict({self.pid: rows.reshape(-1, k)}, batch_size=[rows.numel() // k]))
        size = self.trial.hp("minibatch")
        chunk = -(-int(size) // k) * k if size else rows.numel()
        stats = []
        for _ in range(int(self.trial.hp("epochs"))):
            for idx in torch.randperm(rows.numel()).split(chunk):
                mb = rows[idx].reshape(-1, k)
                stats.append(self._step(TensorDict({self.pid: mb}, batch_size=mb.batch_size[:1])))
        return mean_stats(stats)

    def _step(self, batch: TensorDictBase) -> dict[str, float]:
        self.grad_steps += 1
        return loss_step(self.loss, batch, optim=self.optim, params=self.params, grad_clip=self.grad_clip,
                         vf_coeff=self.vf_coeff)  # fmt: skip

    def state_dict(self) -> dict[str, Any]:
        """The group's actor and critic weights, Adam's state and gradient-step count."""
        return {"loss": learned_state(self.loss), "optim": self.optim.state_dict(),
                "counters": {"grad_steps": self.grad_steps}}  # fmt: skip

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """As :meth:`state_dict` gave it; the loss's coefficients and the learning rate stay the trial's."""
        load_learned_state(self.loss, state["loss"])
        load_optimizer(self.optim, state["optim"], optimizer_lr(self.trial, float(self.trial.hp("lr"))))
        self.grad_steps = int(state["counters"]["grad_steps"])

    def param_count(self) -> int:
        """Trainable parameters of the group's actor and critic (one MLP each, shared by its agents)."""
        return count_params(self.actor) + count_params(self.critic)

    def native(self) -> dict[str, Any]:
        return {
            "agents": list(self.dims.agents),
            "loss": {"class": type(self.loss).__name__, "kwargs": self.loss_kwargs,
                     "keys": {k: list(v) for k, v in self.keys.items()}},
            "value_estimator": {"class": "GAE", "kwargs": self.estimator_kwargs},
            "optimizer": {"class": "torch.optim.Adam", "lr": self.optim.defaults["lr"], "eps": self.optim.defaults["eps"]},
            "networks": {"actor": repr(self.actor_net), "critic": repr(self.critic_net),
                         "actor_params": count_params(self.actor), "critic_params": count_params(self.critic)},
        }  # fmt: skip


class MultiAgentLearner:
    """A :class:`GroupLearner` per policy; ``policy`` (every group's actor) is what the collectors run."""

    always_sync = False

    def __init__(self, *, trial: Trial, dims: dict[str, GroupDims]) -> None:
        if trial.algorithm not in ALGORITHMS:
            raise ValueError(
                f"torchrl: no {trial.algorithm!r} on multi-agent envs; it runs {', '.join(ALGORITHMS)} there"
            )
        self.trial = trial
        self.groups = {pid: GroupLearner(trial=trial, pid=pid, dims=d) for pid, d in dims.items()}
        self.policy = TensorDictSequential(*(g.actor for g in self.groups.values()))

    def learn(self, data: TensorDictBase) -> tuple[int, dict[str, float]]:
        """Every policy learns on its part of the batch; returns (env steps trained, stats).

        The stats: each name's mean over the policies (the headline losses) and each policy's own as
        ``policy.<id>.<name>`` (also with one policy).
        """
        per_policy = {pid: g.learn(data) for pid, g in self.groups.items()}
        out = mean_stats(list(per_policy.values()))
        for pid, stats in per_policy.items():
            out.update({M.policy_metric(pid, k): v for k, v in stats.items()})
        return data.numel(), out

    # -- checkpoints ---------------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {
            "format": STATE_FORMAT,
            "algorithm": self.trial.algorithm,
            "multi_agent": True,
            "dims": {pid: {"agents": list(g.dims.agents), "obs_dim": g.dims.obs_dim, "n_actions": g.dims.n_actions}
                     for pid, g in self.groups.items()},
            "groups": {pid: g.state_dict() for pid, g in self.groups.items()},
        }  # fmt: skip

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        check_algorithm(state, self.trial.algorithm)
        if set(state.get("groups", {})) != set(self.groups):
            raise ValueError(
                f"torchrl checkpoint: policies {sorted(state.get('groups', {}))}, this trial has {sorted(self.groups)}"
            )
        for pid, g in self.groups.items():
            g.load_state_dict(state["groups"][pid])

    def save(self, folder: Path) -> dict[str, Any]:
        """Every policy's state into ``folder`` (a checkpoint's engine folder); a description of it."""
        save_state(folder, self.state_dict())
        return {"learner": type(self).__name__, "algorithm": self.trial.algorithm,
                "grad_steps": {pid: g.grad_steps for pid, g in self.groups.items()}, "files": [LEARNER_FILE]}  # fmt: skip

    def restore(self, folder: Path) -> None:
        self.load_state_dict(read_state(folder))

    def native(self) -> dict[str, Any]:
        trial = self.trial
        if trial.algorithm == "ppo":
            update = (f"per policy: GAE over the whole batch, then {trial.hp('epochs')} epochs of shuffled minibatches "
                      f"of {trial.hp('minibatch')} agent rows (rounded up to a multiple of the policy's agents; a "
                      "policy of k agents has k rows per env step); advantages normalised per minibatch")  # fmt: skip
        else:
            update = "per policy: one Adam step per collected batch (GAE over the batch, every agent row)"
        return {
            "policies": {pid: list(g.dims.agents) for pid, g in self.groups.items()},
            "learners": {pid: g.native() for pid, g in self.groups.items()},
            "grad_clip_norm": float(trial.hp("grad_clip")),
            "update": update,
            "independent_learners": "one actor, critic (on the agent's own observation) and Adam per policy: "
            "IPPO, no centralised critic; MultiAgentMLP(share_params=True, centralized=False) shares a policy's "
            "weights between its agents",
        }


# -- the trial loop ----------------------------------------------------------------------------------------------


class TorchrlMultiAgentAdapter:
    """TorchRL 0.14 on multi-agent envs: the adapter the registry loads for a torchrl trial whose env has
    ``agents`` (its ``multi_agent_target``); single-agent trials run in :class:`crossrl.adapters.torchrl.adapter.TorchrlAdapter`."""

    engine: ClassVar[str] = "torchrl"

    def run(self, trial: Trial, sink: MetricSink) -> None:
        torch.set_num_threads(1)  # as TorchrlAdapter: tiny networks, intra-op threads only spin
        torch.manual_seed(trial.seed)
        tags: dict[str, str] = {}
        if trial.ray_address:
            from crossrl.core.cluster import connect

            tags = connect(trial.ray_address)
        run_multi_agent(trial, sink, tags)


def run_multi_agent(trial: Trial, sink: MetricSink, tags: dict[str, str]) -> None:
    """The trial loop of :class:`TorchrlMultiAgentAdapter` (``tags``: the Ray cluster's, when the trial names one)."""

    import torchrl

    from crossrl.adapters.torchrl.adapter import collector_seed, layout_label, mapping_for, train_loop

    dims = ma_env_dims(trial.env)
    learner = MultiAgentLearner(trial=trial, dims=dims)
    collector, collector_desc = build_ma_collector(trial=trial, policy=learner.policy)
    groups = {pid: d.agents for pid, d in dims.items()}
    try:
        collector.set_seed(collector_seed(trial, sink.resumed()))
        layout = layout_label(trial, collector_desc["class"], env="SerialEnv")
        sink.tags(engine_version=torchrl.__version__, collector=collector_desc["class"], layout=layout, **tags)
        mapping = mapping_for(trial.algorithm)
        sink.native_config(
            {
                "engine": "torchrl",
                "torchrl_version": torchrl.__version__,
                "multi_agent": True,
                "collector": collector_desc,
                "env": ENV_DESCRIPTION.format(n=trial.envs_per_worker, id=trial.env.id),
                "episode_end": "done_on_any=False: the env's done is the AND over every agent's done, so an episode "
                "ends (and the collector resets the env) when all agents are done, as crossrl's engine; an agent "
                "done before the others is not supported (PettingZooWrapper without use_mask raises)",
                "frames": "one frame = one env step (a joint step of every agent); frames_per_batch counts env steps",
                **learner.native(),
                "hyperparams": {k: {"value": v, "torchrl": mapping[k].torchrl}
                                for k, v in trial.hyperparams.items() if k in mapping},
                "seed": trial.seed,
                "torch_num_threads": {"learner": torch.get_num_threads(), "collector_workers": 1},
            }
        )  # fmt: skip

        def episodes(data: TensorDictBase) -> tuple[list[float], list[int], dict[str, float]]:
            returns, lengths, agent_returns = completed_ma_episodes(data, groups)
            return returns, lengths, M.agent_return_values(agent_returns)

        train_loop(collector=collector, learner=learner, sink=sink, episodes=episodes)
    finally:
        collector.shutdown()
