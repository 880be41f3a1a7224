"""What TorchRL's native loops (``torchrl_loop``: PPO, ``torchrl_impala``: IMPALA) share: their envs, built as
TorchRL's reference scripts build them, and reading the adapter's stored native config."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from crossrl.adapters.base import MetricSink
from crossrl.measure.fidelity import beat
from crossrl.scenarios import metrics as M
from crossrl.scenarios.spec import Trial

ACTIVATIONS = {"tanh": "Tanh", "relu": "ReLU"}
INIT = "the spec's (init_as_spec): orthogonal, gain sqrt(2) hidden, 0.01 logits, 1.0 value, zero biases"


def make_env(env_id: str, kwargs: Mapping[str, Any], num_envs: int) -> Any:
    """``num_envs`` gymnasium envs stepped serially, with episode return and length counters (module-level: a
    collector worker started with spawn unpickles it)."""
    import torch
    from torchrl.envs import Compose, RewardSum, SerialEnv, StepCounter, TransformedEnv

    torch.set_num_threads(1)
    base = SerialEnv(num_envs, functools.partial(gym_env, env_id, dict(kwargs)), serial_for_single=True)
    return TransformedEnv(base, Compose(RewardSum(), StepCounter()))


def gym_env(env_id: str, kwargs: dict[str, Any]) -> Any:
    from torchrl.envs import GymEnv, set_gym_backend

    with set_gym_backend("gymnasium"):
        return GymEnv(env_id, categorical_action_encoding=True, **kwargs)


def stored_value(stored: Mapping[str, Any], *keys: str) -> Any:
    value: Any = stored
    for key in keys:
        if not isinstance(value, Mapping) or key not in value:
            raise ValueError(f"torchrl-native: the stored native config has no {'.'.join(keys)}")
        value = value[key]
    return value


def needed(stored: Mapping[str, Any], where: str, fix: str, *keys: str) -> Any:
    """:func:`stored_value`, its error in one line with the stored file (``where``) and the remedy (``fix``)."""
    try:
        return stored_value(stored, *keys)
    except ValueError as e:
        raise ValueError(f"{e} ({where}): {fix}") from None


SYNC_COLLECTORS = ("Collector", "MultiSyncCollector")


def stored_sync_collector(
    trial: Trial, stored: Mapping[str, Any], where: str, *, algorithm: str, fix: str
) -> dict[str, Any]:
    """The stored synchronous collector of a replay loop (SAC's, DreamerV3's), checked against the trial:
    ``collector_cls``, ``collector_kwargs`` (without ``num_workers``), ``workers`` and ``fpb`` (frames per batch, > 0);
    a ValueError in one line naming the file (``where``) and the remedy (``fix``) otherwise."""

    def refuse(what: str) -> ValueError:
        return ValueError(f"torchrl-native: {algorithm} {what} ({where}): {fix}")

    collector_cls = needed(stored, where, fix, "collector", "class")
    if collector_cls not in SYNC_COLLECTORS:
        raise refuse(f"runs on {' or '.join(SYNC_COLLECTORS)}, the stored collector is {collector_cls!r}")
    collector_kwargs = dict(needed(stored, where, fix, "collector", "kwargs"))
    workers = int(collector_kwargs.pop("num_workers", 1))
    if workers != trial.workers:
        raise refuse(f"config is for {workers} worker(s), the trial has {trial.workers}")
    fpb = int(needed(stored, where, fix, "collector", "kwargs", "frames_per_batch"))
    if fpb <= 0:
        raise refuse(f"needs frames_per_batch > 0, not {fpb}")
    return {"collector_cls": collector_cls, "collector_kwargs": collector_kwargs, "workers": workers, "fpb": fpb}


def sync_collector(collector_cls: str, env_fn: Any, policy: Any, *, workers: int, kwargs: Mapping[str, Any]) -> Any:
    """The stored synchronous collector: ``Collector`` over one env of ``env_fn`` in this process, or
    ``MultiSyncCollector`` over ``workers`` of them."""
    from torchrl.collectors import Collector, MultiSyncCollector

    if collector_cls == "Collector":
        return Collector(env_fn(), policy, **kwargs)
    return MultiSyncCollector([env_fn] * workers, policy, **kwargs)


def actor_critic(trial: Trial) -> tuple[Any, Any, Any, Any]:
    """The policy and value networks as TorchRL's reference scripts build them from a proof env (its specs and
    dimensions): ``MLP``s of the trial's hidden sizes and activation, a ``ProbabilisticActor`` with a
    ``Categorical`` over the logits and a ``ValueOperator``. Their weights are initialised as the spec's network
    is on every engine that takes crossrl's initialisation (:func:`init_as_spec`), so both sides of a fidelity
    check start from the same kind of network and only the loops differ (with PyTorch's default initialisation,
    as TorchRL's Atari scripts keep it, the native loop needed 1.42x the adapter's env steps on ``cartpole-ppo``:
    docs/fidelity.md). Returns ``(actor, critic, policy_net, value_net)``; seeds torch with the trial's seed
    first."""
    import torch
    from tensordict.nn import TensorDictModule
    from torchrl.data import Categorical as CategoricalSpec
    from torchrl.envs import ExplorationType
    from torchrl.modules import MLP, ProbabilisticActor, ValueOperator

    torch.set_num_threads(1)
    torch.manual_seed(trial.seed)
    proof = gym_env(trial.env.id, dict(trial.env.kwargs))
    try:
        action_spec = proof.action_spec_unbatched
        obs_spec = proof.observation_spec.get("observation", None)
        if not isinstance(action_spec, CategoricalSpec) or obs_spec is None or len(obs_spec.shape) != 1:
            raise ValueError(
                f"torchrl-native runs discrete-action envs with vector observations; {trial.env.id} has the action "
                f"spec {type(action_spec).__name__} and observations {None if obs_spec is None else obs_spec.shape}"
            )
        n_obs, n_actions = int(obs_spec.shape[-1]), int(action_spec.space.n)
        action_spec = proof.full_action_spec_unbatched.clone()
    finally:
        proof.close()

    activation = getattr(torch.nn, ACTIVATIONS[trial.model.activation])
    hidden = list(trial.model.hidden)
    policy_net = MLP(in_features=n_obs, out_features=n_actions, num_cells=hidden, activation_class=activation)
    value_net = MLP(in_features=n_obs, out_features=1, num_cells=hidden, activation_class=activation)
    init_as_spec(policy_net, out_gain=0.01)
    init_as_spec(value_net, out_gain=1.0)
    actor = ProbabilisticActor(
        TensorDictModule(policy_net, in_keys=["observation"], out_keys=["logits"]),
        in_keys=["logits"],
        spec=action_spec,
        distribution_class=torch.distributions.Categorical,
        return_log_prob=True,
        default_interaction_type=ExplorationType.RANDOM,
    )
    return actor, ValueOperator(value_net, in_keys=["observation"]), policy_net, value_net


def init_as_spec(mlp: Any, *, out_gain: float) -> Any:
    """``mlp``'s linear layers initialised as the spec's network (``core.models.init_linears_``: orthogonal, gain
    sqrt(2) on hidden layers and ``out_gain`` on the last, 0.01 for policy logits, 1.0 for values, zero biases)."""
    from crossrl.core.models import init_linears_

    return init_linears_(mlp, out_gain=out_gain)


def episodes(data: Any) -> tuple[list[float], list[int]]:
    """The returns and lengths of the episodes that ended in a collected batch (``RewardSum``, ``StepCounter``)."""
    done = data["next", "done"]
    return [float(r) for r in data["next", "episode_reward"][done]], [int(n) for n in data["next", "step_count"][done]]


def report(
    sink: MetricSink,
    data: Any,
    *,
    sampled: int,
    values: Mapping[str, float],
    times: tuple[float, float, float, float],
    trained: int | None = None,
) -> None:
    """One point for a collected batch (its finished episodes, the losses in ``values``, the sample / learn / weight
    sync seconds from ``times`` = (collect start, collected, learned, synced)), then a beat for the stall watchdog."""
    returns, lengths = episodes(data)
    t0, t1, t2, t3 = times
    sink.point(
        env_steps_sampled=sampled,
        env_steps_trained=trained,
        episode_returns=returns,
        episode_lengths=lengths,
        values={**values, M.TIME_SAMPLE_S: t1 - t0, M.TIME_LEARN_S: t2 - t1, M.TIME_SYNC_WEIGHTS_S: t3 - t2},
    )
    beat()
