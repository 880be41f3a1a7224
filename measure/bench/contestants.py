"""The sampling contestants, as they run inside one fresh measurement process (see :mod:`.samplers`).

Each ``setup_<engine>`` (raw, limit and crossrl here, RLlib and TorchRL in :mod:`.others`) builds its
engine's sampler for ``workers x envs_per_worker`` envs and returns a :class:`~.base.Contestant`:
``step()`` runs one iteration (one weight broadcast, then ``fragment`` env steps per env on every
worker, gathered on the driver) and returns the env steps it sampled; ``close()`` releases it. No
contestant learns. The engines are built by the adapters' own builders (:mod:`crossrl.adapters.crossrl`,
:mod:`crossrl.adapters.rllib.adapter`, :mod:`crossrl.adapters.torchrl.adapter`). :func:`time_windows` turns ``step``
into steps/s figures.

Run through ``python -m crossrl.measure.bench._child REQUEST.json RESULT.json`` by :mod:`.samplers`.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing as mp
import os
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from crossrl.measure.bench.base import Contestant, getpid, ray_up
from crossrl.measure.bench.others import setup_rllib, setup_torchrl
from crossrl.scenarios import catalog
from crossrl.scenarios.spec import DEFAULT_TRANSPORT, EnvSpec, ModelSpec

# raw: plain processes stepping the envs with random actions, the env's own limit; limit: the same processes
# also running the policy network's batched forward pass every step, no framework (the sampling limit)
ENGINES = ("raw", "limit", *catalog.ENGINES)


def peak_rss_mb(pid: int) -> float:
    """A process's peak resident set size so far (Linux ``VmHWM``), in MiB."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024  # kB
    raise RuntimeError(f"no VmHWM for pid {pid}")


def time_windows(
    step: Callable[[], int],
    *,
    warmup_s: float,
    seconds: float,
    windows: int,
    on_timed_start: Callable[[], None] | None = None,
) -> list[float]:
    """Env steps/s over ``windows`` consecutive windows of at least ``seconds`` each, after ``warmup_s``.

    A window ends at the first iteration boundary after ``seconds`` of wall time (at least one
    iteration), so a slow engine is timed over whole iterations, never a partial one.
    ``on_timed_start`` is called once, after the warm-up, right before the first window.
    """
    t0 = time.perf_counter()
    step()
    while time.perf_counter() - t0 < warmup_s:
        step()
    if on_timed_start is not None:
        on_timed_start()
    out = []
    for _ in range(windows):
        n, t0 = 0, time.perf_counter()
        while True:
            n += step()
            elapsed = time.perf_counter() - t0
            if elapsed >= seconds:
                break
        out.append(n / elapsed)
    return out


# raw: gymnasium's own vector env with random actions, one process per worker (the limit)


def _raw_worker(conn: Connection, env_spec_json: str, num_envs: int, seed: int) -> None:
    """Steps ``num_envs`` copies ``k`` times per request ``k``; replies with transitions (autoreset steps excluded)."""
    import numpy as np

    from crossrl.core.envs import make_vector_env

    env = make_vector_env(EnvSpec.model_validate_json(env_spec_json), num_envs)
    env.reset(seed=seed)
    env.action_space.seed(seed)
    actions = [env.action_space.sample() for _ in range(64)]  # sampling is not the env's cost
    autoreset = np.zeros(num_envs, bool)
    conn.send("ready")
    i = 0
    while (k := conn.recv()) is not None:
        count = 0
        for _ in range(k):
            _, _, term, trunc, _ = env.step(actions[i % 64])
            i += 1
            count += num_envs - int(np.count_nonzero(autoreset))
            autoreset = term | trunc
        conn.send(count)
    env.close()


def _raw_parallel_worker(conn: Connection, env_spec_json: str, num_envs: int, seed: int) -> None:
    """:func:`_raw_worker` for a multi-agent env: ``num_envs`` PettingZoo parallel envs stepped one after another
    with random joint actions, each reset when its episode ends; a joint step of one env is one env step."""
    from crossrl.core.envs import make_parallel_env

    spec = EnvSpec.model_validate_json(env_spec_json)
    envs = [make_parallel_env(spec) for _ in range(num_envs)]
    for j, env in enumerate(envs):
        env.reset(seed=seed * num_envs + j)
        for k, a in enumerate(env.possible_agents):
            env.action_space(a).seed(1000 * (seed * num_envs + j) + k)
    agents = envs[0].possible_agents
    actions = [{a: envs[0].action_space(a).sample() for a in agents} for _ in range(64)]  # not the env's cost
    conn.send("ready")
    i = 0
    while (k := conn.recv()) is not None:
        for _ in range(k):
            for env in envs:
                joint = actions[i % 64]
                env.step({a: joint[a] for a in env.agents})
                if not env.agents:
                    env.reset()
            i += 1
        conn.send(k * num_envs)
    for env in envs:
        env.close()


def setup_raw(*, env_spec: EnvSpec, workers: int, envs_per_worker: int, model: ModelSpec, fragment: int) -> Contestant:
    del model  # random actions: no policy
    worker = _raw_parallel_worker if env_spec.multi_agent else _raw_worker
    made_by = "make_parallel_env (PettingZoo, random joint actions)" if env_spec.multi_agent else "make_vector_env"
    info = {"vector_env": f"crossrl.core.envs.{made_by}", "processes": workers}
    return _pipe_workers(worker, (env_spec.model_dump_json(),), workers, envs_per_worker, fragment, info)


def _pipe_workers(
    worker: Callable[..., None],
    args: tuple[Any, ...],
    workers: int,
    envs_per_worker: int,
    fragment: int,
    info: dict[str, Any],
) -> Contestant:
    """``workers`` spawned processes ``worker(conn, *args, envs_per_worker, seed=i)``, each sent ``fragment`` per
    iteration over its pipe (all first, then every reply: one barrier per iteration, as sync_samples has)."""
    ctx = mp.get_context("spawn")
    conns, procs = [], []
    for i in range(workers):
        parent, child = ctx.Pipe()
        p = ctx.Process(target=worker, args=(child, *args, envs_per_worker, i), daemon=True)
        p.start()
        conns.append(parent)
        procs.append(p)
    for c in conns:
        assert c.recv() == "ready"

    def step() -> int:
        for c in conns:
            c.send(fragment)
        return sum(int(c.recv()) for c in conns)

    def close() -> None:
        for c in conns:
            c.send(None)
        for p in procs:
            p.join(timeout=10)

    return Contestant(step, close, info, lambda: [int(p.pid) for p in procs if p.pid is not None])


# limit: the raw processes plus the policy's network, run as a hand-written sampler would (the sampling limit)


def _limit_worker(conn: Connection, env_spec_json: str, model_json: str, num_envs: int, seed: int) -> None:
    """:func:`_raw_worker` acting through the policy network instead of random actions, with no framework.

    The networks crossrl's actor-critic policy has (:func:`crossrl.core.models.build_net` from the same ModelSpec:
    an actor and a separate critic of the same layers, random weights), run the cheapest way known here, producing
    what a PPO sampler hands over (actions, log-probabilities, values); replies with the transitions stepped
    (autoreset steps excluded), nothing else leaves the process.

    An MLP acts through crossrl's own numpy acting code (:class:`crossrl.core.numpy_net.NumpyFragmentActor`: per
    step one forward pass of the actor for every env and a Gumbel-max or Gaussian action on noise drawn once per
    fragment; after the fragment the log-probabilities and the critic's values), the fastest known here for a few
    observations (a torch module call costs ~30 us of overhead per step). So the limit is crossrl's sampling without
    the evaluator's bookkeeping (episode returns, GAE, the batch), the transport, Ray and the driver. A conv net runs
    in torch (one thread, ``torch.inference_mode``, the module's call on ``torch.from_numpy`` of the frames, uint8
    kept uint8); the critic's values in passes of ``VALUE_CHUNK`` frames (crossrl's batching).
    """
    import gymnasium as gym
    import numpy as np
    import torch

    from crossrl.core.envs import make_vector_env
    from crossrl.core.models import build_net

    torch.set_num_threads(1)
    spec, model = EnvSpec.model_validate_json(env_spec_json), ModelSpec.model_validate_json(model_json)
    env = make_vector_env(spec, num_envs)
    obs, _ = env.reset(seed=seed)
    obs_shape = tuple(int(n) for n in env.single_observation_space.shape or ())
    space = env.single_action_space
    discrete = isinstance(space, gym.spaces.Discrete)
    act_dim = int(space.n) if isinstance(space, gym.spaces.Discrete) else int(np.prod(space.shape or (1,)))
    torch.manual_seed(seed)
    pi = build_net(obs_shape=obs_shape, out_dim=act_dim, model=model, out_gain=0.01)
    vf = build_net(obs_shape=obs_shape, out_dim=1, model=model, out_gain=1.0)
    sampler = _LimitSampler(env, obs, pi, vf, model=model, discrete=discrete, act_dim=act_dim, seed=seed)
    conn.send("ready")
    while (k := conn.recv()) is not None:
        conn.send(sampler.fragment(k) if not model.conv else sampler.torch_fragment(k))
    env.close()


class _LimitSampler:
    """The limit's acting state across fragments: the env's last observations and autoreset flags, the nets, the
    noise generator. :meth:`fragment` acts through crossrl's numpy actor (an MLP), :meth:`torch_fragment` through the
    torch modules (a conv net); each returns the transitions stepped."""

    def __init__(self, env: Any, obs: Any, pi: Any, vf: Any, *, model: ModelSpec, discrete: bool, act_dim: int,
                 seed: int) -> None:  # fmt: skip
        import gymnasium as gym
        import numpy as np

        space = env.single_action_space
        self.env, self.obs, self.pi, self.vf = env, obs, pi, vf
        self.discrete, self.act_dim, self.num_envs = discrete, act_dim, int(env.num_envs)
        self.clip = (space.low, space.high) if isinstance(space, gym.spaces.Box) else None
        self.autoreset = np.zeros(self.num_envs, bool)
        self.rng = np.random.default_rng(seed)
        self.net: Any = None
        if not model.conv:
            from crossrl.core.numpy_net import actor_critic_net

            weights = {
                f"{p}.{key}": v.numpy() for p, m in (("pi", pi), ("vf", vf)) for key, v in m.state_dict().items()
            }
            weights["log_std"] = np.zeros(act_dim, np.float32)
            self.net = actor_critic_net(weights, model.activation, discrete=discrete)

    def _step(self, actions: Any) -> int:
        """One env step of every env; the transitions it made (autoreset steps excluded)."""
        import numpy as np

        clip = self.clip
        self.obs, _, term, trunc, _ = self.env.step(np.clip(actions, *clip) if clip is not None else actions)
        count = self.num_envs - int(np.count_nonzero(self.autoreset))
        self.autoreset = term | trunc
        return count

    def fragment(self, k: int) -> int:
        import numpy as np

        from crossrl.core.numpy_net import NumpyFragmentActor

        obs = self.obs
        act = NumpyFragmentActor(self.net, obs_dim=int(np.prod(obs.shape[1:])), act_dim=self.act_dim,
                                 discrete=self.discrete, rng=self.rng, num_steps=k, num_envs=self.num_envs)  # fmt: skip
        rows = act.obs_rows(obs.dtype, obs.shape)
        count = 0
        for t in range(k):
            if rows is not None:
                rows[t] = self.obs
            count += self._step(act(self.obs, t))
        act.columns()  # log-probabilities and values, as a sampler must; nothing leaves the process
        return count

    def torch_fragment(self, k: int) -> int:
        import numpy as np
        import torch

        from crossrl.core.actor_critic import VALUE_CHUNK
        from crossrl.core.numpy_net import LOG_2PI

        n, a = self.num_envs, self.act_dim
        obs_buf = np.empty((k, *np.shape(self.obs)), np.asarray(self.obs).dtype)
        count = 0
        with torch.inference_mode():
            out = torch.empty(k, n, a)
            if self.discrete:
                noise = torch.from_numpy(self.rng.gumbel(size=(k, n, a)).astype(np.float32))
                actions = torch.empty(k, n, dtype=torch.int64)
            else:
                noise = torch.from_numpy(self.rng.standard_normal((k, n, a), np.float32))
                actions = torch.empty(k, n, a)
            for t in range(k):
                obs_buf[t] = self.obs
                out[t] = self.pi(torch.from_numpy(obs_buf[t]))
                if self.discrete:
                    torch.argmax(out[t] + noise[t], dim=1, out=actions[t])
                else:
                    torch.add(out[t], noise[t], out=actions[t])
                count += self._step(actions[t].numpy())
            if self.discrete:
                logp = torch.log_softmax(out, dim=-1).gather(-1, actions[..., None])[..., 0]
            else:
                logp = (-0.5 * noise**2 - 0.5 * LOG_2PI).sum(-1)
            frames = torch.from_numpy(obs_buf.reshape(k * n, *obs_buf.shape[2:]))
            values = torch.cat([self.vf(frames[i : i + VALUE_CHUNK])[:, 0] for i in range(0, len(frames), VALUE_CHUNK)])
            del logp, values  # computed, as a sampler must; nothing leaves the process
        return count


def setup_limit(
    *, env_spec: EnvSpec, workers: int, envs_per_worker: int, model: ModelSpec, fragment: int
) -> Contestant:
    """The sampling limit: ``workers`` processes, each stepping ``make_vector_env`` and running the policy
    network's batched forward pass every step (:func:`_limit_worker`); single-agent envs only."""
    if env_spec.multi_agent:
        raise ValueError(f"limit: {env_spec.id} is a multi-agent env; the limit contestant steps single-agent envs")
    info = {
        "vector_env": "crossrl.core.envs.make_vector_env",
        "processes": workers,
        "policy": "crossrl.core.models.build_net's weights, actor per step, critic per fragment: numpy for an MLP, "
        "torch (inference_mode, 1 thread) for a conv net",
    }
    args = (env_spec.model_dump_json(), model.model_dump_json())
    return _pipe_workers(_limit_worker, args, workers, envs_per_worker, fragment, info)


# crossrl: the real policy optimizer over evaluator actors, with learning replaced by nothing


def setup_crossrl(
    *,
    env_spec: EnvSpec,
    workers: int,
    envs_per_worker: int,
    model: ModelSpec,
    fragment: int,
    optimizer: str = "sync_samples",
    transport: str = DEFAULT_TRANSPORT,
) -> Contestant:
    """``optimizer``'s own ``step()`` (sync_samples: broadcast, sample all, concat; async_samples: one
    sample in flight per worker, a learner thread that consumes batches) with a no-op learning step."""
    import ray

    from crossrl.adapters.crossrl import start_core
    from crossrl.core.algorithms import load
    from crossrl.core.cluster import disconnect
    from crossrl.measure.bench.nolearn import NoLearnPolicy

    ray_up(workers)
    alg = load("ppo")
    batch = fragment * workers * envs_per_worker
    hp = {**alg.hyperparams(alg_defaults("ppo")), "train_batch": batch, "rollout_fragment": fragment}

    def start() -> tuple[Any, Any]:
        return start_core(
            env_spec=env_spec,
            workers=workers,
            envs_per_worker=envs_per_worker,
            policy_cls=NoLearnPolicy,
            hyperparams=hp,
            model=model,
            optimizer=optimizer,
            seed=0,
            remote_num_cpus=1.0,
            transport=transport,
        )

    now: dict[str, Any] = dict(zip(("evaluators", "opt"), start(), strict=True))

    def stop() -> None:
        now["opt"].stop()
        now["evaluators"].stop()

    def redraw() -> None:  # fresh evaluator actors (same seeds), this driver and its Ray kept
        stop()
        now.update(zip(("evaluators", "opt"), start(), strict=True))

    def close() -> None:
        stop()
        disconnect()

    def pids() -> list[int]:
        return [int(p) for p in now["evaluators"].pids() if p is not None]

    info = {
        "optimizer": optimizer,
        "transport": transport,
        "fragment": fragment,
        "actor_blas": ray.get(now["evaluators"].remotes[0].apply.remote(_blas)),
    }
    return Contestant(lambda: now["opt"].step().env_steps_sampled, close, info, pids, redraw)


# learner: PPO's learning step alone, for the end-to-end bench's limit


def setup_learner(
    *,
    env_spec: EnvSpec,
    workers: int,
    envs_per_worker: int,
    model: ModelSpec,
    fragment: int,
    hyperparams: dict[str, Any] | None = None,
) -> Contestant:
    """crossrl's PPO ``learn_on_batch`` alone (its epochs and minibatches, one torch thread as in a trial) on one
    stored batch of ``fragment`` steps on each of ``workers x envs_per_worker`` envs, sampled once before the
    clock; ``step()`` is one learning iteration and returns the batch's env steps (so steps/s is trained env
    steps per second of learning). ``hyperparams``: the scenario's PPO settings over the catalog's."""
    import torch

    from crossrl.core.algorithms import load
    from crossrl.core.evaluator import PolicyEvaluator
    from crossrl.core.policy import PolicySpec

    torch.set_num_threads(1)
    alg = load("ppo")
    hp = alg.hyperparams({**alg_defaults("ppo"), **(hyperparams or {})})
    ev = PolicyEvaluator(
        env_spec=env_spec,
        num_envs=workers * envs_per_worker,
        policy_factory=PolicySpec(policy_cls=alg.policy_cls, hyperparams=hp, model=model),
        seed=0,
        worker_index=0,
    )
    batch = ev.sample(fragment)
    steps = batch.num_env_steps()

    def step() -> int:
        ev.learn_on_batch(batch)
        return steps

    return Contestant(step, lambda: None, {"train_batch": steps, "epochs": hp["epochs"], "minibatch": hp["minibatch"]},
                      lambda: [getpid(None)])  # fmt: skip


def _blas(_: Any) -> list[str]:
    """The BLAS/OpenMP thread pools of the calling process, e.g. ``openblas:1``."""
    from threadpoolctl import threadpool_info

    return [f"{p['internal_api']}:{p['num_threads']}" for p in threadpool_info()]


def alg_defaults(name: str) -> dict[str, Any]:
    from crossrl.scenarios.catalog import HYPERPARAM_DEFAULTS

    return dict(HYPERPARAM_DEFAULTS[name])


def _setups() -> dict[str, Callable[..., Contestant]]:
    return {
        "raw": setup_raw,
        "limit": setup_limit,
        "crossrl": setup_crossrl,
        "learner": setup_learner,
        "rllib": setup_rllib,
        "torchrl": setup_torchrl,
    }


def set_up(request: dict[str, Any]) -> Contestant:
    """The contestant a measurement request names (engine, env, workers, envs, model, fragment, optimizer)."""
    engine = request["engine"]
    setups = _setups()
    if engine not in setups:
        raise ValueError(f"unknown contestant {engine!r}; known: {', '.join(ENGINES)}")
    kwargs: dict[str, Any] = {
        "env_spec": EnvSpec.model_validate(request["env_spec"]),
        "workers": int(request["workers"]),
        "envs_per_worker": int(request["envs_per_worker"]),
        "model": ModelSpec.model_validate(request["model"]),
        "fragment": int(request["fragment"]),
    }
    if engine == "crossrl":
        kwargs["optimizer"] = request.get("optimizer") or "sync_samples"
        kwargs["transport"] = request.get("transport") or DEFAULT_TRANSPORT
    if engine == "learner":
        kwargs["hyperparams"] = request.get("hyperparams") or {}
    if request.get("layout") is not None:
        if engine not in ("rllib", "torchrl"):
            raise ValueError(f"{engine}: no execution layouts (rllib and torchrl have them)")
        kwargs["layout"] = dict(request["layout"])
    return setups[engine](**kwargs)


def run_request(request: dict[str, Any]) -> dict[str, Any]:
    """Set up ``request["engine"]``, time it, close it; returns {"samples": [steps/s...], "info": {...}}."""
    t0 = time.perf_counter()
    contestant = set_up(request)
    setup_s = time.perf_counter() - t0
    meter = CpuMeter(contestant.worker_pids())
    try:
        samples = time_windows(
            contestant.step,
            warmup_s=float(request["warmup_s"]),
            seconds=float(request["seconds"]),
            windows=int(request.get("windows", 1)),
            on_timed_start=meter.start,
        )
        cpu = meter.stop()
        rss = [peak_rss_mb(pid) for pid in contestant.worker_pids()] if request.get("rss") else None
    finally:
        contestant.close()
    info = {**contestant.info, "setup_s": setup_s}
    return {"samples": samples, "info": info, "peak_rss_mb": rss, "cpu": cpu}


def process_cpu_s(proc: Any) -> float:
    """CPU seconds a process (every thread of it) has run: Linux's per-thread ``schedstat`` (nanoseconds), or
    psutil's user + system times (clock ticks, 10 ms here: 1 % of a 1 s window) where there is none."""
    import glob

    try:
        total = 0
        for path in glob.glob(f"/proc/{proc.pid}/task/*/schedstat"):
            with contextlib.suppress(OSError), open(path) as f:  # OSError: a thread that ended meanwhile
                total += int(f.read().split()[0])
        if total:
            return total / 1e9
    except (OSError, ValueError):
        pass
    t = proc.cpu_times()
    return float(t.user + t.system)


class CpuMeter:
    """CPUs in use over the timed part: the whole machine, the env-stepping processes, the driver.

    Figures are CPU-seconds per wall second (2.0 = both cores of this machine busy). They tell a
    CPU-bound measurement (machine near its core count) from one that waits on something else.
    """

    def __init__(self, worker_pids: list[int]) -> None:
        import psutil

        self._procs = []
        # A contestant whose envs are stepped in this process (TorchRL's Collector, RLlib's local env runner) names
        # it among its env-stepping processes: its CPU counts as the workers' and as the driver's, but once in all.
        self._driver_steps = os.getpid() in worker_pids
        for pid in dict.fromkeys(worker_pids):
            if pid == os.getpid():
                continue
            try:
                self._procs.append(psutil.Process(pid))
            except psutil.Error:
                continue
        self._procs.append(psutil.Process())
        self._t0 = 0.0
        self._snap: tuple[float, list[float]] = (0.0, [])

    @staticmethod
    def _busy() -> float:
        import psutil

        c = psutil.cpu_times()
        return float(c.user + c.nice + c.system + getattr(c, "irq", 0.0) + getattr(c, "softirq", 0.0))

    def _proc_cpu(self) -> list[float]:
        out = []
        for p in self._procs:
            try:
                out.append(process_cpu_s(p))
            except Exception:  # noqa: BLE001 - a process that ended counts nothing more
                out.append(float("nan"))
        return out

    def start(self) -> None:
        self._t0 = time.perf_counter()
        self._snap = (self._busy(), self._proc_cpu())

    def stop(self) -> dict[str, float] | None:
        if not self._t0:
            return None
        dt = max(time.perf_counter() - self._t0, 1e-9)
        busy0, procs0 = self._snap
        procs1 = self._proc_cpu()
        deltas = [b - a for a, b in zip(procs0, procs1, strict=True)]
        out = {"machine_busy_cpus": (self._busy() - busy0) / dt, "driver_cpus": deltas[-1] / dt}
        if len(deltas) > 1 or self._driver_steps:  # contestants that name their env-stepping processes
            workers = sum(d for d in deltas[:-1] if d == d) / dt
            out["workers_cpus"] = workers + (out["driver_cpus"] if self._driver_steps else 0.0)
            out["sampling_cpus"] = workers + out["driver_cpus"]  # every process once: the driver and the workers
        return out


def pin(procs: list[Any], allowed: set[int] | None = None) -> dict[int, int]:
    """Pin every thread of the env-stepping processes and of the driver (last) to one CPU each: the driver to
    the first allowed CPU, worker ``i`` to the ``i + 1``-th (round robin). Two measurement processes pinned
    alike run their slices on the same CPUs; this VM's vCPUs drift apart in speed (docs/performance.md).
    ``allowed``: the CPUs to use (default: this thread's; once the driver is pinned that is one CPU only)."""
    import glob
    import os

    cpus = sorted(allowed if allowed is not None else os.sched_getaffinity(0))
    where = {}
    for i, proc in enumerate(procs):
        cpu = cpus[0] if i == len(procs) - 1 else cpus[(i + 1) % len(cpus)]
        for task in glob.glob(f"/proc/{proc.pid}/task/*"):
            with contextlib.suppress(OSError, ValueError):  # a thread that ended meanwhile
                os.sched_setaffinity(int(task.rsplit("/", 1)[1]), {cpu})
        where[proc.pid] = cpu
    return where


def serve(request: dict[str, Any], commands: Any, replies: Any) -> None:
    """Set up ``request["engine"]``, warm it up, then run iterations in slices on command until told to stop.

    The A/B gate's measurement server (:mod:`crossrl.measure.bench.ab`): the gate keeps one per side alive
    and alternates short slices of iterations between them (A B A B ... a few per second), so both sides
    see the same stretch of the machine's speed, which on a shared VM drifts within seconds. Between
    slices the contestant is idle: no iteration runs. ``commands`` (one JSON line each):
    ``{"run": K}`` runs K iterations and replies ``{"steps": n}``; ``{"read": true}`` replies the totals
    so far, ``{"steps", "active_s", "cpu_s"}`` (env steps, wall seconds spent in ``run``, CPU seconds of
    the driver and the env-stepping processes since start-up, idle time included); ``{"redraw": true}``
    (when the first reply said ``"can_redraw": true``) replaces the env-stepping processes with fresh ones
    (:attr:`Contestant.redraw`), warms them up for ``warmup_s``, pins them and replies
    ``{"ready": true, "redraw_s": ...}``: reads before and after it are not comparable. EOF or ``{}`` closes.
    The first reply, after ``warmup_s`` of iterations, is
    ``{"ready": true, "iteration_s": ..., "can_redraw": ..., "info": ...}``.
    """
    import psutil

    t0 = time.perf_counter()
    contestant = set_up(request)

    def reply(data: dict[str, Any]) -> None:
        replies.write(json.dumps(data) + "\n")
        replies.flush()

    allowed = os.sched_getaffinity(0)  # before the first pin narrows this process to one CPU

    def warm_and_pin() -> list[psutil.Process]:
        time_windows(contestant.step, warmup_s=float(request["warmup_s"]), seconds=0.5, windows=1)
        procs = [psutil.Process(pid) for pid in contestant.worker_pids()] + [psutil.Process()]
        if request.get("pin"):
            pin(procs, allowed)
        return procs

    try:
        setup_s = time.perf_counter() - t0
        procs = warm_and_pin()
        n, t1 = 0, time.perf_counter()
        while time.perf_counter() - t1 < 0.3:
            n += 1
            contestant.step()
        iteration_s = (time.perf_counter() - t1) / n
        info = {**contestant.info, "setup_s": setup_s}
        can_redraw = contestant.redraw is not None
        reply({"ready": True, "iteration_s": iteration_s, "can_redraw": can_redraw, "info": info})
        steps, active = 0, 0.0
        for line in commands:
            cmd = json.loads(line)
            if not cmd:
                break
            if cmd.get("redraw") and contestant.redraw is not None:
                t1 = time.perf_counter()
                contestant.redraw()
                procs = warm_and_pin()
                reply({"ready": True, "redraw_s": time.perf_counter() - t1})
            elif "run" in cmd:
                got, t1 = 0, time.perf_counter()
                for _ in range(int(cmd["run"])):
                    got += contestant.step()
                active += time.perf_counter() - t1
                steps += got
                reply({"steps": got})
            else:
                reply({"steps": steps, "active_s": active, "cpu_s": sum(process_cpu_s(p) for p in procs)})
    finally:
        contestant.close()


def main(argv: list[str]) -> int:
    if argv[1] == "--serve":  # _child --serve REQUEST.json COMMAND_FD REPLY_FD
        with open(argv[2]) as f:
            request = json.load(f)
        with open(int(argv[3])) as commands, open(int(argv[4]), "w") as replies:
            serve(request, commands, replies)
        return 0
    # LOCAL_RAY_ENV is already set: importing .base imported crossrl.core.cluster, before any Ray import.
    with open(argv[1]) as f:
        request = json.load(f)
    if request.get("profile"):
        import cProfile

        prof = cProfile.Profile()
        result = prof.runcall(run_request, request)
        prof.dump_stats(request["profile"])
    else:
        result = run_request(request)
    with open(argv[2], "w") as f:
        json.dump(result, f)
    return 0
