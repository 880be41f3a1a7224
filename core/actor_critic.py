"""The actor-critic policy of ppo/a2c/a3c/impala: torch learns, numpy acts (MLPs) or torch acts (conv models).

:class:`ActorCriticPolicy` has separate actor and critic networks (:func:`crossrl.core.models.build_net`:
the spec's MLP, after its conv stack when it has one), categorical actions for ``Discrete`` spaces and a
diagonal Gaussian for ``Box``; each algorithm module subclasses it and supplies only
:meth:`~crossrl.core.policy.Policy.loss`. An MLP policy acts through the numpy nets of
:mod:`crossrl.core.numpy_net` (the actor per step, the critic once per fragment); torch is imported only where
the policy learns or computes gradients (the driver, A3C workers): a sampling-only evaluator actor keeps its weights as numpy and never
imports torch (RSS per evaluator actor: ``crossrl bench overhead``). A conv policy acts through its
torch modules (:class:`ConvFragmentActor`: the actor's batched forward pass per step on the uint8 frames as the
envs give them; the critic's values for the whole fragment afterwards, in batches).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np

from crossrl.core import maths
from crossrl.core import sample_batch as sb
from crossrl.core.numpy_net import (
    LOG_2PI,
    ActorCriticNet,
    NumpyFragmentActor,
    actor_critic_net,
    augmented_forward,
    same_layout,
    write_actor_critic,
)
from crossrl.core.policy import FragmentActor, Policy, StepwiseActor
from crossrl.core.sample_batch import SampleBatch
from crossrl.scenarios import metrics as M
from crossrl.scenarios.spec import ModelSpec

if TYPE_CHECKING:
    import torch
    from torch import nn

# Frames per forward pass of the critic when a conv policy computes a fragment's values after sampling it. Per frame,
# MinAtar's net cost ~14 us in passes of 8 frames (one env step of 8 envs) and ~5-7 us in passes of 128 or more;
# the Nature CNN ~250 us at 8 and ~155-175 us at 32-256 (one torch thread, 2026-11-24).
VALUE_CHUNK = 128


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
        self.obs_shape = tuple(int(n) for n in observation_space.shape)
        self.obs_dim = int(np.prod(self.obs_shape))
        self.conv = bool(model.conv)  # a conv model acts through torch (numpy_net runs MLPs only)
        self.discrete = isinstance(action_space, gym.spaces.Discrete)
        # MultiDiscrete actions: a factored categorical head, one categorical per dimension over its logits' slice
        # (the dimensions' sizes in order), log-probabilities and entropies summed over the dimensions.
        self.nvec: tuple[int, ...] | None = None
        if self.discrete:
            assert isinstance(action_space, gym.spaces.Discrete)
            act_dim = int(action_space.n)
        elif isinstance(action_space, gym.spaces.MultiDiscrete):
            if action_space.nvec.ndim != 1:
                raise TypeError(f"ActorCriticPolicy takes one-dimensional MultiDiscrete actions, got {action_space}")
            self.nvec = tuple(int(n) for n in action_space.nvec)
            act_dim = sum(self.nvec)
        elif isinstance(action_space, gym.spaces.Box):
            act_dim = int(np.prod(action_space.shape))
        else:
            raise TypeError(f"ActorCriticPolicy supports Discrete, MultiDiscrete and Box actions, got {action_space}")
        self.act_dim = act_dim
        # Weights live in the torch modules once built (self._torch), in _np_weights before that.
        self._torch: tuple[nn.ModuleDict, list[nn.Parameter], torch.optim.Optimizer] | None = None
        self._np_weights: dict[str, np.ndarray] | None = None
        self._np_cache: ActorCriticNet | None = None
        self._weight_views: dict[str, np.ndarray] | None = None  # get_weights' views of the torch parameters

    # -- torch, built on first use -------------------------------------------------------------------
    def _build_torch(self) -> tuple[nn.ModuleDict, list[nn.Parameter], torch.optim.Optimizer]:
        if self._torch is None:
            import torch
            from torch import nn

            from crossrl.core.models import build_net

            torch.manual_seed(self.seed)
            shape, spec = self.obs_shape, self.model_spec
            net = nn.ModuleDict(
                {
                    "pi": build_net(obs_shape=shape, out_dim=self.act_dim, model=spec, out_gain=0.01),
                    "vf": build_net(obs_shape=shape, out_dim=1, model=spec, out_gain=1.0),
                }
            )
            if self.gaussian:
                net.register_parameter("log_std", nn.Parameter(torch.zeros(self.act_dim)))
            if self._np_weights is not None:
                net.load_state_dict({k: torch.as_tensor(v) for k, v in self._np_weights.items()})
                self._np_weights = None
            params = list(net.parameters())
            optimizer = torch.optim.Adam(params, lr=float(self.hp["lr"]), eps=float(self.hp["adam_eps"]))
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

    def learning_rate(self) -> float:
        return float(self.hp["lr"])

    # -- acting ------------------------------------------------------------------------------------
    @property
    def gaussian(self) -> bool:
        """Box actions: a diagonal Gaussian head (a state-independent log std per action dimension)."""
        return not self.discrete and self.nvec is None

    def _multi_actions(self, logits: np.ndarray, *, explore: bool) -> tuple[np.ndarray, np.ndarray]:
        """MultiDiscrete: (actions [B, D], their log-probability [B]), one categorical per dimension."""
        assert self.nvec is not None
        actions = np.empty((len(logits), len(self.nvec)), np.int64)
        logp = np.zeros(len(logits), np.float64)
        start = 0
        for d, n in enumerate(self.nvec):
            part = logits[:, start : start + n]
            start += n
            if explore:
                actions[:, d] = np.argmax(part - np.log(self.rng.standard_exponential(part.shape, np.float32)), axis=1)
            else:
                actions[:, d] = np.argmax(part, axis=1)
            chosen = part[np.arange(len(part)), actions[:, d]]
            logp -= np.log(np.exp(part - chosen[:, None]).sum(axis=1))
        return actions, logp

    def compute_actions(self, obs: np.ndarray, *, explore: bool = True) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        out, log_std = self._outputs(obs)
        values = out[:, -1]
        if self.nvec is not None:
            actions, logp = self._multi_actions(out[:, :-1], explore=explore)
        elif self.discrete:
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
            logp = (-0.5 * noise**2 - log_std - 0.5 * LOG_2PI).sum(axis=1)
        return actions, {sb.LOGP: logp.astype(np.float32), sb.VF_PREDS: values.astype(np.float32)}

    def fragment_actor(self, *, num_steps: int, num_envs: int) -> FragmentActor:
        if self.nvec is not None:  # MultiDiscrete: compute_actions per step (the fast actors take one categorical)
            return StepwiseActor(self, num_steps)
        if self.conv:
            return ConvFragmentActor(self, num_steps=num_steps, num_envs=num_envs)
        return NumpyFragmentActor(
            self._numpy_net(),
            obs_dim=self.obs_dim,
            act_dim=self.act_dim,
            discrete=self.discrete,
            rng=self.rng,
            num_steps=num_steps,
            num_envs=num_envs,
        )

    def value(self, obs: np.ndarray) -> np.ndarray:
        """V(obs) for ``obs[B, ...]`` -> ``[B]`` (float32)."""
        if self.conv:
            return self.conv_values(obs)
        x = np.asarray(obs, np.float32).reshape(len(obs), self.obs_dim)
        return augmented_forward(self._numpy_net().vf, x)[:, 0].copy()

    def _outputs(self, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """(the actor's outputs and the value side by side ``[B, act_dim + 1]``, log std or None) for ``obs``."""
        if not self.conv:
            net = self._numpy_net()
            x = np.asarray(obs, np.float32).reshape(len(obs), self.obs_dim)
            return np.concatenate([augmented_forward(net.pi, x), augmented_forward(net.vf, x)], axis=1), net.log_std
        import torch

        with torch.no_grad():
            frames = self._frames(obs)
            out = torch.cat([self.net["pi"](frames), self.net["vf"](frames)], dim=1).numpy()
            log_std = self.net.get_parameter("log_std").numpy().copy() if self.gaussian else None
        return out, log_std

    def conv_values(self, obs: np.ndarray) -> np.ndarray:
        """A conv critic's V(obs) for frames of any leading shape (``[T, N, H, W, C]``, ``[B, H, W, C]``) -> that
        leading shape (float32): passes of :data:`VALUE_CHUNK` frames, the frames as they are (no copy)."""
        import torch

        from crossrl.core.models import inference_forward

        lead = obs.shape[: obs.ndim - len(self.obs_shape)]
        frames = np.ascontiguousarray(obs).reshape(-1, *self.obs_shape)
        out = np.empty(len(frames), np.float32)
        vf = inference_forward(self.net["vf"])
        with torch.inference_mode():
            for i in range(0, len(frames), VALUE_CHUNK):
                out[i : i + VALUE_CHUNK] = vf(torch.from_numpy(frames[i : i + VALUE_CHUNK]))[:, 0].numpy()
        return out.reshape(lead)

    def _frames(self, obs: np.ndarray) -> torch.Tensor:
        """Observations ``[B, ...]`` as a tensor ``[B, H, W, C]`` in their own dtype (uint8 frames stay uint8)."""
        import torch

        return torch.as_tensor(np.asarray(obs)).reshape(len(obs), *self.obs_shape)

    def _numpy_net(self) -> ActorCriticNet:
        """The actor and critic as numpy MLPs, refreshed in place on new weights, rebuilt after a learning step.

        For the small batches a sampler feeds (one row per env) a numpy matmul costs far less than a torch
        module call (dispatch overhead).
        """
        if self._np_cache is None:
            self._np_cache = actor_critic_net(
                self.get_weights(), self.model_spec.activation, discrete=not self.gaussian
            )
        return self._np_cache

    # -- postprocessing ------------------------------------------------------------------------------
    def postprocess_trajectory(self, batch: SampleBatch) -> SampleBatch:
        """Adds ADVANTAGES and VALUE_TARGETS (GAE) to a time-major batch, bootstrapping where episodes were cut.

        A conv policy's fragment comes without VF_PREDS (:class:`ConvFragmentActor`): the critic's values of its
        observations are computed here first, in batches, whatever the loss.
        """
        if self.conv and sb.VF_PREDS not in batch:
            batch[sb.VF_PREDS] = self.conv_values(batch[sb.OBS])
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
        x = self.net_input(obs)
        out = self.net["pi"](x)
        values = self.net["vf"](x)[:, 0]
        if self.nvec is not None:
            a = actions.reshape(-1, len(self.nvec)).long()
            logp = torch.zeros(len(out), dtype=out.dtype, device=out.device)
            entropy = torch.zeros_like(logp)
            for d, part in enumerate(torch.split(out, list(self.nvec), dim=-1)):
                logp_all = torch.log_softmax(part, dim=-1)
                logp = logp + logp_all.gather(1, a[:, d : d + 1])[:, 0]
                entropy = entropy - (logp_all.exp() * logp_all).sum(-1)
        elif self.discrete:
            logp_all = torch.log_softmax(out, dim=-1)
            a = actions.reshape(-1).long()
            logp = logp_all.gather(1, a[:, None])[:, 0]
            entropy = -(logp_all.exp() * logp_all).sum(-1)
        else:
            log_std = self.net.get_parameter("log_std").expand_as(out)
            a = actions.reshape(-1, self.act_dim)
            z = (a - out) / log_std.exp()
            logp = (-0.5 * z**2 - log_std - 0.5 * LOG_2PI).sum(-1)
            entropy = (log_std + 0.5 * (1.0 + LOG_2PI)).sum(-1)
        return logp.reshape(lead), entropy.reshape(lead), values.reshape(lead)

    def net_input(self, obs: torch.Tensor) -> torch.Tensor:
        """Observations of any leading shape as the networks take them: float rows (MLP) or frames ``[B, H, W, C]``
        in their own dtype (conv; the model scales uint8 itself)."""
        return obs.reshape(-1, *self.obs_shape) if self.conv else obs.reshape(-1, self.obs_dim).float()

    # -- learning -----------------------------------------------------------------------------------
    def to_tensors(self, batch: SampleBatch) -> dict[str, torch.Tensor]:
        import torch

        return {k: torch.as_tensor(v) for k, v in batch.items()}

    def learn_on_batch(self, batch: SampleBatch) -> dict[str, float]:
        """``epochs`` passes of shuffled minibatches of ``minibatch`` env steps (time-major losses: whole batch)."""
        epochs = int(self.hp["epochs"])
        if not self.use_gae:
            stats = [self._sgd_step(self.to_tensors(batch)) for _ in range(epochs)]
            return maths.mean_stats(stats)
        flat = batch.flatten()
        size = int(self.hp["minibatch"] or flat.num_env_steps())  # None: the whole batch
        stats = []
        for _ in range(epochs):
            for mb in flat.minibatches(size=size, rng=self.rng):
                stats.append(self._sgd_step(self.to_tensors(mb)))
        return maths.mean_stats(stats)

    def _sgd_step(self, tensors: dict[str, torch.Tensor]) -> dict[str, float]:
        loss, stats = self.loss(tensors)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        stats[M.DIAG_GRAD_NORM] = self._clip()
        self.optimizer.step()
        self._np_cache = None
        return stats

    def _clip(self) -> float:
        """Clip the gradients to ``grad_clip`` (global norm); returns the norm before clipping."""
        from torch import nn

        return float(nn.utils.clip_grad_norm_(self.params, float(self.hp["grad_clip"])))

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
        if self._weight_views is None:
            # numpy views of the parameters' own storage (the optimizer and load_state_dict write it in place): a
            # copy of each per call instead of walking the modules' state_dict (~34 -> ~2 us, on the driver between
            # every learning step and the next broadcast)
            self._weight_views = {k: v.detach().numpy() for k, v in self.net.state_dict().items()}
        return {k: v.copy() for k, v in self._weight_views.items()}

    def set_weights(self, weights: Mapping[str, np.ndarray]) -> None:
        if self._torch is None:  # a sampling-only copy: keep numpy, never import torch
            old = self._np_weights
            if old is not None and self._np_cache is not None and same_layout(old, weights):
                # New values for the same arrays, the numpy nets refreshed in place: an evaluator gets new
                # weights every iteration, and rebuilding the numpy nets (~50 numpy calls and fresh
                # arrays) cost ~1.6 ms per fragment at 16 latency workers on 2 cores, ~25 us per step.
                for k, v in weights.items():
                    np.copyto(old[k], v)
                write_actor_critic(self._np_cache, old)
                return
            self._np_weights = {k: np.array(v, np.float32) for k, v in weights.items()}
        else:
            import torch

            self.net.load_state_dict({k: torch.as_tensor(np.asarray(v)) for k, v in weights.items()})
        self._np_cache = None


class ConvFragmentActor:
    """One fragment of acting through a conv policy's torch actor (a :class:`~crossrl.core.policy.FragmentActor`).

    Per step, one batched forward pass of the actor (``pi``, through :func:`~crossrl.core.models.inference_forward`)
    over the envs' observations as they come (``torch.from_numpy``: uint8 frames, no copy, no float copy; one torch
    thread in an evaluator actor) under ``torch.inference_mode``, its logits written into the fragment's buffer, and
    the action sampled from them.
    Exploration noise for the whole fragment is drawn in one call, as
    :class:`~crossrl.core.numpy_net.NumpyFragmentActor` does: the same numbers, in the same order, as
    :meth:`ActorCriticPolicy.compute_actions` draws step by step, so the same actions for the same seed. Log-probabilities come after the loop, for the whole fragment; the critic's
    values too, in :meth:`ActorCriticPolicy.postprocess_trajectory` (batched passes over the fragment's observations,
    which the evaluator keeps anyway: the weights do not change within a fragment, so they are the values a
    per-step pass gives, at 35-70 % of the cost per frame).
    """

    def __init__(self, policy: ActorCriticPolicy, *, num_steps: int, num_envs: int) -> None:
        import torch

        from crossrl.core.models import inference_forward

        self.inference_mode, self.from_numpy = torch.inference_mode, torch.from_numpy
        net = policy.net
        self.pi = inference_forward(net["pi"])
        self.obs_shape = (num_envs, *policy.obs_shape)
        self.discrete = policy.discrete
        a = policy.act_dim
        self.out = np.empty((num_steps, num_envs, a), np.float32)  # the actor's outputs: logits or means
        rng = policy.rng
        if self.discrete:
            self.actions = np.empty((num_steps, num_envs), np.int64)
            self.gumbel = -np.log(rng.standard_exponential((num_steps, num_envs, a), np.float32))
            self.scores = np.empty((num_envs, a), np.float32)
            self.log_std: np.ndarray | None = None
        else:
            self.noise = rng.standard_normal((num_steps, num_envs, a), np.float32)
            self.log_std = net.get_parameter("log_std").detach().numpy().copy()
            self.std = np.exp(self.log_std)
            self.actions_f = np.empty((num_steps, num_envs, a), np.float32)

    def __call__(self, obs: np.ndarray, t: int) -> np.ndarray:
        if obs.shape != self.obs_shape:
            obs = obs.reshape(self.obs_shape)
        with self.inference_mode():
            y = self.pi(self.from_numpy(obs)).numpy()
        self.out[t] = y
        if self.discrete:
            actions: np.ndarray = self.actions[t]
            np.add(y, self.gumbel[t], out=self.scores).argmax(1, out=actions)
            return actions
        self.actions_f[t] = y + self.std * self.noise[t]
        return self.actions_f[t]

    def columns(self) -> dict[str, np.ndarray]:
        if self.discrete:
            chosen = np.take_along_axis(self.out, self.actions[..., None], -1)
            logp = -np.log(np.exp(self.out - chosen).sum(-1))  # log softmax of the chosen action, no overflow
            return {sb.ACTIONS: self.actions, sb.LOGP: logp.astype(np.float32)}
        assert self.log_std is not None
        logp = (-0.5 * self.noise**2 - self.log_std - 0.5 * LOG_2PI).sum(-1)
        return {sb.ACTIONS: self.actions_f, sb.LOGP: logp.astype(np.float32)}


def next_values_from(batch: SampleBatch, bootstrap: np.ndarray) -> np.ndarray:
    """V(next obs) per row ``[T, N]``: the next row's VF_PREDS, and ``bootstrap[N]`` for the last row.

    In NEXT_STEP autoreset mode the row after an ended episode is an autoreset row whose OBS is the
    episode's final observation, so its VF_PREDS is exactly the value a truncated episode bootstraps on.
    """
    values = batch[sb.VF_PREDS]
    return np.concatenate([values[1:], bootstrap[None].astype(values.dtype)], axis=0)
