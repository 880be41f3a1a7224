"""A sweep's trials fanned out over a Ray cluster: up to N at once, each in a Ray actor of its own.

Each trial runs in a :class:`TrialHost` actor (its own worker process, so engines keep their global state
apart, as in a trial process on one machine) inside a placement group of one bundle for the trial's driver
and one per worker. By default the group is ``STRICT_PACK``: every process of the trial on one node, so its
speed figures are one node's; ``spread`` lets Ray place the bundles across nodes. The group captures the
actors the engine starts (crossrl's evaluators, RLlib's env runners, TorchRL's Ray collectors), so they run
in the trial's bundles, on its node.

The launcher (the ``crossrl run`` process) is the only writer of the store: hosts hand their messages over
when asked (:meth:`TrialHost.take`), and the launcher records them as a trial process's messages
(:class:`~crossrl.orchestration.runner.TrialRecorder`). No node needs the store's address. The actors belong to
the launcher's Ray job: if the launcher dies, Ray ends them, and ``crossrl run --resume`` reruns the trials
that did not end. Each trial is tagged with its node and the trials that ran on that node meanwhile
(``node.shared_with``): throughput measured beside other trials is marked as such in the report.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import queue
import shutil
import signal
import socket
import tempfile
import threading
import time
import traceback
import uuid
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from crossrl.adapters import checkpoints
from crossrl.adapters.base import MetricSink
from crossrl.core.cluster import group_actor_pids
from crossrl.core.envguard import WATCH_DIR_ENV, register_stacks
from crossrl.orchestration.procs import UsageMeter
from crossrl.orchestration.signals import Interrupted, deferred_signals, held_signals
from crossrl.orchestration.trials import Carried, Progress, TrialRecorder, TrialResult, open_trial
from crossrl.orchestration.watch import TrialWatch, Verdict
from crossrl.reports.store import ResultsStore
from crossrl.scenarios import metrics as M
from crossrl.scenarios.loader import SpecError
from crossrl.scenarios.spec import ScenarioSpec, Trial

PLACEMENTS = {"node": "STRICT_PACK", "spread": "SPREAD"}
NODE_DIR_ENV = "CROSSRL_NODE_DIR"  # where a node keeps its trials' own files (log, checkpoints before shipping)
ATTEMPT_TAG, RETRY_AFTER_TAG = "attempt", "retry.after"  # on a trial started again: its attempt (2, 3, ...) and why
LOST_TAGS = ("lost.node.id", "lost.node.host", "lost.env_step")  # on an attempt lost with its node or actor
SHIP_TAG = "checkpoint.ship_s_total"  # on a trial: seconds its checkpoints took to reach the launcher (pack + unpack)
MAX_RETRIES = 2  # a trial lost with its node (or its actor) is started again this many times at most
LOST_WAIT_S = 60.0  # how long a dead host's node may still count as alive before the host alone is called dead
TAKE_WAIT_S = 0.5  # a host waits this long for a first message before answering with none
LOG_TAIL_BYTES = 4 << 20  # the most of a trial's log that comes back with it
USAGE_EVERY_S = 2.0
WATCH_EVERY_S = 0.5  # how often a host reads its trial's watch folder
# the trial's processes: one torch / OpenMP thread each, as for a trial process on one machine
HOST_ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "MLFLOW_DISABLE_TELEMETRY": "true"}


class _QueueSink(MetricSink):
    def __init__(self, trial: Trial, out: queue.Queue[dict[str, Any]], on_setup: Callable[[], None]) -> None:
        self._out, self._on_setup = out, on_setup
        super().__init__(trial)

    def _emit(self, message: dict[str, Any]) -> None:
        if message["kind"] == "setup":
            self._on_setup()
        self._out.put(message)


def node_dir() -> str:
    """The folder a trial's host keeps its own files in on its node: ``$CROSSRL_NODE_DIR`` (set where the node's Ray
    was started) or the system's temporary folder."""
    return os.environ.get(NODE_DIR_ENV) or tempfile.gettempdir()


def _verdict_message(verdict: Verdict) -> dict[str, Any]:
    return {"kind": "verdict", **dataclasses.asdict(verdict)}


class TrialHost:
    """One trial in a Ray actor: the engine trains in a thread, the launcher takes its messages.

    The engines' own output (stdout, stderr) goes to the trial's log, which comes back at the end (:meth:`log`).
    """

    def __init__(
        self, trial_json: str, *, ship_checkpoints: bool = False, resume: tuple[str, bytes] | None = None
    ) -> None:
        self._trial = Trial.model_validate_json(trial_json)
        self._dir = Path(tempfile.mkdtemp(prefix="crossrl-trial-", dir=node_dir()))
        self._ship = ship_checkpoints
        update: dict[str, Any] = {}
        if ship_checkpoints and self._trial.checkpoint_dir is not None:
            # checkpoints are written on this node, then shipped to the launcher with the trial's messages (take):
            # they outlive this node, and the launcher's folder is never written from here
            update["checkpoint_dir"] = str(self._dir / "checkpoints")
        if resume is not None:  # the launcher's checkpoint to continue from, unpacked on this node
            update["resume_from"] = str(checkpoints.unpack(self._dir / "resume", resume[0], resume[1]))
        self._trial = self._trial.model_copy(update=update)
        self._log = self._dir / f"{self._trial.name}.log"
        fd = os.open(self._log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
        self._out: queue.Queue[dict[str, Any]] = queue.Queue()
        self._usage = _Usage()
        self._fewest_free: float | None = None
        # The env guard's folder for this trial's processes (its runtime env names it; the actors the engine starts
        # inherit it): faults and stalls end the trial from here, as the runner's watch does for a trial process.
        watch_dir = os.environ.get(WATCH_DIR_ENV)
        # A trial spread over nodes steps envs where this host cannot see their beats: no stall before one is seen.
        stall = self._trial.budget.stall_seconds
        self._watch = TrialWatch(Path(watch_dir), stall_seconds=stall, require_beat=True) if watch_dir else None
        self._ended = threading.Event()
        register_stacks()
        threading.Thread(target=self._train, name="crossrl-trial", daemon=True).start()
        if self._watch is not None:
            threading.Thread(target=self._watching, name="crossrl-watch", daemon=True).start()

    def _train(self) -> None:
        try:
            from crossrl.adapters.registry import load_adapter

            on_setup = self._watch.arm if self._watch is not None else lambda: None
            load_adapter(self._trial.engine, multi_agent=self._trial.env.multi_agent).run(
                self._trial, _QueueSink(self._trial, self._out, on_setup)
            )
        except BaseException as e:  # report everything, as a trial process does
            tb = traceback.format_exc()
            print(tb, flush=True)
            fault = self._watch.fault() if self._watch is not None else None  # the guard's words, on every engine
            if not self._ended.is_set():
                self._ended.set()
                self._out.put(
                    _verdict_message(fault)
                    if fault is not None
                    else {"kind": "error", "error": f"{type(e).__name__}: {e}", "traceback": tb}
                )
            return
        if not self._ended.is_set():
            self._ended.set()
            self._out.put({"kind": "done"})

    def _watching(self) -> None:
        assert self._watch is not None
        while not self._ended.wait(WATCH_EVERY_S):
            for message in self._watch.warnings():
                self._out.put({"kind": "warning", "message": message})
            verdict = self._watch.check()
            if verdict is not None and not self._ended.is_set():
                self._ended.set()  # the launcher ends the host (and the engine's actors with it) on this error
                self._out.put(_verdict_message(verdict))

    def where(self) -> dict[str, str]:
        import ray

        return {"id": ray.get_runtime_context().get_node_id(), "host": socket.gethostname(), "pid": str(os.getpid())}

    def take(self, wait_s: float = TAKE_WAIT_S) -> dict[str, Any]:
        """The messages so far (waiting up to ``wait_s`` for a first one), and the trial's memory and CPU use."""
        messages: list[dict[str, Any]] = []
        with contextlib.suppress(queue.Empty):
            messages.append(self._out.get(timeout=wait_s))
            while True:
                messages.append(self._out.get_nowait())
        if self._ship:
            messages = [self._shipped(m) if m.get("kind") == "checkpoint" else m for m in messages]
        from crossrl.core.cluster import group_free_cpus

        # the fewest CPUs the group had free: 0 once the engine's workers hold the group's CPUs (they were
        # started inside it), the workers' count if they took CPUs elsewhere in the cluster
        free = group_free_cpus()
        if free is not None:
            self._fewest_free = free if self._fewest_free is None else min(self._fewest_free, free)
        self._usage.sample()
        usage = self._usage
        return {
            "messages": messages,
            "peak_rss": usage.peak_rss,
            "cpu_seconds": usage.cpu_seconds,
            "whole": usage.whole,
            "group_free_cpus": self._fewest_free,
        }

    def _shipped(self, msg: dict[str, Any]) -> dict[str, Any]:
        """A checkpoint message with the checkpoint itself (:func:`checkpoints.pack`) and the seconds packing took; one
        already pruned for a newer one (this node keeps ``checkpoint.keep``) goes without it."""
        t0 = time.perf_counter()
        try:
            data = checkpoints.pack(Path(msg["path"]))
        except OSError:
            return {**msg, "path": ""}
        return {**msg, "data": data, "pack_s": time.perf_counter() - t0}

    def log(self) -> bytes:
        with open(self._log, "rb") as f:
            f.seek(max(0, self._log.stat().st_size - LOG_TAIL_BYTES))
            return f.read()

    def close(self) -> None:
        """Removes what the trial left on this node (its log, its local checkpoints), once the launcher has them."""
        shutil.rmtree(self._dir, ignore_errors=True)


class CheckpointKeeper:
    """Checkpoints for trials the launcher does not drive itself (a search's, run by Ray Tune's trial actors): a Ray
    actor on the launcher's node that stores what trials ship under each trial's checkpoint folder there (as
    :meth:`Sweep.received` does) and hands back the one a trial started again is to continue from."""

    def __init__(self) -> None:
        self._plans: dict[str, str] = {}  # trial -> the checkpoint folder its next start continues from

    def store(self, root: str, name: str, data: bytes, keep: int) -> str:
        """``data`` (:func:`checkpoints.pack`) as ``root/name``, the newest ``keep`` kept; its path here, or "" for one
        that did not come whole."""
        try:
            folder = checkpoints.unpack(Path(root), name, data)
            checkpoints.prune(Path(root), keep)
        except (checkpoints.CheckpointError, OSError):
            return ""
        return str(folder)

    def plan(self, trial: str, folder: str) -> None:
        """The trial's next start continues from ``folder`` (a checkpoint stored here)."""
        self._plans[trial] = folder

    def planned(self, trial: str) -> tuple[str, bytes] | None:
        """The checkpoint planned for the trial's start, packed (once: a later start has its own plan, or none)."""
        folder = self._plans.pop(trial, "")
        if not folder or not Path(folder).is_dir():
            return None
        return Path(folder).name, checkpoints.pack(Path(folder))


def start_keeper() -> Any:
    """A :class:`CheckpointKeeper` on this (the launcher's) node, holding no CPU."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    here = NodeAffinitySchedulingStrategy(node_id=ray.get_runtime_context().get_node_id(), soft=False)
    return ray.remote(CheckpointKeeper).options(num_cpus=0, scheduling_strategy=here).remote()  # type: ignore[attr-defined]


class _Usage(UsageMeter):
    """Peak RSS and CPU seconds of the host process and the actors of its placement group on this node."""

    def __init__(self) -> None:
        super().__init__()
        self._pids: list[int] = []
        self._pids_at = 0.0
        self.whole = True  # False once the group's actors cannot be listed: then this process alone

    def _group_pids(self) -> list[int]:
        if self.whole and time.monotonic() - self._pids_at > 10.0:
            self._pids_at = time.monotonic()
            try:  # the GCS actor table: a private Ray API, so any failure means this process alone
                pids = group_actor_pids()
                if pids is not None:
                    self._pids = pids
            except Exception:
                self.whole = False
        return self._pids

    def sample(self) -> None:
        mine = []
        for pid in {os.getpid(), *self._group_pids()}:
            with contextlib.suppress(psutil.Error):
                mine.append(self.known.get(pid) or psutil.Process(pid))
        self.measure(mine)


@dataclass
class RunningTrial:
    """A trial the launcher started: its placement group, then its host, and what it reported so far."""

    trial: Trial
    rec: TrialRecorder
    group: Any
    group_ready: Any
    queued_at: float
    host: Any = None
    take: Any = None
    where: Any = None
    node: dict[str, str] = field(default_factory=dict)
    started: float | None = None  # when its host was placed (its wall-clock budget counts from here)
    ended: float | None = None
    peak_rss: float = 0.0
    cpu_seconds: float = 0.0
    usage_whole: bool = True  # memory and CPU counted over the trial's actors, not its driver alone
    group_free_cpus: float | None = None  # the fewest CPUs the trial's group had free while it ran
    watch_dir: str = ""  # the env guard's folder of the trial's processes (crossrl.orchestration.watch)
    lost: tuple[float, str] | None = None  # its host died: since when (monotonic) and what the call raised
    ship_s: float = 0.0  # seconds spent shipping its checkpoints to the launcher (pack + unpack)
    bundles_on: dict[str, int] = field(default_factory=dict)  # node id -> how many of its group's bundles it holds


def bundles(trial: Trial) -> list[dict[str, float]]:
    """The trial's placement group: one CPU for its driver (the host), one per worker."""
    return [{"CPU": 1.0}] + [{"CPU": 1.0} for _ in range(trial.workers)]


def bundles_per_node(group: Any) -> dict[str, int]:
    """Node id -> how many of a (ready) placement group's bundles it holds: where a trial's driver and workers are."""
    from ray.util import placement_group_table

    with contextlib.suppress(Exception):  # Ray's state API may be unreachable: then nothing is said of it
        return dict(Counter(placement_group_table(group).get("bundles_to_node_id", {}).values()))
    return {}


def spread_tags(bundles_on: dict[str, int]) -> dict[str, str]:
    """``placement.nodes`` (how many nodes the trial's group spans) and ``placement.bundles`` (its bundles per node,
    most first, as ``node-id-prefix:count``); nothing when it is not known."""
    if not bundles_on:
        return {}
    counts = sorted(bundles_on.items(), key=lambda kv: (-kv[1], kv[0]))
    return {
        "placement.nodes": str(len(counts)),
        "placement.bundles": ",".join(f"{node[:8]}:{n}" for node, n in counts),
    }


def check_fits(trials: list[Trial], *, placement: str) -> None:
    """Refuse, before anything runs, a trial no node of the cluster can hold (it would wait for ever)."""
    import ray

    nodes = [n for n in ray.nodes() if n.get("Alive")]
    biggest = max((float(n["Resources"].get("CPU", 0.0)) for n in nodes), default=0.0)
    total = sum(float(n["Resources"].get("CPU", 0.0)) for n in nodes)
    problems = []
    for t in trials:
        need = sum(b["CPU"] for b in bundles(t))
        room = biggest if placement == "node" else total
        if need > room:
            where = (
                f"one node (the biggest has {biggest:g} CPUs)" if placement == "node" else f"the cluster ({total:g})"
            )
            problems.append(
                f"trial {t.name} needs {need:g} CPUs ({t.workers} workers + its driver) on {where}: lower "
                "execution.workers, add bigger nodes" + (", or --placement spread" if placement == "node" else "")
            )
    if problems:
        raise SpecError(problems)


def connect_launcher(ray_address: str | None, *, num_cpus: int | None = None) -> str:
    """Join the cluster at ``ray_address`` (or start a local one on 127.0.0.1 with ``num_cpus`` logical CPUs, this
    machine's by default); returns its address.

    ``ray.init`` puts its own SIGTERM handler in place (``sys.exit(15)``: exit code 15, no trial recorded as
    KILLED); the launcher's handler (``stop_on_signals``) is put back.
    """
    from crossrl.core import cluster

    on_term = signal.getsignal(signal.SIGTERM)
    try:
        return cluster.connect(ray_address, num_cpus=num_cpus or os.cpu_count())["ray_gcs_address"]
    finally:
        if on_term is not None and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, on_term)


def run_fanned_out(
    trials: list[Trial],
    *,
    parallel: int,
    placement: str,
    store: ResultsStore,
    parent_id: str,
    spec: ScenarioSpec,
    results: list[TrialResult],
    progress: Progress,
    beat: Any,
    log_dir: Path,
    attempts: dict[str, list[str]],
    carried: dict[str, Carried] | None = None,
    max_retries: int = MAX_RETRIES,
) -> None:
    """Run ``trials`` (each already bound to the cluster's address) up to ``parallel`` at once; append each
    result to ``results`` as it ends. A trial whose host died for a reason not its own (its node lost, its actor
    killed) is started again from its newest checkpoint, up to ``max_retries`` times. A stop (KeyboardInterrupt) kills
    every running trial, records it KILLED, and is raised again as :class:`Interrupted`."""
    sweep = Sweep(
        store=store, parent_id=parent_id, spec=spec, placement=placement, results=results, progress=progress,
        log_dir=log_dir, attempts=attempts, carried=carried or {}, trials=trials, max_retries=max_retries,
    )  # fmt: skip
    try:
        while sweep.waiting or sweep.running:
            while sweep.waiting and len(sweep.running) < parallel:
                sweep.start(sweep.waiting.popleft())
            sweep.advance()
            if not sweep.collect():
                time.sleep(0.2)
            beat()
            sweep.flush()
    except KeyboardInterrupt as e:
        stop = Interrupted.of(e)
        sweep.kill_all(f"interrupted ({stop.label})")
        raise stop from None
    finally:
        sweep.release()  # an error in the launcher itself: nothing of the sweep is left behind


class Sweep:
    """The launcher's side of a fanned-out sweep: each trial's placement group, then its host actor on the group's
    node, then the messages it takes from the host, until the trial ends and is recorded.

    Checkpoints come back with the messages and are stored under the trial's checkpoint folder in the launcher's
    results folder (a node may go, and its disk with it); a trial started again gets its checkpoint shipped back."""

    def __init__(
        self, *, store: ResultsStore, parent_id: str, spec: ScenarioSpec, placement: str, results: list[TrialResult],
        progress: Progress, log_dir: Path, attempts: dict[str, list[str]], carried: dict[str, Carried],
        trials: list[Trial], max_retries: int = MAX_RETRIES,
    ) -> None:  # fmt: skip
        import ray

        self.store, self.parent_id, self.spec, self.placement = store, parent_id, spec, placement
        self.results, self.progress, self.log_dir = results, progress, log_dir
        self.attempts, self.carried, self.total = attempts, carried, len(trials)
        self.waiting: deque[Trial] = deque(trials)
        self.index = {t.name: i for i, t in enumerate(trials)}
        self.max_retries = max_retries
        self.retries: dict[str, int] = {}  # trial -> how many times it was started again
        self.lost_on: dict[str, str] = {}  # trial -> the node (or actor) its last attempt was lost with
        self.host_cls = ray.remote(TrialHost)
        self.running: dict[str, RunningTrial] = {}
        self.history: list[RunningTrial] = []  # every trial placed so far, for who shared a node with whom

    def start(self, trial: Trial) -> None:
        """Opens the trial's run and asks the cluster for its placement group."""
        from ray.util.placement_group import placement_group

        with deferred_signals():
            run_id = open_trial(self.store, self.parent_id, trial, spec=self.spec, attempts=self.attempts)
        group = placement_group(bundles(trial), strategy=PLACEMENTS[self.placement], name=f"crossrl-{run_id}")
        rec = TrialRecorder(trial, store=self.store, run_id=run_id, progress=self.progress)
        if trial.name in self.carried:
            rec.carry_over(self.carried[trial.name])
        if trial.name in self.retries:  # the attempt it is, and why it was started again
            tags = {ATTEMPT_TAG: str(self.retries[trial.name] + 1), RETRY_AFTER_TAG: self.lost_on[trial.name]}
            self.store.set_tags(run_id, tags, what="retry tags")
        self.running[trial.name] = RunningTrial(trial, rec, group, group.ready(), queued_at=time.perf_counter())
        self.progress("trial_start", {"trial": trial, "index": self.index.get(trial.name, 0), "total": self.total})

    def place(self, r: RunningTrial) -> None:
        """Starts the trial's host actor in its (ready) placement group; a trial that continues from a checkpoint gets
        it shipped along (the node it lands on may never have seen it)."""
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        strategy = PlacementGroupSchedulingStrategy(
            r.group, placement_group_bundle_index=0, placement_group_capture_child_tasks=True
        )
        r.bundles_on = bundles_per_node(r.group)
        r.watch_dir = os.path.join(tempfile.gettempdir(), f"crossrl-watch-{r.trial.name}-{uuid.uuid4().hex[:8]}")
        env_vars = {**HOST_ENV, WATCH_DIR_ENV: r.watch_dir}
        resume = None
        if r.trial.resume_from:
            folder = Path(r.trial.resume_from)
            resume = (folder.name, checkpoints.pack(folder))
        r.host = self.host_cls.options(  # type: ignore[attr-defined]
            num_cpus=1, scheduling_strategy=strategy, runtime_env={"env_vars": env_vars}
        ).remote(r.trial.model_dump_json(), ship_checkpoints=True, resume=resume)
        r.where = r.host.where.remote()
        r.started = time.perf_counter()
        self.history.append(r)

    def advance(self) -> None:
        """One look at every running trial: place it once its group is ready, learn its node, ask its host for what
        it has, judge a dead host, end it at its wall-clock budget."""
        import ray

        now = time.perf_counter()
        for r in list(self.running.values()):
            if r.lost is not None:
                self.judge(r)
                continue
            if r.host is None:
                ready, _ = ray.wait([r.group_ready], timeout=0)
                if ready:
                    self.place(r)
                continue
            if r.where is not None:
                ready, _ = ray.wait([r.where], timeout=0)
                if ready:
                    with contextlib.suppress(Exception):
                        self.located(r, ray.get(r.where))
                    r.where = None
            if r.take is None:
                r.take = r.host.take.remote()
            budget = r.trial.budget.wall_seconds
            if r.started is not None and now - r.started > budget:
                r.rec.result.status = M.TIMEOUT
                r.rec.result.reason = f"wall-clock budget of {budget:g} s exceeded"
                self.finish(r)

    def located(self, r: RunningTrial, node: dict[str, str]) -> None:
        """The trial's host answered where it runs: tagged at once (a running trial's node is seen in the store), and
        a trial started again after a loss says where it went on."""
        r.node = node
        with deferred_signals():
            self.store.set_tags(r.rec.run_id, {"node.id": node["id"], "node.host": node["host"]}, what="node tags")
        if r.trial.name in self.retries:
            carried = self.carried.get(r.trial.name)
            self.progress(
                "retried",
                {"trial": r.trial, "node": _where(node), "env_step": carried.env_step if carried else None,
                 "lost": self.lost_on[r.trial.name], "attempt": self.retries[r.trial.name] + 1},
            )  # fmt: skip

    def collect(self) -> bool:
        """Waits up to TAKE_WAIT_S for a host's answer and hands its messages to the trial's recorder (checkpoints
        stored in the launcher's folder first); a trial that ended is recorded; a host that died is judged
        (:meth:`judge`). False when no host was asked anything."""
        import ray

        takes = {r.take: r for r in self.running.values() if r.take is not None}
        if not takes:
            return False
        ready, _ = ray.wait(list(takes), num_returns=1, timeout=TAKE_WAIT_S)
        for ref in ready:
            r = takes[ref]
            r.take = None
            try:
                answer = ray.get(ref)
            except Exception as e:  # the host died: its node went away, it was killed, or it ran out of memory
                first = str(e).splitlines()[0][:200] if str(e) else ""
                r.lost = (time.monotonic(), f"{type(e).__name__}: {first}")
                self.judge(r)
                continue
            r.peak_rss = max(r.peak_rss, float(answer["peak_rss"]))
            r.cpu_seconds = max(r.cpu_seconds, float(answer["cpu_seconds"]))
            r.usage_whole = bool(answer["whole"])
            if answer["group_free_cpus"] is not None:
                r.group_free_cpus = float(answer["group_free_cpus"])
            with deferred_signals():
                for msg in answer["messages"]:
                    r.rec.handle(self.received(r, msg) if msg.get("kind") == "checkpoint" else msg)
            if r.rec.done or r.rec.error is not None:
                r.rec.ended(True, "trial actor ended")
                self.finish(r)
        return True

    def received(self, r: RunningTrial, msg: dict[str, Any]) -> dict[str, Any]:
        """A checkpoint the host shipped, stored under the trial's checkpoint folder here (the newest ``keep``
        kept); the message then names it here. One that did not come whole is a warning: the trial goes on."""
        data = msg.pop("data", None)
        if data is None or r.trial.checkpoint_dir is None:
            return {**msg, "path": ""}
        root = Path(r.trial.checkpoint_dir)
        t0 = time.perf_counter()
        try:
            folder = checkpoints.unpack(root, Path(msg["path"]).name, data)
            checkpoints.prune(root, r.trial.checkpoint.keep)
        except (checkpoints.CheckpointError, OSError) as e:
            r.rec.handle({"kind": "warning", "message": f"checkpoint at env step {msg['env_step']} not stored: {e}"})
            return {**msg, "path": ""}
        ship_s = float(msg.pop("pack_s", 0.0)) + time.perf_counter() - t0
        r.ship_s += ship_s
        return {**msg, "path": str(folder), "ship_s": ship_s}

    def judge(self, r: RunningTrial) -> None:
        """A host that died: its node lost (Ray says it is no longer alive), or, after LOST_WAIT_S with its node alive,
        the host alone (killed, out of memory). Either way the trial ends KILLED naming the node and the env step, and
        is started again from its newest checkpoint while it has retries left."""
        assert r.lost is not None
        since, error = r.lost
        alive = node_alive(r.node.get("id", ""))
        if alive and time.monotonic() - since < LOST_WAIT_S:
            return  # Ray may not have seen the node go yet
        lost = mark_lost(r.rec, self.store, r.node, alive=alive, error=error)
        name = r.trial.name
        again = self.retries.get(name, 0) < self.max_retries
        self.finish(r, superseded=again)
        if again:
            self.retry(r.trial, r.rec, lost)

    def retry(self, trial: Trial, rec: TrialRecorder, lost: str) -> None:
        """The trial queued first, to start again from its newest good checkpoint here (from the start without one),
        its lost attempt superseded by the new one, which carries that attempt's points up to the checkpoint."""
        name = trial.name
        self.retries[name] = self.retries.get(name, 0) + 1
        self.lost_on[name] = lost
        self.attempts.setdefault(name, []).append(rec.run_id)
        found = carried_from_newest(
            trial, rec, warn=lambda msg: self.progress("warning", {"trial": trial, "message": msg})
        )
        if found is None:
            self.carried.pop(name, None)
            again = trial.model_copy(update={"resume_from": None})
        else:
            self.carried[name] = found
            again = trial.model_copy(update={"resume_from": str(found.folder)})
        self.progress(
            "retry",
            {"trial": trial, "lost": lost, "attempt": self.retries[name] + 1, "of": self.max_retries + 1,
             "env_step": None if found is None else found.env_step},
        )  # fmt: skip
        self.waiting.appendleft(again)

    def flush(self) -> None:
        with deferred_signals():
            for r in self.running.values():
                r.rec.flush_if_due()

    def stop_host(self, r: RunningTrial) -> None:
        import ray
        from ray.util.placement_group import remove_placement_group

        if r.host is not None:
            with contextlib.suppress(Exception):
                ray.kill(r.host)
        with contextlib.suppress(Exception):
            remove_placement_group(r.group)

    def finish(self, r: RunningTrial, *, superseded: bool = False) -> None:
        """Record the trial's end (its status already set) and free its group; a ``superseded`` attempt (started
        again) is recorded in the store but is not one of the sweep's results."""
        import ray

        r.ended = time.perf_counter()
        log_path: Path | None = None
        if r.host is not None and r.lost is None:
            with contextlib.suppress(Exception):
                log_path = self.log_dir / f"{r.trial.name}.log"
                log_path.write_bytes(ray.get(r.host.log.remote(), timeout=30))
            with contextlib.suppress(Exception):
                ray.get(r.host.close.remote(), timeout=30)
        self.stop_host(r)
        if r.watch_dir:  # the host's node's folder: removed here when the launcher shares that node
            shutil.rmtree(r.watch_dir, ignore_errors=True)
        with held_signals():
            if r.node:
                self.store.set_tags(r.rec.run_id, self.placement_tags(r), what="placement tags")
            if r.ship_s:
                self.store.set_tags(r.rec.run_id, {SHIP_TAG: f"{r.ship_s:.3f}"}, what="checkpoint shipping")
            r.rec.record_end(
                wall_s=(r.ended - (r.started or r.queued_at)),
                peak_rss=r.peak_rss,
                cpu_seconds=r.cpu_seconds,
                log_path=log_path if log_path is not None and log_path.exists() else None,
            )
        if not superseded:
            self.results.append(r.rec.result)
        del self.running[r.trial.name]

    def placement_tags(self, r: RunningTrial) -> dict[str, str]:
        """Where the trial ran, and with which other trials it shared that node while it ran."""
        shared = sorted(
            o.trial.name
            for o in self.history
            if o is not r and o.node.get("id") and o.node.get("id") == r.node.get("id") and _overlap(o, r)
        )
        return {
            "node.id": r.node["id"],
            "node.host": r.node["host"],
            "node.shared_with": ",".join(shared),
            "node.shared": str(bool(shared)).lower(),
            "placement": self.placement,
            **spread_tags(r.bundles_on),
            "usage.scope": "trial" if r.usage_whole else "driver (Ray's state API unavailable)",
            **({} if r.group_free_cpus is None else {"placement.free_cpus": f"{r.group_free_cpus:g}"}),
        }

    def kill_all(self, reason: str) -> None:
        """Every running trial goes, and is recorded KILLED with ``reason``, whatever else is asked meanwhile."""
        with held_signals():
            for r in list(self.running.values()):
                r.rec.result.status, r.rec.result.reason = M.KILLED, reason
                self.finish(r)

    def release(self) -> None:
        for r in list(self.running.values()):
            self.stop_host(r)


def carried_from_newest(trial: Trial, rec: TrialRecorder, *, warn: Callable[[str], None]) -> Carried | None:
    """Where a lost attempt's trial starts again: its newest good checkpoint in the launcher's folder and the attempt's
    points up to it (None without one: from the start)."""
    if trial.checkpoint_dir is None:
        return None
    found = checkpoints.newest_good(
        Path(trial.checkpoint_dir), fingerprint=trial.fingerprint, trial=trial.name, warn=warn
    )
    if found is None:
        return None
    folder, meta = found
    step = int(meta["env_steps_sampled"])
    points = [(s, v) for s, v in rec.result.points if s <= step]
    return Carried(folder, step, float(meta["train_s"]), points, rec.run_id)


def mark_lost(rec: TrialRecorder, store: ResultsStore, node: dict[str, str], *, alive: bool, error: str = "") -> str:
    """A trial's attempt ends KILLED (not its fault: a retry or `--resume` runs it again) because its host died: its
    node lost (``alive`` False) or its actor alone; the reason names the node and the env step, the tags say the same.
    Returns what the attempt was lost with, for the retry's console line and ``retry.after`` tag."""
    step = rec.result.points[-1][0] if rec.result.points else 0
    where = f"node {_where(node)}" if node else "an unknown node"
    detail = f" ({error})" if error else ""
    if alive:
        rec.result.reason, lost = (
            f"trial actor died on {where} at env step {step:,}{detail}",
            f"its actor on {where} died",
        )
    else:
        rec.result.reason, lost = f"{where} was lost at env step {step:,}{detail}", f"{where} was lost"
    rec.result.status = M.KILLED
    with deferred_signals():
        tags = dict(zip(LOST_TAGS, (node.get("id", ""), node.get("host", ""), str(step)), strict=True))
        store.set_tags(rec.run_id, tags, what="lost-node tags")
    return lost


def _where(node: dict[str, str]) -> str:
    return f"{node.get('host', '?')} ({node.get('id', '?')[:12]})"


def node_alive(node_id: str) -> bool:
    """Whether Ray counts the node alive (True for a node it does not know: the host may have died before saying
    where it ran)."""
    import ray

    if not node_id:
        return True
    try:
        return any(n.get("NodeID") == node_id and n.get("Alive") for n in ray.nodes())
    except Exception:
        return True


def _overlap(a: RunningTrial, b: RunningTrial) -> bool:
    a0, b0 = a.started or 0.0, b.started or 0.0
    a1, b1 = a.ended or float("inf"), b.ended or float("inf")
    return a0 < b1 and b0 < a1
