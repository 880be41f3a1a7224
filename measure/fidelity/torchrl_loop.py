"""TorchRL's own PPO loop: the structure of TorchRL's reference scripts (``sota-implementations/ppo``, ppo_atari.py /
ppo_mujoco.py) with the settings crossrl's TorchRL adapter stored for the same trial; nothing of crossrl's adapter.

Taken from the stored native config (``crossrl.measure.fidelity.stored_config``): the collector (class, its kwargs,
frames per batch, number of workers), ``ClipPPOLoss``'s kwargs, ``GAE``'s kwargs, Adam's lr and eps and the gradient
clip norm. From the trial: epochs, minibatch, the env id, envs per worker, the MLP's hidden sizes and activation and
the seed. Built with TorchRL's own calls: per worker a ``SerialEnv`` of ``GymEnv`` (gymnasium) with ``RewardSum`` and
``StepCounter`` (the adapter's layout: one process per worker stepping its envs one after another), a
``ProbabilisticActor`` with a ``Categorical`` over ``MLP`` logits, a ``ValueOperator`` over an ``MLP``, both
initialised as the spec's network (``torchrl_common.init_as_spec``: the adapter's initialisation, so both sides start
from the same kind of network).

The loop, as the reference scripts: the collector iterated in a ``for`` loop; per batch and per epoch ``GAE`` over the
whole batch (recomputed every epoch with the current critic, as the reference does), the flattened batch extended into
a ``ReplayBuffer(LazyTensorStorage(frames_per_batch), SamplerWithoutReplacement(), batch_size=minibatch)``, iterated
minibatch by minibatch: ``loss_objective + loss_critic + loss_entropy``, ``backward()``, ``clip_grad_norm_``, Adam's
step; then ``collector.update_policy_weights_()``. No learning-rate or clip annealing (the reference's
``anneal_lr`` / ``anneal_clip_epsilon``): crossrl's adapter has none, and the stored config names none.

IMPALA, SAC and DreamerV3 trials run their own reference loops (``torchrl_impala.run_impala``,
``torchrl_sac.run_sac``, ``torchrl_dreamer.run_dreamer``) on the same stored config; SAC's and DreamerV3's are imported
when such a trial runs (their modules import torch).
"""

from __future__ import annotations

import functools
import os
import time
from pathlib import Path
from typing import Any, ClassVar

from crossrl.adapters.base import MetricSink
from crossrl.measure.fidelity import CONFIGS_ENV, stored_config
from crossrl.measure.fidelity.torchrl_common import INIT, actor_critic, make_env, report, stored_value, sync_collector
from crossrl.measure.fidelity.torchrl_impala import run_impala
from crossrl.scenarios import metrics as M
from crossrl.scenarios.spec import Trial

COLLECTORS = ("Collector", "MultiSyncCollector")
"""The collector classes an on-policy PPO trial's stored config may name (the adapter's local, synchronous ones)."""


def _refuse(trial: Trial) -> None:
    env = trial.env
    if (
        trial.algorithm not in TorchrlNativeLoop.algorithms
        or env.multi_agent
        or trial.model.conv
        or env.resolved_preprocessing != "none"
        or env.resolved_reward_clip
        or env.step_latency_ms > 0
    ):
        raise ValueError(
            f"torchrl-native runs {', '.join(TorchrlNativeLoop.algorithms)} on single-agent gymnasium envs with "
            "vector observations and an MLP (ppo, impala, dreamer: discrete actions; sac: continuous ones; no "
            f"preprocessing, reward clip or step latency), not {trial.algorithm} on {env.id}"
        )


class TorchrlNativeLoop:
    """TorchRL's PPO (IMPALA: ``torchrl_impala``, SAC: ``torchrl_sac``, DreamerV3: ``torchrl_dreamer``) reference
    loop on the stored config's settings."""

    engine: ClassVar[str] = "torchrl-native"
    algorithms: ClassVar[dict[str, str]] = {
        "ppo": "TorchRL's PPO reference loop (sota-implementations/ppo): collector, GAE, ReplayBuffer of "
        "minibatches, ClipPPOLoss, Adam, clip_grad_norm_; settings from the stored native config",
        "impala": "TorchRL's IMPALA reference loop (sota-implementations/impala, single node): MultiAsyncCollector, "
        "worker batches stacked into a learner batch, VTrace, A2CLoss, Adam, clip_grad_norm_; stored settings",
        "sac": "TorchRL's SAC reference loop (sota-implementations/sac): collector with init_random_frames, uniform "
        "ReplayBuffer, SACLoss (twin critics, learned temperature), grouped Adams, SoftUpdate; stored settings",
        "dreamer": "TorchRL's DreamerV3 example loop (sota-implementations/dreamer_v3): collector with a recurrent "
        "state primer, SliceSampler replay of sequences, RSSMPriorV3/RSSMPosteriorV3 world model, DreamerV3 model, "
        "actor and value losses, Adams, SoftUpdate of the slow critic; discrete actions; stored settings",
    }

    def run(self, trial: Trial, sink: MetricSink) -> None:
        _refuse(trial)
        stored = stored_config(trial.seed)
        if sink.resumed() is not None:
            raise ValueError("torchrl-native: a native loop starts from scratch; it does not resume from a checkpoint")
        where = str(Path(os.environ.get(CONFIGS_ENV, ".")) / f"{trial.seed}.json")
        if trial.algorithm == "impala":
            return run_impala(trial, sink, stored, where)
        if trial.algorithm == "sac":
            from crossrl.measure.fidelity.torchrl_sac import run_sac

            return run_sac(trial, sink, stored, where)
        if trial.algorithm == "dreamer":
            from crossrl.measure.fidelity.torchrl_dreamer import run_dreamer

            return run_dreamer(trial, sink, stored, where)

        import torch
        import torchrl
        from torchrl.data import LazyTensorStorage, ReplayBuffer
        from torchrl.data.replay_buffers import SamplerWithoutReplacement
        from torchrl.objectives import ClipPPOLoss
        from torchrl.objectives.value import GAE

        collector_cls = stored_value(stored, "collector", "class")
        if collector_cls not in COLLECTORS:
            raise ValueError(
                f"torchrl-native: the stored collector {collector_cls!r} ({where}) is not one of {COLLECTORS}"
            )
        collector_kwargs = dict(stored_value(stored, "collector", "kwargs"))
        workers = int(collector_kwargs.pop("num_workers", 1))
        fpb = int(collector_kwargs["frames_per_batch"])
        if workers != trial.workers:
            raise ValueError(f"torchrl-native: {where} is for {workers} worker(s), the trial has {trial.workers}")
        for part, cls_name in (("loss", "ClipPPOLoss"), ("value_estimator", "GAE")):
            if stored_value(stored, part, "class") != cls_name:
                raise ValueError(f"torchrl-native: the stored {part} is not {cls_name} ({where})")
        loss_kwargs = dict(stored_value(stored, "loss", "kwargs"))
        gae_kwargs = dict(stored_value(stored, "value_estimator", "kwargs"))
        lr, eps = float(stored_value(stored, "optimizer", "lr")), float(stored_value(stored, "optimizer", "eps"))
        max_grad_norm = float(stored_value(stored, "grad_clip_norm"))
        epochs, minibatch = int(trial.hyperparams["epochs"]), int(trial.hyperparams["minibatch"])

        actor, critic, policy_net, value_net = actor_critic(trial)

        adv_module = GAE(value_network=critic, **gae_kwargs)
        loss_module = ClipPPOLoss(actor, critic, **loss_kwargs)
        optim = torch.optim.Adam(loss_module.parameters(), lr=lr, eps=eps)
        buffer = ReplayBuffer(storage=LazyTensorStorage(fpb), sampler=SamplerWithoutReplacement(), batch_size=minibatch)
        nan = torch.tensor(float("nan"))
        coeff = loss_kwargs.get("critic_coeff")
        critic_coeff = 1.0 if coeff is None else float(coeff)  # ClipPPOLoss's default weight is 1

        env_fn = functools.partial(make_env, trial.env.id, dict(trial.env.kwargs), trial.envs_per_worker)
        collector = sync_collector(collector_cls, env_fn, actor, workers=workers, kwargs=collector_kwargs)
        try:
            collector.set_seed(trial.seed)
            sink.tags(engine_version=torchrl.__version__, collector=collector_cls,
                      native_loop="torchrl: the PPO reference loop (sota-implementations/ppo)")  # fmt: skip
            sink.native_config(
                {
                    "engine": "torchrl-native",
                    "torchrl_version": torchrl.__version__,
                    "stored_config": where,
                    "collector": {"class": collector_cls, "kwargs": collector_kwargs, "num_workers": workers},
                    "env": f"TransformedEnv(SerialEnv({trial.envs_per_worker} x GymEnv({trial.env.id!r}, "
                    f"categorical_action_encoding=True, **{dict(trial.env.kwargs)})), Compose(RewardSum(), "
                    "StepCounter()))",
                    "actor": f"ProbabilisticActor(MLP(logits), Categorical): {policy_net!r}",
                    "critic": f"ValueOperator(MLP): {value_net!r}",
                    "init": INIT,
                    "value_estimator": {"class": "GAE", "kwargs": gae_kwargs, "computed": "every epoch, whole batch"},
                    "loss": {"class": "ClipPPOLoss", "kwargs": loss_kwargs},
                    "optimizer": {"class": "torch.optim.Adam", "lr": lr, "eps": eps},
                    "grad_clip_norm": max_grad_norm,
                    "replay_buffer": {"class": "ReplayBuffer", "storage": f"LazyTensorStorage({fpb})",
                                      "sampler": "SamplerWithoutReplacement", "batch_size": minibatch},
                    "epochs": epochs,
                    "seed": trial.seed,
                    "torch_num_threads": torch.get_num_threads(),
                }
            )  # fmt: skip
            sink.start_clock()
            sampled = 0
            t0 = time.perf_counter()
            for data in collector:
                t1 = time.perf_counter()
                sampled += data.numel()

                stats: list[Any] = []
                for _ in range(epochs):
                    with torch.no_grad():
                        data = adv_module(data)
                    buffer.extend(data.reshape(-1))
                    for batch in buffer:
                        loss = loss_module(batch)
                        total = loss["loss_objective"] + loss["loss_critic"]
                        if "loss_entropy" in loss.keys():  # noqa: SIM118 - TensorDict refuses `key in td`
                            total = total + loss["loss_entropy"]
                        optim.zero_grad(set_to_none=True)
                        total.backward()
                        grad_norm = torch.nn.utils.clip_grad_norm_(loss_module.parameters(), max_grad_norm)
                        optim.step()
                        parts = (
                            loss["loss_objective"],
                            loss["loss_critic"],
                            loss.get("entropy", nan).mean(),
                            grad_norm,
                        )
                        stats.append(torch.stack(parts).detach())  # averaged once per batch, as the reference does
                t2 = time.perf_counter()
                collector.update_policy_weights_()
                t3 = time.perf_counter()
                policy_loss, critic_loss, entropy, norm = (float(x) for x in torch.stack(stats).mean(0))
                values = {M.POLICY_LOSS: policy_loss, M.ENTROPY: entropy, M.DIAG_GRAD_NORM: norm}
                if critic_coeff > 0:  # the squared error, as the adapter reports it
                    values[M.VALUE_LOSS] = critic_loss / critic_coeff
                report(sink, data, sampled=sampled, values=values, times=(t0, t1, t2, t3))
                if sink.exhausted:
                    break
                t0 = time.perf_counter()
        finally:
            collector.shutdown()
