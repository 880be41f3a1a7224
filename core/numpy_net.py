"""The numpy acting path: torch-built MLPs run from their state dicts in numpy, without torch.

:func:`np_layers` reads a :func:`~crossrl.core.models.build_mlp` MLP out of a state dict and
:func:`np_forward` runs it (QPolicy's Q-values). :func:`actor_critic_net` reads an actor (``pi``) and a critic
(``vf``) into an :class:`ActorCriticNet`, which :func:`write_actor_critic` refreshes in place on new weights.
:class:`NumpyFragmentActor` samples a whole fragment through it: per env step one forward pass of the actor
and one argmax (Gumbel-max for categorical actions) on noise drawn once per fragment; the log-probabilities
and the critic's values are computed for the whole fragment afterwards.

Nothing here imports torch, so a sampling-only actor-critic evaluator never does.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import NamedTuple

import numpy as np

from crossrl.core import sample_batch as sb

LOG_2PI = math.log(2.0 * math.pi)

# One layer of a numpy MLP: (W^T [in, out], b [out]) for a Linear, or the activation's name.
NpLayer = tuple[np.ndarray, np.ndarray] | str


def np_layers(weights: Mapping[str, np.ndarray], prefix: str, activation: str) -> list[NpLayer]:
    """A :func:`~crossrl.core.models.build_mlp` MLP from its state dict (``prefix.<i>.weight``, Linear at even i)."""
    if activation not in ("tanh", "relu"):
        raise TypeError(f"numpy inference does not know the activation {activation!r}")
    layers: list[NpLayer] = []
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


def np_forward(layers: list[NpLayer], x: np.ndarray) -> np.ndarray:
    for layer in layers:
        if isinstance(layer, str):
            x = np.tanh(x) if layer == "tanh" else np.maximum(x, 0.0)
        else:
            x = x @ layer[0] + layer[1]
    return x


# One Linear of an :class:`ActorCriticNet`: [W^T; b] [in + 1, out] and the activation after it (None after the last).
AugLayer = tuple[np.ndarray, str | None]


class ActorCriticNet(NamedTuple):
    """The actor (``pi``) and the critic (``vf``) as numpy MLPs, rebuilt after a learning step, refreshed in place by
    set_weights. Each Linear is one matrix ``[W^T; b]`` ``[in + 1, out]`` with the activation after it (None after the
    last): applied to ``[x, 1]``, one ``np.dot`` does both the product and the bias."""

    pi: list[AugLayer]
    vf: list[AugLayer]
    log_std: np.ndarray | None  # Gaussian policies' state-independent log std


def actor_critic_net(weights: Mapping[str, np.ndarray], activation: str, *, discrete: bool) -> ActorCriticNet:
    """The actor and critic MLPs of a state dict (``pi.<i>``, ``vf.<i>``) as an :class:`ActorCriticNet`.

    The two stay separate: a block-diagonal fusion into one MLP (one call per layer for both) cost more than
    the two calls it replaced, the zero blocks being half of its products (docs/performance.md), and the
    critic is not needed per step (:class:`NumpyFragmentActor` runs it once per fragment).
    """
    layouts = {prefix: _augmented(weights, prefix, activation) for prefix in ("pi", "vf")}
    net = ActorCriticNet(layouts["pi"], layouts["vf"], None if discrete else np.array(weights["log_std"], np.float32))
    write_actor_critic(net, weights)
    return net


def _augmented(weights: Mapping[str, np.ndarray], prefix: str, activation: str) -> list[AugLayer]:
    linears = [x for x in np_layers(weights, prefix, activation) if not isinstance(x, str)]
    return [
        (np.zeros((w.shape[0] + 1, w.shape[1]), np.float32), activation if j < len(linears) - 1 else None)
        for j, (w, _) in enumerate(linears)
    ]


def same_layout(a: Mapping[str, np.ndarray], b: Mapping[str, np.ndarray]) -> bool:
    return a.keys() == b.keys() and all(np.shape(b[k]) == v.shape for k, v in a.items())


def write_actor_critic(net: ActorCriticNet, weights: Mapping[str, np.ndarray]) -> None:
    """Write ``weights`` (a ``pi``/``vf`` state dict) into ``net``'s ``[W^T; b]`` matrices in place."""
    for prefix, layers in (("pi", net.pi), ("vf", net.vf)):
        for j, (m, _) in enumerate(layers):
            m[:-1] = weights[f"{prefix}.{2 * j}.weight"].T
            m[-1] = weights[f"{prefix}.{2 * j}.bias"]
    if net.log_std is not None:
        np.copyto(net.log_std, weights["log_std"])


def augmented_forward(layers: list[AugLayer], x: np.ndarray, *, ones_column: bool = False) -> np.ndarray:
    """An :class:`ActorCriticNet` MLP on a batch ``x [B, in]`` (``[B, in + 1]`` ending in ones if ``ones_column``)."""
    for j, (m, fn) in enumerate(layers):
        if j == 0 and ones_column:
            x = np.dot(x, m)
        else:
            x = np.dot(x, m[:-1])
            x += m[-1]
        if fn is not None:
            _ACTIVATIONS[fn](x, out=x)
    return x


class NumpyFragmentActor:
    """One fragment of acting through an :class:`ActorCriticNet` (a :class:`~crossrl.core.policy.FragmentActor`): per
    env step one forward pass of the actor and the sampled action; after the loop the log-probabilities and the
    critic's values, for the whole fragment at once.

    Exploration noise for the whole fragment is drawn in one call (Gumbel noise for categorical actions, standard
    normal for Gaussian ones): the same distribution as drawing it step by step. The per-step pass runs feature-major
    (activations ``[units + 1, envs]``, the last row ones, the bias row of ``[W^T; b]``): each ``np.dot`` writes
    straight into the next layer's input and each activation runs in place on contiguous rows (8 CartPole envs: 3.7
    against 4.3 us per step env-major, where the activations were written into a column-strided view;
    docs/performance.md). The observations go into a fragment-long input buffer; the critic runs over it after
    the loop, batched (the weights do not change within a fragment, so these are the values a per-step pass gives,
    for a fraction of the CPU).
    """

    def __init__(
        self,
        net: ActorCriticNet,
        *,
        obs_dim: int,
        act_dim: int,
        discrete: bool,
        rng: np.random.Generator,
        num_steps: int,
        num_envs: int,
    ) -> None:
        self.log_std = net.log_std
        self.vf = net.vf
        *hidden, (last, _) = net.pi
        self.obs_dim = obs_dim
        self.x0 = np.ones((num_steps, obs_dim + 1, num_envs), np.float32)  # each step's input, feature-major
        # (W [out, in + 1], its activation, the next layer's input [out + 1, envs], its first ``out`` rows)
        self.hidden = []
        for m, fn in hidden:
            assert fn is not None  # every Linear but the last has its activation
            nxt = np.ones((m.shape[1] + 1, num_envs), np.float32)
            self.hidden.append((np.ascontiguousarray(m.T), _ACTIVATIONS[fn], nxt, nxt[:-1]))
        self.last_w = np.ascontiguousarray(last.T)
        self.discrete = discrete
        a = act_dim
        self.out = np.empty((num_steps, a, num_envs), np.float32)  # the actor's outputs: logits or means
        if self.discrete:
            self.actions = np.empty((num_steps, num_envs), np.int64)
            gumbel = -np.log(rng.standard_exponential((num_steps, num_envs, a), np.float32))
            self.noise = np.ascontiguousarray(gumbel.transpose(0, 2, 1))  # [T, a, N], the same numbers
            self.scores = np.empty((a, num_envs), np.float32)
        else:
            self.gauss = rng.standard_normal((num_steps, num_envs, a), np.float32)  # [T, N, a]
            assert self.log_std is not None
            self.std = np.exp(self.log_std)[:, None]
            self.actions_f = np.empty((num_steps, num_envs, a), np.float32)
        self.steps = 0  # steps acted so far: the critic runs over these rows
        self.filled = False  # True: the caller writes each step's observations into obs_rows() itself

    def obs_rows(self, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray | None:
        """The fragment's input rows as an observation buffer ``[T, N, obs_dim]`` (a view) for the caller to fill,
        row ``t`` before step ``t`` (then this actor does not copy them again), or None when observations of
        ``dtype`` and ``shape`` (one step of every env) do not fit it as they are (not float32, not flat)."""
        if np.dtype(dtype) != np.float32 or tuple(shape) != (self.x0.shape[2], self.obs_dim):
            return None
        self.filled = True
        return self.x0[:, :-1, :].transpose(0, 2, 1)

    def __call__(self, obs: np.ndarray, t: int) -> np.ndarray:
        x = self.x0[t]
        if not self.filled:
            x[:-1] = (obs if obs.ndim == 2 else obs.reshape(len(obs), self.obs_dim)).T  # casts to float32
        dot = np.dot
        for w, act, nxt, nxt_out in self.hidden:
            dot(w, x, out=nxt_out)
            act(nxt_out, out=nxt_out)
            x = nxt
        out = self.out[t]
        dot(self.last_w, x, out=out)
        self.steps = t + 1
        if self.discrete:
            actions: np.ndarray = self.actions[t]
            np.add(out, self.noise[t], out=self.scores).argmax(0, out=actions)
            return actions
        self.actions_f[t] = (out + self.std * self.gauss[t].T).T
        return self.actions_f[t]

    def columns(self) -> dict[str, np.ndarray]:
        t, n = self.steps, self.x0.shape[2]
        rows = self.x0[:t].transpose(0, 2, 1).reshape(t * n, -1)  # [T * N, obs_dim + 1], env-major (a copy)
        values = augmented_forward(self.vf, rows, ones_column=True)[:, 0].reshape(t, n)
        if self.discrete:
            logits, actions = self.out[:t].transpose(0, 2, 1), self.actions[:t]
            chosen = np.take_along_axis(logits, actions[..., None], -1)
            logp = -np.log(np.exp(logits - chosen).sum(-1))  # log softmax of the chosen action, no overflow
            return {sb.ACTIONS: actions, sb.LOGP: logp.astype(np.float32), sb.VF_PREDS: values}
        assert self.log_std is not None
        logp = (-0.5 * self.gauss[:t] ** 2 - self.log_std - 0.5 * LOG_2PI).sum(-1)
        return {sb.ACTIONS: self.actions_f[:t], sb.LOGP: logp.astype(np.float32), sb.VF_PREDS: values}


def _relu_(x: np.ndarray, *, out: np.ndarray) -> np.ndarray:
    return np.maximum(x, 0.0, out=out)


_ACTIVATIONS: dict[str, Callable[..., np.ndarray]] = {"tanh": np.tanh, "relu": _relu_}
