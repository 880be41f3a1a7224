"""Policy evaluators (RLlib paper, section 4): an env copy plus a policy copy, local or as a Ray actor.

:class:`PolicyEvaluator` owns a gymnasium vector env of ``num_envs`` copies and a policy; ``sample``
steps all copies ``num_steps`` times and returns a postprocessed time-major :class:`SampleBatch`.
:class:`EvaluatorSet` holds one local evaluator (the driver's policy copy, which learns) and the remote
actors; it broadcasts weights with one ``ray.put`` per broadcast and replaces actors that died.
"""

from __future__ import annotations

import logging
import os
import pickle
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import gymnasium as gym
import numpy as np
import ray
from ray.actor import ActorHandle
from ray.exceptions import RayActorError

from crossrl.core import sample_batch as sb
from crossrl.core import transport as tx
from crossrl.core.envs import make_vector_env
from crossrl.core.policy import Policy, PolicyFactory
from crossrl.core.sample_batch import SampleBatch
from crossrl.scenarios.spec import EnvSpec

log = logging.getLogger(__name__)
T = TypeVar("T")

# Test-only: a slowdown planted in the sampling loop, to measure the A/B gate's power (docs/performance.md,
# "The A/B gate's power"). ``sample`` then burns this fraction of its own CPU time on top. 0: off.
PLANTED_SLOWDOWN_ENV = "CROSSRL_PLANTED_SLOWDOWN"
_PLANTED_SLOWDOWN = float(os.environ.get(PLANTED_SLOWDOWN_ENV) or 0.0)


def _burn_cpu(seconds: float) -> None:
    """Spin until this thread has used ``seconds`` more CPU time (busy work that waiting cannot hide)."""
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


class PolicyEvaluator:
    """Env + policy. ``worker_index`` 0 is the driver's local copy; remote actors are 1..n."""

    def __init__(
        self,
        *,
        env_spec: EnvSpec,
        num_envs: int,
        policy_factory: PolicyFactory,
        seed: int,
        worker_index: int,
    ) -> None:
        single_thread(worker_index)
        self.worker_index = worker_index
        self.num_envs = num_envs
        self.env = make_vector_env(env_spec, num_envs)
        self.policy: Policy = policy_factory(
            observation_space=self.env.single_observation_space,
            action_space=self.env.single_action_space,
            seed=seed,
        )
        act_space = self.env.single_action_space
        self._clip = (act_space.low, act_space.high) if isinstance(act_space, gym.spaces.Box) else None
        self._reward_clip = env_spec.resolved_reward_clip  # learn on sign(reward); episode returns stay raw
        obs, _ = self.env.reset(seed=seed)
        self._obs = np.asarray(obs)
        self._autoreset = np.zeros(num_envs, bool)  # True: the env's next step is a reset, not a transition
        self._ep_return = np.zeros(num_envs)
        self._ep_len = np.zeros(num_envs, np.int64)
        # -1: its own initial weights. Every version an optimizer sends (0 included) is then set.
        self.weights_version = -1

    def sample(
        self,
        num_steps: int,
        weights: dict[str, np.ndarray] | bytes | None = None,
        version: int | None = None,
        epsilon: float | None = None,
    ) -> SampleBatch:
        """Step every env ``num_steps`` times (so ``num_steps x num_envs`` rows) with the current weights.

        ``weights`` (with their ``version``) are set first unless this evaluator already has that
        version: an optimizer sends new weights with the sample request, one actor call per iteration.
        They may come packed (:func:`pack_weights`).
        ``epsilon`` likewise sets an epsilon-greedy policy's exploration first.
        Returns the policy-postprocessed time-major batch; its ``episode_returns``/``episode_lengths`` are
        the episodes completed during this call. Autoreset rows are marked ``VALID == False``.
        """
        if num_steps < 1:
            raise ValueError(f"sample: num_steps={num_steps} must be >= 1")
        cpu0 = time.thread_time() if _PLANTED_SLOWDOWN else 0.0
        if weights is not None and (version is None or version != self.weights_version):
            self.set_weights(weights, version)
        if epsilon is not None:
            self.policy.set_epsilon(epsilon)
        rewards = np.empty((num_steps, self.num_envs), np.float32)
        terms = np.empty((num_steps, self.num_envs), bool)
        truncs = np.empty((num_steps, self.num_envs), bool)
        step = self.env.step
        act = self.policy.fragment_actor(num_steps=num_steps, num_envs=self.num_envs)
        # a recurrent actor (DreamerV3's) learns of each step's ended episodes to reset their state
        ended_hook = getattr(act, "ended", None)
        # The actor's own input rows when they hold the observations as they are: one copy per step, not two.
        rows = act.obs_rows(self._obs.dtype, self._obs.shape) if hasattr(act, "obs_rows") else None
        obs_buf = rows if rows is not None else np.empty((num_steps, *self._obs.shape), self._obs.dtype)
        clip = self._clip
        for t in range(num_steps):
            obs_buf[t] = self._obs
            actions = act(self._obs, t)
            obs, rewards[t], terms[t], truncs[t], _ = step(np.clip(actions, *clip) if clip is not None else actions)
            self._obs = obs
            if ended_hook is not None:
                ended_hook(terms[t] | truncs[t])
        cols = act.columns()
        if rows is not None:
            obs_buf = np.ascontiguousarray(rows)  # the batch's own column, not a view of the actor's buffer
        # Per-step bookkeeping is vectorized here, after the loop: at a few microseconds per numpy call
        # it would otherwise cost as much as the env step itself.
        ended = terms | truncs
        # gymnasium 1.x NEXT_STEP autoreset: the step after an ended episode only resets that env.
        valid = np.concatenate([~self._autoreset[None], ~ended[:-1]], axis=0)
        self._autoreset = ended[-1].copy()
        ep_returns, ep_lengths = self._episode_stats(rewards, valid, ended & valid)
        if self._reward_clip:  # after the raw scores are counted: the policy learns from the clipped ones
            np.sign(rewards, out=rewards)
        next_obs = np.concatenate([obs_buf[1:], self._obs[None]], axis=0)
        cols.update(
            {
                sb.OBS: obs_buf,
                sb.NEXT_OBS: next_obs,
                sb.REWARDS: rewards,
                sb.TERMINATEDS: terms,
                sb.TRUNCATEDS: truncs,
                sb.VALID: valid,
            }
        )
        batch = SampleBatch(cols, time_major=True, episode_returns=ep_returns, episode_lengths=ep_lengths)
        batch = self.policy.postprocess_trajectory(batch)
        batch.source = (self.worker_index, os.getpid())
        if _PLANTED_SLOWDOWN:
            _burn_cpu(_PLANTED_SLOWDOWN * (time.thread_time() - cpu0))
        return batch

    def sample_packed(self, *args: Any) -> bytes:
        """:meth:`sample` as remote callers use it: its arguments positionally (``num_steps, weights, version,
        epsilon``), the batch pickled in-band out (:func:`unpack_batch` reads it back).

        Ray serializes a returned batch's dozen numpy columns one by one, out of band; one pickle of the
        whole batch is much cheaper on both sides (one actor call with the weights and a 64-step batch:
        ~1.3 -> ~0.9 ms of the actor's CPU, ~1.2 -> ~0.95 ms of the driver's; docs/performance.md, measured
        with ``crossrl bench scaling --workers 1,16 --fragment 64``). Callers pass only the arguments they use:
        Ray serializes each one.
        """
        batch = self.sample(*args)
        batch.weights_version = self.weights_version
        return pickle.dumps(batch, protocol=pickle.HIGHEST_PROTOCOL)

    def stream(self, address: dict[str, Any], incarnation: int) -> None:
        """The ``stream`` transport's evaluator end: connect to the driver's :class:`~crossrl.core.transport.StreamHub`
        and sample on its grants until the driver ends the stream (then return) or goes away.

        It runs on the actor's main thread, as one long call: Ray calls made to the actor meanwhile wait until the
        stream ends (the driver learns the process id from the connection's hello, :meth:`EvaluatorSet.pids`). Ray
        wakes an actor's main thread every 10 ms while no call runs on it (its core worker's signal check, which
        takes the GIL): on a thread of its own, the stream paid for those wake-ups, about 6 ms of CPU per second
        per actor, 0.2 CPUs for 32 actors (docs/performance.md, "32 workers on two cores").
        """
        node_id = ray.get_runtime_context().get_node_id()
        conn = tx.connect(address, node_id=node_id, hello=(self.worker_index, incarnation, os.getpid()))
        tx.serve_fragments(conn, self._stream_sample, threading.Event(), worker_index=self.worker_index)

    def _stream_sample(self, grant: tx.Grant | None, num_steps: int) -> SampleBatch:
        if grant is None:
            batch = self.sample(num_steps)
        else:
            batch = self.sample(num_steps, grant.weights, grant.version, grant.epsilon)
        batch.weights_version = self.weights_version
        return batch

    def _episode_stats(self, rewards: np.ndarray, valid: np.ndarray, done: np.ndarray) -> tuple[list[float], list[int]]:
        """Returns and lengths of the episodes that ended in this fragment; carries the unfinished ones over."""
        ret_sum = np.cumsum(np.where(valid, rewards, 0.0), axis=0)
        len_sum = np.cumsum(valid, axis=0)
        returns: list[float] = []
        lengths: list[int] = []
        for i in range(self.num_envs):
            prev_r, prev_n = -self._ep_return[i], -self._ep_len[i]  # the episode running into this fragment
            for t in np.flatnonzero(done[:, i]):
                returns.append(float(ret_sum[t, i] - prev_r))
                lengths.append(int(len_sum[t, i] - prev_n))
                prev_r, prev_n = ret_sum[t, i], len_sum[t, i]
            self._ep_return[i] = ret_sum[-1, i] - prev_r
            self._ep_len[i] = len_sum[-1, i] - prev_n
        return returns, lengths

    def learn_on_batch(self, batch: SampleBatch) -> dict[str, float]:
        return self.policy.learn_on_batch(batch)

    def compute_gradients(self, batch: SampleBatch) -> tuple[list[np.ndarray], dict[str, float]]:
        return self.policy.compute_gradients(batch)

    def sample_and_compute_gradients(self, *, num_steps: int) -> tuple[list[np.ndarray], dict[str, float], SampleBatch]:
        """A3C's worker step: sample, compute gradients on it; returns (grads, loss stats, stats-only batch)."""
        t0 = time.perf_counter()
        batch = self.sample(num_steps=num_steps)
        t1 = time.perf_counter()
        grads, stats = self.policy.compute_gradients(batch)
        stats = {**stats, "worker_time_sample_s": t1 - t0, "worker_time_grad_s": time.perf_counter() - t1}
        return grads, stats, batch.stats_only()

    def get_weights(self) -> dict[str, np.ndarray]:
        return self.policy.get_weights()

    def acting_weights(self) -> dict[str, np.ndarray]:
        """What a sampling copy of this evaluator needs to act (:meth:`~crossrl.core.policy.Policy.acting_weights`)."""
        return self.policy.acting_weights()

    def set_weights(self, weights: dict[str, np.ndarray] | bytes, version: int | None = None) -> None:
        self.policy.set_weights(pickle.loads(weights) if isinstance(weights, bytes) else weights)
        if version is not None:
            self.weights_version = version

    def set_epsilon(self, epsilon: float) -> None:
        self.policy.set_epsilon(epsilon)

    def apply(self, fn: Callable[[PolicyEvaluator], T]) -> T:
        """Run ``fn(self)`` where the evaluator lives (an escape hatch for optimizers' own hooks)."""
        return fn(self)

    def ping(self) -> int:
        return self.worker_index


RemoteEvaluator = ray.remote(num_cpus=1)(PolicyEvaluator)


def _getpid(_evaluator: PolicyEvaluator) -> int:
    return os.getpid()


def single_thread(worker_index: int) -> None:
    """In a remote evaluator (``worker_index`` > 0): one intra-op thread for numpy/torch."""
    if worker_index > 0:
        # Actors share the machine's cores with each other and the learner: one thread each. torch
        # is not imported by sampling-only evaluators; if something imports it later, it reads this.
        os.environ["OMP_NUM_THREADS"] = "1"
        if "torch" in sys.modules:
            sys.modules["torch"].set_num_threads(1)


_REMOTE_CLASSES: dict[type[PolicyEvaluator], Any] = {PolicyEvaluator: RemoteEvaluator}


def remote_class(evaluator_cls: type[PolicyEvaluator]) -> Any:
    """``evaluator_cls`` as a Ray actor class (one CPU), made once per class."""
    if evaluator_cls not in _REMOTE_CLASSES:
        _REMOTE_CLASSES[evaluator_cls] = ray.remote(num_cpus=1)(evaluator_cls)
    return _REMOTE_CLASSES[evaluator_cls]


# Weights up to this size are sent inside each remote's sample call (below Ray's default 100 KiB
# inline limit, so on any cluster they ride in the call's RPC), as long as all the copies together
# stay under INLINE_WEIGHTS_TOTAL_BYTES; bigger weights go through one ray.put. Measured with 16
# latency-bound workers and 36 KiB of weights: inline 164 ms per round, ray.put 171 ms.
INLINE_WEIGHTS_BYTES = 96 * 1024
INLINE_WEIGHTS_TOTAL_BYTES = 2 * 1024 * 1024


def unpack_batch(packed: bytes) -> SampleBatch:
    """The batch :meth:`PolicyEvaluator.sample_packed` returned."""
    batch = pickle.loads(packed)
    if not isinstance(batch, SampleBatch):
        raise TypeError(f"unpack_batch: expected a pickled SampleBatch, got {type(batch).__name__}")
    return batch


def pack_weights(weights: dict[str, np.ndarray]) -> bytes:
    """Weights serialized once, for sending inline to many remotes (``PolicyEvaluator`` unpacks them).

    Ray serializes each call's arguments itself: a dict of a dozen arrays costs it ~140 us per call
    here, bytes ~0 (16 remotes: 7.8 -> 5.5 ms to submit the 16 sample calls of a round).
    """
    return pickle.dumps(weights, protocol=pickle.HIGHEST_PROTOCOL)


def weights_payload(weights: dict[str, np.ndarray], copies: int) -> bytes | ray.ObjectRef:
    """What carries ``weights`` to ``copies`` remotes: packed bytes inside each call when small
    (:data:`INLINE_WEIGHTS_BYTES` each, :data:`INLINE_WEIGHTS_TOTAL_BYTES` over all), else one ``ray.put``."""
    nbytes = sum(v.nbytes for v in weights.values())
    if nbytes <= INLINE_WEIGHTS_BYTES and nbytes * copies <= INLINE_WEIGHTS_TOTAL_BYTES:
        return pack_weights(weights)
    return ray.put(weights)


class WorkerRestartsExceeded(RuntimeError):
    """A sampling worker died once too often (``max_restarts``), or again right after its restart (a crash loop)."""


class EvaluatorSet:
    """The driver's local evaluator plus ``num_remote`` evaluator actors, with dead-actor replacement.

    Remote evaluator ``i`` (0-based in :attr:`remotes`) has ``worker_index = i + 1`` and seed
    ``seed + 1000 * (i + 1)`` (+ ``100_000 * restarts`` after a restart, so a replacement does not
    replay its predecessor's episodes).

    Fragments travel by ``transport`` (:mod:`crossrl.core.transport`): ``calls`` (one Ray actor call per
    fragment) or ``stream`` (a socket per evaluator, fragments granted and sent back without a call; the
    evaluators start streaming at the first :meth:`launch`). Either way :meth:`launch` asks remote ``i`` for
    fragments and :meth:`ready` hands back what arrived, ``(i, None)`` for a remote that died (the caller
    restarts it with :meth:`restart` and launches it again; the fragment is dropped, never re-sampled).
    """

    def __init__(
        self,
        *,
        env_spec: EnvSpec,
        num_envs: int,
        policy_factory: PolicyFactory,
        num_remote: int,
        seed: int,
        remote_num_cpus: float = 1.0,
        local_num_envs: int = 1,
        evaluator_cls: type[PolicyEvaluator] = PolicyEvaluator,
        transport: str = tx.DEFAULT_TRANSPORT,
        max_restarts: int | None = None,
    ) -> None:
        if env_spec.multi_agent and evaluator_cls is PolicyEvaluator:
            raise TypeError(
                f"EvaluatorSet: {env_spec.id} is a multi-agent env (env.agents); pass "
                "evaluator_cls=crossrl.core.multi_agent.MultiAgentEvaluator"
            )
        self.transport = tx.check_transport(transport)
        self.env_spec = env_spec
        self.num_envs = num_envs
        self.policy_factory = policy_factory
        self.seed = seed
        self.remote_num_cpus = remote_num_cpus
        self.worker_restarts = 0
        self.max_restarts = max_restarts
        self._restarts_of = [0] * num_remote
        self._fresh = [False] * num_remote  # restarted and not yet delivered a fragment
        self._remote_cls = remote_class(evaluator_cls)
        self.local = evaluator_cls(
            env_spec=env_spec, num_envs=local_num_envs, policy_factory=policy_factory, seed=seed, worker_index=0
        )
        self.remotes: list[ActorHandle] = [self._make(i) for i in range(num_remote)]
        self.weights_version = 0
        self._pending_weights: ray.ObjectRef | bytes | None = None
        self._in_flight: dict[ray.ObjectRef, int] = {}  # calls: sample call -> remote index
        self._hub: tx.StreamHub | None = None  # stream: made at the first launch
        self._lost: list[int] = []  # stream: remotes that died before they connected, reported by ready()

    def _make(self, i: int) -> ActorHandle:
        return self._remote_cls.options(num_cpus=self.remote_num_cpus).remote(  # type: ignore[attr-defined,return-value]
            env_spec=self.env_spec,
            num_envs=self.num_envs,
            policy_factory=self.policy_factory,
            seed=self.seed + 1000 * (i + 1) + 100_000 * self._restarts_of[i],
            worker_index=i + 1,
        )

    def payload(self, weights: dict[str, np.ndarray]) -> ray.ObjectRef | bytes:
        """What carries ``weights`` to the remotes with their next fragment: packed bytes on the stream, else
        :func:`weights_payload` (bytes inside each call when small, one ``ray.put`` when big)."""
        if self.transport == "stream":
            return pack_weights(weights)
        return weights_payload(weights, len(self.remotes))

    def broadcast_weights(self, *, with_next_sample: bool = False) -> ray.ObjectRef | bytes:
        """Send the local policy's weights to every remote (one ``ray.put``); returns what was sent.

        Actor calls run in submission order, so each remote's next ``sample`` uses these weights. With
        ``with_next_sample`` no call is made now: the next :meth:`sample` carries the weights with its
        fragments (one actor round trip per iteration instead of two, or none on the stream); then small
        weights (see :meth:`payload`) travel packed, which skips the object store: a ``ray.put`` costs ~1 ms
        here, 36 KiB inline ~0.1 ms.
        """
        self.weights_version += 1
        weights = self.local.acting_weights()
        if with_next_sample:
            self._pending_weights = self.payload(weights)
            return self._pending_weights
        if self._hub is not None:
            raise RuntimeError("broadcast_weights: the evaluators stream; send weights with the next sample")
        ref = ray.put(weights)
        self._pending_weights = None
        for r in self.remotes:
            r.set_weights.remote(ref, self.weights_version)
        return ref

    def restart(self, i: int) -> ActorHandle:
        """Replace remote ``i`` (dead or hung) with a fresh actor carrying the current weights; counted.

        On the stream the new actor connects at its next :meth:`launch`."""
        if self.max_restarts is not None and self.worker_restarts >= self.max_restarts:
            raise WorkerRestartsExceeded(
                f"evaluator {i + 1} died after {self.worker_restarts} sampling-worker restarts "
                f"(budget.max_worker_restarts: {self.max_restarts})"
            )
        if self._fresh[i]:
            raise WorkerRestartsExceeded(
                f"crash loop: evaluator {i + 1} died again after its restart before it sampled anything"
            )
        log.warning("evaluator %d died; restarting it", i + 1)
        try:
            ray.kill(self.remotes[i], no_restart=True)
        except Exception:  # noqa: BLE001 - already gone is fine
            pass
        self._restarts_of[i] += 1
        self.worker_restarts += 1
        self._fresh[i] = True
        actor = self._make(i)
        actor.set_weights.remote(ray.put(self.local.acting_weights()), self.weights_version)
        self.remotes[i] = actor
        if self._hub is not None:
            self._hub.forget(i)
        return actor

    def launch(
        self,
        i: int,
        num_steps: int,
        *,
        weights: ray.ObjectRef | bytes | None = None,
        version: int | None = None,
        epsilon: float | None = None,
        credits: int = 1,
    ) -> None:
        """Ask remote ``i`` for ``credits`` fragments of ``num_steps`` steps per env, setting ``weights``
        (from :meth:`payload`, version ``version``) and ``epsilon`` first when given. :meth:`ready` returns them.
        More than one credit needs the stream (a Ray call returns one fragment)."""
        if self.transport == "calls":
            if credits != 1:
                raise ValueError(f"launch: credits={credits}: the calls transport returns one fragment per call")
            args = [num_steps, weights, None if weights is None else version, epsilon]
            while args[-1] is None:  # trailing unset arguments stay home: Ray serializes each one (~30 us apiece)
                args.pop()
            self._in_flight[self.remotes[i].sample_packed.remote(*args)] = i
            return
        if isinstance(weights, ray.ObjectRef):
            raise TypeError("launch: the stream carries weights as packed bytes (EvaluatorSet.payload)")
        hub = self._stream_hub()
        if hub.conns[i] is None:
            self._lost += hub.start([(i, self.remotes[i])])
            if i in self._lost:
                return
        grant = tx.Grant(num_steps, credits, version if weights is not None else None, weights, epsilon)
        if not hub.grant(i, grant):
            self._lost.append(i)

    def ready(self, timeout: float | None = None) -> list[tuple[int, SampleBatch | None]]:
        """Every fragment that has arrived (waits for at least one unless ``timeout`` passes), as
        ``(remote index, batch)``; ``(i, None)`` for a remote that died (its fragments are dropped)."""
        out = self._ready(timeout)
        for i, batch in out:
            if batch is not None:
                self.delivered(i)
        return out

    def delivered(self, i: int) -> None:
        """Remote ``i`` answered with work since its last restart: a later death of it is no crash loop."""
        self._fresh[i] = False

    def _ready(self, timeout: float | None) -> list[tuple[int, SampleBatch | None]]:
        if self._lost:
            lost, self._lost = self._lost, []
            return [(i, None) for i in dict.fromkeys(lost)]
        if self._hub is not None:
            return self._hub.ready(timeout)
        refs = list(self._in_flight)
        if not refs:
            return []
        ready, rest = ray.wait(refs, num_returns=1, timeout=timeout)
        if rest:
            # with many workers several finish while the driver handles one: take them together
            more, _ = ray.wait(rest, num_returns=len(rest), timeout=0)
            ready += more
        indices = [self._in_flight.pop(r) for r in ready]
        try:
            batches: list[SampleBatch | None] = [unpack_batch(b) for b in ray.get(ready)]
        except RayActorError:
            batches = []
            for r in ready:
                try:
                    batches.append(unpack_batch(ray.get(r)))
                except RayActorError:
                    batches.append(None)
        return list(zip(indices, batches, strict=True))

    def _stream_hub(self) -> tx.StreamHub:
        """The stream's hub, made and every remote connected at the first call."""
        if self._hub is None:
            ctx = ray.get_runtime_context()
            self._hub = tx.StreamHub(
                len(self.remotes), node_ip=ray.util.get_node_ip_address(), node_id=ctx.get_node_id()
            )
            self._lost += self._hub.start(list(enumerate(self.remotes)))
        return self._hub

    def cancel(self) -> None:
        """Drop every fragment asked for and not yet received (best effort; the actors go on existing)."""
        cancel_in_flight(self._in_flight)
        if self._hub is not None:
            self._hub.close()
            self._hub = None

    def gather(self, refs: Sequence[ray.ObjectRef], *, indices: Sequence[int] | None = None) -> list[Any]:
        """``ray.get`` each ref; a ref whose actor died is dropped (its actor restarted), never retried.

        ``indices[j]`` is the remote that produced ``refs[j]`` (default: ``j``).
        """
        try:
            got = list(ray.get(list(refs)))  # one call for all: the common case, no actor died
            for j in range(len(refs)):
                self.delivered(indices[j] if indices is not None else j)
            return got
        except RayActorError:
            pass
        out = []
        for j, ref in enumerate(refs):
            try:
                out.append(ray.get(ref))
                self.delivered(indices[j] if indices is not None else j)
            except RayActorError:
                self.restart(indices[j] if indices is not None else j)
        return out

    def pids(self) -> list[int | None]:
        """Each remote's process id; None for one that is streaming no more (died, not yet restarted). A streaming
        evaluator takes no Ray call until its stream ends (:meth:`PolicyEvaluator.stream`): its stream's hello
        says it."""
        if self._hub is not None:
            return list(self._hub.pids)
        return [int(p) for p in ray.get([r.apply.remote(_getpid) for r in self.remotes])]

    def foreach_remote(self, method: str, *args: Any, **kwargs: Any) -> list[Any]:
        """Call ``method`` on every remote and wait; results of actors that died are dropped."""
        refs = [getattr(r, method).remote(*args, **kwargs) for r in self.remotes]
        return self.gather(refs)

    def sample(self, *, num_steps: int, epsilon: float | None = None) -> list[SampleBatch]:
        """One batch per live remote (``num_steps`` per env each), in remote order; a dead remote's batch is
        dropped (the remote restarted).

        Weights from ``broadcast_weights(with_next_sample=True)`` and ``epsilon`` travel with the request.
        """
        if not self.remotes:
            return [self.local.sample(num_steps=num_steps, epsilon=epsilon)]
        weights, self._pending_weights = self._pending_weights, None
        for i in range(len(self.remotes)):
            self.launch(i, num_steps, weights=weights, version=self.weights_version, epsilon=epsilon)
        waiting, out = set(range(len(self.remotes))), {}
        while waiting:
            for i, batch in self.ready():
                waiting.discard(i)
                if batch is None:
                    self.restart(i)
                else:
                    out[i] = batch
        return [out[i] for i in sorted(out)]

    def stop(self) -> None:
        self.cancel()
        for r in self.remotes:
            try:
                ray.kill(r, no_restart=True)
            except Exception:  # noqa: BLE001 - shutting down anyway
                pass
        self.remotes = []


def cancel_in_flight(in_flight: dict[ray.ObjectRef, int]) -> None:
    """Cancel every call in ``in_flight`` (best effort) and empty it."""
    for ref in in_flight:
        try:
            ray.cancel(ref, force=False)
        except Exception:  # noqa: BLE001 - best effort: the actors are killed next anyway
            pass
    in_flight.clear()
