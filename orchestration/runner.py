"""Runs a scenario's trials, each in its own child process, and records every one in the store.

Isolation: one process (and its own Ray cluster, torch threads, memory) per trial, in its own
session, so a crash, a hang or an engine's global state cannot touch the next trial. The runner
enforces the wall-clock budget (TIMEOUT), keeps partial metrics (points are streamed as they come),
records FAILED with the traceback and goes on, and on a stop signal (Ctrl-C; SIGTERM or SIGHUP under
`stop_on_signals`, as `crossrl run` does) marks the running trial KILLED, closes the parent run and stops.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import selectors
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from crossrl.adapters import checkpoints
from crossrl.adapters.registry import engine_ids, require_supported, unsupported
from crossrl.core.cluster import LOCAL_RAY_ENV, disconnect
from crossrl.orchestration.procs import UsageMeter, kill_procs, process_tree
from crossrl.orchestration.signals import Interrupted, deferred_signals, deliver, held_signals
from crossrl.orchestration.trials import Carried, Progress, TrialRecorder, TrialResult, open_trial
from crossrl.orchestration.watch import TrialWatch
from crossrl.reports.journal import Journal, JournalError
from crossrl.reports.store import HEARTBEAT_S, ResultsStore, StoreError
from crossrl.scenarios import metrics as M
from crossrl.scenarios.loader import SpecError
from crossrl.scenarios.spec import BEST, EnvSpec, ScenarioSpec, Trial

KILL_GRACE_S = 5.0
RAW_PROBE_LIMIT_S = 30.0  # the raw-speed probe's child process: building the envs, 50 warm-up steps, 1 s measured
STORE_WAIT_S = 60.0  # at the end of a run, how long to wait for the store to have every write


@dataclass
class RunOutcome:
    parent_id: str  # the store's run id; a journal ref (``@1``) when the store does not have the run yet
    experiment_id: str | None
    results: list[TrialResult]  # every trial of the run: a resumed run's kept ones (read back from the store) first
    interrupted: bool = False
    stop_signal: int | None = None  # the signal that stopped the run (SIGINT for Ctrl-C), when interrupted
    unsent: int = 0  # journaled writes the store did not have when the run ended (`crossrl sync` sends them)
    journal: Path | None = None
    store_error: str = ""  # the store's last error while it was unreachable

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in self.results:
            out[r.status] = out.get(r.status, 0) + 1
        return out


class _TreeMeter(UsageMeter):
    """Peak RSS and CPU seconds of a process and all its descendants (Ray's workers included)."""

    def __init__(self, pid: int) -> None:
        super().__init__()
        self.root = psutil.Process(pid)

    def sample(self) -> None:
        self.measure(process_tree(self.root.pid))

    def kill_all(self) -> None:
        """SIGTERM every process seen in the tree (re-parented ones too), SIGKILL what is left after a grace period."""
        self.sample()
        kill_procs(self.known.values(), grace_s=KILL_GRACE_S)


def child_env() -> dict[str, str]:
    """The trial process's environment: Ray on loopback, and one intra-op thread per process for every
    engine alike (more threads than cores made each engine slower here: a PPO minibatch step took 20 ms
    with 1 torch thread and 490 ms with 2 on a loaded 2-core machine)."""
    env = {**os.environ, **LOCAL_RAY_ENV, "PYTHONUNBUFFERED": "1"}
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("MKL_NUM_THREADS", "1")
    env.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    return env


class Heartbeat:
    """Beats the parent run's heartbeat at most every HEARTBEAT_S (called from the runner's loop)."""

    def __init__(self, store: ResultsStore, parent_id: str) -> None:
        self.store, self.parent_id = store, parent_id
        self.last = time.monotonic()

    def __call__(self) -> None:
        if time.monotonic() - self.last >= HEARTBEAT_S:
            self.last = time.monotonic()
            with contextlib.suppress(JournalError):  # a journal that cannot take a beat: the next write says so
                self.store.heartbeat(self.parent_id)


def _run_one(
    trial: Trial,
    *,
    store: ResultsStore,
    run_id: str,
    progress: Progress,
    log_dir: Path,
    beat: Callable[[], None] = lambda: None,
    carried: Carried | None = None,
) -> TrialResult:
    """One trial in a child process; the store always ends with the trial's status and what it logged. ``carried``:
    the points of the attempt a resumed trial continues, up to its checkpoint."""
    rec = TrialRecorder(trial, store=store, run_id=run_id, progress=progress)
    if carried is not None:
        rec.carry_over(carried)
    result = rec.result
    log_path = log_dir / f"{trial.name}.log"
    t0 = time.perf_counter()
    partial = b""
    deadline = t0 + trial.budget.wall_seconds

    watch = TrialWatch(log_dir / f"{trial.name}.watch", stall_seconds=trial.budget.stall_seconds)
    read_fd, write_fd = os.pipe()
    with held_signals() as early:  # a stop asked while the trial process starts is taken in the try below
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "crossrl.orchestration.trial_proc", str(write_fd)],
                stdin=subprocess.PIPE,
                stdout=log,
                stderr=subprocess.STDOUT,
                pass_fds=(write_fd,),
                start_new_session=True,
                env={**child_env(), **watch.env()},
            )
        os.close(write_fd)
        assert proc.stdin is not None
        proc.stdin.write(trial.model_dump_json().encode())
        proc.stdin.close()
        meter = _TreeMeter(proc.pid)
        sel = selectors.DefaultSelector()
        sel.register(read_fd, selectors.EVENT_READ)
    eof = False
    try:
        deliver(early)
        while not eof:
            if time.perf_counter() > deadline:
                meter.kill_all()
                result.status = M.TIMEOUT
                result.reason = f"wall-clock budget of {trial.budget.wall_seconds:g} s exceeded"
                break
            for _key, _ in sel.select(timeout=0.5):
                chunk = os.read(read_fd, 1 << 16)
                if not chunk:
                    eof = True
                    break
                partial += chunk
                *lines, partial = partial.split(b"\n")
                with deferred_signals():  # store writes: never interrupted half-way (a held sqlite lock)
                    for line in lines:
                        if line.strip():
                            rec.handle(json.loads(line))
            meter.sample()
            beat()
            if rec.setup_s is not None:
                watch.arm()
            verdict = watch.check()
            with deferred_signals():
                rec.flush_if_due()
                rec.warn(watch.warnings())
            if verdict is not None:  # the env broke or nothing steps: the trial ends now, on every engine alike
                meter.kill_all()
                rec.failed(verdict)
                break
        else:
            try:
                code = proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                meter.kill_all()
                code = proc.wait()
            rec.ended(code == 0, f"trial process exited with code {code}")
            fault = watch.fault()
            if fault is not None:  # the engine's own error (or none, if it went on) gives way to the guard's words
                rec.failed(fault)
    except KeyboardInterrupt as e:
        stop = Interrupted.of(e)
        result.status, result.reason = M.KILLED, f"interrupted ({stop.label})"
        stop.result = result
        with held_signals():  # the trial's processes go, whatever else is asked meanwhile
            meter.kill_all()
        raise stop from None
    finally:
        with held_signals() as late:  # the trial's end reaches the store whole, a stop signal or not
            sel.close()
            os.close(read_fd)
            if proc.poll() is None:
                meter.kill_all()
            watch.close()
            rec.record_end(
                wall_s=time.perf_counter() - t0,
                peak_rss=meter.peak_rss,
                cpu_seconds=meter.cpu_seconds,
                log_path=log_path,
            )
        if late:  # asked to stop while the end was being recorded: the trial stands as recorded
            try:
                deliver(late)
            except KeyboardInterrupt as e:
                stop = Interrupted.of(e)
                stop.result = result
                raise stop from None
    return result


def run_scenario(
    spec: ScenarioSpec,
    *,
    store: ResultsStore,
    spec_path: Path | None = None,
    ray_address: str | None = None,
    skip_unsupported: bool = False,
    progress: Progress | None = None,
    command: str = "",
    resume: str | None = None,
    store_wait_s: float = STORE_WAIT_S,
    parallel: int = 1,
    placement: str = "node",
    kind: str = "parent",
    tags: Mapping[str, str] | None = None,
    refused: Mapping[str, str] | None = None,
    max_retries: int | None = None,
    layouts: Mapping[tuple[str, int], Mapping[str, Any]] | None = None,
) -> RunOutcome:
    """Run every trial of ``spec`` (engines x workers x seeds); unsupported ones are SKIPPED or refused.

    Raises ``SpecError`` before anything is stored when a trial is unsupported and
    ``skip_unsupported`` is false. A stop (KeyboardInterrupt: Ctrl-C, or SIGTERM / SIGHUP under
    :func:`~crossrl.orchestration.signals.stop_on_signals`) marks the running trial KILLED with its partial
    metrics and the signal's name as reason, closes the parent run KILLED with its counts and returns
    with ``interrupted=True`` and ``stop_signal``; trials already finished stay as they are. Store writes
    are never cut half-way by a stop signal: it is taken once the write is done.

    ``resume`` (a parent run id, or ``"latest"``: the scenario's newest) takes up an earlier run of the
    same spec under the same parent run: only its trials that did not end (interrupted, killed with the
    runner, never started) run again; the interrupted attempts are kept, marked superseded; the trials that had ended
    are read back into the outcome, so its results and counts are the whole run's. Refused
    (``SpecError``) when the spec's fingerprint differs or the run is still alive.

    Every write goes first to a journal under the results folder and from there to the store in a sender
    thread (reports/journal.py), so an unreachable store never stops or slows a trial. At the end the run
    waits up to ``store_wait_s`` for the store to have every write; ``outcome.unsent`` counts what it has
    not (``crossrl sync`` sends it later). A journal that cannot be written (a full disk) raises
    ``JournalError`` once the running trial's processes are gone.

    ``parallel`` > 1 fans the trials out over the Ray cluster at ``ray_address`` (a local one on 127.0.0.1
    without it), up to ``parallel`` at once, each in a placement group (``placement``: ``node`` keeps a trial's
    processes on one node, ``spread`` lets them spread; ``spread`` fans out at ``parallel`` 1 too, one trial at a
    time); see ``crossrl.orchestration.fanout``. Raises ``SpecError``
    before anything is stored when a trial cannot fit the cluster. ``kind``: the parent run's ``crossrl.kind``
    (`crossrl tune`'s test-seed runs are "tuned"; ``resume`` then takes up a run of that kind); ``tags`` go on the parent
    run as it starts (`crossrl tune` finds its test-seed runs by them, a run killed part-way included). ``refused``:
    trials the caller found their engine would refuse at start (trial name -> why, as `crossrl validate` says):
    recorded SKIPPED with that reason, as unsupported ones are. ``max_retries``: how many times a fanned-out trial lost
    with its node (or its actor) is started again from its newest checkpoint (``fanout.MAX_RETRIES`` by default).
    ``layouts``: (engine, workers) -> the layout those trials run in, where the spec's says ``best``
    (:mod:`crossrl.measure.bench.best_layout` resolves them); a ``best`` left unresolved is a ``SpecError``.
    """
    trials, bad = plan_trials(
        spec,
        ray_address=ray_address,
        skip_unsupported=skip_unsupported,
        parallel=parallel,
        placement=placement,
        layouts=layouts,
    )
    bad = {**(refused or {}), **bad}
    notify = progress or (lambda _event, _payload: None)
    start = _starting_point(store, spec, trials, resume=resume, kind=kind, notify=notify)
    journal = store.start_journal(warn=lambda msg: notify("store_warning", {"message": msg}))
    try:
        parent_id = _open_parent(store, spec, start, spec_path=spec_path, command=command, kind=kind, tags=tags)
        outcome = RunOutcome(parent_id=parent_id, experiment_id=None, results=list(start.kept), journal=journal.path)
        _run_trials(
            store,
            spec,
            start.trials,
            outcome,
            bad=bad,
            attempts=start.attempts,
            notify=notify,
            fresh=resume is None,
            fan_out=(parallel, placement) if fans_out(parallel, placement) else None,
            carried=start.carried,
            max_retries=max_retries,
        )
    except JournalError:
        store.end_journal(wait_s=min(store_wait_s, 10.0))  # what the journal holds goes on to the store
        raise
    except BaseException:
        store.end_journal(wait_s=0.0)  # stopped before the parent run opened; the journal keeps what it holds
        raise
    finally:
        if fans_out(parallel, placement):
            disconnect()  # leaves the cluster (a local one started for the sweep stops)
    _close_journal(store, outcome, journal, wait_s=store_wait_s)
    outcome.parent_id = store.resolve(outcome.parent_id)
    for r in outcome.results:
        r.run_id = store.resolve(r.run_id)
    if not outcome.unsent:
        with contextlib.suppress(Exception):
            outcome.experiment_id = store.experiment_id(spec.name, create=False)
    return outcome


def fans_out(parallel: int, placement: str) -> bool:
    """Whether the trials go out over the Ray cluster, each in a placement group: ``--parallel`` 2 or more, or
    ``--placement spread`` (then one trial at a time too, its processes spread over the nodes: how figures measured on
    one node are checked across nodes)."""
    return parallel > 1 or placement == "spread"


def plan_trials(
    spec: ScenarioSpec,
    *,
    ray_address: str | None,
    skip_unsupported: bool,
    parallel: int,
    placement: str,
    layouts: Mapping[tuple[str, int], Mapping[str, Any]] | None = None,
) -> tuple[list[Trial], dict[str, str]]:
    """The run's trials (bound to the launcher's cluster when fanned out, in ``layouts``' layout where it names their
    engine and workers) and the unsupported ones' reasons (name -> why); ``SpecError`` when one is unsupported and not
    to be skipped, when a fanned-out trial cannot fit, or when a layout still says ``best``."""
    if parallel < 1:
        raise SpecError([f"--parallel must be at least 1, got {parallel}"])
    trials = with_layouts(spec.trials(ray_address=ray_address), layouts)
    if not skip_unsupported:
        require_supported(trials)
    if placement not in ("node", "spread"):  # fanout.PLACEMENTS' keys (fanout imports Ray: only when it is used)
        raise SpecError([f"--placement must be one of node, spread, got {placement!r}"])
    if fans_out(parallel, placement):
        from crossrl.orchestration import fanout

        # the trials join the launcher's cluster
        trials = with_layouts(spec.trials(ray_address=fanout.connect_launcher(ray_address)), layouts)
        fanout.check_fits(trials, placement=placement)
    return trials, {t.name: reason for t, reason in unsupported(trials)}


def with_layouts(trials: list[Trial], layouts: Mapping[tuple[str, int], Mapping[str, Any]] | None) -> list[Trial]:
    """``trials`` in the layouts ``layouts`` names for their (engine, workers); ``SpecError`` for a trial whose layout
    still says ``best`` (only `crossrl run` resolves it)."""
    chosen = layouts or {}
    out = [
        t.model_copy(update={"layout": dict(chosen[(t.engine, t.workers)])}) if (t.engine, t.workers) in chosen else t
        for t in trials
    ]
    unresolved = sorted({t.engine for t in out if BEST in t.layout.values()})
    if unresolved:
        raise SpecError([
            f"execution.layout: 'best' for {', '.join(unresolved)} is resolved by `crossrl run` (from the stored "
            "layout sweeps); name a layout here instead"
        ])  # fmt: skip
    return out


@dataclass
class StartingPoint:
    """Where a run starts: the trials to run (each bound to its checkpoint folder, and to the checkpoint it resumes
    from), and for a resumed run its parent, the trials it keeps and the earlier attempts of the others."""

    trials: list[Trial]
    checkpoint_root: Path
    resumed_id: str = ""  # the parent run taken up ("" for a new run)
    root_tagged: bool = True  # the parent run already names its checkpoint folder
    kept: list[TrialResult] = field(default_factory=list)  # a resumed run's trials that ended, read back
    attempts: dict[str, list[str]] = field(default_factory=dict)  # trial -> its unfinished attempts' run ids
    carried: dict[str, Carried] = field(default_factory=dict)  # trial -> the checkpoint it continues from


def _starting_point(
    store: ResultsStore, spec: ScenarioSpec, trials: list[Trial], *, resume: str | None, kind: str, notify: Progress
) -> StartingPoint:
    if resume is None:
        start = StartingPoint(trials=trials, checkpoint_root=new_checkpoint_root(store, spec))
    else:
        resumed_id, kept, attempts, root = _resume_point(store, spec, resume, trials, kind=kind)
        left = [t for t in trials if t.name not in {r.trial.name for r in kept}]
        checkpoint_root = Path(root) if root else new_checkpoint_root(store, spec)
        carried = checkpoints_to_resume(store, left, attempts, checkpoint_root, notify)
        start = StartingPoint(left, checkpoint_root, resumed_id, bool(root), kept, attempts, carried)
        for t in left:  # what each trial continues from, said before it starts
            if t.name in carried:
                notify("resumed", {"trial": t, "env_step": carried[t.name].env_step})
            elif t.name in attempts:
                notify("restarted", {"trial": t, "why": "no checkpoint"})
    start.trials = [
        t.model_copy(
            update={
                "checkpoint_dir": str(start.checkpoint_root / t.name),
                "resume_from": str(start.carried[t.name].folder) if t.name in start.carried else None,
            }
        )
        for t in start.trials
    ]
    return start


def _open_parent(
    store: ResultsStore, spec: ScenarioSpec, start: StartingPoint, *, spec_path: Path | None, command: str, kind: str,
    tags: Mapping[str, str] | None,
) -> str:  # fmt: skip
    """The run's parent run: a new one, or the resumed one reopened; tagged with its checkpoint folder."""
    if not start.resumed_id:
        parent_id = store.start_parent(spec, spec_path=spec_path, command=command, kind=kind)
        store.set_tags(parent_id, {CHECKPOINT_ROOT_TAG: str(start.checkpoint_root), **(tags or {})}, what="run tags")
        return parent_id
    store.reopen_parent(start.resumed_id)
    if not start.root_tagged:
        store.set_tags(start.resumed_id, {CHECKPOINT_ROOT_TAG: str(start.checkpoint_root)}, what="checkpoint folder")
    return start.resumed_id


def _close_journal(store: ResultsStore, outcome: RunOutcome, journal: Journal, *, wait_s: float) -> None:
    """Waits up to ``wait_s`` for the store to have every write; what it has not is counted in ``outcome.unsent``
    (with the store's last error). A stop while waiting leaves the rest in the journal and marks the run stopped."""
    sender = store.sender
    try:
        outcome.unsent = store.end_journal(wait_s=wait_s)
    except KeyboardInterrupt as e:  # stopped while waiting for the store: what is left stays in the journal
        assert sender is not None
        sender.close(0.0)
        outcome.unsent = sender.unsent(journal)
        if not outcome.interrupted:
            outcome.interrupted, outcome.stop_signal = True, Interrupted.of(e).signum
    if outcome.unsent and sender is not None:
        outcome.store_error = sender.last_error


def _run_trials(
    store: ResultsStore,
    spec: ScenarioSpec,
    trials: list[Trial],
    outcome: RunOutcome,
    *,
    bad: dict[str, str],
    attempts: dict[str, list[str]],
    notify: Progress,
    fresh: bool,
    fan_out: tuple[int, str] | None = None,
    carried: dict[str, Carried] | None = None,
    max_retries: int | None = None,
) -> None:
    """The trials, one after another (or ``fan_out`` = (parallel, placement) at once over a Ray cluster), then
    the parent run's ending (see run_scenario); writes go to the journal."""
    parent_id = outcome.parent_id
    started: tuple[Trial, str] | None = None  # the trial run opened last
    stopped = ""  # the parent's reason when a stop signal ends the run
    try:
        resolved = store.wait_resolved(parent_id, timeout_s=5.0)
        # kept: the trials of a resumed run that had ended (in outcome.results already), not run again
        notify("start", {"trials": trials, "parent_id": resolved, "kept": len(outcome.results)})
        probe_ok = _log_raw_speed(store, parent_id, spec, step=0) if fresh else True
        beat = Heartbeat(store, parent_id)
        with tempfile.TemporaryDirectory(prefix="crossrl-logs-") as tmp:
            fanned = [t for t in trials if t.name not in bad] if fan_out is not None else []
            for index, trial in enumerate(t for t in trials if t not in fanned):  # all but those fanned out
                with deferred_signals():  # a stop asked meanwhile comes once the run id is known
                    run_id = open_trial(store, parent_id, trial, spec=spec, attempts=attempts)
                    started = (trial, run_id)
                if trial.name in bad:
                    _record_skipped(store, trial, run_id, bad[trial.name], outcome, notify)
                    continue
                notify("trial_start", {"trial": trial, "index": index, "total": len(trials)})
                outcome.results.append(
                    _run_one(
                        trial,
                        store=store,
                        run_id=run_id,
                        progress=notify,
                        log_dir=Path(tmp),
                        beat=beat,
                        carried=(carried or {}).get(trial.name),
                    )
                )
            if fan_out is not None and fanned:
                from crossrl.orchestration.fanout import run_fanned_out

                started = None  # the fanned-out trials' ends are recorded by run_fanned_out, a stop included
                run_fanned_out(
                    fanned,
                    parallel=fan_out[0],
                    placement=fan_out[1],
                    store=store,
                    parent_id=parent_id,
                    spec=spec,
                    results=outcome.results,
                    progress=notify,
                    beat=beat,
                    log_dir=Path(tmp),
                    attempts=attempts,
                    carried=carried,
                    **({} if max_retries is None else {"max_retries": max_retries}),
                )
        if probe_ok:  # an env that failed the probe once is not probed again (a hang would cost its limit twice)
            _log_raw_speed(store, parent_id, spec, step=1)
    except KeyboardInterrupt as e:  # Ctrl-C, or SIGTERM / SIGHUP under stop_on_signals
        stop = Interrupted.of(e)
        outcome.interrupted, outcome.stop_signal = True, stop.signum
        stopped = f"interrupted ({stop.label})"
        with held_signals():  # the store is closed whole; the stop is under way already
            if isinstance(stop.result, TrialResult):  # the trial _run_one ended and recorded
                outcome.results.append(stop.result)
            elif started is not None and started[1] not in {r.run_id for r in outcome.results}:
                trial, run_id = started  # stopped between opening the trial run and starting its process
                store.finish_trial(run_id, status=M.KILLED, reason=stopped)
                outcome.results.append(TrialResult(trial=trial, run_id=run_id, status=M.KILLED, reason=stopped))
    status = M.KILLED if outcome.interrupted else M.FINISHED
    with held_signals() as late:
        store.finish_parent(parent_id, status=status, counts=outcome.counts(), reason=stopped)
    if late and not outcome.interrupted:  # the run ended whole; the stop asked meanwhile still stops the caller
        outcome.interrupted, outcome.stop_signal = True, late[0]


def _record_skipped(
    store: ResultsStore, trial: Trial, run_id: str, reason: str, outcome: RunOutcome, notify: Progress
) -> None:
    store.finish_trial(run_id, status=M.SKIPPED, reason=reason)
    result = TrialResult(trial=trial, run_id=run_id, status=M.SKIPPED, reason=reason)
    outcome.results.append(result)
    notify("trial_end", {"result": result})


ENDED = (M.FINISHED, M.FAILED, M.TIMEOUT, M.SKIPPED)  # a trial in one of these needs no new attempt on resume


def parent_to_resume(store: ResultsStore, scenario: str, resume: str) -> Any:
    """The parent run ``--resume`` names: the scenario's newest (``latest``) or the one with that id."""
    if resume == "latest":
        parents = store.parent_runs(scenario)
        if not parents:
            raise StoreError(f"--resume: no earlier `crossrl run` of {scenario!r} in {store.uri}")
        return parents[0]
    return store.parent_run(resume)


def stored_spec(store: ResultsStore, parent: Any, *, label: str) -> ScenarioSpec:
    """The spec a run set out to run, as it stored it at its start (its overrides and its selection of engines,
    workers and seeds applied): what ``--resume`` finishes."""
    from crossrl.reports.store import SPEC_ARTIFACT
    from crossrl.scenarios.loader import validate

    try:
        raw = json.loads(store.artifact_bytes(str(parent.info.run_id), SPEC_ARTIFACT))
    except Exception as e:
        raise StoreError(f"--resume: run {parent.info.run_id} has no readable {SPEC_ARTIFACT} ({e})") from None
    return validate(raw, label=label, engines=engine_ids())


def spec_differences(before: Mapping[str, Any], after: Mapping[str, Any], prefix: str = "") -> list[str]:
    """The dotted fields whose values differ between two spec dumps (a field present in one only included)."""
    out: list[str] = []
    for key in sorted(set(before) | set(after)):
        a, b = before.get(key), after.get(key)
        if isinstance(a, Mapping) and isinstance(b, Mapping):
            out += spec_differences(a, b, f"{prefix}{key}.")
        elif a != b:
            out.append(f"{prefix}{key}")
    return out


def _resume_point(
    store: ResultsStore, spec: ScenarioSpec, resume: str, trials: Sequence[Trial], *, kind: str = "parent"
) -> tuple[str, list[TrialResult], dict[str, list[str]], str]:
    """The parent run to resume, its trials that ended (read back), its unfinished attempts (name -> ids, oldest
    first) and its checkpoint folder ("" for a run from before checkpoints)."""
    parent = parent_to_resume(store, spec.name, resume)
    if parent.info.status == "RUNNING" and str(parent.info.run_id) in store.reap_orphans():
        parent = store.parent_run(str(parent.info.run_id))  # its owner had died without closing it: KILLED now
    parent_id, tags = str(parent.info.run_id), parent.data.tags
    if tags.get("crossrl.kind") != kind or tags.get("scenario") != spec.name:
        what = "a `crossrl run`" if kind == "parent" else f"a {kind!r} run"
        raise SpecError([f"--resume: run {parent_id} is not {what} of scenario {spec.name!r}"])
    if parent.info.status == "RUNNING":
        owner = f"pid {tags.get('owner.pid', '?')} on {tags.get('owner.host', '?')}"
        raise SpecError([f"--resume: run {parent_id} is still running ({owner}); stop it first or wait for it"])
    if tags.get("fingerprint") != spec.fingerprint():
        raise SpecError(
            [
                f"--resume: the spec's fingerprint {spec.fingerprint()} differs from run {parent_id}'s "
                f"{tags.get('fingerprint')}: the spec changed since that run; resume it with the spec it ran "
                "(its spec.json artifact) or start a new run"
            ]
        )
    kept, attempts = ended_trials(store, parent, trials)
    return parent_id, kept, attempts, tags.get(CHECKPOINT_ROOT_TAG, "")


def ended_trials(
    store: ResultsStore, parent: Any, trials: Sequence[Trial]
) -> tuple[list[TrialResult], dict[str, list[str]]]:
    """The trials of a parent run (a run's trials, a search's configurations) that ended, read back as results (a
    search's values, tag ``search.values``, in their hyperparams), and the attempts of those that did not (name -> run
    ids, oldest first)."""
    by_name = {t.name: t for t in trials}
    kept: list[TrialResult] = []
    attempts: dict[str, list[str]] = {}
    for run in sorted(store.children(parent), key=lambda r: r.info.start_time or 0):
        name, status = str(run.info.run_name), run.data.tags.get("status", "")
        if name not in by_name:
            continue
        if status in ENDED:
            values = json.loads(run.data.tags.get("search.values", "{}"))
            trial = by_name[name].model_copy(update={"hyperparams": {**by_name[name].hyperparams, **values}})
            metrics = run.data.metrics
            summary: dict[str, float | None] = {
                k: metrics[k]
                for k in (M.FINAL_RETURN_MEAN, M.STEPS_TO_TARGET, M.CPU_SECONDS, "setup_s")
                if k in metrics
            }
            kept.append(
                TrialResult(
                    trial=trial,
                    run_id=str(run.info.run_id),
                    status=status,
                    reason=run.data.tags.get("reason", ""),
                    points=store.points_of(str(run.info.run_id)),
                    summary=summary,
                    wall_s=((run.info.end_time or 0) - (run.info.start_time or 0)) / 1000 if run.info.end_time else 0.0,
                )
            )
        else:
            attempts.setdefault(name, []).append(str(run.info.run_id))
    return kept, attempts


CHECKPOINT_ROOT_TAG = "checkpoint.root"  # on a parent run: the folder of its trials' checkpoints


def new_checkpoint_root(store: ResultsStore, spec: ScenarioSpec) -> Path:
    """A new run's checkpoint folder: ``<results>/checkpoints/<scenario>/<UTC time>-<random>`` (known before the store
    has the run, so a run started while the store is unreachable has one too)."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    return store.results_dir / "checkpoints" / spec.name / f"{stamp}-{uuid.uuid4().hex[:8]}"


def checkpoints_to_resume(
    store: ResultsStore,
    trials: list[Trial],
    attempts: dict[str, list[str]],
    root: Path,
    notify: Progress,
) -> dict[str, Carried]:
    """Each trial that an interrupted attempt left a good checkpoint for: the checkpoint and the points that attempt
    logged up to it. A corrupted or truncated checkpoint is passed over (one warning line each) for the one before;
    a checkpoint of another spec or trial raises SpecError."""
    out: dict[str, Carried] = {}
    for trial in trials:
        if trial.name not in attempts:
            continue
        try:
            found = checkpoints.newest_good(
                root / trial.name,
                fingerprint=trial.fingerprint,
                trial=trial.name,
                warn=lambda msg, t=trial: notify("warning", {"trial": t, "message": msg}),  # type: ignore[misc]
            )
        except checkpoints.CheckpointMismatch as e:
            raise SpecError([f"--resume: {e}"]) from None
        if found is None:
            continue
        folder, meta = found
        step = int(meta["env_steps_sampled"])
        points: list[tuple[int, dict[str, float]]] = []
        source = ""
        for run_id in reversed(attempts[trial.name]):  # the newest attempt that logged anything
            logged = store.points_of(run_id)
            if logged:
                points, source = [(s, p) for s, p in logged if s <= step], run_id
                break
        out[trial.name] = Carried(
            folder=folder, env_step=step, train_s=float(meta["train_s"]), points=points, run=source
        )
    return out


def _log_raw_speed(store: ResultsStore, parent_id: str, spec: ScenarioSpec, *, step: int) -> bool:
    """This machine's raw gymnasium speed for the scenario's env and envs-per-worker, measured before (step 0)
    and after (step 1) the trials, so throughput can be read as a ratio to it on whatever machine ran this.
    False when the env failed the probe (then the tag ``raw_speed_error.<step>`` says why).

    The simulated ``step_latency_ms`` is left out: it is part of the scenario, not of the machine, so a
    latency added to the env shows as a lower ratio instead of cancelling out.
    """
    env = spec.env.model_copy(update={"step_latency_ms": 0.0})
    speed, error = raw_speed_probe(env, num_envs=spec.execution.envs_per_worker)
    if error:  # a user's env may fail here too; the trials will record how
        store.set_tags(parent_id, {f"raw_speed_error.{step}": error})
        return False
    store.log_points(parent_id, [(step, {M.RAW_ENV_STEPS_PER_S: speed})])
    return True


def raw_speed_probe(
    env: EnvSpec, *, num_envs: int, seconds: float = 1.0, limit_s: float = RAW_PROBE_LIMIT_S
) -> tuple[float, str]:
    """:func:`crossrl.core.rawspeed.raw_env_steps_per_s` in a child process of its own, ended after ``limit_s``:
    (env steps per second, "") or (0, the problem on one line). The user's env never runs in the runner's process,
    so a hang or a crash there costs at most ``limit_s``."""
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "crossrl.core.rawspeed", str(num_envs), repr(seconds)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=err,
            start_new_session=True,
            env=child_env(),
        )
        try:
            out, _ = proc.communicate(env.model_dump_json().encode(), timeout=limit_s)
        except subprocess.TimeoutExpired:
            return 0.0, f"the env did not step through the raw-speed probe within {limit_s:g} s (does it hang?)"
        finally:  # a hang, or a stop signal meanwhile: the probe goes, whatever it started with it
            if proc.poll() is None:
                kill_procs(process_tree(proc.pid), grace_s=0)
                proc.wait()
        err.seek(0)
        problem = " ".join(err.read().decode(errors="replace").split())[-500:]
    if proc.returncode != 0:
        return 0.0, problem or f"the raw-speed probe exited with code {proc.returncode}"
    try:
        return float(out.decode().strip().splitlines()[-1]), ""
    except (ValueError, IndexError):
        return 0.0, f"the raw-speed probe printed no speed ({out[-200:]!r})"


def finite(x: float | None) -> bool:
    return x is not None and math.isfinite(x)
