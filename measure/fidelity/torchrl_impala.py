"""TorchRL's own IMPALA loop: the structure of TorchRL's single-node reference script
(``sota-implementations/impala/impala_single_node.py``) with the settings crossrl's TorchRL adapter stored for the
same trial; nothing of crossrl's adapter. Run by :class:`~crossrl.measure.fidelity.torchrl_loop.TorchrlNativeLoop`
for an ``impala`` trial.

What the reference does: a ``MultiaSyncDataCollector`` (TorchRL 0.14: ``MultiAsyncCollector``) whose workers keep
sampling with the weights they have while the learner trains; per collected worker batch, the batch is put in an
accumulator until it holds ``loss.batch_size`` rollouts (the learner batch: ``frames_per_batch * batch_size`` env
steps); then, ``loss.sgd_updates`` times: the rollouts stacked (``torch.stack(accumulator, 0)``), ``VTrace``
advantages and value targets computed under ``torch.no_grad()`` with the current critic and actor, the stacked
batch flattened into a ``TensorDictReplayBuffer`` (``SamplerWithoutReplacement``, batch size the whole learner
batch) and iterated: ``A2CLoss`` (``loss_objective + loss_critic + loss_entropy``), ``backward()``,
``clip_grad_norm_``, the optimiser's step; then ``collector.update_policy_weights_()`` and a new accumulator.

Taken from the stored native config (``crossrl.measure.fidelity.stored_config``): the collector (its class, which
must be ``MultiAsyncCollector``, its kwargs, frames per worker batch, number of workers), ``VTrace``'s kwargs,
``A2CLoss``'s kwargs, Adam's lr and eps, the gradient clip norm and the learner batch (the stored
``hyperparams.train_batch``: the learner batch is ``ceil(train_batch / frames_per_batch)`` worker batches, the
reference's ``batch_size``). From the trial: the env id and kwargs, envs per worker, the MLP's hidden sizes and
activation and the seed. Built with TorchRL's own calls, as the PPO loop (``torchrl_loop``) builds them: per worker
a ``SerialEnv`` of ``GymEnv`` (gymnasium) with ``RewardSum`` and ``StepCounter``, a ``ProbabilisticActor`` with a
``Categorical`` over ``MLP`` logits and a ``ValueOperator`` over an ``MLP``, initialised as the spec's network
(``init_as_spec``). One SGD update per learner batch: the reference's ``sgd_updates`` default, and the adapter's.

Known differences from the reference script, kept on purpose:

- The reference appends a batch to its accumulator only while it holds fewer than ``batch_size`` rollouts; the batch
  that finds it full starts the update and is then dropped (one worker batch in ``batch_size + 1`` is sampled but
  never trained on). Here every collected batch is appended and the update runs once the accumulator is full, so
  every batch is trained on, as the adapter does and as the reference's own count of updates
  (``total_frames // (frames_per_batch * batch_size)``) assumes.
- The optimiser is the stored Adam (lr, eps), not the reference's RMSprop (alpha 0.99, no weight decay); no
  learning-rate annealing (the reference's ``anneal_lr``): crossrl's adapter has none, the stored config names none.
- No Atari specifics: no frame-skip correction, no end-of-life done key (``set_keys(done="eol")``), no
  periodic deterministic evaluation. Finished episodes are those at ``("next", "done")`` (terminated or truncated,
  as the adapter and the PPO loop count them), not only at ``"terminated"``.
- The replay buffer's storage is a ``LazyTensorStorage`` (memory), not the reference's ``LazyMemmapStorage`` (files,
  for Atari frames); the same batches, without a disk write per update on the learner's clock.
- The collector gets the stored kwargs only: no ``update_at_each_batch=True``. Between two learner updates the
  weights do not change, and ``update_policy_weights_()`` right after each update (the reference does it too) is
  the only push with new weights; the reference's extra push at every batch sends the same weights again.

Known differences from crossrl's adapter (``adapters/torchrl/adapter.py``, ``adapters/torchrl/algorithms.py``):

- V-trace: TorchRL's ``VTrace`` module, as the reference uses it, which takes ``log pi`` of a newly drawn action
  (0.14.1); the adapter computes TorchRL's ``vtrace_advantage_estimate`` on the actions taken
  (``vtrace_taken_actions``; docs/fidelity.md, "TorchRL's V-trace weighs the wrong action").
- The learner batch: the adapter concatenates worker batches (``[envs, T]`` each, along the env dim) until it holds
  >= ``train_batch`` env steps; here ``ceil(train_batch / frames_per_batch)`` batches are stacked along a new dim
  (``[k, envs, T]``). Every worker batch holds ``frames_per_batch`` env steps, so both learn on the same number of
  batches, and V-trace runs along the time dim either way (the same targets).
- Policy lag is the same mechanism on both sides (``MultiAsyncCollector``: a worker told to go on with the weights
  it has while the learner trains, new weights pushed after each update); the adapter pushes them in a thread that
  watches the worker processes, this loop calls ``update_policy_weights_()`` directly. What lag each batch has
  depends on the two processes' timing, not on settings.
- The networks: TorchRL's ``MLP``, initialised as the adapter initialises crossrl's MLP (``init_as_spec``). The
  envs: ``GymEnv`` on the gymnasium id; the adapter
  wraps crossrl's ``make_env`` (its env guard) in ``GymWrapper``. The adapter's collector workers also get an
  ``init_fn`` setting one torch thread; here each worker's env factory sets it.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Mapping
from typing import Any

from crossrl.adapters.base import MetricSink
from crossrl.measure.fidelity.torchrl_common import INIT, actor_critic, make_env, needed, report
from crossrl.scenarios import metrics as M
from crossrl.scenarios.spec import Trial

COLLECTORS = ("MultiAsyncCollector",)
"""The collector classes an IMPALA trial's stored config may name (the adapter's local, asynchronous one)."""

LOSS, VALUE_ESTIMATOR, OPTIMIZER = "A2CLoss", "VTrace", "torch.optim.Adam"
SGD_UPDATES = 1
"""Updates per learner batch: the reference's ``loss.sgd_updates`` default, and the adapter's one Adam step."""

FIX = "store the config crossrl's TorchRL adapter reports for a local impala trial (`crossrl fidelity` does)"


def _need(stored: Mapping[str, Any], where: str, *keys: str) -> Any:
    """``stored_value`` with the file and the remedy in its one line."""
    return needed(stored, where, FIX, *keys)


def settings(trial: Trial, stored: Mapping[str, Any], where: str) -> dict[str, Any]:
    """Every setting of the loop from the stored native config, checked; a ValueError in one line otherwise."""
    collector_cls = _need(stored, where, "collector", "class")
    if collector_cls not in COLLECTORS:
        raise ValueError(
            f"torchrl-native: impala runs on {' or '.join(COLLECTORS)}, the stored collector is {collector_cls!r} "
            f"({where}): {FIX}"
        )
    collector_kwargs = dict(_need(stored, where, "collector", "kwargs"))
    workers = int(collector_kwargs.pop("num_workers", 1))
    if workers != trial.workers:
        raise ValueError(f"torchrl-native: {where} is for {workers} worker(s), the trial has {trial.workers}: {FIX}")
    fpb = int(_need(stored, where, "collector", "kwargs", "frames_per_batch"))
    for part, cls_name in (("loss", LOSS), ("value_estimator", VALUE_ESTIMATOR), ("optimizer", OPTIMIZER)):
        found = _need(stored, where, part, "class")
        if found != cls_name:
            raise ValueError(
                f"torchrl-native: impala needs the stored {part} {cls_name}, not {found!r} ({where}): {FIX}"
            )
    train_batch = int(_need(stored, where, "hyperparams", "train_batch", "value"))
    if fpb <= 0 or train_batch <= 0:
        raise ValueError(f"torchrl-native: frames_per_batch {fpb} and train_batch {train_batch} ({where}) must be > 0")
    rollouts = math.ceil(train_batch / fpb)
    return {
        "collector_cls": collector_cls,
        "collector_kwargs": collector_kwargs,
        "workers": workers,
        "fpb": fpb,
        "loss_kwargs": dict(_need(stored, where, "loss", "kwargs")),
        "vtrace_kwargs": dict(_need(stored, where, "value_estimator", "kwargs")),
        "lr": float(_need(stored, where, "optimizer", "lr")),
        "eps": float(_need(stored, where, "optimizer", "eps")),
        "max_grad_norm": float(_need(stored, where, "grad_clip_norm")),
        "train_batch": train_batch,
        "rollouts": rollouts,
        "learner_frames": rollouts * fpb,
    }


def run_impala(trial: Trial, sink: MetricSink, stored: Mapping[str, Any], where: str) -> None:
    """TorchRL's single-node IMPALA loop on the stored settings, reported through ``sink`` per collected batch."""
    s = settings(trial, stored, where)

    import torch
    import torchrl
    from torchrl.collectors import MultiAsyncCollector
    from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer
    from torchrl.data.replay_buffers import SamplerWithoutReplacement
    from torchrl.objectives import A2CLoss
    from torchrl.objectives.value import VTrace

    actor, critic, policy_net, value_net = actor_critic(trial)

    adv_module = VTrace(value_network=critic, actor_network=actor, **s["vtrace_kwargs"])
    loss_module = A2CLoss(actor, critic, **s["loss_kwargs"])
    optim = torch.optim.Adam(loss_module.parameters(), lr=s["lr"], eps=s["eps"])
    learner_frames, rollouts, fpb = s["learner_frames"], s["rollouts"], s["fpb"]
    buffer = TensorDictReplayBuffer(
        storage=LazyTensorStorage(learner_frames), sampler=SamplerWithoutReplacement(), batch_size=learner_frames
    )
    nan = torch.tensor(float("nan"))
    coeff = s["loss_kwargs"].get("critic_coeff")
    critic_coeff = 1.0 if coeff is None else float(coeff)  # A2CLoss's default weight is 1

    workers, collector_kwargs = s["workers"], s["collector_kwargs"]
    env_fn = functools.partial(make_env, trial.env.id, dict(trial.env.kwargs), trial.envs_per_worker)
    collector = MultiAsyncCollector([env_fn] * workers, actor, **collector_kwargs)
    try:
        collector.set_seed(trial.seed)
        sink.tags(
            engine_version=torchrl.__version__,
            collector=s["collector_cls"],
            native_loop="torchrl: the IMPALA reference loop (sota-implementations/impala, single node)",
        )
        sink.native_config(
            {
                "engine": "torchrl-native",
                "torchrl_version": torchrl.__version__,
                "stored_config": where,
                "collector": {"class": s["collector_cls"], "kwargs": collector_kwargs, "num_workers": workers},
                "env": f"TransformedEnv(SerialEnv({trial.envs_per_worker} x GymEnv({trial.env.id!r}, "
                f"categorical_action_encoding=True, **{dict(trial.env.kwargs)})), Compose(RewardSum(), "
                "StepCounter()))",
                "actor": f"ProbabilisticActor(MLP(logits), Categorical): {policy_net!r}",
                "critic": f"ValueOperator(MLP): {value_net!r}",
                "init": INIT,
                "learner_batch": {"train_batch": s["train_batch"], "worker_batches": rollouts,
                                  "frames_per_worker_batch": fpb, "env_steps": learner_frames,
                                  "assembled": "torch.stack(worker batches, 0): [worker_batches, envs, T]"},
                "value_estimator": {"class": VALUE_ESTIMATOR, "kwargs": s["vtrace_kwargs"],
                                    "computed": "every SGD update, whole learner batch, current critic and actor"},
                "loss": {"class": LOSS, "kwargs": s["loss_kwargs"]},
                "optimizer": {"class": OPTIMIZER, "lr": s["lr"], "eps": s["eps"]},
                "grad_clip_norm": s["max_grad_norm"],
                "sgd_updates": SGD_UPDATES,
                "replay_buffer": {"class": "TensorDictReplayBuffer", "storage": f"LazyTensorStorage({learner_frames})",
                                  "sampler": "SamplerWithoutReplacement", "batch_size": learner_frames},
                "weights": "collector.update_policy_weights_() after every learner update",
                "seed": trial.seed,
                "torch_num_threads": torch.get_num_threads(),
            }
        )  # fmt: skip
        sink.start_clock()
        sampled = trained = 0
        accumulator: list[Any] = []
        t0 = time.perf_counter()
        for data in collector:
            t1 = time.perf_counter()
            if data.numel() != fpb:
                raise ValueError(f"torchrl-native: a worker batch of {data.numel()} env steps, not {fpb} ({where})")
            sampled += data.numel()

            values: dict[str, float] = {}
            accumulator.append(data)
            if len(accumulator) == rollouts:
                stats: list[Any] = []
                for _ in range(SGD_UPDATES):
                    stacked = torch.stack(accumulator, dim=0).contiguous()
                    with torch.no_grad():
                        stacked = adv_module(stacked)
                    buffer.extend(stacked.reshape(-1))
                    for batch in buffer:
                        loss = loss_module(batch)
                        total = loss["loss_objective"] + loss["loss_critic"]
                        if "loss_entropy" in loss.keys():  # noqa: SIM118 - TensorDict refuses `key in td`
                            total = total + loss["loss_entropy"]
                        total.backward()
                        grad_norm = torch.nn.utils.clip_grad_norm_(loss_module.parameters(), s["max_grad_norm"])
                        optim.step()
                        optim.zero_grad(set_to_none=True)
                        parts = (
                            loss["loss_objective"],
                            loss["loss_critic"],
                            loss.get("entropy", nan).mean(),
                            grad_norm,
                        )
                        stats.append(torch.stack(parts).detach())
                trained += learner_frames
                accumulator = []
                policy_loss, critic_loss, entropy, norm = (float(x) for x in torch.stack(stats).mean(0))
                values = {M.POLICY_LOSS: policy_loss, M.ENTROPY: entropy, M.DIAG_GRAD_NORM: norm}
                if critic_coeff > 0:  # the squared error, as the adapter reports it
                    values[M.VALUE_LOSS] = critic_loss / critic_coeff
                t2 = time.perf_counter()
                collector.update_policy_weights_()
            else:
                t2 = time.perf_counter()
            t3 = time.perf_counter()
            report(sink, data, sampled=sampled, trained=trained, values=values, times=(t0, t1, t2, t3))
            if sink.exhausted:
                break
            t0 = time.perf_counter()
    finally:
        collector.shutdown()
