"""The numpy acting path: torch-built MLPs run from their state dicts in numpy, without torch.

:func:`np_layers` reads a :func:`~crossrl.core.models.build_mlp` MLP out of a state dict and
:func:`np_forward` runs it (QPolicy's Q-values, the actor-critic's values). :func:`fused_net` fuses an
actor (``pi``) and a critic (``vf``) into one MLP, a :class:`FusedNet`, which :func:`write_fused`
refreshes in place on new weights. :class:`FusedFragmentActor` samples a whole fragment through it: per
env step one forward pass and one argmax (Gumbel-max for categorical actions) on noise drawn once per
fragment, the log-probabilities computed for the whole fragment afterwards.

Nothing here imports torch, so a sampling-only actor-critic evaluator never does.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import NamedTuple

import numpy as np

from crossrl.core import sample_batch as sb

LOG_2PI = math.log(2.0 * math.pi)

# One layer of a numpy MLP: (W^T [in, out], b [out]) for a Linear, or the activation's name.
NpLayer = tuple[np.ndarray, np.ndarray] | str


class FusedNet(NamedTuple):
    """The fused actor-critic as numpy arrays, rebuilt after a learning step, refreshed in place by set_weights."""

    layers: list[NpLayer]  # (W^T, b) Linears and activation names, outputs [actor's..., value]
    log_std: np.ndarray | None  # Gaussian policies' state-independent log std
    augmented: list[tuple[np.ndarray, str | None]]  # per Linear: [W^T; b] [in + 1, out], the activation after it


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


def fused_net(weights: Mapping[str, np.ndarray], activation: str, *, discrete: bool) -> FusedNet:
    """The actor (``pi``) and critic (``vf``) MLPs of a state dict fused into one, outputs [actor's..., value].

    Each fused Linear is one matrix ``[W^T; b]`` applied to ``[x, 1]``: the acting loop keeps a column of
    ones after every layer's input, so one ``np.dot`` does both the product and the bias (per step one
    numpy call less per layer). The matrices are allocated here in the layout
    :func:`write_fused` fills (and refills in place on new weights); ``layers`` are views of them.
    """
    pi, vf = ([x for x in np_layers(weights, prefix, activation) if not isinstance(x, str)] for prefix in ("pi", "vf"))
    if len(pi) != len(vf):
        raise ValueError(f"actor and critic differ in depth ({len(pi)} vs {len(vf)} Linears): cannot fuse them")
    augmented: list[tuple[np.ndarray, str | None]] = []
    layers: list[NpLayer] = []
    for j, ((wa, _), (wb, _)) in enumerate(zip(pi, vf, strict=True)):
        rows = wa.shape[0] + (0 if j == 0 else wb.shape[0])  # the first layer's input is shared
        m = np.zeros((rows + 1, wa.shape[1] + wb.shape[1]), np.float32)
        fn = activation if j < len(pi) - 1 else None
        augmented.append((m, fn))
        layers.append((m[:-1], m[-1]))
        if fn is not None:
            layers.append(fn)
    net = FusedNet(layers, None if discrete else np.array(weights["log_std"], np.float32), augmented)
    write_fused(net, weights)
    return net


def same_layout(a: Mapping[str, np.ndarray], b: Mapping[str, np.ndarray]) -> bool:
    return a.keys() == b.keys() and all(np.shape(b[k]) == v.shape for k, v in a.items())


def write_fused(net: FusedNet, weights: Mapping[str, np.ndarray]) -> None:
    """Write ``weights`` (a ``pi``/``vf`` state dict) into ``net``'s fused ``[W^T; b]`` matrices in place.

    The layout :func:`fused_net` allocates: the first Linear puts the actor's and the critic's columns
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


class FusedFragmentActor:
    """One fragment of acting through a :class:`FusedNet`: per step a forward pass and the sampled action;
    extras (LOGP, VF_PREDS) afterwards. A :class:`~crossrl.core.policy.FragmentActor`.

    Exploration noise for the whole fragment is drawn in one call (Gumbel noise for categorical
    actions, standard normal for Gaussian ones): the same distribution as drawing it step by step.
    """

    def __init__(
        self,
        net: FusedNet,
        *,
        obs_dim: int,
        act_dim: int,
        discrete: bool,
        rng: np.random.Generator,
        num_steps: int,
        num_envs: int,
    ) -> None:
        self.log_std = net.log_std
        *hidden, (self.last_w, _) = net.augmented
        # Every layer's input lives in a buffer whose last column is ones (the bias row of [W^T; b]); each
        # numpy call writes in place, so an env step allocates nothing here.
        self.obs_dim = obs_dim
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
        self.discrete = discrete
        a = act_dim
        self.a = a
        self.out = np.empty((num_steps, num_envs, a + 1), np.float32)
        if self.discrete:
            self.actions = np.empty((num_steps, num_envs), np.int64)
            # Gumbel noise beside the logits, -inf beside the value: argmax over a whole output row
            self.noise = np.full((num_steps, num_envs, a + 1), -np.inf, np.float32)
            self.noise[..., :a] = -np.log(rng.standard_exponential((num_steps, num_envs, a), np.float32))
            self.scores = np.empty((num_envs, a + 1), np.float32)
        else:
            self.noise = rng.standard_normal((num_steps, num_envs, a), np.float32)
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
        logp = (-0.5 * self.noise**2 - self.log_std - 0.5 * LOG_2PI).sum(-1)
        return {sb.ACTIONS: self.actions_f, sb.LOGP: logp.astype(np.float32), sb.VF_PREDS: values}


def _relu_(x: np.ndarray, *, out: np.ndarray) -> np.ndarray:
    return np.maximum(x, 0.0, out=out)
