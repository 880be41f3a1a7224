"""The policy graph (RLlib paper, section 3): model + action distribution + postprocessing + loss.

:class:`Policy` is what evaluators and optimizers see. :class:`ActorCriticPolicy` is the concrete
policy for ppo/a2c/a3c/impala: categorical actions for ``Discrete`` spaces, a diagonal Gaussian for
``Box``; each algorithm module subclasses it and supplies only :meth:`Policy.loss`.

Inference is numpy only: actor and critic fused into one numpy MLP; categorical sampling uses
Gumbel-max, about twice as fast as ``torch.distributions`` on small batches. An evaluator samples a
whole fragment through :meth:`Policy.fragment_actor`: per env step one forward pass and one argmax on
noise drawn once per fragment, the log-probabilities computed for the whole fragment afterwards.

torch is imported only where a policy learns or computes gradients (the driver, A3C workers): a
sampling-only evaluator actor keeps its weights as numpy and never pays torch's ~220 MiB of RSS.
"""

from __future__ import annotations

import abc
import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

import gymnasium as gym
import numpy as np

from crossrl.core import maths
from crossrl.core import sample_batch as sb
from crossrl.core.sample_batch import SampleBatch
from crossrl.scenarios.spec import ModelSpec

if TYPE_CHECKING:
    import torch
    from torch import nn

_LOG_2PI = math.log(2.0 * math.pi)


class Policy(abc.ABC):
    """Abstract policy graph. Subclasses keep this constructor signature (evaluators build them by keyword).

    ``hyperparams`` are the trial's resolved hyperparameters (crossrl's shared names, see
    :mod:`crossrl.scenarios.catalog`) plus the algorithm module's extra defaults.
    """

    def __init__(
        self,
        *,
        observation_space: gym.Space,
        action_space: gym.Space,
        hyperparams: Mapping[str, Any],
        model: ModelSpec,
        seed: int,
    ) -> None:
        self.observation_space = observation_space
        self.action_space = action_space
        self.hp: dict[str, Any] = dict(hyperparams)
        self.model_spec = model
        self.seed = seed
        self.rng = np.random.default_rng(seed)

    @abc.abstractmethod
    def compute_actions(self, obs: np.ndarray, *, explore: bool = True) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Actions for a batch ``obs[B, ...]`` and extra columns (e.g. LOGP, VF_PREDS) each ``[B, ...]``."""

    def fragment_actor(self, *, num_steps: int, num_envs: int) -> FragmentActor:
        """Acting for one ``sample()`` call of ``num_steps`` x ``num_envs``; the default calls compute_actions per step."""
        return StepwiseActor(self, num_steps)

    def postprocess_trajectory(self, batch: SampleBatch) -> SampleBatch:
        """Runs on the worker right after sampling, on the time-major batch (GAE, n-step, priorities)."""
        return batch

    @abc.abstractmethod
    def loss(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, float]]:
        """Scalar loss to minimise and stats (metric names from :mod:`crossrl.scenarios.metrics` where they apply)."""

    @abc.abstractmethod
    def learn_on_batch(self, batch: SampleBatch) -> dict[str, float]:
        """Improve the policy on ``batch`` (SGD epochs/minibatches as the hyperparameters say); returns stats."""

    @abc.abstractmethod
    def compute_gradients(self, batch: SampleBatch) -> tuple[list[np.ndarray], dict[str, float]]:
        """Gradients of :meth:`loss` on the whole batch, one array per parameter (``parameters()`` order)."""

    @abc.abstractmethod
    def apply_gradients(self, grads: list[np.ndarray]) -> None:
        """One optimizer step with ``grads`` (as returned by :meth:`compute_gradients`, maybe from another copy)."""

    @abc.abstractmethod
    def get_weights(self) -> dict[str, np.ndarray]:
        """Every tensor needed to act and learn identically elsewhere (copies, numpy)."""

    @abc.abstractmethod
    def set_weights(self, weights: Mapping[str, np.ndarray]) -> None: ...

    def set_epsilon(self, epsilon: float) -> None:
        """Exploration hook for epsilon-greedy policies; a no-op for stochastic ones."""


class FragmentActor(Protocol):
    """Acts for one fragment: ``actor(obs, t)`` returns step ``t``'s actions; ``columns()`` the per-step extras."""

    def __call__(self, obs: np.ndarray, t: int) -> np.ndarray: ...

    def columns(self) -> dict[str, np.ndarray]:
        """ACTIONS and the policy's extra columns, each ``[num_steps, num_envs, ...]``."""
        ...


class StepwiseActor:
    """The generic fragment actor: ``compute_actions`` per step, columns stacked as they come."""

    def __init__(self, policy: Policy, num_steps: int) -> None:
        self.policy = policy
        self.num_steps = num_steps
        self.cols: dict[str, np.ndarray] = {}

    def __call__(self, obs: np.ndarray, t: int) -> np.ndarray:
        actions, extra = self.policy.compute_actions(obs)
        if not self.cols:
            for k, v in {sb.ACTIONS: actions, **extra}.items():
                self.cols[k] = np.empty((self.num_steps, *v.shape), v.dtype)
        self.cols[sb.ACTIONS][t] = actions
        for k, v in extra.items():
            self.cols[k][t] = v
        return actions

    def columns(self) -> dict[str, np.ndarray]:
        return self.cols


class PolicyFactory(Protocol):
    """Builds a policy in an evaluator (must pickle: it travels to Ray actors)."""

    def __call__(self, *, observation_space: gym.Space, action_space: gym.Space, seed: int) -> Policy: ...


class PolicySpec:
    """A picklable :class:`PolicyFactory`: a policy class with its hyperparameters and model spec."""

    def __init__(self, *, policy_cls: type[Policy], hyperparams: Mapping[str, Any], model: ModelSpec) -> None:
        self.policy_cls = policy_cls
        self.hyperparams = dict(hyperparams)
        self.model = model

    def __call__(self, *, observation_space: gym.Space, action_space: gym.Space, seed: int) -> Policy:
        return self.policy_cls(
            observation_space=observation_space,
            action_space=action_space,
            hyperparams=self.hyperparams,
            model=self.model,
            seed=seed,
        )


class ActorCriticPolicy(Policy):
    """Separate actor and critic MLPs (no shared layers). Subclasses implement :meth:`loss`.

    Hyperparameters used here: ``lr``, ``grad_clip`` (global norm), ``gamma``, ``gae_lambda``,
    ``epochs`` (default 1) and ``minibatch`` (env steps; default: the whole batch).
    Set ``use_gae = False`` in a subclass whose loss needs raw time-major batches (V-trace).
    """

    use_gae: bool = True

    def __init__(
        self,
        *,
        observation_space: gym.Space,
        action_space: gym.Space,
        hyperparams: Mapping[str, Any],
        model: ModelSpec,
        seed: int,
    ) -> None:
        super().__init__(
            observation_space=observation_space,
            action_space=action_space,
            hyperparams=hyperparams,
            model=model,
            seed=seed,
        )
        if not isinstance(observation_space, gym.spaces.Box):
            raise TypeError(f"ActorCriticPolicy needs a Box observation space, got {observation_space}")
        self.obs_dim = int(np.prod(observation_space.shape))
        self.discrete = isinstance(action_space, gym.spaces.Discrete)
        if self.discrete:
            assert isinstance(action_space, gym.spaces.Discrete)
            act_dim = int(action_space.n)
        elif isinstance(action_space, gym.spaces.Box):
            act_dim = int(np.prod(action_space.shape))
        else:
            raise TypeError(f"ActorCriticPolicy supports Discrete and Box actions, got {action_space}")
        self.act_dim = act_dim
        # Weights live in the torch modules once built (self._torch), in _np_weights before that.
        self._torch: tuple[nn.ModuleDict, list[nn.Parameter], torch.optim.Optimizer] | None = None
        self._np_weights: dict[str, np.ndarray] | None = None
        self._np_cache: _NpNet | None = None

    # -- torch, built on first use -------------------------------------------------------------------
    def _build_torch(self) -> tuple[nn.ModuleDict, list[nn.Parameter], torch.optim.Optimizer]:
        if self._torch is None:
            import torch
            from torch import nn

            from crossrl.core.models import build_mlp

            torch.manual_seed(self.seed)
            net = nn.ModuleDict(
                {
                    "pi": build_mlp(in_dim=self.obs_dim, out_dim=self.act_dim, model=self.model_spec, out_gain=0.01),
                    "vf": build_mlp(in_dim=self.obs_dim, out_dim=1, model=self.model_spec, out_gain=1.0),
                }
            )
            if not self.discrete:
                net.register_parameter("log_std", nn.Parameter(torch.zeros(self.act_dim)))
            if self._np_weights is not None:
                net.load_state_dict({k: torch.as_tensor(v) for k, v in self._np_weights.items()})
                self._np_weights = None
            params = list(net.parameters())
            optimizer = torch.optim.Adam(params, lr=float(self.hp.get("lr", 3e-4)), eps=1e-5)
            self._torch = (net, params, optimizer)
        return self._torch

    @property
    def net(self) -> nn.ModuleDict:
        """The actor (``pi``) and critic (``vf``) torch modules (``log_std`` for Gaussian policies)."""
        return self._build_torch()[0]

    @property
    def params(self) -> list[nn.Parameter]:
        return self._build_torch()[1]

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        return self._build_torch()[2]

    # -- acting ------------------------------------------------------------------------------------
    def compute_actions(self, obs: np.ndarray, *, explore: bool = True) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        fused, log_std, _ = self._numpy_net()
        out = _np_forward(fused, np.asarray(obs, np.float32).reshape(len(obs), self.obs_dim))
        values = out[:, -1]
        if self.discrete:
            logits = out[:, :-1]
            if explore:
                # Gumbel-max via exponential race: argmax(logits - log E), E ~ Exp(1), samples softmax(logits).
                actions = np.argmax(logits - np.log(self.rng.standard_exponential(logits.shape, np.float32)), axis=1)
            else:
                actions = np.argmax(logits, axis=1)
            chosen = logits[np.arange(len(actions)), actions]
            # log softmax of the chosen action: -log sum_j exp(l_j - l_a) (no overflow for a sampled a).
            logp = -np.log(np.exp(logits - chosen[:, None]).sum(axis=1))
        else:
            assert log_std is not None
            mean = out[:, :-1]
            noise = self.rng.standard_normal(mean.shape, np.float32) if explore else np.zeros_like(mean)
            actions = mean + np.exp(log_std) * noise
            logp = (-0.5 * noise**2 - log_std - 0.5 * _LOG_2PI).sum(axis=1)
        return actions, {sb.LOGP: logp.astype(np.float32), sb.VF_PREDS: values.astype(np.float32)}

    def fragment_actor(self, *, num_steps: int, num_envs: int) -> FragmentActor:
        return _ActorCriticFragment(self, num_steps, num_envs)

    def value(self, obs: np.ndarray) -> np.ndarray:
        """V(obs) for ``obs[B, ...]`` -> ``[B]`` (float32)."""
        fused = self._numpy_net().layers
        return _np_forward(fused, np.asarray(obs, np.float32).reshape(len(obs), self.obs_dim))[:, -1].copy()

    def _numpy_net(self) -> _NpNet:
        """Actor and critic fused into one numpy MLP (block-diagonal weights), refreshed after weight changes.

        Output columns: the actor's outputs, then the value. For the small batches a sampler feeds (one
        row per env) a numpy matmul costs a few microseconds where a torch module call costs tens
        (dispatch overhead), and the fusion halves the number of calls.
        """
        if self._np_cache is None:
            self._np_cache = _fused_net(self.get_weights(), self.model_spec.activation, discrete=self.discrete)
        return self._np_cache

    # -- postprocessing ------------------------------------------------------------------------------
    def postprocess_trajectory(self, batch: SampleBatch) -> SampleBatch:
        """Adds ADVANTAGES and VALUE_TARGETS (GAE) to a time-major batch, bootstrapping where episodes were cut."""
        if not self.use_gae:
            return batch
        next_values = next_values_from(batch, self.value(batch[sb.NEXT_OBS][-1]))
        adv, targets = maths.gae(
            rewards=batch[sb.REWARDS],
            values=batch[sb.VF_PREDS],
            next_values=next_values,
            terminated=batch[sb.TERMINATEDS],
            truncated=batch[sb.TRUNCATEDS],
            valid=batch.get(sb.VALID),
            gamma=float(self.hp["gamma"]),
            lam=float(self.hp["gae_lambda"]),
        )
        batch[sb.ADVANTAGES] = adv.astype(np.float32)
        batch[sb.VALUE_TARGETS] = targets.astype(np.float32)
        del batch[sb.NEXT_OBS]  # only the bootstrap needed it: a quarter less to ship to the learner
        return batch

    # -- model evaluation for losses ----------------------------------------------------------------
    def evaluate(self, obs: torch.Tensor, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(log pi(a|s), entropy, V(s)), each of ``obs``'s leading shape (works on [B] and [T, N])."""
        import torch

        lead = obs.shape[: obs.dim() - len(self.observation_space.shape or ())]
        x = obs.reshape(-1, self.obs_dim)
        out = self.net["pi"](x)
        values = self.net["vf"](x)[:, 0]
        if self.discrete:
            logp_all = torch.log_softmax(out, dim=-1)
            a = actions.reshape(-1).long()
            logp = logp_all.gather(1, a[:, None])[:, 0]
            entropy = -(logp_all.exp() * logp_all).sum(-1)
        else:
            log_std = self.net.get_parameter("log_std").expand_as(out)
            a = actions.reshape(-1, self.act_dim)
            z = (a - out) / log_std.exp()
            logp = (-0.5 * z**2 - log_std - 0.5 * _LOG_2PI).sum(-1)
            entropy = (log_std + 0.5 * (1.0 + _LOG_2PI)).sum(-1)
        return logp.reshape(lead), entropy.reshape(lead), values.reshape(lead)

    # -- learning -----------------------------------------------------------------------------------
    def to_tensors(self, batch: SampleBatch) -> dict[str, torch.Tensor]:
        import torch

        return {k: torch.as_tensor(v) for k, v in batch.items()}

    def learn_on_batch(self, batch: SampleBatch) -> dict[str, float]:
        """``epochs`` passes of shuffled minibatches of ``minibatch`` env steps (time-major losses: whole batch)."""
        epochs = int(self.hp.get("epochs") or 1)
        if not self.use_gae:
            stats = [self._sgd_step(self.to_tensors(batch)) for _ in range(epochs)]
            return maths.mean_stats(stats)
        flat = batch.flatten()
        size = int(self.hp.get("minibatch") or flat.num_env_steps())
        stats = []
        for _ in range(epochs):
            for mb in flat.minibatches(size=size, rng=self.rng):
                stats.append(self._sgd_step(self.to_tensors(mb)))
        return maths.mean_stats(stats)

    def _sgd_step(self, tensors: dict[str, torch.Tensor]) -> dict[str, float]:
        loss, stats = self.loss(tensors)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        stats["grad_norm"] = self._clip()
        self.optimizer.step()
        self._np_cache = None
        return stats

    def _clip(self) -> float:
        import torch
        from torch import nn

        clip = self.hp.get("grad_clip")
        if clip:
            return float(nn.utils.clip_grad_norm_(self.params, float(clip)))
        return float(torch.sqrt(sum((p.grad**2).sum() for p in self.params if p.grad is not None)))  # type: ignore[arg-type]

    def compute_gradients(self, batch: SampleBatch) -> tuple[list[np.ndarray], dict[str, float]]:
        data = batch if not self.use_gae else batch.flatten()
        loss, stats = self.loss(self.to_tensors(data))
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grads = [(p.grad.numpy().copy() if p.grad is not None else np.zeros(p.shape, np.float32)) for p in self.params]
        return grads, stats

    def apply_gradients(self, grads: list[np.ndarray]) -> None:
        if len(grads) != len(self.params):
            raise ValueError(f"apply_gradients: got {len(grads)} arrays for {len(self.params)} parameters")
        import torch

        for p, g in zip(self.params, grads, strict=True):
            p.grad = torch.tensor(g, dtype=p.dtype).reshape(p.shape)
        self._clip()
        self.optimizer.step()
        self._np_cache = None

    def get_weights(self) -> dict[str, np.ndarray]:
        if self._torch is None and self._np_weights is not None:
            return {k: v.copy() for k, v in self._np_weights.items()}
        return {k: v.detach().numpy().copy() for k, v in self.net.state_dict().items()}

    def set_weights(self, weights: Mapping[str, np.ndarray]) -> None:
        if self._torch is None:  # a sampling-only copy: keep numpy, never import torch
            old = self._np_weights
            if old is not None and self._np_cache is not None and _same_layout(old, weights):
                # New values for the same arrays, the fused net refreshed in place: an evaluator gets new
                # weights every iteration, and rebuilding the fused net (~50 numpy calls and fresh
                # arrays) cost ~1.6 ms per fragment at 16 latency workers on 2 cores, ~25 us per step.
                for k, v in weights.items():
                    np.copyto(old[k], v)
                _write_fused(self._np_cache, old)
                return
            self._np_weights = {k: np.array(v, np.float32) for k, v in weights.items()}
        else:
            import torch

            self.net.load_state_dict({k: torch.as_tensor(np.asarray(v)) for k, v in weights.items()})
        self._np_cache = None


# One layer of a numpy MLP: (W^T [in, out], b [out]) for a Linear, or the activation's name.
_NpLayer = tuple[np.ndarray, np.ndarray] | str


class _NpNet(NamedTuple):
    """The fused actor-critic as numpy arrays, rebuilt after a learning step, refreshed in place by set_weights."""

    layers: list[_NpLayer]  # (W^T, b) Linears and activation names, outputs [actor's..., value]
    log_std: np.ndarray | None  # Gaussian policies' state-independent log std
    augmented: list[tuple[np.ndarray, str | None]]  # per Linear: [W^T; b] [in + 1, out], the activation after it


def _np_layers(weights: Mapping[str, np.ndarray], prefix: str, activation: str) -> list[_NpLayer]:
    """A :func:`~crossrl.core.models.build_mlp` MLP from its state dict (``prefix.<i>.weight``, Linear at even i)."""
    if activation not in ("tanh", "relu"):
        raise TypeError(f"numpy inference does not know the activation {activation!r}")
    layers: list[_NpLayer] = []
    i = 0
    key = prefix if not prefix or prefix.endswith(".") else prefix + "."
    while f"{key}{i}.weight" in weights:
        if i:
            layers.append(activation)
        w, b = weights[f"{key}{i}.weight"], weights[f"{key}{i}.bias"]
        layers.append((np.ascontiguousarray(w.T, np.float32), np.asarray(b, np.float32).copy()))
        i += 2
    if not layers:
        raise KeyError(f"no {key}0.weight in the weights (keys: {', '.join(weights)})")
    return layers


class _ActorCriticFragment:
    """One fragment of acting: per step a fused forward pass and the sampled action; extras afterwards.

    Exploration noise for the whole fragment is drawn in one call (Gumbel noise for categorical
    actions, standard normal for Gaussian ones): the same distribution as drawing it step by step.
    """

    def __init__(self, policy: ActorCriticPolicy, num_steps: int, num_envs: int) -> None:
        net = policy._numpy_net()
        self.log_std = net.log_std
        *hidden, (self.last_w, _) = net.augmented
        # Every layer's input lives in a buffer whose last column is ones (the bias row of [W^T; b]); each
        # numpy call writes in place, so an env step allocates nothing here.
        self.obs_dim = policy.obs_dim
        self.x0 = np.ones((num_envs, self.obs_dim + 1), np.float32)
        self.x0_in = self.x0[:, :-1]
        self.hidden = []
        x = self.x0
        for w, act in hidden:
            nxt = np.ones((num_envs, w.shape[1] + 1), np.float32)
            fn = np.tanh if act == "tanh" else _relu_
            self.hidden.append((x, w, np.empty((num_envs, w.shape[1]), np.float32), fn, nxt[:, :-1]))
            x = nxt
        self.x_last = x
        self.discrete = policy.discrete
        a = policy.act_dim
        self.a = a
        self.out = np.empty((num_steps, num_envs, a + 1), np.float32)
        if self.discrete:
            self.actions = np.empty((num_steps, num_envs), np.int64)
            # Gumbel noise beside the logits, -inf beside the value: argmax over a whole output row
            self.noise = np.full((num_steps, num_envs, a + 1), -np.inf, np.float32)
            self.noise[..., :a] = -np.log(policy.rng.standard_exponential((num_steps, num_envs, a), np.float32))
            self.scores = np.empty((num_envs, a + 1), np.float32)
        else:
            self.noise = policy.rng.standard_normal((num_steps, num_envs, a), np.float32)
            assert self.log_std is not None
            self.std = np.exp(self.log_std)
            self.actions_f = np.empty((num_steps, num_envs, a), np.float32)

    def __call__(self, obs: np.ndarray, t: int) -> np.ndarray:
        self.x0_in[...] = obs if obs.ndim == 2 else obs.reshape(len(obs), self.obs_dim)  # casts to float32
        dot = np.dot
        for x, w, h, act, nxt_in in self.hidden:
            dot(x, w, out=h)
            act(h, out=nxt_in)
        out = self.out[t]
        dot(self.x_last, self.last_w, out=out)
        if self.discrete:
            actions: np.ndarray = self.actions[t]
            np.add(out, self.noise[t], out=self.scores).argmax(1, out=actions)
            return actions
        self.actions_f[t] = out[:, : self.a] + self.std * self.noise[t]
        return self.actions_f[t]

    def columns(self) -> dict[str, np.ndarray]:
        values = self.out[..., self.a].copy()
        if self.discrete:
            logits = self.out[..., : self.a]
            chosen = np.take_along_axis(logits, self.actions[..., None], -1)
            logp = -np.log(np.exp(logits - chosen).sum(-1))  # log softmax of the chosen action, no overflow
            return {sb.ACTIONS: self.actions, sb.LOGP: logp.astype(np.float32), sb.VF_PREDS: values}
        assert self.log_std is not None
        logp = (-0.5 * self.noise**2 - self.log_std - 0.5 * _LOG_2PI).sum(-1)
        return {sb.ACTIONS: self.actions_f, sb.LOGP: logp.astype(np.float32), sb.VF_PREDS: values}


def _fused_net(weights: Mapping[str, np.ndarray], activation: str, *, discrete: bool) -> _NpNet:
    """The actor (``pi``) and critic (``vf``) MLPs of a state dict fused into one, outputs [actor's..., value].

    Each fused Linear is one matrix ``[W^T; b]`` applied to ``[x, 1]``: the acting loop keeps a column of
    ones after every layer's input, so one ``np.dot`` does both the product and the bias (per step one
    numpy call less per layer, ~0.7 us each at 8 envs). The matrices are allocated here in the layout
    :func:`_write_fused` fills (and refills in place on new weights); ``layers`` are views of them.
    """
    pi, vf = ([x for x in _np_layers(weights, prefix, activation) if not isinstance(x, str)] for prefix in ("pi", "vf"))
    if len(pi) != len(vf):
        raise ValueError(f"actor and critic differ in depth ({len(pi)} vs {len(vf)} Linears): cannot fuse them")
    augmented: list[tuple[np.ndarray, str | None]] = []
    layers: list[_NpLayer] = []
    for j, ((wa, _), (wb, _)) in enumerate(zip(pi, vf, strict=True)):
        rows = wa.shape[0] + (0 if j == 0 else wb.shape[0])  # the first layer's input is shared
        m = np.zeros((rows + 1, wa.shape[1] + wb.shape[1]), np.float32)
        fn = activation if j < len(pi) - 1 else None
        augmented.append((m, fn))
        layers.append((m[:-1], m[-1]))
        if fn is not None:
            layers.append(fn)
    net = _NpNet(layers, None if discrete else np.array(weights["log_std"], np.float32), augmented)
    _write_fused(net, weights)
    return net


def _same_layout(a: Mapping[str, np.ndarray], b: Mapping[str, np.ndarray]) -> bool:
    return a.keys() == b.keys() and all(np.shape(b[k]) == v.shape for k, v in a.items())


def _write_fused(net: _NpNet, weights: Mapping[str, np.ndarray]) -> None:
    """Write ``weights`` (a ``pi``/``vf`` state dict) into ``net``'s fused ``[W^T; b]`` matrices in place.

    The layout :func:`_fused_net` allocates: the first Linear puts the actor's and the critic's columns
    side by side on the shared input; later ones are block-diagonal; each bias is the matrix's last
    row. The zero blocks stay zero.
    """
    for j, (m, _) in enumerate(net.augmented):
        wa, wb = weights[f"pi.{2 * j}.weight"], weights[f"vf.{2 * j}.weight"]  # [out, in]
        ca, ra = wa.shape
        rb0 = 0 if j == 0 else ra  # the critic's input rows: shared on the first layer
        m[:ra, :ca] = wa.T
        m[rb0 : rb0 + wb.shape[1], ca:] = wb.T
        m[-1, :ca] = weights[f"pi.{2 * j}.bias"]
        m[-1, ca:] = weights[f"vf.{2 * j}.bias"]
    if net.log_std is not None:
        np.copyto(net.log_std, weights["log_std"])


def _np_forward(layers: list[_NpLayer], x: np.ndarray) -> np.ndarray:
    for layer in layers:
        if isinstance(layer, str):
            x = np.tanh(x) if layer == "tanh" else np.maximum(x, 0.0)
        else:
            x = x @ layer[0] + layer[1]
    return x


def _relu_(x: np.ndarray, *, out: np.ndarray) -> np.ndarray:
    return np.maximum(x, 0.0, out=out)


def next_values_from(batch: SampleBatch, bootstrap: np.ndarray) -> np.ndarray:
    """V(next obs) per row ``[T, N]``: the next row's VF_PREDS, and ``bootstrap[N]`` for the last row.

    In NEXT_STEP autoreset mode the row after an ended episode is an autoreset row whose OBS is the
    episode's final observation, so its VF_PREDS is exactly the value a truncated episode bootstraps on.
    """
    values = batch[sb.VF_PREDS]
    return np.concatenate([values[1:], bootstrap[None].astype(values.dtype)], axis=0)
