"""The ``crossrl bench`` commands as library functions: sampling (and its layout sweep), scaling, e2e, overhead,
sweep.

Each returns plain data (:mod:`crossrl.measure.bench.results`), which has ``to_json(path)``, and has a
printer there. Throughput is measured interleaved (A B C D A B C D ...), each measurement in a fresh
process with its own warm-up, and quoted as ratios of medians measured in the same run, because
absolute figures move from run to run on shared machines (DESIGN.md, "Measuring speed").
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from crossrl.measure.bench.results import (
    E2ERow,
    E2ETable,
    LayoutSweep,
    Overhead,
    SpeedTable,
    SweepRow,
    SweepTable,
    add_scaling,
    speed_rows,
)
from crossrl.measure.bench.samplers import (
    AUTO_TRAIN_BATCH,
    DEFAULT_MODEL,
    SamplerResult,
    auto_fragment,
    default_model,
    measure,
)
from crossrl.scenarios import catalog
from crossrl.scenarios import metrics as M
from crossrl.scenarios.spec import DEFAULT_TRANSPORT, EnvSpec, ModelSpec

# raw: plain processes stepping the envs with random actions; limit: the same running the policy network too
SAMPLING_ENGINES = ("raw", "limit", *catalog.ENGINES)
SCALING_ENGINES = ("raw", *catalog.ENGINES)
Progress = Callable[[str], None]  # one line of progress text


def _say(progress: Progress | None, text: str) -> None:
    if progress is not None:
        progress(text)


def _interleaved(
    contestants: Sequence[tuple[str, str | None, str | None]],
    *,
    env_spec: EnvSpec,
    workers: Sequence[int],
    envs_per_worker: int,
    repeat: int,
    seconds: float,
    warmup_s: float,
    fragments: Sequence[int | None],
    model: ModelSpec,
    progress: Progress | None,
    rss: bool = False,
) -> list[SamplerResult]:
    """Round r: for each worker count and each fragment (None: :func:`auto_fragment`), every contestant
    (engine, crossrl's optimizer, crossrl's transport) once, in order; ``repeat`` rounds. ``rss``: also read each
    env-stepping process's peak RSS."""
    if repeat < 1:
        raise ValueError(f"bench: repeat={repeat} must be >= 1")
    out = []
    for r in range(repeat):
        for w in workers:
            for fragment in fragments:
                for engine, optimizer, transport in contestants:
                    res = measure(
                        engine,
                        env_spec=env_spec,
                        workers=w,
                        envs_per_worker=envs_per_worker,
                        model=model,
                        seconds=seconds,
                        warmup_s=warmup_s,
                        fragment=fragment or auto_fragment(w, envs_per_worker),
                        optimizer=optimizer,
                        rss=rss,
                        transport=transport,
                    )
                    out.append(res)
                    frag = f" fragment {res.fragment}" if len(fragments) > 1 else ""
                    _say(progress, f"round {r + 1}/{repeat}: {res.label} w{w}{frag}: {res.steps_per_s[0]:,.0f} steps/s")
    return out


def bench_sampling(
    *,
    env_id: str = "CartPole-v1",
    env_spec: EnvSpec | None = None,
    workers: Sequence[int] = (1, 2),
    envs_per_worker: int = 8,
    repeat: int = 3,
    seconds: float = 3.0,
    engines: Sequence[str] = SAMPLING_ENGINES,
    warmup_s: float = 1.0,
    fragment: int | None = None,
    model: ModelSpec | None = None,
    progress: Progress | None = None,
    transports: Sequence[str] = (DEFAULT_TRANSPORT,),
) -> SpeedTable:
    """Pure-sampling env steps/s of each engine at each worker count, interleaved over ``repeat`` rounds.

    ``seconds``: timed wall seconds per measurement (after ``warmup_s`` s of warm-up in the same
    process). ``fragment``: env steps per env per iteration (one weight broadcast per iteration), the
    same for every engine; None: :func:`auto_fragment` per worker count.
    Include "raw", "limit" and "crossrl" in ``engines`` to get the ratios to them. ``env_spec`` (a scenario's env,
    e.g. a multi-agent one with its policy mapping; raw then steps its PettingZoo envs with random joint actions)
    replaces ``env_id``. ``model``: every engine's network; None: :func:`~.samplers.default_model` (the suite's
    conv model for a pixel env, a 64x64 tanh MLP otherwise). "limit" (one process per worker stepping the same
    vector env and running that network's batched forward pass every step, no framework) needs a single-agent
    env and is left out for a multi-agent one. Each env-stepping process's peak RSS is read after its timed part.
    """
    unknown = [e for e in engines if e not in SAMPLING_ENGINES]
    if unknown:
        raise ValueError(f"bench sampling: unknown engine(s) {unknown}; known: {', '.join(SAMPLING_ENGINES)}")
    env_spec = env_spec or EnvSpec(id=env_id)
    model = model or default_model(env_spec)
    if env_spec.multi_agent and "limit" in engines:
        engines = [e for e in engines if e != "limit"]
        _say(progress, f"limit: left out, {env_spec.id} is a multi-agent env (the limit steps single-agent envs)")
    contestants: list[tuple[str, str | None, str | None]] = []
    for e in engines:
        contestants += [(e, "sync_samples", t) for t in transports] if e == "crossrl" else [(e, None, None)]
    results = _interleaved(
        contestants,
        env_spec=env_spec, workers=workers, envs_per_worker=envs_per_worker, repeat=repeat, seconds=seconds,
        warmup_s=warmup_s, fragments=[fragment], model=model, progress=progress, rss=True,
    )  # fmt: skip
    # sync_samples is crossrl's default sampler here: label it plainly "crossrl".
    for r in results:
        r.optimizer = None
    frag: Any = fragment or {
        "auto": f"ceil({AUTO_TRAIN_BATCH} / (workers x envs_per_worker))",
        **{f"w{w}": auto_fragment(w, envs_per_worker) for w in workers},
    }
    cond = {"seconds": seconds, "warmup_s": warmup_s, "repeat": repeat, "fragment": frag,
            "model": model.model_dump(mode="json"), "network": network_line(model), "crossrl_optimizer": "sync_samples",
            "crossrl_transports": list(transports),
            "machine_cores": os.cpu_count() or 1}  # fmt: skip
    if env_spec.multi_agent:
        cond["env"] = env_spec.model_dump(mode="json", exclude_defaults=True)
    return SpeedTable(kind="sampling", env_id=env_spec.id, rows=speed_rows(results), conditions=cond)


def bench_sampling_sweep(
    *,
    env_id: str = "CartPole-v1",
    env_spec: EnvSpec | None = None,
    workers: int = 2,
    envs_per_worker: int = 8,
    repeat: int = 3,
    seconds: float = 3.0,
    engines: Sequence[str] = ("crossrl", "rllib", "torchrl"),
    warmup_s: float = 1.0,
    fragment: int | None = None,
    model: ModelSpec | None = None,
    points: int | None = None,
    stop_below: float = 0.5,
    progress: Progress | None = None,
) -> LayoutSweep:
    """``bench sampling --sweep``: per engine, its execution layouts (:func:`.layouts.grid`: RLlib's env runners,
    envs per runner, vectorisation and fragment; TorchRL's collector, batched env and frames per batch; crossrl's
    fixed layout and one more) for the same ``workers x envs_per_worker`` envs and ``fragment x`` that many env
    steps per iteration (None: :func:`auto_fragment`), within ``2 x cores`` sampling processes; each timed as
    :func:`bench_sampling` times a contestant, interleaved over ``repeat`` rounds (:func:`.layouts.sweep`: points
    below ``stop_below`` x their engine's best so far stop after a round). ``points``: at most that many layouts
    of RLlib and TorchRL each, the fixed one first (crossrl then times its fixed layout alone). Single-agent envs
    only. Returns each engine's best layout beside its fixed
    one and the whole grid (:class:`~.results.LayoutSweep`)."""
    from crossrl.measure.bench.layouts import SWEEP_ENGINES, sweep

    unknown = [e for e in engines if e not in SWEEP_ENGINES]
    if unknown or not engines:
        raise ValueError(f"bench sampling --sweep: engine(s) {unknown or 'none'}; layouts exist for "
                         f"{', '.join(SWEEP_ENGINES)}")  # fmt: skip
    if workers < 1 or envs_per_worker < 1:
        raise ValueError(f"bench sampling --sweep: workers={workers}, envs_per_worker={envs_per_worker} must be >= 1")
    env_spec = env_spec or EnvSpec(id=env_id)
    if env_spec.multi_agent:
        raise ValueError(f"bench sampling --sweep: {env_spec.id} is a multi-agent env; the sweep's layouts are for "
                         "single-agent envs")  # fmt: skip
    model = model or default_model(env_spec)
    result = sweep(
        env_spec, workers=workers, envs_per_worker=envs_per_worker, engines=engines, repeat=repeat, seconds=seconds,
        warmup_s=warmup_s, fragment=fragment or auto_fragment(workers, envs_per_worker), model=model, points=points,
        stop_below=stop_below, progress=progress,
    )  # fmt: skip
    result.conditions["network"] = network_line(model)
    return result


def network_line(model: ModelSpec) -> str:
    """The model on one line, for the table's title: ``conv [[16, 3, 1]] hidden [128] relu``."""
    conv = f"conv {[list(c) for c in model.conv]} " if model.conv else ""
    return f"{conv}hidden {list(model.hidden)} {model.activation}"


def bench_scaling(
    *,
    env_id: str = "CartPole-v1",
    env_latency_ms: float = 2.0,
    workers: Sequence[int] = (1, 2, 4, 8, 16),
    engines: Sequence[str] = SCALING_ENGINES,
    optimizers: Sequence[str] = ("sync_samples", "async_samples"),
    envs_per_worker: int = 1,
    repeat: int = 1,
    seconds: float = 3.0,
    warmup_s: float = 1.0,
    fragments: Sequence[int] = (64,),
    model: ModelSpec = DEFAULT_MODEL,
    progress: Progress | None = None,
    transports: Sequence[str] = (DEFAULT_TRANSPORT,),
) -> SpeedTable:
    """Throughput against workers on an env whose step sleeps ``env_latency_ms`` (wall time, no CPU).

    ``fragments``: env steps per worker per iteration; several make a sweep (interleaved in the same rounds:
    Ray's cost per sample call is paid once per fragment, so efficiency depends on it); speedup and
    efficiency are then per fragment.

    crossrl is measured once per optimizer in ``optimizers`` (rows "crossrl/<optimizer>"), each
    through the optimizer's own ``step()`` with a no-op learning step; ratios to crossrl use
    "crossrl/sync_samples", and once per transport in ``transports`` (rows "crossrl/<optimizer>+calls" for Ray
    calls; the default transport's rows carry no suffix). Ray is started with ``max(workers, cores)`` CPUs and every actor asks for
    one, so 16 sleeping workers fit on 2 cores. Speedup and efficiency are against the fewest workers.
    "raw" (plain processes stepping the same latency env with random actions, ``fragment`` steps per
    request over a pipe, a barrier per request like sync_samples) is the machine's own scaling limit.
    """
    unknown = [e for e in engines if e not in SAMPLING_ENGINES]
    if unknown:
        raise ValueError(f"bench scaling: unknown engine(s) {unknown}; known: {', '.join(SAMPLING_ENGINES)}")
    fragments = list(dict.fromkeys(fragments))  # a repeated value is measured once
    if not fragments or any(f < 1 for f in fragments):
        raise ValueError(f"bench scaling: fragments {fragments} must be one or more integers >= 1")
    contestants: list[tuple[str, str | None, str | None]] = []
    for e in engines:
        contestants += [(e, o, t) for o in optimizers for t in transports] if e == "crossrl" else [(e, None, None)]
    results = _interleaved(
        contestants,
        env_spec=EnvSpec(id=env_id, step_latency_ms=env_latency_ms), workers=sorted(workers),
        envs_per_worker=envs_per_worker, repeat=repeat, seconds=seconds, warmup_s=warmup_s, fragments=fragments,
        model=model, progress=progress,
    )  # fmt: skip
    rows = speed_rows(results, crossrl_label="crossrl/sync_samples")
    add_scaling(rows)
    cond = {"env_latency_ms": env_latency_ms, "seconds": seconds, "warmup_s": warmup_s, "repeat": repeat,
            "fragment": fragments[0] if len(fragments) == 1 else fragments, "ray_cpus": "max(workers, cores), 1 per actor",
            "machine_cores": os.cpu_count() or 1, "model": model.model_dump(mode="json"),
            "crossrl_transports": list(transports)}  # fmt: skip
    return SpeedTable(kind="scaling", env_id=env_id, rows=rows, conditions=cond)


def e2e_layouts(spec: Any) -> dict[str, list[tuple[str, dict[str, Any]]]]:
    """Per engine, the layouts ``bench e2e --sweep`` runs the scenario in: (label, spec overrides), the default first.

    The knobs a trial can name (``execution.layout``, crossrl's ``execution.transport``) within the machine's cap of
    two sampling processes per core that ``bench sampling --sweep`` keeps: crossrl's two transports, RLlib's SYNC and
    (for an env with its own vector class) VECTOR_ENTRY_POINT vectorisation, TorchRL's gymnasium SyncVectorEnv and its
    own SerialEnv. gymnasium's AsyncVectorEnv (a process per env, on either engine) is left out, as there."""
    from crossrl.core.envs import native_vector

    rllib = [("SYNC", {"execution.layout.rllib.vectorize": "SYNC"})]
    if native_vector(spec.env):
        rllib.append(("native vector", {"execution.layout.rllib.vectorize": "VECTOR_ENTRY_POINT"}))
    return {
        "crossrl": [("stream", {"execution.transport": "stream"}), ("calls", {"execution.transport": "calls"})],
        "rllib": rllib,
        "torchrl": [
            ("gym_sync", {"execution.layout.torchrl.env": "gym_sync"}),
            ("SerialEnv", {"execution.layout.torchrl.env": "SerialEnv"}),
        ],  # fmt: skip
    }


def bench_e2e(
    *,
    engines: Sequence[str] = ("crossrl", "rllib", "torchrl"),
    seeds: Sequence[int] = (0, 1, 2),
    store: Any = None,
    scenario: str = "cartpole-ppo",
    progress: Progress | None = None,
    limit: bool = True,
    sweep: bool = False,
    sets: dict[str, Any] | None = None,
) -> E2ETable:
    """Run ``scenario`` (PPO CartPole-v1 to 450) through the real runner; wall seconds to target per engine.

    ``limit``: then also time, in the same run, the raw env alone and crossrl's learner alone
    (:func:`e2e_parts`), and give each seed's wall seconds against the sum of the two for its env steps.
    ``sweep``: run the scenario in each engine's layouts (:func:`e2e_layouts`), one row per engine and layout, with
    the IQM of wall seconds to target over the seeds and its 95 % CI; the default layouts run first, then each
    engine's k-th other layout in the k-th next run (one run per round, so each round's trials share the machine's
    state of that moment).

    ``sets``: spec fields to override (``--set``: a lower target, a smaller budget), applied before the engines,
    seeds and stop-at-target the bench sets itself.
    ``store``: a :class:`~crossrl.reports.store.ResultsStore`; None: a throw-away one in a temp folder.
    Wall seconds are the trials' ``wall_s_to_target`` (from the clock start, set-up excluded, and reported apart);
    each trial stops at its target (``budget.stop_at_target``).
    """
    from crossrl.orchestration.runner import run_scenario
    from crossrl.reports.store import ResultsStore
    from crossrl.scenarios.loader import load

    # each trial ends at the target: what is measured is the time to reach it, not the rest of the budget
    overrides: dict[str, Any] = {
        **(sets or {}), "engines": list(engines), "seeds": list(seeds), "budget.stop_at_target": True,
    }  # fmt: skip
    spec, path = load(scenario, overrides=overrides)
    rounds: list[list[tuple[str, str, dict[str, Any]]]] = [[(e, "", {}) for e in spec.engines]]
    if sweep:
        layouts = e2e_layouts(spec)
        depth = max(len(layouts.get(e, [])) for e in spec.engines)
        rounds = [
            [(e, layouts[e][k][0], layouts[e][k][1]) for e in spec.engines if k < len(layouts.get(e, []))]
            for k in range(depth)
        ]
    rows: list[E2ERow] = []
    parent = ""
    with tempfile.TemporaryDirectory(prefix="crossrl-bench-e2e-") as tmp:
        st = store if store is not None else ResultsStore(results_dir=Path(tmp))

        def notify(event: str, payload: dict[str, Any]) -> None:
            if event == "trial_end":
                r = payload["result"]
                _say(progress, f"{r.trial.name}: {r.status}, wall_s_to_target={r.summary.get(M.WALL_S_TO_TARGET)}")

        for k, round_ in enumerate(rounds):
            extra = {key: value for _, _, o in round_ for key, value in o.items()}
            spec_k, _ = load(scenario, overrides={**overrides, "engines": [e for e, _, _ in round_], **extra})
            if sweep:
                _say(progress, f"layouts round {k + 1} of {len(rounds)}: "
                     + ", ".join(f"{e} {label}" for e, label, _ in round_))  # fmt: skip
            outcome = run_scenario(spec_k, store=st, spec_path=path, skip_unsupported=True, progress=notify,
                                   command=f"crossrl bench e2e {scenario}" + (" --sweep" if sweep else "")
                                   + "".join(f" --set {k}={v}" for k, v in (sets or {}).items()))  # fmt: skip
            parent = parent or outcome.parent_id
            table_k = e2e_table(spec_k, outcome)
            for row in table_k.rows:
                label = next((lab for e, lab, _ in round_ if e == row.engine), "")
                row.layout, row.default_layout = label, k == 0
            rows += table_k.rows
    parts = e2e_parts(spec, progress=progress) if limit else None
    if parts:
        for row in rows:
            row.limit_s = [e2e_limit_s(n, parts) for n in row.steps]
    order = {e: i for i, e in enumerate(spec.engines)}
    rows.sort(key=lambda r: (order[r.engine], not r.default_layout))
    target = spec.target.episode_return_mean
    return E2ETable(scenario=spec.name, target=target, rows=rows, parent_run_id=parent, parts=parts or {})


def bench_sweep(
    *,
    ray_address: str,
    scenario: str = "smoke",
    parallel: int = 2,
    overrides: dict[str, Any] | None = None,
    progress: Progress | None = None,
) -> SweepTable:
    """The scenario's sweep on the cluster at ``ray_address`` twice, both timed: ``parallel`` trials at once
    first, then one trial at a time (so whatever the first sweep warms, such as Ray's idle workers, helps
    the sequential one). Each into a throw-away store of its own."""
    from crossrl.orchestration.runner import run_scenario
    from crossrl.reports.store import ResultsStore
    from crossrl.scenarios.loader import load

    spec, path = load(scenario, overrides=overrides or {})
    rows = []
    for at_once in (parallel, 1):
        with tempfile.TemporaryDirectory(prefix="crossrl-bench-sweep-") as tmp:

            def notify(event: str, payload: dict[str, Any], at_once: int = at_once) -> None:
                if event == "trial_end":
                    r = payload["result"]
                    _say(progress, f"--parallel {at_once}: {r.trial.name} {r.status} ({r.wall_s:.1f} s)")

            t0 = time.perf_counter()
            outcome = run_scenario(
                spec,
                store=ResultsStore(results_dir=Path(tmp)),
                spec_path=path,
                ray_address=ray_address,
                progress=notify,
                command=f"crossrl bench sweep {scenario} --parallel {at_once}",
                parallel=at_once,
            )
            wall = time.perf_counter() - t0
        finished = sum(r.status == M.FINISHED for r in outcome.results)
        rows.append(SweepRow(at_once, len(outcome.results), finished, wall, outcome.parent_id))
    return SweepTable(scenario=spec.name, ray_address=ray_address, rows=rows)


def e2e_parts(spec: Any, *, seconds: float = 5.0, progress: Progress | None = None) -> dict[str, float]:
    """The two parts a PPO iteration of ``spec`` cannot avoid, each timed in a fresh process: the raw env alone
    (``workers x envs_per_worker`` envs in plain processes, random actions, the train batch's fragment per
    request) and crossrl's learner alone (the scenario's epochs and minibatches on one stored train batch), as
    env steps per second of each."""
    workers = spec.execution.workers[0]
    envs = spec.execution.envs_per_worker
    hp = spec.algorithm.resolved_hyperparams()
    fragment = -(-int(hp["train_batch"]) // (workers * envs))
    kw = {"env_spec": spec.env, "workers": workers, "envs_per_worker": envs, "model": spec.algorithm.model,
          "seconds": seconds, "fragment": fragment}  # fmt: skip
    raw = measure("raw", **kw)
    _say(progress, f"raw env alone, {workers} x {envs}: {raw.steps_per_s[0]:,.0f} env steps/s")
    learner = measure("learner", **kw, warmup_s=2.0, hyperparams=hp)
    per_iteration = learner.info["train_batch"] / learner.steps_per_s[0]
    _say(progress, f"learner alone: {per_iteration:.3f} s per iteration of {learner.info['train_batch']} env steps")
    return {
        "raw_env_steps_per_s": raw.steps_per_s[0],
        "learner_env_steps_per_s": learner.steps_per_s[0],
        "learner_s_per_iteration": per_iteration,
        "train_batch": float(learner.info["train_batch"]),
    }


def e2e_table(spec: Any, outcome: Any, parts: dict[str, float] | None = None) -> E2ETable:
    """Per engine of ``spec`` (a ScenarioSpec), its trials' wall seconds and env steps to the target; with
    ``parts`` (:func:`e2e_parts`) also each seed's limit: its env steps to the target through the raw env alone
    plus the learner alone."""

    rows = []
    for engine in spec.engines:
        mine = [r for r in outcome.results if r.trial.engine == engine]
        steps = [_opt(r.summary.get(M.STEPS_TO_TARGET)) for r in mine]
        rows.append(
            E2ERow(
                engine=engine,
                wall_s=[_opt(r.summary.get(M.WALL_S_TO_TARGET)) for r in mine],
                steps=steps,
                statuses=[r.status for r in mine],
                limit_s=[e2e_limit_s(n, parts) for n in steps] if parts else [],
                setup_s=[_opt(r.summary.get("setup_s")) for r in mine],
            )
        )
    target = spec.target.episode_return_mean
    return E2ETable(scenario=spec.name, target=target, rows=rows, parent_run_id=outcome.parent_id, parts=parts or {})


def e2e_limit_s(steps: float | None, parts: dict[str, float]) -> float | None:
    """Seconds the raw env alone and the learner alone need for ``steps`` env steps (None: target not reached)."""
    if steps is None:
        return None
    return steps / parts["raw_env_steps_per_s"] + steps / parts["learner_env_steps_per_s"]


def _opt(x: Any) -> float | None:
    return float(x) if x is not None else None


def bench_overhead(
    *,
    results_dir: Path | None = None,
    report_builds: int = 1,
    help_repeats: int = 5,
    rss_seconds: float = 3.0,
    rss_workers: int = 2,
    rss_envs_per_worker: int = 8,
    compare_rllib_rss: bool = True,
    progress: Progress | None = None,
) -> Overhead:
    """crossrl's own costs: store logging share of a smoke run, report build, CLI start, evaluator RSS.

    - Logging: the ``smoke`` scenario, crossrl only, 1 worker, 1 seed, through the real runner with a
      store whose ``log_points`` (and every other write) is timed; ``results_dir`` (default: a temp
      folder) holds that store.
    - Report: ``build_report`` over synthetic frames of 100 runs x 200 points, ``report_builds`` times.
    - CLI: ``crossrl --help`` as a whole process, ``help_repeats`` times.
    - Memory: peak RSS (VmHWM) of each crossrl evaluator actor after ``rss_seconds`` of sampling
      ``rss_workers x rss_envs_per_worker`` CartPole envs (and of RLlib's env runners, for reference).
    """
    with tempfile.TemporaryDirectory(prefix="crossrl-bench-overhead-") as tmp:
        run_wall, log_s, write_s = _timed_smoke_run(results_dir or Path(tmp), progress)
        _say(progress, f"smoke run {run_wall:.1f} s, log_points {log_s:.2f} s, store writes {write_s:.2f} s")
        builds = _time_report_builds(Path(tmp) / "report", report_builds)
        _say(progress, f"report builds: {', '.join(f'{b:.2f}' for b in builds)} s")
    helps = _time_help(help_repeats)
    _say(progress, f"crossrl --help: {', '.join(f'{h:.2f}' for h in helps)} s")
    env = EnvSpec(id="CartPole-v1")
    kw: dict[str, Any] = {"env_spec": env, "workers": rss_workers, "envs_per_worker": rss_envs_per_worker,
                          "seconds": rss_seconds, "rss": True}  # fmt: skip
    rss = measure("crossrl", optimizer="sync_samples", **kw).peak_rss_mb or []
    rllib_rss = (measure("rllib", **kw).peak_rss_mb or []) if compare_rllib_rss else []
    _say(progress, f"peak RSS: crossrl evaluators {rss}, rllib env runners {rllib_rss} MiB")
    return Overhead(
        run_wall_s=run_wall,
        log_points_s=log_s,
        store_writes_s=write_s,
        report_build_s=builds,
        help_s=helps,
        evaluator_peak_rss_mb=rss,
        rllib_env_runner_peak_rss_mb=rllib_rss,
        details={
            "smoke": "crossrl x 1 worker x seed 0",
            "rss_workers": rss_workers,
            "rss_envs_per_worker": rss_envs_per_worker,
        },  # fmt: skip
    )


_WRITES = ("start_parent", "start_trial", "log_points", "set_tags", "log_native_config", "log_text", "log_file",
           "finish_trial", "finish_parent")  # fmt: skip


def _timed_store(results_dir: Path) -> tuple[Any, dict[str, float]]:
    """A ResultsStore whose write methods add their wall seconds to the returned dict (by method name)."""
    from crossrl.reports.store import ResultsStore

    store = ResultsStore(results_dir=results_dir)
    spent: dict[str, float] = dict.fromkeys(_WRITES, 0.0)
    for name in _WRITES:
        original = getattr(store, name)

        def timed(*args: Any, _f: Callable[..., Any] = original, _n: str = name, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return _f(*args, **kwargs)
            finally:
                spent[_n] += time.perf_counter() - t0

        setattr(store, name, timed)
    return store, spent


def _timed_smoke_run(results_dir: Path, progress: Progress | None) -> tuple[float, float, float]:
    """(run wall s, log_points s, all store writes s) of the smoke scenario on crossrl, 1 worker, seed 0."""
    from crossrl.orchestration.runner import run_scenario
    from crossrl.scenarios.loader import load

    spec, path = load("smoke", overrides={"engines": ["crossrl"], "seeds": [0], "execution.workers": [1]})
    store, spent = _timed_store(results_dir)
    t0 = time.perf_counter()
    outcome = run_scenario(spec, store=store, spec_path=path, command="crossrl bench overhead")
    wall = time.perf_counter() - t0
    bad = [f"{r.trial.name}: {r.status} {r.reason}" for r in outcome.results if r.status != M.FINISHED]
    if bad:
        raise RuntimeError(f"bench overhead: the smoke run did not finish: {bad}")
    return wall, spent["log_points"], sum(spent.values())


def _time_report_builds(out_dir: Path, n: int, **frames: Any) -> list[float]:
    """Wall seconds of ``n`` report builds over synthetic frames (default: 100 runs x 200 points)."""
    from crossrl.measure.bench.synthetic import synthetic_frames
    from crossrl.reports.render import build_report

    trials, points, meta = synthetic_frames(**frames)
    times = []
    for i in range(n):
        t0 = time.perf_counter()
        build_report(trials=trials, points=points, meta=meta, out_dir=out_dir / f"r{i}")
        times.append(time.perf_counter() - t0)
    return times


def help_command() -> list[str]:
    """The installed ``crossrl`` script next to this Python, else the same entry point through ``-c``."""
    script = Path(sys.executable).with_name("crossrl")
    if script.exists():
        return [str(script), "--help"]
    return [sys.executable, "-c", "import sys; from crossrl.cli import main; sys.exit(main())", "--help"]


def _time_help(n: int) -> list[float]:
    cmd = help_command()
    env = {**os.environ, "COLUMNS": "100"}
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True, capture_output=True, env=env, timeout=120)
        times.append(time.perf_counter() - t0)
    return times


def bench_sac(
    *,
    env_id: str = "Pendulum-v1",
    engines: Sequence[str] = ("crossrl", "rllib", "torchrl"),
    env_steps: int = 2500,
    learning_starts: int = 500,
    hidden: Sequence[int] = (256, 256),
    train_batch: int = 256,
    limit_seconds: float = 15.0,
    progress: Progress | None = None,
) -> Any:
    """SAC's speed where it spends it, in the learner: a short SAC trial per engine through the real runner (one
    worker, one env, one update per env step of ``train_batch``) and, before and after them, the limit: a plain torch
    SAC update loop with the same networks and batch in a fresh process (:mod:`crossrl.measure.bench.sac_limit`).
    Each engine's env steps and gradient updates per second are read off its points from the first one past
    ``learning_starts`` to its last (so its random warm-up and set-up are left out)."""
    from crossrl.measure.bench.results import SacTable
    from crossrl.orchestration.runner import run_scenario
    from crossrl.reports.store import ResultsStore
    from crossrl.scenarios.spec import ScenarioSpec

    spec = ScenarioSpec.model_validate(
        {
            "name": f"bench-sac-{env_id.lower()}",
            "env": {"id": env_id},
            "algorithm": {
                "name": "sac",
                "hyperparams": {
                    "learning_starts": learning_starts,
                    "train_batch": train_batch,
                    "updates_per_step": 1.0,
                },
                "model": {"hidden": list(hidden), "activation": "relu"},
            },
            "engines": list(engines),
            "execution": {"workers": [1], "envs_per_worker": 1},
            "budget": {"env_steps": env_steps, "wall_seconds": 3600},
            "seeds": [0],
        }
    )
    import math

    import gymnasium as gym

    from crossrl.core.envs import make_env

    probe = make_env(spec.trials()[0].env)
    if not isinstance(probe.action_space, gym.spaces.Box):
        probe.close()
        raise ValueError(f"--env: {env_id} has {probe.action_space} actions; SAC needs bounded continuous (Box) ones")
    obs_dim = math.prod(probe.observation_space.shape or ())
    act_dim = math.prod(probe.action_space.shape or ())
    probe.close()
    limits = [_sac_limit(obs_dim, act_dim, hidden, train_batch, limit_seconds, progress)]
    with tempfile.TemporaryDirectory(prefix="crossrl-bench-sac-") as tmp:
        outcome = run_scenario(spec, store=ResultsStore(results_dir=Path(tmp)), command="crossrl bench sac")
        rows = []
        for result in outcome.results:
            points = [p for _, p in result.points]
            rows.append(_sac_row(result.trial.engine, result.status, points, learning_starts))
            _say(progress, f"{result.trial.name}: {result.status}")
    limits.append(_sac_limit(obs_dim, act_dim, hidden, train_batch, limit_seconds, progress))
    return SacTable(env=env_id, hidden=list(hidden), train_batch=train_batch, rows=rows, limit_updates_per_s=limits,
                    parent_run_id=outcome.parent_id)  # fmt: skip


def _sac_limit(
    obs_dim: int, act_dim: int, hidden: Sequence[int], batch: int, seconds: float, progress: Progress | None
) -> float:
    """The plain torch loop's updates per second, in a fresh process with one torch thread."""
    args = [str(obs_dim), str(act_dim), ",".join(str(h) for h in hidden), str(batch), str(seconds)]
    return _limit_process("sac_limit", args, seconds, "plain torch SAC updates", progress)


def _limit_process(module: str, args: list[str], seconds: float, label: str, progress: Progress | None) -> float:
    """``python -m crossrl.measure.bench.<module> ARGS`` with one torch thread: its JSON line's updates per second."""
    import json as _json

    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-m", f"crossrl.measure.bench.{module}", *args], env=env,
                         capture_output=True, text=True, check=True, timeout=seconds * 10 + 120)  # fmt: skip
    rate = float(_json.loads(out.stdout.strip().splitlines()[-1])["updates_per_s"])
    _say(progress, f"limit ({label}): {rate:.2f} updates/s")
    return rate


def bench_dreamer(
    *,
    env_id: str = "CartPole-v1",
    engines: Sequence[str] = ("crossrl", "rllib", "torchrl"),
    env_steps: int = 2000,
    hyperparams: dict[str, Any] | None = None,
    limit_seconds: float = 20.0,
    progress: Progress | None = None,
) -> Any:
    """DreamerV3's speed where it spends it, in the learner: a short dreamer trial per engine through the real runner
    (one worker, one env, the catalog's DreamerV3 but ``hyperparams``; by default nano, B=16 x T=64, training ratio 64:
    one update per 16 env steps) and, before and after them, the limit: crossrl's DreamerV3 update of the same
    networks and batch in a bare loop in a fresh process (:mod:`crossrl.measure.bench.dreamer_limit`). Each engine's
    env steps and updates per second are read off its points from the first one past B x T env steps (when learning
    starts) to its last."""
    from crossrl.measure.bench.results import DreamerTable
    from crossrl.orchestration.runner import run_scenario
    from crossrl.reports.store import ResultsStore
    from crossrl.scenarios.spec import ScenarioSpec

    hp = {"model_size": "nano", "training_ratio": 64.0, **(hyperparams or {})}
    spec = ScenarioSpec.model_validate(
        {
            "name": f"bench-dreamer-{env_id.lower()}",
            "env": {"id": env_id},
            "algorithm": {"name": "dreamer", "hyperparams": hp},
            "engines": list(engines),
            "execution": {"workers": [1], "envs_per_worker": 1},
            "budget": {"env_steps": env_steps, "wall_seconds": 3600},
            "seeds": [0],
        }
    )
    resolved = spec.trials()[0].hyperparams
    learning_starts = int(resolved["batch_size_B"]) * int(resolved["batch_length_T"])
    if learning_starts >= env_steps:
        raise ValueError(f"--env-steps {env_steps} must exceed B x T = {learning_starts}: nothing would train")
    limits = [_dreamer_limit(env_id, resolved, limit_seconds, progress)]
    with tempfile.TemporaryDirectory(prefix="crossrl-bench-dreamer-") as tmp:
        outcome = run_scenario(spec, store=ResultsStore(results_dir=Path(tmp)), command="crossrl bench dreamer")
        rows = []
        for result in outcome.results:
            points = [p for _, p in result.points]
            rows.append(_sac_row(result.trial.engine, result.status, points, learning_starts))
            _say(progress, f"{result.trial.name}: {result.status}")
    limits.append(_dreamer_limit(env_id, resolved, limit_seconds, progress))
    return DreamerTable(
        env=env_id,
        model_size=str(resolved["model_size"]),
        batch=f"{resolved['batch_size_B']} x {resolved['batch_length_T']}",
        horizon=int(resolved["horizon_H"]),
        rows=rows,
        limit_updates_per_s=limits,
        parent_run_id=outcome.parent_id,
    )


def _dreamer_limit(env_id: str, hp: dict[str, Any], seconds: float, progress: Progress | None) -> float:
    """crossrl's DreamerV3 update in a bare loop, updates per second, in a fresh process with one torch thread."""
    import json as _json

    args = [env_id, _json.dumps(dict(hp)), str(seconds)]
    return _limit_process("dreamer_limit", args, seconds, "crossrl's DreamerV3 update alone", progress)


def _sac_row(engine: str, status: str, points: Sequence[dict[str, float]], learning_starts: int) -> Any:
    from crossrl.measure.bench.results import SacRow

    learning = [p for p in points if p.get(M.ENV_STEPS_SAMPLED, 0) > learning_starts and M.DIAG_UPDATES in p]
    if len(learning) < 2:
        return SacRow(engine, status, None, None)
    first, last = learning[0], learning[-1]
    dt = last[M.WALL_TIME_S] - first[M.WALL_TIME_S]
    if dt <= 0:
        return SacRow(engine, status, None, None)
    steps = (last[M.ENV_STEPS_SAMPLED] - first[M.ENV_STEPS_SAMPLED]) / dt
    updates = (last[M.DIAG_UPDATES] - first[M.DIAG_UPDATES]) / dt
    return SacRow(engine, status, steps, updates)
