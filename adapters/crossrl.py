"""The ``crossrl`` engine: a trial mapped onto crossrl's own core (evaluator actors + a policy optimizer).

Set-up (Ray, actors, the learning policy's torch modules) happens before ``sink.start_clock()``; every ``optimizer.step()``
becomes one metric point with cumulative env steps and the episodes completed in that step.
"""

from __future__ import annotations

import math
import os
import pickle
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from crossrl.adapters.base import MetricSink, send_clip
from crossrl.scenarios.spec import DEFAULT_TRANSPORT, EnvSpec, ModelSpec, Trial

if TYPE_CHECKING:
    from crossrl.core.dreamer_policy import DreamerPolicy
    from crossrl.core.evaluator import EvaluatorSet
    from crossrl.core.optimizers.base import PolicyOptimizer
    from crossrl.core.policy import Policy


def start_core(
    *,
    env_spec: EnvSpec,
    workers: int,
    envs_per_worker: int,
    policy_cls: type[Policy],
    hyperparams: Mapping[str, Any],
    model: ModelSpec,
    optimizer: str,
    seed: int,
    remote_num_cpus: float,
    transport: str = DEFAULT_TRANSPORT,
    max_restarts: int | None = None,
) -> tuple[EvaluatorSet, PolicyOptimizer]:
    """``workers`` evaluator actors of ``envs_per_worker`` envs each, and the policy optimizer ``optimizer`` over them.

    Ray must be up. Returns once every actor answers; the caller stops the optimizer, then the
    evaluators. On failure, what was started is stopped before the error propagates.
    """
    import ray

    from crossrl.core.evaluator import EvaluatorSet
    from crossrl.core.multi_agent import evaluator_class
    from crossrl.core.optimizers.base import load_optimizer
    from crossrl.core.policy import PolicySpec

    evaluators = EvaluatorSet(
        env_spec=env_spec,
        num_envs=envs_per_worker,
        policy_factory=PolicySpec(policy_cls=policy_cls, hyperparams=hyperparams, model=model),
        num_remote=workers,
        seed=seed,
        remote_num_cpus=remote_num_cpus,
        evaluator_cls=evaluator_class(env_spec),  # a policy map per evaluator for a multi-agent env
        transport=transport,
        max_restarts=max_restarts,
    )
    opt: PolicyOptimizer | None = None
    try:
        opt = load_optimizer(optimizer)(evaluators, hyperparams=hyperparams)
        ray.get([r.ping.remote() for r in evaluators.remotes])
        # The learning policy is built here, not inside the trial's clock: its first get_weights builds the torch
        # modules and the optimizer (~0.7 s on the 2-vCPU machine), as RLlib and TorchRL build their learners before
        # theirs.
        evaluators.local.get_weights()
    except BaseException:
        if opt is not None:
            opt.stop()
        evaluators.stop()
        raise
    return evaluators, opt


class CrossrlAdapter:
    """crossrl's own distributed core on Ray (RLlib paper: policy graph, evaluator actors, optimizers)."""

    engine: ClassVar[str] = "crossrl"

    def __init__(self, *, on_iteration: Callable[[int, Any], None] | None = None) -> None:
        """``on_iteration(i, evaluator_set)`` runs after each step (tests use it to kill an actor)."""
        self.on_iteration = on_iteration

    def run(self, trial: Trial, sink: MetricSink) -> None:
        import ray
        import torch

        from crossrl.core import algorithms, cluster

        started_ray = not ray.is_initialized()
        info = cluster.connect(trial.ray_address, num_cpus=None if trial.ray_address else os.cpu_count())
        evaluators: EvaluatorSet | None = None
        optimizer = None
        try:
            # Small MLPs gain nothing from intra-op threads, and on a busy machine OpenMP's spinning
            # threads cost 20x (measured: 4000 x 10 epochs PPO SGD, 5.5 s with 1 thread vs 112 s with 2).
            torch.set_num_threads(1)
            torch.manual_seed(trial.seed)
            alg = algorithms.load(trial.algorithm)
            hp = alg.hyperparams(trial.hyperparams, trial.native.get("settings"))
            # Never ask for more CPUs than exist, or actors would wait forever for resources.
            cpus = cluster.available_cpus()
            remote_cpus = min(1.0, math.floor(100 * cpus / trial.workers) / 100)
            evaluators, optimizer = start_core(  # actors up before the clock starts
                env_spec=trial.env,
                workers=trial.workers,
                envs_per_worker=trial.envs_per_worker,
                policy_cls=alg.policy_cls,
                hyperparams=hp,
                model=trial.model,
                optimizer=trial.optimizer,
                seed=trial.seed,
                remote_num_cpus=remote_cpus,
                transport=trial.transport,
                max_restarts=trial.budget.max_worker_restarts,
            )
            layout = f"{trial.workers} evaluator{'s' if trial.workers != 1 else ''} x {trial.envs_per_worker}, "
            sink.tags(engine_version=_version(), optimizer=trial.optimizer, layout=layout + trial.transport, **info)
            sink.native_config(
                {
                    "algorithm": trial.algorithm,
                    "optimizer": trial.optimizer,
                    "transport": trial.transport,
                    "policy_cls": alg.policy_cls.__name__,
                    "hyperparams": hp,
                    "model": trial.model.model_dump(),
                    "num_remote_evaluators": trial.workers,
                    "envs_per_evaluator": trial.envs_per_worker,
                    "remote_num_cpus": remote_cpus,
                    "reward_clip": "sign(reward) in each sample batch, after the episode returns are counted"
                    if trial.env.resolved_reward_clip
                    else None,
                    "torch_threads_driver": torch.get_num_threads(),
                    # multi-agent: policy id -> the agents it acts for (crossrl.core.multi_agent)
                    **({"policies": getattr(evaluators.local, "groups", {})} if trial.env.multi_agent else {}),
                }
            )
            resumed = sink.resumed()
            sampled = trained = 0
            if resumed is not None:  # the learning policy, the optimizer's counters and replay, as checkpointed
                optimizer.set_state(load_state(resumed.path))
                sampled, trained = resumed.env_steps_sampled, resumed.env_steps_trained
            running_opt = optimizer

            def save(folder: Path) -> dict[str, Any]:
                return save_state(running_opt, folder, replay=trial.checkpoint.replay_buffer)

            sink.start_clock()
            iteration = 0
            while not sink.exhausted:
                stats = optimizer.step()
                sampled += stats.env_steps_sampled
                trained += stats.env_steps_trained
                sink.point(
                    env_steps_sampled=sampled,
                    env_steps_trained=trained,
                    episode_returns=stats.episode_returns,
                    episode_lengths=stats.episode_lengths,
                    values=stats.common_values(),
                )
                sink.checkpoint_if_due(save)
                if self.on_iteration is not None:
                    self.on_iteration(iteration, evaluators)
                iteration += 1
            sink.final_checkpoint(save)
            running, optimizer = optimizer, None
            running.stop()  # no learner thread changes the policy while its clip is recorded
            local = evaluators.local
            send_clip(sink, lambda: greedy_act(local.policy))
        finally:
            if optimizer is not None:
                optimizer.stop()
            if evaluators is not None:
                evaluators.stop()
            if started_ray and trial.ray_address is None:
                cluster.disconnect()


STATE_FILE = "core.pkl"


def save_state(optimizer: PolicyOptimizer, folder: Path, *, replay: bool = True) -> dict[str, Any]:
    """The optimizer's whole state (:meth:`~crossrl.core.optimizers.base.PolicyOptimizer.get_state`) in one pickle;
    ``replay=False``: without its replay buffer (``checkpoint.replay_buffer: false``)."""
    state = optimizer.get_state(replay=replay)
    with open(folder / STATE_FILE, "wb") as f:
        pickle.dump(state, f, protocol=pickle.HIGHEST_PROTOCOL)
    held = ["policy weights", "Adam moments", "policy RNG", "env-step counters"]
    if state.get("buffer") is not None or state.get("shards") is not None:
        held.append("replay buffer")
    if "buffer" in state or "shards" in state:
        held.append("target-network sync step")
    if "version" in state:
        held.append("learner weight version")
    return {"crossrl": f"{optimizer.name}.get_state", "holds": held}


def load_state(folder: Path) -> dict[str, Any]:
    with open(folder / STATE_FILE, "rb") as f:
        state: dict[str, Any] = pickle.load(f)
    return state


def load_policy(trial: Trial, folder: Path, *, greedy: bool = True) -> Callable[[Any], Any]:
    """The trained policy of a checkpoint's engine folder, for one single-agent observation: greedy (argmax of the
    logits or Q-values) or sampled from the policy (a Q-policy: epsilon-greedy at its final epsilon)."""
    from crossrl.core.dreamer_policy import DreamerPolicy

    policy = _restored_policy(trial, folder)
    if isinstance(policy, DreamerPolicy):
        return RecurrentAct(policy, explore=not greedy)
    if greedy:
        return greedy_act(policy)

    def act(obs: Any) -> Any:
        actions, _ = policy.compute_actions(obs[None], explore=True)
        return actions[0]

    return act


class RecurrentAct:
    """A DreamerV3 policy acting on one observation at a time through its world model's recurrent state, which
    :meth:`reset` clears (the caller does at each episode's start). Greedy: the actor's mode (its most likely action,
    or its mean), the latent state still sampled as the world model does."""

    def __init__(self, policy: DreamerPolicy, *, explore: bool) -> None:
        self.policy = policy
        self.explore = explore

    def reset(self) -> None:
        self.policy.reset_acting_state()

    def __call__(self, obs: Any) -> Any:
        actions, _ = self.policy.compute_actions(obs[None], explore=self.explore)
        return actions[0]


def _restored_policy(trial: Trial, folder: Path) -> Policy:
    """The trial's policy with a checkpoint's engine folder's weights (and a Q-policy's epsilon)."""
    from crossrl.core import algorithms
    from crossrl.core.envs import make_env

    if trial.env.multi_agent:
        raise ValueError(f"{trial.name}: reloading a multi-agent env's policies is not supported yet")
    alg = algorithms.load(trial.algorithm)
    env = make_env(trial.env)
    try:
        policy = alg.policy_cls(
            observation_space=env.observation_space,
            action_space=env.action_space,
            hyperparams=alg.hyperparams(trial.hyperparams, trial.native.get("settings")),
            model=trial.model,
            seed=trial.seed,
        )
    finally:
        env.close()
    state = load_state(folder)["policy"]
    policy.set_weights(state["weights"])
    if state.get("epsilon") is not None:  # a Q-policy explores at the epsilon it had reached
        policy.set_epsilon(float(state["epsilon"]))
    return policy


def export_policy(trial: Trial, folder: Path) -> Any:
    """The checkpoint's greedy policy as a pure torch module (:class:`~crossrl.adapters.exported.GreedyPolicy`) for
    `crossrl export`: the argmax of the actor's logits (PPO, A2C, A3C, IMPALA on Discrete actions) or of the
    Q-values (DQN, Ape-X); a Gaussian's mean clipped to the env's bounds, as the evaluators clip every action before
    stepping the env; SAC's ``mid + scale * tanh(mean)``. MultiDiscrete actions and conv models: ValueError."""
    from crossrl.adapters.exported import GreedyPolicy
    from crossrl.core.actor_critic import ActorCriticPolicy
    from crossrl.core.q_policy import QPolicy
    from crossrl.core.sac_policy import SACPolicy

    if trial.model.conv:
        raise ValueError(f"{trial.name}: export takes flat observations (MLP models); this trial has a conv model")
    if trial.algorithm == "dreamer":
        raise ValueError(
            f"{trial.name}: export writes feed-forward policies; a dreamer policy acts through its world model's "
            "recurrent state (crossrl evaluate runs it)"
        )
    policy = _restored_policy(trial, folder)
    if isinstance(policy, SACPolicy):
        return GreedyPolicy(
            policy._nets().actor, act_dim=policy.act_dim, squash=True, mid=policy.act_mid, scale=policy.act_scale
        )
    if isinstance(policy, QPolicy):
        return GreedyPolicy(policy.q)
    if isinstance(policy, ActorCriticPolicy) and policy.nvec is None:
        if policy.discrete:
            return GreedyPolicy(policy.net["pi"])
        space = policy.action_space
        return GreedyPolicy(policy.net["pi"], act_dim=policy.act_dim, low=space.low.reshape(-1),
                            high=space.high.reshape(-1))  # fmt: skip
    raise ValueError(
        f"{trial.name}: export takes Discrete or Box actions; {trial.algorithm} here acts on {policy.action_space}"
    )


def greedy_act(policy: Policy) -> Callable[[Any], Any]:
    """The policy's deterministic action for one observation: argmax of its logits or Q-values."""

    def act(obs: Any) -> Any:
        actions, _ = policy.compute_actions(obs[None], explore=False)
        return actions[0]

    return act


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("crossrl")
    except PackageNotFoundError:
        return "unknown"
