"""``crossrl bench sampling --sweep``: each engine's execution layouts for the same envs, and the sweep over them.

``bench sampling`` times every engine in one layout chosen by crossrl (:func:`fixed_layout`: RLlib's ``workers``
env runners of ``envs_per_worker`` envs, SYNC vectorisation; TorchRL's ``MultiSyncCollector`` of ``workers``
processes over its default batched env, gymnasium's ``SyncVectorEnv`` in ``GymWrapper``, or ``Collector`` for one
worker). An engine's maintainer will ask for its fastest
layout on the same machine: :func:`grid` lists, per engine, the layouts its own execution knobs give for the
same total envs (``workers x envs_per_worker``) and the same env steps per iteration, within the machine's CPUs
(at most ``2 x cores`` sampling processes, :func:`processes`), and :func:`sweep` times them all, interleaved in
rounds like the other bench commands, each measurement in a fresh process as today (warm-up dropped, medians,
CPU per env step, the same env through crossrl's ``make_env`` and the same random-init network on every engine).

A layout is a small dict:

- rllib: ``{"num_env_runners": 0, "num_envs_per_env_runner": 16, "vectorize": "SYNC", "fragment": 250}``:
  0 env runners samples in the driver's local env runner; ``vectorize`` is RLlib's
  ``config.env_runners(gym_env_vectorize_mode=...)`` (gymnasium's ``VectorizeMode``: ``SYNC``; ``ASYNC``, one
  process per env; ``VECTOR_ENTRY_POINT``, the env's own vector class, the one crossrl's core steps, for envs
  that have one such as CartPole); ``fragment`` is ``rollout_fragment_length``; every iteration samples the
  bench's ``fragment x total envs`` env steps (PPO's ``synchronous_parallel_sample``).
- torchrl: ``{"collector": "MultiSyncCollector", "workers": 2, "env": "SerialEnv", "envs_per_worker": 8,
  "frames_per_batch": 4000}``: ``collector`` is ``Collector`` (one batched env stepped in the driver),
  ``MultiSyncCollector`` or ``MultiAsyncCollector`` (``workers`` processes, one batched env each); ``env`` is the
  batched env: ``SerialEnv`` (TorchRL's own), ``ParallelEnv`` (``env_workers`` processes, each a ``SerialEnv``),
  ``gym_sync`` / ``gym_async`` (gymnasium's ``SyncVectorEnv`` / ``AsyncVectorEnv`` of crossrl's ``make_env``,
  autoreset disabled as TorchRL prefers, in ``GymWrapper``: ``gym_sync`` is the adapter's default); an iteration is one batch of ``frames_per_batch``.
- crossrl: ``{"workers": 2, "envs_per_worker": 8}``: its fixed layout and at most one more (1 worker, or 2 for a
  1-worker bench); its transports are compared elsewhere (``crossrl bench transport``).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from typing import Any

from crossrl.measure.bench.results import LayoutSweep, SweepPoint
from crossrl.measure.bench.samplers import BenchError, SamplerResult, auto_fragment, measure
from crossrl.scenarios.spec import DEFAULT_TORCHRL_ENV, EnvSpec, ModelSpec

SWEEP_ENGINES = ("crossrl", "rllib", "torchrl")
RLLIB_VECTORIZE = ("SYNC", "VECTOR_ENTRY_POINT", "ASYNC")
TORCHRL_COLLECTORS = ("Collector", "MultiSyncCollector", "MultiAsyncCollector")
TORCHRL_ENVS = ("SerialEnv", "gym_sync", "ParallelEnv", "gym_async")
PROCESSES_PER_CORE = 2  # the cap: at most this many sampling processes per core
STOP_BELOW = 0.5  # after a round, a point whose median is below this share of its engine's best so far stops
FRAGMENT_VARIANT = 4  # the fixed layout is also timed with fragment / 4 (RLlib) or frames_per_batch / 4 (TorchRL)


def fixed_layout(engine: str, *, workers: int, envs_per_worker: int, fragment: int) -> dict[str, Any]:
    """The layout ``bench sampling`` times ``engine`` in (what ``layout=None`` builds)."""
    if engine == "rllib":
        return {"num_env_runners": workers, "num_envs_per_env_runner": envs_per_worker, "vectorize": "SYNC",
                "fragment": fragment}  # fmt: skip
    if engine == "torchrl":
        return {
            "collector": "Collector" if workers == 1 else "MultiSyncCollector",
            "workers": workers,
            "env": DEFAULT_TORCHRL_ENV,
            "envs_per_worker": envs_per_worker,
            "frames_per_batch": fragment * workers * envs_per_worker,
        }
    if engine == "crossrl":
        return {"workers": workers, "envs_per_worker": envs_per_worker}
    raise ValueError(f"bench sampling --sweep: no layouts for {engine!r}; engines: {', '.join(SWEEP_ENGINES)}")


def total_envs(engine: str, layout: dict[str, Any]) -> int:
    """Envs a layout steps in all."""
    if engine == "rllib":
        return max(int(layout["num_env_runners"]), 1) * int(layout["num_envs_per_env_runner"])
    return int(layout["workers"]) * int(layout["envs_per_worker"])


def _env_processes(env: str, envs: int, env_workers: int) -> int:
    """Processes a TorchRL batched env of ``envs`` envs starts of its own."""
    return {"SerialEnv": 0, "gym_sync": 0, "ParallelEnv": env_workers, "gym_async": envs}[env]


def processes(engine: str, layout: dict[str, Any]) -> int:
    """The processes doing a layout's sampling work (stepping envs or running the policy), counting the driver only
    where it does either: RLlib's env runners (the driver's local one for 0) plus ASYNC's one process per env;
    TorchRL's collector workers (the driver for ``Collector``) plus their batched envs' own processes; crossrl's
    evaluator actors."""
    if engine == "rllib":
        runners = max(int(layout["num_env_runners"]), 1)
        return runners + (total_envs(engine, layout) if layout["vectorize"] == "ASYNC" else 0)
    if engine == "torchrl":
        workers = int(layout["workers"])
        per = _env_processes(layout["env"], int(layout["envs_per_worker"]), int(layout.get("env_workers", 0)))
        return workers * (1 + per)
    return int(layout["workers"])


def label(engine: str, layout: dict[str, Any]) -> str:
    """A layout on one short line, e.g. ``2 runners x 8 SYNC, fragment 250`` or ``MultiSync 2 x SerialEnv(8)``."""
    if engine == "rllib":
        r, n = int(layout["num_env_runners"]), int(layout["num_envs_per_env_runner"])
        where = "local runner" if r == 0 else f"{r} runner{'s' if r != 1 else ''}"
        mode = {"VECTOR_ENTRY_POINT": "native vector"}.get(layout["vectorize"], layout["vectorize"])
        return f"{where} x {n} {mode}, fragment {layout['fragment']}"
    if engine == "torchrl":
        n, k = int(layout["envs_per_worker"]), int(layout.get("env_workers", 0))
        env = {"SerialEnv": f"SerialEnv({n})", "gym_sync": f"gym Sync({n})", "gym_async": f"gym Async({n})",
               "ParallelEnv": f"ParallelEnv({k} x SerialEnv({n // max(k, 1)}))"}[layout["env"]]  # fmt: skip
        coll = str(layout["collector"]).removesuffix("Collector") or "Collector"
        where = coll if coll == "Collector" else f"{coll} {layout['workers']} x"
        return f"{where} {env}, {layout['frames_per_batch']} frames"
    return f"{layout['workers']} x {layout['envs_per_worker']}"


def _divisor_counts(total: int, cap: int, first: int) -> list[int]:
    """``first``, then 1, 2, 4, ... up to ``cap``: the process counts that split ``total`` envs evenly."""
    counts = [first] + [2**i for i in range(int(math.log2(max(cap, 1))) + 1)]
    return [c for c in dict.fromkeys(counts) if 1 <= c <= cap and total % c == 0]


def candidates(
    engine: str, *, workers: int, envs_per_worker: int, fragment: int, native_vector: bool = False, cap: int = 4
) -> list[dict[str, Any]]:
    """Every layout of ``engine`` for ``workers x envs_per_worker`` envs with up to ``cap`` processes per knob, the
    fixed one first, then in the order the sweep prefers (those most likely to beat the fixed one first); some may
    exceed ``cap`` processes in all (:func:`grid` drops those). ``native_vector``: the env has its own vector
    class (RLlib's VECTOR_ENTRY_POINT)."""
    total = workers * envs_per_worker
    fixed = fixed_layout(engine, workers=workers, envs_per_worker=envs_per_worker, fragment=fragment)
    out = [fixed]
    small = max(fragment // FRAGMENT_VARIANT, 1)
    if engine == "crossrl":
        other = 1 if workers > 1 else 2
        if total % other == 0:
            out.append({"workers": other, "envs_per_worker": total // other})
    elif engine == "rllib":
        runners = [0, *_divisor_counts(total, cap, workers)]
        modes = [m for m in RLLIB_VECTORIZE if m != "VECTOR_ENTRY_POINT" or native_vector]

        def rl(r: int, mode: str, frag: int = fragment) -> dict[str, Any]:
            return {"num_env_runners": r, "num_envs_per_env_runner": total // max(r, 1), "vectorize": mode,
                    "fragment": frag}  # fmt: skip

        out.append(rl(0, "SYNC"))
        if native_vector:  # at the fixed runner count and in the driver; other runner counts are SYNC's question
            out += [rl(workers, "VECTOR_ENTRY_POINT"), rl(0, "VECTOR_ENTRY_POINT")]
        out += [rl(r, mode) for mode in modes if mode != "VECTOR_ENTRY_POINT" for r in runners]
        if small != fragment:
            out.append(rl(workers, "SYNC", small))
    elif engine == "torchrl":
        batch = fragment * total
        multi = [w for w in _divisor_counts(total, cap, workers) if w >= 2]

        def tr(coll: str, w: int, env: str, k: int = 0, frames: int = batch) -> dict[str, Any]:
            lay = {
                "collector": coll,
                "workers": w,
                "env": env,
                "envs_per_worker": total // w,
                "frames_per_batch": frames,
            }
            return lay | ({"env_workers": k} if env == "ParallelEnv" else {})

        # collector x batched env at one worker (Collector) and at the bench's worker count (2 for a 1-worker bench);
        # other worker counts with the fixed collector and env only
        main = multi[:1]
        out += [tr("Collector", 1, "gym_sync"), tr("Collector", 1, "SerialEnv")]
        out += [tr("MultiSyncCollector", w, "SerialEnv") for w in main]
        out += [tr("MultiAsyncCollector", w, env) for w in main for env in ("SerialEnv", "gym_sync")]
        out += [tr("MultiSyncCollector", w, DEFAULT_TORCHRL_ENV) for w in multi]
        for w in (1, *main):  # ParallelEnv: k processes per collector worker, each a SerialEnv of the rest
            coll = "Collector" if w == 1 else "MultiSyncCollector"
            out += [tr(coll, w, "ParallelEnv", k) for k in _divisor_counts(total // w, cap, 2) if k >= 2]
        out += [tr("Collector", 1, "gym_async")] + [tr("MultiSyncCollector", w, "gym_async") for w in main]
        if small != fragment:
            out.append(fixed | {"frames_per_batch": small * total})
    else:
        raise ValueError(f"bench sampling --sweep: no layouts for {engine!r}; engines: {', '.join(SWEEP_ENGINES)}")
    unique: list[dict[str, Any]] = []
    for lay in out:
        if lay not in unique:
            unique.append(lay)
    return unique


def max_processes(cores: int) -> int:
    return PROCESSES_PER_CORE * max(cores, 1)


def grid(
    engine: str,
    *,
    workers: int,
    envs_per_worker: int,
    cores: int,
    fragment: int | None = None,
    native_vector: bool = False,
    points: int | None = None,
) -> list[dict[str, Any]]:
    """``engine``'s layouts for ``workers x envs_per_worker`` envs with at most ``2 x cores`` sampling processes
    (:func:`processes`), the fixed layout first (always kept, whatever its processes), then the others in the
    sweep's order of preference; ``points``: at most that many (the fixed one included). ``fragment``: env steps
    per env per iteration (None: ``bench sampling``'s auto fragment)."""
    if fragment is None:
        fragment = auto_fragment(workers, envs_per_worker)
    cap = max_processes(cores)
    found = candidates(engine, workers=workers, envs_per_worker=envs_per_worker, fragment=fragment,
                       native_vector=native_vector, cap=cap)  # fmt: skip
    kept = found[:1] + [lay for lay in found[1:] if processes(engine, lay) <= cap]
    return kept[: max(points, 1)] if points is not None else kept


def over_cap(engine: str, *, workers: int, envs_per_worker: int, cores: int, fragment: int,
             native_vector: bool = False) -> list[str]:  # fmt: skip
    """The candidate layouts :func:`grid` leaves out for their processes, as ``label (N processes)``."""
    cap = max_processes(cores)
    found = candidates(engine, workers=workers, envs_per_worker=envs_per_worker, fragment=fragment,
                       native_vector=native_vector, cap=cap)  # fmt: skip
    return [f"{label(engine, lay)} ({processes(engine, lay)} processes)" for lay in found[1:]
            if processes(engine, lay) > cap]  # fmt: skip


def has_native_vector(env_spec: EnvSpec) -> bool:
    """Whether crossrl's core steps the env's own vector class (CartPole: yes; preprocessed pixel envs: no)."""
    from crossrl.core.envs import native_vector

    return bool(native_vector(env_spec))


def sweep(
    env_spec: EnvSpec,
    *,
    workers: int,
    envs_per_worker: int,
    engines: Sequence[str] = SWEEP_ENGINES,
    repeat: int = 3,
    seconds: float = 3.0,
    warmup_s: float = 1.0,
    fragment: int,
    model: ModelSpec,
    cores: int | None = None,
    points: int | None = None,
    stop_below: float = STOP_BELOW,
    progress: Callable[[str], None] | None = None,
    measure_fn: Callable[..., SamplerResult] = measure,
) -> LayoutSweep:
    """Time every engine's :func:`grid` over ``repeat`` interleaved rounds (round r: the engines' first points, then
    their second points, ...; each measurement a fresh process). After each round but the last, a point whose
    median so far is below ``stop_below`` x its engine's best median so far stops (the fixed layouts never do;
    0 disables). A point whose measurement fails is recorded with its error and stops, unless it is a fixed one
    (then the sweep fails). ``points``: at most that many layouts of every engine, the fixed one first (crossrl has
    two). ``measure_fn``: :func:`~.samplers.measure` (tests pass a fake)."""
    if repeat < 1:
        raise ValueError(f"bench sampling --sweep: repeat={repeat} must be >= 1")
    cores = cores or os.cpu_count() or 1
    native = has_native_vector(env_spec)
    pts: list[SweepPoint] = []
    for engine in engines:
        lays = grid(engine, workers=workers, envs_per_worker=envs_per_worker, cores=cores, fragment=fragment,
                    native_vector=native, points=points)  # fmt: skip
        for i, lay in enumerate(lays):
            pts.append(SweepPoint(engine=engine, layout=lay, label=label(engine, lay), processes=processes(engine, lay),
                                  fixed=i == 0, index=i))  # fmt: skip
    order = sorted(pts, key=lambda p: (p.index, list(engines).index(p.engine)))
    stopped: list[str] = []
    for r in range(repeat):
        for p in order:
            if p.stopped_after is not None:
                continue
            try:
                res = _measure_point(p, env_spec=env_spec, workers=workers, envs_per_worker=envs_per_worker,
                                     seconds=seconds, warmup_s=warmup_s, fragment=fragment, model=model,
                                     measure_fn=measure_fn)  # fmt: skip
            except BenchError as e:
                if p.fixed:
                    raise
                p.error, p.stopped_after = str(e)[-1500:], r
                _say(progress, f"round {r + 1}/{repeat}: {p.engine} ({p.label}): failed, left out ({_first_line(e)})")
                continue
            p.add(res)
            _say(progress, f"round {r + 1}/{repeat}: {p.engine} ({p.label}): {res.steps_per_s[0]:,.0f} steps/s")
        if r < repeat - 1 and stop_below > 0:
            for p in _stop_slow(pts, stop_below, r):
                stopped.append(p.label)
                _say(progress, f"{p.engine} ({p.label}): stopped after round {r + 1}, {p.median:,.0f} steps/s < "
                               f"{stop_below:g} x its engine's best so far")  # fmt: skip
    cond = {"workers": workers, "envs_per_worker": envs_per_worker, "total_envs": workers * envs_per_worker,
            "seconds": seconds, "warmup_s": warmup_s, "repeat": repeat, "fragment": fragment,
            "batch_env_steps": fragment * workers * envs_per_worker, "machine_cores": cores,
            "max_processes": max_processes(cores), "stop_below": stop_below, "points": points,
            "native_vector_env": native, "model": model.model_dump(mode="json"),
            "crossrl_optimizer": "sync_samples",
            "over_cap": {e: over_cap(e, workers=workers, envs_per_worker=envs_per_worker, cores=cores,
                                     fragment=fragment, native_vector=native) for e in engines}}  # fmt: skip
    return LayoutSweep(env_id=env_spec.id, points=pts, conditions=cond)


def _measure_point(
    p: SweepPoint,
    *,
    env_spec: EnvSpec,
    workers: int,
    envs_per_worker: int,
    seconds: float,
    warmup_s: float,
    fragment: int,
    model: ModelSpec,
    measure_fn: Callable[..., SamplerResult],
) -> SamplerResult:
    kw: dict[str, Any] = {"env_spec": env_spec, "model": model, "seconds": seconds, "warmup_s": warmup_s,
                          "fragment": fragment, "rss": True}  # fmt: skip
    if p.engine == "crossrl":  # its layout is its workers x envs per worker; the same fragment per env
        w, e = int(p.layout["workers"]), int(p.layout["envs_per_worker"])
        return measure_fn("crossrl", workers=w, envs_per_worker=e, optimizer="sync_samples", **kw)
    return measure_fn(p.engine, workers=workers, envs_per_worker=envs_per_worker, layout=p.layout, **kw)


def _stop_slow(points: list[SweepPoint], share: float, round_index: int) -> list[SweepPoint]:
    """The running points (not fixed) whose median so far is below ``share`` x their engine's best so far; marks
    them stopped after ``round_index``."""
    best: dict[str, float] = {}
    for p in points:
        if p.samples:
            best[p.engine] = max(best.get(p.engine, 0.0), p.median)
    out = []
    for p in points:
        if p.fixed or p.stopped_after is not None or not p.samples:
            continue
        if p.median < share * best[p.engine]:
            p.stopped_after = round_index
            p.stopped_early = True
            out.append(p)
    return out


def _first_line(e: BaseException) -> str:
    lines = [ln for ln in str(e).splitlines() if ln.strip()]
    return lines[-1][:200] if lines else type(e).__name__


def _say(progress: Callable[[str], None] | None, text: str) -> None:
    if progress is not None:
        progress(text)
