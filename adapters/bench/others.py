"""The RLlib and TorchRL sampling contestants (see :mod:`crossrl.adapters.bench.contestants`).

Each engine is built by its adapter's public builders (:mod:`crossrl.adapters.rllib`,
:mod:`crossrl.adapters.torchrl`), so the bench samples with the envs, networks and collectors a trial uses.
"""

from __future__ import annotations

import os
from typing import Any

from crossrl.adapters.bench.base import Contestant, getpid, ray_up
from crossrl.scenarios.spec import EnvSpec, ModelSpec

# rllib: an EnvRunnerGroup of SingleAgentEnvRunners from the adapter's sampler_config(PPOConfig()), sampled as
# PPO.training_step does; for a multi-agent env (env.agents set) MultiAgentEnvRunners over the adapter's
# ParallelPettingZooEnv with one RLModule per policy, counting env steps (count_steps_by="env_steps")

BENCH_ENV = "crossrl-bench-env"


def setup_rllib(
    *, env_spec: EnvSpec, workers: int, envs_per_worker: int, model: ModelSpec, fragment: int
) -> Contestant:
    import ray
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.rllib.env.env_runner_group import EnvRunnerGroup
    from ray.rllib.execution.rollout_ops import synchronous_parallel_sample
    from ray.tune.registry import register_env

    from crossrl.adapters.rllib import env_creator, sampler_config
    from crossrl.core.cluster import disconnect

    ray_up(workers)
    register_env(BENCH_ENV, env_creator)
    config = sampler_config(
        PPOConfig(),
        env_spec=env_spec,
        env_name=BENCH_ENV,
        model=model,
        num_env_runners=workers,
        envs_per_env_runner=envs_per_worker,
        cpus_per_env_runner=1,
        rollout_fragment=fragment,
        seed=0,
    )
    now = {"group": EnvRunnerGroup(env_creator=env_creator, config=config, local_env_runner=True)}
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
        now["group"] = EnvRunnerGroup(env_creator=env_creator, config=config, local_env_runner=True)

    def close() -> None:
        now["group"].stop()
        disconnect()

    def pids() -> list[int]:
        return [int(p) for p in now["group"].foreach_env_runner(getpid, local_env_runner=False)]

    return Contestant(step, close, {"rllib_version": ray.__version__, "fragment": fragment}, pids, redraw)


# torchrl: the adapter's collector (Collector / MultiSyncCollector over SerialEnv(GymWrapper(make_env))) and actor


def setup_torchrl(
    *, env_spec: EnvSpec, workers: int, envs_per_worker: int, model: ModelSpec, fragment: int
) -> Contestant:
    import torch

    from crossrl.adapters.torchrl import env_dims, local_collector, worker_init
    from crossrl.adapters.torchrl_algos import build_actor, build_actor_net

    # This process: one torch thread, as in the adapter's run() (with one worker it steps the envs itself).
    worker_init()
    torch.manual_seed(0)
    collector: Any
    if env_spec.multi_agent:
        # A PettingZoo env (torchrl_multi): every policy's actor, PettingZooWrapper envs; a frame is an env step.
        from crossrl.adapters.torchrl_multi import build_ma_policy, ma_env_dims, ma_local_collector

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
        collector, desc = local_collector(
            env_spec,
            workers=workers,
            envs_per_worker=envs_per_worker,
            policy=actor,
            frames_per_batch=fragment * workers * envs_per_worker,
        )
    collector.set_seed(0)
    batches = iter(collector)

    def step() -> int:
        data = next(batches)
        collector.update_policy_weights_()  # one weight sync per batch, as the adapter does
        return int(data.numel())  # env steps (multi-agent: joint steps, not agent steps)

    def pids() -> list[int]:
        # Collector: this process steps the envs; MultiSyncCollector: one process per worker.
        return [int(p.pid) for p in getattr(collector, "procs", [])] or [os.getpid()]

    info = {"collector": desc["class"], "fragment": fragment}
    return Contestant(step, collector.shutdown, info, pids)
