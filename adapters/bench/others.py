"""The RLlib and TorchRL sampling contestants (see :mod:`crossrl.adapters.bench.contestants`)."""

from __future__ import annotations

import os
from typing import Any

from crossrl.adapters.bench.contestants import Contestant, _getpid, _ray_up
from crossrl.scenarios.spec import EnvSpec, ModelSpec

# rllib: an EnvRunnerGroup of SingleAgentEnvRunners from a PPOConfig, sampled as PPO.training_step does


def _rllib_env(env_config: Any) -> Any:
    from crossrl.core.envs import make_env

    if getattr(env_config, "worker_index", 0) > 0:
        import torch

        torch.set_num_threads(1)
    return make_env(EnvSpec.model_validate(env_config["env_spec"]))


def setup_rllib(
    *, env_spec: EnvSpec, workers: int, envs_per_worker: int, model: ModelSpec, fragment: int
) -> Contestant:
    import ray
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig
    from ray.rllib.env.env_runner_group import EnvRunnerGroup
    from ray.rllib.execution.rollout_ops import synchronous_parallel_sample
    from ray.tune.registry import register_env

    _ray_up(workers)
    register_env("crossrl-bench-env", _rllib_env)
    config = (
        PPOConfig()
        .api_stack(enable_rl_module_and_learner=True, enable_env_runner_and_connector_v2=True)
        .framework("torch")
        .environment(env="crossrl-bench-env", env_config={"env_spec": env_spec.model_dump(mode="json")})
        .env_runners(
            num_env_runners=workers,
            num_envs_per_env_runner=envs_per_worker,
            num_cpus_per_env_runner=1,
            rollout_fragment_length=fragment,
        )
        .rl_module(
            model_config=DefaultModelConfig(
                fcnet_hiddens=list(model.hidden),
                fcnet_activation=model.activation,
                head_fcnet_hiddens=[],
                vf_share_layers=False,
            )
        )
        .debugging(seed=0)
    )
    group = EnvRunnerGroup(env_creator=_rllib_env, config=config, local_env_runner=True)
    batch = fragment * workers * envs_per_worker

    def step() -> int:
        # As PPO: weights from the learner side (here the local env runner's random module), then sample.
        group.sync_weights(from_worker_or_learner_group=group.local_env_runner, inference_only=True)
        out: Any = synchronous_parallel_sample(
            worker_set=group, max_env_steps=batch, _uses_new_env_runners=True, _return_metrics=True
        )
        return int(sum(e.env_steps() for e in out[0]))

    def close() -> None:
        group.stop()
        ray.shutdown()

    def pids() -> list[int]:
        return [int(p) for p in group.foreach_env_runner(_getpid, local_env_runner=False)]

    return Contestant(step, close, {"rllib_version": ray.__version__, "fragment": fragment}, pids)


# torchrl: Collector / MultiSyncCollector over SerialEnv(GymWrapper(make_env)), a ProbabilisticActor MLP


def _torchrl_worker_init() -> None:
    import torch

    torch.set_num_threads(1)


def setup_torchrl(
    *, env_spec: EnvSpec, workers: int, envs_per_worker: int, model: ModelSpec, fragment: int
) -> Contestant:
    import functools

    import torch
    from torchrl.collectors import Collector, MultiSyncCollector

    from crossrl.adapters.torchrl import _gym_env, make_torchrl_env
    from crossrl.adapters.torchrl_algos import build_actor
    from crossrl.core.models import build_mlp

    probe = _gym_env(env_spec)
    obs_dim = int(probe.observation_spec["observation"].shape[-1])
    n_actions = int(probe.action_spec.space.n)
    probe.close()
    torch.manual_seed(0)
    actor = build_actor(
        net=build_mlp(in_dim=obs_dim, out_dim=n_actions, model=model, out_gain=0.01), n_actions=n_actions
    )
    frames = fragment * workers * envs_per_worker
    common: dict[str, Any] = {"frames_per_batch": frames, "total_frames": -1, "auto_register_policy_transforms": False}
    collector: Any
    if workers == 1:
        torch.set_num_threads(1)  # the one worker is this process: one thread, as the others get
        collector = Collector(make_torchrl_env(env_spec, envs_per_worker), actor, **common)
    else:
        env_fn = functools.partial(make_torchrl_env, env_spec, envs_per_worker, worker_process=True)
        collector = MultiSyncCollector(
            [env_fn] * workers,
            actor,
            init_fn=_torchrl_worker_init,
            num_sub_threads=1,
            cat_results="stack",
            **common,
        )
    collector.set_seed(0)
    batches = iter(collector)

    def step() -> int:
        data = next(batches)
        collector.update_policy_weights_()  # one weight sync per batch, as the adapter does
        return int(data.numel())

    def pids() -> list[int]:
        # Collector: this process steps the envs; MultiSyncCollector: one process per worker.
        return [int(p.pid) for p in getattr(collector, "procs", [])] or [os.getpid()]

    info = {"collector": type(collector).__name__, "fragment": fragment}
    return Contestant(step, collector.shutdown, info, pids)
