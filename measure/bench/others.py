"""The RLlib and TorchRL sampling contestants (see :mod:`crossrl.measure.bench.contestants`).

Each engine is built by its adapter's public builders (:mod:`crossrl.adapters.rllib.adapter`,
:mod:`crossrl.adapters.torchrl.adapter`), so the bench samples with the envs, networks and collectors a trial uses.
"""

from __future__ import annotations

import os
from typing import Any

from crossrl.measure.bench.base import Contestant, ray_up
from crossrl.scenarios.spec import TORCHRL_ENVS, EnvSpec, ModelSpec

# rllib: an EnvRunnerGroup of SingleAgentEnvRunners from the adapter's sampler_config(PPOConfig()), sampled as
# PPO.training_step does; for a multi-agent env (env.agents set) MultiAgentEnvRunners over the adapter's
# ParallelPettingZooEnv with one RLModule per policy, counting env steps (count_steps_by="env_steps")

BENCH_ENV = "crossrl-bench-env"


def setup_rllib(
    *,
    env_spec: EnvSpec,
    workers: int,
    envs_per_worker: int,
    model: ModelSpec,
    fragment: int,
    layout: dict[str, Any] | None = None,
) -> Contestant:
    """RLlib's env runners sampled as PPO's training_step does: ``fragment x workers x envs_per_worker`` env steps per
    iteration. ``layout`` (:mod:`.layouts`): ``num_env_runners`` (0: the driver's local env runner samples),
    ``num_envs_per_env_runner``, ``vectorize`` (gymnasium's VectorizeMode: SYNC, ASYNC, VECTOR_ENTRY_POINT: the
    env's own vector class, as crossrl's core steps it) and ``fragment`` (``rollout_fragment_length``); None:
    :func:`~.layouts.fixed_layout` (``workers`` runners of ``envs_per_worker`` envs, SYNC, ``fragment``)."""
    import ray
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.rllib.env.env_runner_group import EnvRunnerGroup
    from ray.rllib.execution.rollout_ops import synchronous_parallel_sample
    from ray.tune.registry import register_env

    from crossrl.adapters.rllib.adapter import env_creator, sampler_config, vector_env_creator
    from crossrl.core.cluster import disconnect
    from crossrl.measure.bench.layouts import fixed_layout

    lay = layout or fixed_layout("rllib", workers=workers, envs_per_worker=envs_per_worker, fragment=fragment)
    runners, mode = int(lay["num_env_runners"]), str(lay.get("vectorize", "SYNC"))
    if env_spec.multi_agent and layout is not None:
        raise ValueError("rllib: execution layouts are for single-agent envs")
    creator = vector_env_creator if mode == "VECTOR_ENTRY_POINT" else env_creator
    ray_up(max(runners, 1))
    register_env(BENCH_ENV, creator)
    config = sampler_config(
        PPOConfig(),
        env_spec=env_spec,
        env_name=BENCH_ENV,
        model=model,
        num_env_runners=runners,
        envs_per_env_runner=int(lay["num_envs_per_env_runner"]),
        cpus_per_env_runner=1,
        rollout_fragment=int(lay.get("fragment", fragment)),
        seed=0,
    )
    if mode != "SYNC":
        config.env_runners(gym_env_vectorize_mode=mode.lower())  # gymnasium.VectorizeMode's values
    now = {"group": EnvRunnerGroup(env_creator=creator, config=config, local_env_runner=True)}
    batch = fragment * workers * envs_per_worker

    def step() -> int:
        # As PPO: weights from the learner side (here the local env runner's random module), then sample.
        group = now["group"]
        group.sync_weights(from_worker_or_learner_group=group.local_env_runner, inference_only=True)
        out: Any = synchronous_parallel_sample(
            worker_set=group, max_env_steps=batch, _uses_new_env_runners=True, _return_metrics=True
        )
        return int(sum(e.env_steps() for e in out[0]))  # env steps (a MultiAgentEpisode's too, not agent steps)

    def redraw() -> None:  # fresh env runner actors, this driver and its Ray kept
        now["group"].stop()
        now["group"] = EnvRunnerGroup(env_creator=creator, config=config, local_env_runner=True)

    def close() -> None:
        now["group"].stop()
        disconnect()

    def pids() -> list[int]:
        # The env runner actors (for 0 of them, this process: its local env runner samples), and with ASYNC
        # vectorisation each one's env processes.
        group = now["group"]
        if runners == 0:
            return _runner_pids(group.local_env_runner)
        return [int(p) for ps in group.foreach_env_runner(_runner_pids, local_env_runner=False) for p in ps]

    info: dict[str, Any] = {"rllib_version": ray.__version__, "fragment": int(lay.get("fragment", fragment))}
    if layout is not None:
        info |= {"layout": lay, "gym_env_vectorize_mode": mode, "batch_env_steps": batch}
        if mode == "VECTOR_ENTRY_POINT":
            info["env"] = "crossrl.core.envs.make_vector_env: the env's own vector class (as crossrl's core steps)"
        if runners == 0:
            import torch

            info["driver_torch_threads"] = torch.get_num_threads()
    return Contestant(step, close, info, pids, redraw)


def _runner_pids(runner: Any) -> list[int]:
    """An env runner's process and, for gymnasium's AsyncVectorEnv, its env processes."""
    vec = getattr(getattr(runner, "env", None), "unwrapped", None)
    return [os.getpid(), *(int(p.pid) for p in getattr(vec, "processes", None) or ())]


# torchrl: the adapter's collector (Collector / MultiSyncCollector over its default batched env) and actor; with a
# layout, the collector and batched env it names (same make_env, same actor)


def setup_torchrl(
    *,
    env_spec: EnvSpec,
    workers: int,
    envs_per_worker: int,
    model: ModelSpec,
    fragment: int,
    layout: dict[str, Any] | None = None,
) -> Contestant:
    """TorchRL's collector over ``workers x envs_per_worker`` envs, one batch and one weight sync per iteration.

    ``layout`` (:mod:`.layouts`): ``collector`` (Collector, MultiSyncCollector, MultiAsyncCollector), ``workers``,
    ``env`` (the batched env per collector worker: SerialEnv, ParallelEnv of ``env_workers`` SerialEnvs, or
    gymnasium's SyncVectorEnv / AsyncVectorEnv of crossrl's make_env in GymWrapper), ``envs_per_worker`` and
    ``frames_per_batch``; None: :func:`~.layouts.fixed_layout`, built by the adapter's ``local_collector``.
    """
    import torch

    from crossrl.adapters.torchrl.adapter import env_dims, local_collector, worker_init
    from crossrl.adapters.torchrl.algorithms import build_actor, build_actor_net
    from crossrl.measure.bench.layouts import fixed_layout

    # This process: one torch thread, as in the adapter's run() (with one worker it steps the envs itself).
    worker_init()
    torch.manual_seed(0)
    collector: Any
    info: dict[str, Any] = {}
    if env_spec.multi_agent:
        if layout is not None:
            raise ValueError("torchrl: execution layouts are for single-agent envs")
        # A PettingZoo env (adapters/torchrl/multi_agent.py): every policy's actor, PettingZooWrapper envs; a frame is an env step.
        from crossrl.adapters.torchrl.multi_agent import build_ma_policy, ma_env_dims, ma_local_collector

        collector, desc = ma_local_collector(
            env_spec,
            workers=workers,
            envs_per_worker=envs_per_worker,
            policy=build_ma_policy(ma_env_dims(env_spec), model),
            frames_per_batch=fragment * workers * envs_per_worker,
        )
    else:
        obs_shape, n_actions = env_dims(env_spec)
        net = build_actor_net(obs_shape=obs_shape, n_actions=n_actions, model=model)
        actor = build_actor(net=net, n_actions=n_actions)
        lay = layout or fixed_layout("torchrl", workers=workers, envs_per_worker=envs_per_worker, fragment=fragment)
        w, n, frames = int(lay["workers"]), int(lay["envs_per_worker"]), int(lay["frames_per_batch"])
        if lay["env"] in TORCHRL_ENVS and (lay["collector"] == "Collector") == (w == 1):
            # the adapter's own collector (what a trial steps): Collector, or Multi(Sync|Async)Collector
            sync = lay["collector"] != "MultiAsyncCollector"
            collector, desc = local_collector(
                env_spec, workers=w, envs_per_worker=n, policy=actor, frames_per_batch=frames, sync=sync,
                batched=lay["env"],
            )  # fmt: skip
        else:
            collector, desc = _layout_collector(env_spec, lay, actor)
        if layout is not None:
            info |= {"layout": lay, "env": _ENV_TEXT[lay["env"]], "frames_per_batch": frames}
    collector.set_seed(0)
    batches = iter(collector)

    def step() -> int:
        data = next(batches)
        collector.update_policy_weights_()  # one weight sync per batch, as the adapter does
        return int(data.numel())  # env steps (multi-agent: joint steps, not agent steps)

    def pids() -> list[int]:
        # Collector: this process steps the envs; Multi*Collector: one process per worker. A ParallelEnv's or an
        # AsyncVectorEnv's own env processes are children of whichever process holds it.
        procs = [int(p.pid) for p in getattr(collector, "procs", [])] or [os.getpid()]
        if layout is None:
            return procs
        return procs + [p for p in _children(procs) if p not in procs]

    info = {"collector": desc["class"], "fragment": fragment, **info}
    return Contestant(step, collector.shutdown, info, pids)


_ENV_TEXT = {
    "SerialEnv": "SerialEnv(GymWrapper(make_env)) x envs (execution.layout.torchrl.env: SerialEnv)",
    "ParallelEnv": "ParallelEnv(env_workers x SerialEnv(GymWrapper(make_env))): one process per env worker (no trial "
    "layout)",
    "gym_sync": "GymWrapper(gymnasium SyncVectorEnv(make_env x envs, autoreset disabled)) (execution.layout.torchrl.env: "
    "gym_sync, the adapter's default)",
    "gym_async": "GymWrapper(gymnasium AsyncVectorEnv(make_env x envs, autoreset disabled)): one process per env "
    "(execution.layout.torchrl.env: gym_async)",
}


def _children(pids: list[int]) -> list[int]:
    """Every descendant process of ``pids`` (a ParallelEnv's or AsyncVectorEnv's env processes) but multiprocessing's
    resource tracker (idle, and not an env)."""
    import psutil

    out = []
    for pid in pids:
        try:
            kids = psutil.Process(pid).children(recursive=True)
        except psutil.Error:
            continue
        for c in kids:
            try:
                if not any("resource_tracker" in part for part in c.cmdline()):
                    out.append(int(c.pid))
            except psutil.Error:
                continue
    return out


def torchrl_layout_env(
    env_spec: EnvSpec, env: str, envs: int, env_workers: int = 0, worker_process: bool = False
) -> Any:
    """One collector worker's batched env of ``envs`` envs for a layout (:func:`setup_torchrl`), with the adapter's
    StepCounter and RewardSum transforms. Module-level so spawned collector workers can unpickle it."""
    import functools

    import torch
    from torchrl.envs import ParallelEnv

    from crossrl.adapters.torchrl.adapter import make_torchrl_env

    if worker_process:
        torch.set_num_threads(1)
    if env == "ParallelEnv":
        sub = functools.partial(make_torchrl_env, env_spec, envs // env_workers, batched="SerialEnv",
                                worker_process=True)  # fmt: skip
        return ParallelEnv(env_workers, sub, num_threads=1, num_sub_threads=1)
    return make_torchrl_env(env_spec, envs, batched=env, worker_process=worker_process)


def _layout_collector(env_spec: EnvSpec, lay: dict[str, Any], policy: Any) -> tuple[Any, dict[str, Any]]:
    """A layout's collector built as the adapter's ``local_collector`` builds its own (same kwargs), over the
    layout's batched env (:func:`torchrl_layout_env`)."""
    import functools

    from torchrl.collectors import Collector, MultiAsyncCollector, MultiSyncCollector

    from crossrl.adapters.torchrl.adapter import worker_init

    w, n, k = int(lay["workers"]), int(lay["envs_per_worker"]), int(lay.get("env_workers", 0))
    common = {"frames_per_batch": int(lay["frames_per_batch"]), "total_frames": -1,
              "auto_register_policy_transforms": False}  # fmt: skip
    if lay["collector"] == "Collector":
        if w != 1:
            raise ValueError(f"torchrl layout {lay}: a Collector has one worker, this process")
        return Collector(torchrl_layout_env(env_spec, lay["env"], n, k), policy, **common), {"class": "Collector"}
    cls = {"MultiSyncCollector": MultiSyncCollector, "MultiAsyncCollector": MultiAsyncCollector}[lay["collector"]]
    env_fn = functools.partial(torchrl_layout_env, env_spec, lay["env"], n, k, worker_process=True)
    multi: dict[str, Any] = {**common, "num_threads": 1, "num_sub_threads": 1}
    if cls is MultiSyncCollector:
        multi["cat_results"] = "stack"
    return cls([env_fn] * w, policy, init_fn=worker_init, **multi), {"class": cls.__name__}
