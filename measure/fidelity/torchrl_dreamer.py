"""TorchRL's own DreamerV3 loop: the structure of TorchRL's DreamerV3 example (``sota-implementations/dreamer_v3``,
``dreamer_v3.py``) on TorchRL 0.14.1's modules, with the settings crossrl's TorchRL adapter stored for the same trial;
nothing of crossrl's adapter. Run by :class:`~crossrl.measure.fidelity.torchrl_loop.TorchrlNativeLoop` for a
``dreamer`` trial.

What the example does: a ``Collector`` over the env (``InitTracker``, a ``TensorDictPrimer`` of the recurrent state)
acting with the encoder, the posterior and the actor; each collected batch's transitions (``action``, ``is_init``,
``next``'s observation, reward and termination) extended into a ``ReplayBuffer(LazyTensorStorage, SliceSampler)``;
once the buffer holds a warm-up, per batch a number of updates, each on ``B`` replayed windows of ``T`` transitions
reshaped to ``[B, T]`` with a zero ``state`` and ``belief``: ``DreamerV3ModelLoss`` over a world model of a symlog
``DreamerV3MLP`` encoder, ``RSSMRolloutV3`` of ``RSSMPriorV3`` / ``RSSMPosteriorV3`` (reset at ``is_init``), a
``DreamerV3MLP`` decoder, a two-hot reward head (``SymExpTwoHot``) and a continue head, summed and stepped; then
``DreamerV3ActorLoss`` on trajectories imagined by a ``DreamerEnv`` (``WorldModelWrapper`` of the prior and the
reward head, the continue head as ``continuation_model``) from every replayed posterior state (detached), its
``TDLambda`` estimator; then ``DreamerV3ValueLoss`` (two-hot, slow-critic regularization) on the same trajectories and
``SoftUpdate`` of the slow critic. (The example read is pytorch/rl's main branch of August 2026, after 0.14.0: the
0.14.1 tag's copy was not at hand. Its loop's structure is what this follows; every module and loss is the installed
0.14.1's.)

Taken from the stored native config (``crossrl.measure.fidelity.stored_config``): the collector (its class,
``Collector`` or ``MultiSyncCollector``, its kwargs with ``frames_per_batch``, the number of workers); the prior's and
the posterior's kwargs (widths, layers, categoricals x classes, ``block_gru`` and its blocks, unimix, RMS norm), the
``DreamerV3MLP``s' depth and width and the two-hot bins; the actor class (``DreamerV3DiscreteActor``) and its
distribution; ``DreamerV3ModelLoss``'s, ``DreamerV3ActorLoss``'s and ``DreamerV3ValueLoss``'s kwargs, the ``TDLambda``
gamma and lambda, the slow critic's ``SoftUpdate`` eps; the three Adams' lr, eps and gradient clip norm; the replay's
capacity, window length ``T`` and windows ``B``; the training ratio, the env steps before learning starts and the env
steps per point. From the trial: the env id and kwargs, envs per worker and the seed. Built with TorchRL's own calls:
per worker a ``SerialEnv`` of ``GymEnv`` (gymnasium, TorchRL's one-hot action encoding) with ``RewardSum``,
``StepCounter``, ``InitTracker`` and a ``TensorDictPrimer`` of ``state``, ``belief`` and ``previous_action``.
Every network is TorchRL's (``DreamerV3MLP``, ``RSSMPriorV3``, ``RSSMPosteriorV3``, ``DreamerV3DiscreteActor``,
``SymExpTwoHot``) with TorchRL's own initialisation, as on the adapter's side: nothing is shared with the adapter,
and the stored parameter counts are checked against the native networks' (:func:`run_dreamer` refuses a mismatch).

Known differences from TorchRL's example, kept on purpose:

- The optimizers: three ``torch.optim.Adam`` at the stored learning rates and epsilons with a global-norm
  ``clip_grad_norm_`` at the stored norms (the adapter's, the paper's Adam as crossrl's core and RLlib run it), where
  the example runs Adam at one lr and eps 1e-20 with TorchRL's per-parameter adaptive clip (``adaptive_grad_clip_``)
  and a linear learning-rate warm-up (``LinearLR``); TorchRL's ``DreamerV3Optimizer`` (LaProp) is not used either.
- The replay's trajectories: each env's stream of transitions (a ``stream`` id and a running ``step`` per env, set
  by this loop on each batch; ``SliceSampler(traj_key="stream", step_key="step", fragmented=True, init_key=None,
  truncated_key=None)``), its windows crossing episode ends, the world model resetting at each ``is_init`` inside a
  window (``RSSMRolloutV3(reset_key="is_init")``); the example slices by the collector's episode ids
  (``("collector", "traj_ids")``), whose windows of ``strict_length`` cannot come from episodes shorter than ``T``
  (CartPole's early episodes of ~20 steps at the default ``T`` = 64). Windows over each env's stream are what the
  adapter's stored sampler draws too.
- The update schedule: TorchRL's ``DreamerV3UpdateRatio`` at ``training_ratio / (B x T)`` updates per env step (its
  fractional remainder carried), called once the stored ``learning_starts_env_steps`` were sampled and an env's
  stream holds a window; the example runs a fixed ``updates_per_batch`` after a warm-up of replay entries.
  ``DreamerV3UpdateRatio``'s first call gives one update and counts from there; the adapter owes
  ``frames x training_ratio`` replayed steps from the batch that crosses learning starts: the same updates whenever
  ``frames_per_batch x training_ratio`` is ``B x T`` (the adapter's ``frames_per_batch`` is chosen so, rounded), at
  most one update apart otherwise.
- The model loss's keys: the target is ``symlog(observation)`` written by the world model and the decoder predicts it
  (``set_keys(pixels="symlog_observation", reco_pixels="reco_observation")``) as the stored ``reco_symlog=False``
  needs; the example's decoder predicts ``symexp`` of its output and the loss symlogs both (the same error).
- The widths: the stored ones for every ``DreamerV3MLP`` (the example has one depth per head), the continue and
  reward heads as deep as the others; no ``continue_target_scale`` (the stored kwargs name none: 1.0, TorchRL's
  default; the example's is ``1 - 1/333``).
- The acting: ``RSSMStateEstimatorV3`` (TorchRL 0.14.1's acting module: the belief advanced from the previous state
  and action, then the posterior of the observation; reset at ``is_init``) and the next step's ``previous_action``
  the actor's one-hot action, where the example's policy runs the posterior on the primer's belief and writes the
  prior's next belief itself. ``collector.update_policy_weights_()`` after a batch's updates.
- Points: one per stored ``point_env_steps`` env steps at the least (and at the budget), with the episodes finished
  since the last point, as the adapter reports DreamerV3; the example evaluates its policy deterministically every
  ``eval_every`` env steps instead. No compilation, no mixed precision, CPU only.

Known differences from crossrl's adapter (``adapters/torchrl/dreamer.py``): the replay holds TorchRL's transitions
(one per env step: the step's action, ``is_init``, the next observation, reward and termination), not the paper's
entries (one per observation, an episode of ``n`` steps in ``n + 1`` entries with its first observation); the world
model so never reconstructs an episode's first observation, and at an ``is_init`` transition ``RSSMRolloutV3`` zeroes
the state, belief and the transition's own action (the first action taken), so the first belief of an episode in
training is ``prior(0, 0, 0)`` paired with the second observation, where acting (and the adapter's training) pairs it
with the first. The replay's capacity counts transitions, not entries. The envs: ``GymEnv`` in ``SerialEnv`` with
one-hot actions (the adapter's are crossrl's ``make_env`` behind its env guard, in gymnasium's ``SyncVectorEnv`` by
default, with index actions mapped from the actor's one-hot); the networks' weights are TorchRL's initialisation
drawn from the trial's seed (the same scheme, not the same draws). Not covered: Box actions (the adapter's Gaussian
actor is crossrl's module); they are refused in one line.
"""

from __future__ import annotations

import functools
import re
import time
from collections.abc import Mapping
from typing import Any

import torch

from crossrl.adapters.base import MetricSink
from crossrl.measure.fidelity import beat
from crossrl.measure.fidelity.torchrl_common import episodes, needed, stored_sync_collector, sync_collector
from crossrl.scenarios import metrics as M
from crossrl.scenarios.spec import Trial

"""The collector classes a dreamer trial's stored config may name (the adapter's local, synchronous ones)."""
MODEL_LOSS, ACTOR_LOSS, VALUE_LOSS = "DreamerV3ModelLoss", "DreamerV3ActorLoss", "DreamerV3ValueLoss"
ACTOR = "DreamerV3DiscreteActor"
DISTRIBUTION = "OneHotCategorical, 1 % uniform"
"""The stored discrete actor's distribution: ``DreamerV3DiscreteActor``'s (its default unimix 0.01)."""
VALUE_ESTIMATOR = "TDLambdaEstimator"
SLOW_CRITIC = "SoftUpdate"
OPTIMIZER = "torch.optim.Adam"
OPTIMIZERS = ("world_model", "actor", "critic")
REPLAY = "ReplayBuffer"
STORAGE = re.compile(r"LazyTensorStorage\((?P<size>[0-9]+)\)")
SLICE = re.compile(r"SliceSampler\(slice_len=(?P<len>[0-9]+),.*fragmented=True.*\)")
STREAM, STEP = "stream", "step"
"""The replay's trajectory and step keys: each env's transitions, in order (``SliceSampler(fragmented=True)``)."""
STATE, BELIEF, PREV_ACTION, IS_INIT = "state", "belief", "previous_action", "is_init"
REPLAY_KEYS: tuple[Any, ...] = (
    "action",
    IS_INIT,
    ("next", "observation"),
    ("next", "reward"),
    ("next", "terminated"),
    ("next", "done"),
)
"""What the replay keeps of a collected transition (the example's ``data.select(...)``, and ``done``)."""

FIX = "store the config crossrl's TorchRL adapter reports for a local dreamer trial (`crossrl fidelity` does)"


def _need(stored: Mapping[str, Any], where: str, *keys: str) -> Any:
    """``stored_value`` with the file and the remedy in its one line."""
    return needed(stored, where, FIX, *keys)


def _refuse(what: str, where: str) -> ValueError:
    """The one-line error for a stored config this loop cannot run as stored."""
    return ValueError(f"torchrl-native: dreamer {what} ({where}): {FIX}")


def settings(trial: Trial, stored: Mapping[str, Any], where: str) -> dict[str, Any]:
    """Every setting of the loop from the stored native config, checked; a ValueError in one line otherwise."""
    collector = stored_sync_collector(trial, stored, where, algorithm="dreamer", fix=FIX)
    for keys, cls_name in (
        (("world_model", "prior", "class"), "RSSMPriorV3"),
        (("world_model", "posterior", "class"), "RSSMPosteriorV3"),
        (("world_model", "mlp", "class"), "DreamerV3MLP"),
        (("model_loss", "class"), MODEL_LOSS),
        (("actor", "class"), ACTOR),
        (("actor", "distribution"), DISTRIBUTION),
        (("actor_loss", "class"), ACTOR_LOSS),
        (("actor_loss", "value_estimator", "class"), VALUE_ESTIMATOR),
        (("value_loss", "class"), VALUE_LOSS),
        (("value_loss", "slow_critic", "class"), SLOW_CRITIC),
        (("replay_buffer", "class"), REPLAY),
        *((("optimizers", name, "class"), OPTIMIZER) for name in OPTIMIZERS),
    ):
        found = _need(stored, where, *keys)
        if found != cls_name:
            raise _refuse(f"needs the stored {'.'.join(keys)} {cls_name}, not {found!r}", where)
    storage = STORAGE.fullmatch(str(_need(stored, where, "replay_buffer", "storage")))
    sampler = SLICE.fullmatch(str(_need(stored, where, "replay_buffer", "sampler")))
    if storage is None or sampler is None:
        raise _refuse("cannot read the stored replay_buffer.storage or its fragmented SliceSampler", where)
    prior = {k: v for k, v in dict(_need(stored, where, "world_model", "prior")).items() if k != "class"}
    posterior = {k: v for k, v in dict(_need(stored, where, "world_model", "posterior")).items() if k != "class"}
    for key in ("prior_num_layers", "hidden_dim", "rnn_hidden_dim", "num_categoricals", "num_classes"):
        _need(stored, where, "world_model", "prior", key)
    for key in ("hidden_dim", "rnn_hidden_dim", "obs_embed_dim", "num_layers", "num_categoricals", "num_classes"):
        _need(stored, where, "world_model", "posterior", key)
    depth = int(_need(stored, where, "world_model", "mlp", "depth"))
    units = int(_need(stored, where, "world_model", "mlp", "num_cells"))
    if int(posterior["obs_embed_dim"]) != units:
        raise _refuse(
            f"encodes observations to the DreamerV3MLP's width ({units}), the stored obs_embed_dim is "
            f"{posterior['obs_embed_dim']}",
            where,
        )
    actor_kwargs = dict(_need(stored, where, "actor_loss", "kwargs"))
    actor_kwargs.pop("continuation_model", None)  # stored as its description; the continue head is built here
    return {
        **collector,
        "prior": prior,
        "posterior": posterior,
        "depth": depth,
        "units": units,
        "bins": int(_need(stored, where, "world_model", "mlp", "two_hot_bins")),
        "model_kwargs": dict(_need(stored, where, "model_loss", "kwargs")),
        "actor_kwargs": actor_kwargs,
        "gamma": float(_need(stored, where, "actor_loss", "value_estimator", "gamma")),
        "lmbda": float(_need(stored, where, "actor_loss", "value_estimator", "lmbda")),
        "value_kwargs": dict(_need(stored, where, "value_loss", "kwargs")),
        "slow_eps": float(_need(stored, where, "value_loss", "slow_critic", "eps")),
        "optimizers": {
            name: {
                "lr": float(_need(stored, where, "optimizers", name, "lr")),
                "eps": float(_need(stored, where, "optimizers", name, "eps")),
                "clip": float(_need(stored, where, "optimizers", name, "grad_clip_norm")),
            }
            for name in OPTIMIZERS
        },
        "buffer_size": int(storage["size"]),
        "batch_length_T": int(sampler["len"]),
        "batch_size_B": int(_need(stored, where, "replay_buffer", "windows")),
        "training_ratio": float(_need(stored, where, "training_ratio")),
        "learning_starts": int(_need(stored, where, "learning_starts_env_steps")),
        "point_env_steps": int(_need(stored, where, "point_env_steps")),
        "params": {
            "world_model": int(_need(stored, where, "world_model", "params")),
            "actor": int(_need(stored, where, "actor", "params")),
            "critic": int(_need(stored, where, "value_loss", "params")),
        },
    }


def gym_env(env_id: str, kwargs: Mapping[str, Any]) -> Any:
    """The gymnasium env in TorchRL's ``GymEnv``, its Discrete actions one-hot (TorchRL's default encoding: the actor's
    action as it samples it)."""
    from torchrl.envs import GymEnv, set_gym_backend

    with set_gym_backend("gymnasium"):
        return GymEnv(env_id, **dict(kwargs))


def make_dreamer_env(
    env_id: str, kwargs: Mapping[str, Any], num_envs: int, *, state_dim: int, belief_dim: int, act_dim: int
) -> Any:
    """``num_envs`` gymnasium envs stepped serially with episode return and length counters, ``InitTracker``
    (``is_init``) and a ``TensorDictPrimer`` of the acting policy's recurrent state (``state``, ``belief``,
    ``previous_action``: zeros at every reset, carried from step to step). Module-level: a collector worker started
    with spawn unpickles it."""
    from torchrl.data import Unbounded
    from torchrl.envs import Compose, InitTracker, RewardSum, SerialEnv, StepCounter, TensorDictPrimer, TransformedEnv

    torch.set_num_threads(1)
    base = SerialEnv(num_envs, functools.partial(gym_env, env_id, dict(kwargs)), serial_for_single=True)
    primer = TensorDictPrimer(
        random=False,
        default_value=0.0,
        expand_specs=True,
        **{STATE: Unbounded(state_dim), BELIEF: Unbounded(belief_dim), PREV_ACTION: Unbounded(act_dim)},
    )
    return TransformedEnv(base, Compose(RewardSum(), StepCounter(), InitTracker(), primer))


def as_float(action: torch.Tensor) -> torch.Tensor:
    """The actor's one-hot action as the next step's ``previous_action`` (module-level: picklable)."""
    return action.to(torch.float32)


def env_dims(trial: Trial) -> tuple[int, int]:
    """(observation width, number of actions) of a proof env; a ValueError unless the actions are Discrete (one-hot
    in TorchRL) and the observations a vector."""
    from torchrl.data import OneHot as OneHotSpec

    proof = gym_env(trial.env.id, trial.env.kwargs)
    try:
        action_spec = proof.action_spec_unbatched
        obs_spec = proof.observation_spec_unbatched.get("observation", None)
    finally:
        proof.close(raise_if_closed=False)
    if not isinstance(action_spec, OneHotSpec) or obs_spec is None or len(obs_spec.shape) != 1:
        raise ValueError(
            f"torchrl-native: dreamer runs Discrete actions with vector observations; {trial.env.id} gives "
            f"{type(action_spec).__name__} actions and observations {None if obs_spec is None else list(obs_spec.shape)}"
        )
    return int(obs_spec.shape[-1]), int(action_spec.shape[-1])


def build(trial: Trial, s: Mapping[str, Any], obs_dim: int, n_actions: int) -> dict[str, Any]:
    """The networks, the three losses, the slow critic and the acting policy, as TorchRL's example wires them with the
    stored settings, after seeding torch with the trial's seed."""
    from tensordict.nn import TensorDictModule, TensorDictSequential
    from torch import nn
    from torchrl.data import Composite, Unbounded
    from torchrl.data import OneHot as OneHotSpec
    from torchrl.envs.model_based.dreamer import DreamerEnv
    from torchrl.modules import (
        DreamerV3DiscreteActor,
        DreamerV3MLP,
        RSSMPosteriorV3,
        RSSMPriorV3,
        RSSMRolloutV3,
        RSSMStateEstimatorV3,
        SymExpTwoHot,
        WorldModelWrapper,
    )
    from torchrl.objectives import (
        DreamerV3ActorLoss,
        DreamerV3ModelLoss,
        DreamerV3ValueLoss,
        SoftUpdate,
        ValueEstimators,
    )
    from torchrl.objectives.dreamer_v3 import symlog

    torch.set_num_threads(1)
    torch.manual_seed(trial.seed)
    prior_kw, post_kw = dict(s["prior"]), dict(s["posterior"])
    depth, units, bins = s["depth"], s["units"], s["bins"]
    state_dim = int(prior_kw["num_categoricals"]) * int(prior_kw["num_classes"])
    belief_dim = int(prior_kw["rnn_hidden_dim"])
    feat = state_dim + belief_dim

    encoder_net = DreamerV3MLP(obs_dim, None, depth=depth, num_cells=units)
    prior_net = RSSMPriorV3(action_shape=(n_actions,), action_dim=n_actions, **prior_kw)
    posterior_net = RSSMPosteriorV3(**post_kw)
    decoder_net = DreamerV3MLP(feat, obs_dim, depth=depth, num_cells=units)
    reward_net = DreamerV3MLP(feat, bins, depth=depth, num_cells=units, outscale=0.0)
    cont_net = DreamerV3MLP(feat, 1, depth=depth, num_cells=units)
    value_net = DreamerV3MLP(feat, bins, depth=depth, num_cells=units, outscale=0.0)
    actor = DreamerV3DiscreteActor(feat, n_actions, depth=depth, num_cells=units, in_keys=[STATE, BELIEF])
    two_hot = SymExpTwoHot(bins)

    def nxt(key: str) -> tuple[str, str]:
        return ("next", key)

    world_model = TensorDictSequential(
        TensorDictModule(symlog, in_keys=[nxt("observation")], out_keys=[nxt("symlog_observation")]),
        TensorDictModule(encoder_net, in_keys=[nxt("symlog_observation")], out_keys=[nxt("encoded_latents")]),
        RSSMRolloutV3(
            TensorDictModule(prior_net, in_keys=[STATE, BELIEF, "action"],
                             out_keys=[nxt("prior_logits"), nxt(STATE), nxt(BELIEF)]),
            TensorDictModule(posterior_net, in_keys=[nxt(BELIEF), nxt("encoded_latents")],
                             out_keys=[nxt("posterior_logits"), nxt(STATE)]),
            reset_key=IS_INIT,
            action_key="action",
        ),
        TensorDictModule(decoder_net, in_keys=[nxt(STATE), nxt(BELIEF)], out_keys=[nxt("reco_observation")]),
        TensorDictModule(reward_net, in_keys=[nxt(STATE), nxt(BELIEF)], out_keys=[nxt("reward_logits")]),
        TensorDictModule(two_hot, in_keys=[nxt("reward_logits")], out_keys=[nxt("reward")]),
        TensorDictModule(cont_net, in_keys=[nxt(STATE), nxt(BELIEF)], out_keys=[nxt("continue_pred")]),
    )  # fmt: skip
    value_model = TensorDictSequential(
        TensorDictModule(value_net, in_keys=[STATE, BELIEF], out_keys=["state_value_logits"]),
        TensorDictModule(two_hot, in_keys=["state_value_logits"], out_keys=["state_value"]),
    )
    continuation = TensorDictSequential(
        TensorDictModule(cont_net, in_keys=[STATE, BELIEF], out_keys=["continue_logits"]),
        TensorDictModule(nn.Sigmoid(), in_keys=["continue_logits"], out_keys=["continuation"]),
    )
    imagination = DreamerEnv(
        world_model=WorldModelWrapper(
            TensorDictModule(prior_net, in_keys=[STATE, BELIEF, "action"], out_keys=["_", STATE, BELIEF]),
            TensorDictSequential(
                TensorDictModule(reward_net, in_keys=[STATE, BELIEF], out_keys=["reward_logits"]),
                TensorDictModule(two_hot, in_keys=["reward_logits"], out_keys=["reward"]),
            ),
        ),
        prior_shape=torch.Size([state_dim]),
        belief_shape=torch.Size([belief_dim]),
    )
    latent = Composite({STATE: Unbounded(state_dim), BELIEF: Unbounded(belief_dim)})
    imagination.observation_spec = latent.clone()
    imagination.state_spec = latent.clone()
    imagination.action_spec = OneHotSpec(n_actions)
    imagination.reward_spec = Unbounded(1)

    model_kwargs = {"num_reward_bins": bins, **s["model_kwargs"]}
    model_loss = DreamerV3ModelLoss(world_model, **model_kwargs)
    model_loss.set_keys(pixels="symlog_observation", reco_pixels="reco_observation")
    actor_loss = DreamerV3ActorLoss(actor, value_model, imagination, continuation_model=continuation,
                                    **s["actor_kwargs"])  # fmt: skip
    actor_loss.make_value_estimator(ValueEstimators.TDLambda, gamma=s["gamma"], lmbda=s["lmbda"])
    value_kwargs = {"num_value_bins": bins, **s["value_kwargs"]}
    value_loss = DreamerV3ValueLoss(value_model, actor_loss=actor_loss, **value_kwargs)
    slow_critic = SoftUpdate(value_loss, eps=s["slow_eps"])

    policy = TensorDictSequential(
        TensorDictModule(symlog, in_keys=["observation"], out_keys=["symlog_observation"]),
        TensorDictModule(encoder_net, in_keys=["symlog_observation"], out_keys=["encoded_latents"]),
        RSSMStateEstimatorV3(prior_net, posterior_net),  # in: state, belief, previous_action, encoded_latents, is_init
        actor,
        TensorDictModule(as_float, in_keys=["action"], out_keys=[PREV_ACTION]),
    )
    params = {
        "world_model": list(model_loss.parameters()),
        "actor": list(actor.parameters()),
        "critic": list(value_loss.parameters()),
    }
    return {
        "policy": policy,
        "model_loss": model_loss,
        "model_kwargs": model_kwargs,
        "actor_loss": actor_loss,
        "value_loss": value_loss,
        "value_kwargs": value_kwargs,
        "slow_critic": slow_critic,
        "params": params,
        "state_dim": state_dim,
        "belief_dim": belief_dim,
        "networks": {"encoder": repr(encoder_net), "actor": repr(actor), "critic": repr(value_net)},
    }


def run_dreamer(trial: Trial, sink: MetricSink, stored: Mapping[str, Any], where: str) -> None:
    """TorchRL's DreamerV3 loop on the stored settings, reported through ``sink`` a point per stored
    ``point_env_steps`` env steps at the least (and at the budget)."""
    s = settings(trial, stored, where)

    import torchrl
    from tensordict import TensorDict
    from torchrl.data import LazyTensorStorage, ReplayBuffer
    from torchrl.data.replay_buffers import SliceSampler
    from torchrl.objectives.dreamer_v3 import categorical_kl_terms
    from torchrl.trainers.algorithms import DreamerV3UpdateRatio

    obs_dim, n_actions = env_dims(trial)
    net = build(trial, s, obs_dim, n_actions)
    counts = {name: sum(p.numel() for p in ps) for name, ps in net["params"].items()}
    if counts != s["params"]:
        raise _refuse(f"builds networks of {counts} parameters, the stored ones have {s['params']}", where)
    model_loss, actor_loss, value_loss = net["model_loss"], net["actor_loss"], net["value_loss"]
    opts = s["optimizers"]
    optims = {name: torch.optim.Adam(net["params"][name], lr=opts[name]["lr"], eps=opts[name]["eps"])
              for name in OPTIMIZERS}  # fmt: skip
    b, t = s["batch_size_B"], s["batch_length_T"]
    replayed = b * t
    buffer = ReplayBuffer(
        storage=LazyTensorStorage(s["buffer_size"]),
        sampler=SliceSampler(slice_len=t, traj_key=STREAM, step_key=STEP, fragmented=True, init_key=None,
                             truncated_key=None, strict_length=True),
        batch_size=replayed,
    )  # fmt: skip
    schedule = DreamerV3UpdateRatio(s["training_ratio"] / replayed)  # updates per env step
    state_dim, belief_dim = net["state_dim"], net["belief_dim"]

    def step(name: str, loss: torch.Tensor) -> None:
        optim = optims[name]
        optim.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(net["params"][name], opts[name]["clip"])
        optim.step()

    def update() -> torch.Tensor:
        """One DreamerV3 update on ``B`` replayed windows, as the example's: the world model's step, the actor's on
        trajectories imagined from every posterior state, the critic's on them, the slow critic's soft update. Its
        losses, detached."""
        sample = buffer.sample().reshape(b, t)
        sample.set(STATE, torch.zeros(b, t, state_dim))
        sample.set(BELIEF, torch.zeros(b, t, belief_dim))
        m_td, model_out = model_loss(sample)
        wm_loss = sum(v for k, v in m_td.items() if k.startswith("loss_")).sum()
        with torch.no_grad():
            kl, _ = categorical_kl_terms(
                model_out.get(("next", "posterior_logits")), model_out.get(("next", "prior_logits")),
                free_nats=0.0, unimix=float(s["model_kwargs"].get("unimix", 0.0)),
            )  # fmt: skip
        step("world_model", wm_loss)
        starts = TensorDict(
            {STATE: model_out.get(("next", STATE)).detach().reshape(-1, state_dim),
             BELIEF: model_out.get(("next", BELIEF)).detach().reshape(-1, belief_dim)},
            batch_size=[replayed],
        )  # fmt: skip
        a_td, fake = actor_loss(starts)
        step("actor", a_td["loss_actor"])
        v_td, _ = value_loss(fake.detach())
        step("critic", v_td["loss_value"])
        net["slow_critic"].step()
        parts = (v_td["loss_value"], a_td["loss_actor"], a_td["actor_entropy"], wm_loss, kl)
        return torch.stack([p.detach().reshape(()) for p in parts])

    held: dict[int, int] = {}  # env stream -> transitions written (the next one's step)

    def store(data: Any) -> None:
        """The batch's transitions, env by env (``[..., T]``, time last), each with its stream id and step."""
        length = data.shape[-1]
        rows = data.select(*REPLAY_KEYS).reshape(-1, length)
        streams = torch.arange(rows.shape[0]).unsqueeze(-1).expand(-1, length)
        steps = torch.stack([torch.arange(held.get(i, 0), held.get(i, 0) + length) for i in range(rows.shape[0])])
        for i in range(rows.shape[0]):
            held[i] = held.get(i, 0) + length
        rows.set("action", rows.get("action").to(torch.float32))
        rows.set(STREAM, streams.contiguous())
        rows.set(STEP, steps)
        buffer.extend(rows.reshape(-1))

    workers, collector_kwargs, fpb = s["workers"], s["collector_kwargs"], s["fpb"]
    env_fn = functools.partial(
        make_dreamer_env, trial.env.id, dict(trial.env.kwargs), trial.envs_per_worker,
        state_dim=state_dim, belief_dim=belief_dim, act_dim=n_actions,
    )  # fmt: skip
    policy = net["policy"]
    collector = sync_collector(s["collector_cls"], env_fn, policy, workers=workers, kwargs=collector_kwargs)
    try:
        collector.set_seed(trial.seed)
        sink.tags(engine_version=torchrl.__version__, collector=s["collector_cls"],
                  native_loop="torchrl: the DreamerV3 example loop (sota-implementations/dreamer_v3)")  # fmt: skip
        sink.native_config(
            {
                "engine": "torchrl-native",
                "torchrl_version": torchrl.__version__,
                "stored_config": where,
                "collector": {"class": s["collector_cls"], "kwargs": collector_kwargs, "num_workers": workers},
                "env": f"TransformedEnv(SerialEnv({trial.envs_per_worker} x GymEnv({trial.env.id!r}, "
                f"**{dict(trial.env.kwargs)})), Compose(RewardSum(), StepCounter(), InitTracker(), "
                "TensorDictPrimer(state, belief, previous_action)))",
                "world_model": {"prior": {"class": "RSSMPriorV3", **s["prior"]},
                                "posterior": {"class": "RSSMPosteriorV3", **s["posterior"]},
                                "mlp": {"class": "DreamerV3MLP", "depth": s["depth"], "num_cells": s["units"],
                                        "two_hot_bins": s["bins"]},
                                "rollout": "RSSMRolloutV3(reset_key='is_init', action_key='action')",
                                "encoder": net["networks"]["encoder"]},
                "params": counts,
                "model_loss": {"class": MODEL_LOSS, "kwargs": net["model_kwargs"],
                               "keys": {"pixels": "symlog_observation", "reco_pixels": "reco_observation"}},
                "actor": {"class": ACTOR, "distribution": DISTRIBUTION, "network": net["networks"]["actor"]},
                "actor_loss": {"class": ACTOR_LOSS, "kwargs": s["actor_kwargs"]
                               | {"continuation_model": "the continue head (sigmoid)"},
                               "value_estimator": {"class": VALUE_ESTIMATOR, "gamma": s["gamma"],
                                                   "lmbda": s["lmbda"]}},
                "value_loss": {"class": VALUE_LOSS, "kwargs": net["value_kwargs"],
                               "slow_critic": {"class": SLOW_CRITIC, "eps": s["slow_eps"]}},
                "optimizers": {name: {"class": OPTIMIZER, "lr": o.param_groups[0]["lr"],
                                      "eps": o.param_groups[0]["eps"], "grad_clip_norm": opts[name]["clip"]}
                               for name, o in optims.items()},
                "replay_buffer": {"class": REPLAY, "storage": f"LazyTensorStorage({s['buffer_size']})",
                                  "sampler": f"SliceSampler(slice_len={t}, traj_key='{STREAM}', step_key='{STEP}', "
                                             "fragmented=True, init_key=None, truncated_key=None, strict_length=True)",
                                  "windows": b, "keys": [list(k) if isinstance(k, tuple) else k for k in REPLAY_KEYS],
                                  "entries": "one per env step (TorchRL's transitions)"},
                "training_ratio": s["training_ratio"],
                "learning_starts_env_steps": s["learning_starts"],
                "updates": f"DreamerV3UpdateRatio({s['training_ratio']} / {replayed}) per env step, once learning "
                           "starts and an env's stream holds a window",
                "acting": "symlog -> encoder -> RSSMStateEstimatorV3 -> DreamerV3DiscreteActor; state, belief and "
                          "previous_action carried by TensorDictPrimer, reset at InitTracker's is_init",
                "weights": "collector.update_policy_weights_() after a batch's updates",
                "point_env_steps": s["point_env_steps"],
                "seed": trial.seed,
                "torch_num_threads": torch.get_num_threads(),
            }
        )  # fmt: skip
        sink.start_clock()
        budget = trial.budget.env_steps
        sampled = trained = updates = 0
        pending_steps, returns, lengths, stats = 0, [], [], []
        times = [0.0, 0.0, 0.0]
        t0 = time.perf_counter()
        for data in collector:
            t1 = time.perf_counter()
            frames = data.numel()
            if frames != fpb:
                raise ValueError(f"torchrl-native: a collector batch of {frames} env steps, not {fpb} ({where})")
            sampled += frames
            store(data)
            n_updates = 0
            if sampled >= s["learning_starts"] and max(held.values()) >= t:
                n_updates = schedule(sampled)
                for _ in range(n_updates):
                    stats.append(update())
                    beat()  # the first batch past learning_starts owes every stored step's updates: minutes
            updates += n_updates
            trained += n_updates * replayed
            t2 = time.perf_counter()
            if n_updates:
                collector.update_policy_weights_()
            t3 = time.perf_counter()
            done_returns, done_lengths = episodes(data)
            returns += done_returns
            lengths += done_lengths
            pending_steps += frames
            times = [times[0] + t1 - t0, times[1] + t2 - t1, times[2] + t3 - t2]
            if pending_steps < s["point_env_steps"] and (budget is None or sampled < budget):
                t0 = time.perf_counter()
                continue
            values = {M.TIME_SAMPLE_S: times[0], M.TIME_LEARN_S: times[1], M.TIME_SYNC_WEIGHTS_S: times[2]}
            if stats:  # the critic's loss first, as the adapter orders them: the sink names a diverged critic
                critic_loss, actor_loss_v, entropy, wm_loss, kl = (float(x) for x in torch.stack(stats).mean(0))
                values |= {M.VALUE_LOSS: critic_loss, M.POLICY_LOSS: actor_loss_v, M.ENTROPY: entropy,
                           M.DIAG_WORLD_MODEL_LOSS: wm_loss, "diag.kl": kl}  # fmt: skip
            values |= {M.DIAG_REPLAY_SIZE: float(len(buffer)), M.DIAG_UPDATES: float(updates)}
            sink.point(
                env_steps_sampled=sampled,
                env_steps_trained=trained,
                episode_returns=returns,
                episode_lengths=lengths,
                values=values,
            )
            beat()
            if sink.exhausted:
                break
            pending_steps, returns, lengths, stats = 0, [], [], []
            times = [0.0, 0.0, 0.0]
            t0 = time.perf_counter()
    finally:
        collector.shutdown()
