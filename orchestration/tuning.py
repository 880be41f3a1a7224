"""`crossrl tune`: each engine's hyperparameter search on Ray Tune, then its best configuration on the test seeds.

The protocol (docs/tuning.md): every engine searches the same space with the same budget (the same
configurations, drawn once from ``search.sample_seed``, and the same env steps per configuration), on tuning seeds
apart from the test seeds; then each engine's best configuration and the scenario's own setting run on the test seeds
as ordinary `crossrl run` trials, so the verdict compares an engine tuned against the same engine untuned.

Orchestration only: a Tune trial is a crossrl trial run as a sweep runs one (``crossrl.orchestration.fanout``): a
:class:`~crossrl.orchestration.fanout.TrialHost` actor in the trial's placement group (one CPU for its driver, one per
worker; Tune's own trainable takes none), the same adapters, the same env guard. The trainable hands the host's
messages to Tune with each result; the launcher (this process) is the only writer of the store: a Tune callback
records them as a trial process's messages (:class:`~crossrl.orchestration.trials.TrialRecorder`). Schedulers:

- ``random``: every configuration runs its whole budget (Tune's FIFO scheduler over the drawn configurations);
- ``asha``: ``AsyncHyperBandScheduler`` over env steps sampled, on the trial's return so far (the mean return over
  the last tenth of its env steps, as ``final_return_mean``); a stopped configuration ends FINISHED with
  ``search.stopped`` naming the env step.

MLflow: a parent run per engine's search (``crossrl.kind = search``), a child per configuration with its
hyperparameters (``hp.*``) and ``search.config``; the test-seed runs are parent runs of kind ``tuned`` tagged with the
search they come from.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
import os
import shutil
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ray import tune

from crossrl.adapters import checkpoints
from crossrl.adapters.registry import unsupported
from crossrl.core.cluster import disconnect
from crossrl.core.envguard import WATCH_DIR_ENV
from crossrl.orchestration import fanout
from crossrl.orchestration.runner import (
    CHECKPOINT_ROOT_TAG,
    Heartbeat,
    RunOutcome,
    checkpoints_to_resume,
    ended_trials,
    run_scenario,
)
from crossrl.orchestration.signals import (
    Interrupted,
    ctrl_c_as_interrupted,
    deferred_signals,
    held_signals,
    stop_since,
)
from crossrl.orchestration.trials import Carried, Progress, TrialRecorder, TrialResult, open_trial, summarize
from crossrl.reports.store import ResultsStore
from crossrl.reports.tuned import LINEAGE_ARTIFACT, SEARCH_KIND, TUNED_KIND
from crossrl.scenarios import metrics as M
from crossrl.scenarios.loader import SpecError
from crossrl.scenarios.spec import CheckpointSpec, Distribution, ScenarioSpec, SearchSpec, Trial

CONFIG_KEY = "config"  # the configuration's index in a Tune trial's config
MESSAGES_KEY = "crossrl_messages"
SCORE_KEY = "score"  # the trial's return so far: what ASHA compares at a rung
STEPS_KEY = "env_steps"  # ASHA's time axis; PBT's, on its clock (pbt_clock)
REPORT_EVERY_S = 10.0  # a trial with messages but no point reports at least this often


# --------------------------------------------------------------------------------------------------------------------
# The Tune trial: runs in a Tune actor that holds no CPU; the crossrl trial runs in a TrialHost in bundle 0.


def pbt_clock(env_step: int, interval: int) -> int:
    """The env step a PBT member reports as its time: the last decision point it passed (a multiple of ``interval``).

    Members write their decision checkpoints at the first fragment past each multiple, a little past it and not the
    same amount each (101,328, 101,808, ...). Synchronous PBT sets every member's last perturbation to the time of the
    member that completed the step, and lets a member whose next time lies less than an interval after that go on:
    reporting raw env steps, a member at 201,601 after a step completed at 101,808 trained on through the next decision
    point, was ranked there on a score one interval ahead of the others, and the member that copied it inherited a
    time past the next step, so it was not run again until a later step had it copy once more, one interval short."""
    return env_step // interval * interval


def _trainable(
    config: dict[str, Any],
    trials: dict[str, str],
    bounds: dict[str, tuple[float, float]],
    pbt_interval: int = 0,
    keeper: Any = None,
) -> None:
    """One configuration (a population member under PBT): its crossrl trial in a TrialHost, its messages handed to
    Tune with each result.

    The trial's checkpoints are shipped to ``keeper`` (:class:`~crossrl.orchestration.fanout.CheckpointKeeper`, on the
    launcher's node), which stores them in the launcher's results folder; a start the launcher planned (a retry after
    the trial's node was lost, a resumed search) continues from the checkpoint the keeper hands back. A host that dies
    raises :class:`TrialLost`: Ray Tune then starts the trial again while it has retries left.

    The trial is the Tune trial's own (by its name: PBT's exploit copies the donor's whole config, the index
    included); the config's hyperparameters go over it. A Tune checkpoint to start from (a paused member restarted, or
    PBT's exploit: the donor's) is the crossrl checkpoint the trial resumes from. Under PBT, a result carries the env
    step (PBT's clock) only with a checkpoint, so every decision PBT takes has the checkpoint of that env step.
    ``pbt_interval``: PBT's perturbation interval in env steps, 0 for the other schedulers."""
    import ray
    from ray.util import get_current_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    pbt = pbt_interval > 0

    trial = Trial.model_validate_json(trials[tune.get_context().get_trial_name()])
    values = _within(bounds, {k: v for k, v in config.items() if k != CONFIG_KEY})
    trial = trial.model_copy(update={"hyperparams": {**trial.hyperparams, **values}})
    pending: list[dict[str, Any]] = []
    scratch = Path(tempfile.mkdtemp(prefix=f"crossrl-tune-{trial.name}-"))
    start_from = tune.get_checkpoint()
    planned = ray.get(keeper.planned.remote(trial.name)) if keeper is not None else None
    if planned is not None:  # the launcher's own checkpoint of this trial, shipped here
        meta = checkpoints.packed_meta(planned[1])
        pending.append(
            {"kind": "resumed", "from": trial.name, "env_step": int(meta["env_steps_sampled"]), "copy": False,
             "values": values}
        )  # fmt: skip
    elif start_from is not None:
        local = scratch / "resume"
        start_from.to_directory(str(local))
        meta = checkpoints.read_meta(local)
        copy = meta.get("trial") != trial.name
        trial = trial.model_copy(update={"resume_from": str(local), "resume_copy": copy})
        pending.append(
            {
                "kind": "resumed",
                "from": str(meta.get("trial")),
                "env_step": int(meta["env_steps_sampled"]),
                "copy": copy,
                "values": values,
            }
        )
    watch_dir = str(scratch / "watch")
    group = get_current_placement_group()
    assert group is not None, "a Tune trial runs in its placement group"
    strategy = PlacementGroupSchedulingStrategy(
        group, placement_group_bundle_index=0, placement_group_capture_child_tasks=True
    )
    host = (
        ray.remote(fanout.TrialHost)
        .options(  # type: ignore[attr-defined]
            num_cpus=1,
            scheduling_strategy=strategy,
            runtime_env={"env_vars": {**fanout.HOST_ENV, WATCH_DIR_ENV: watch_dir}},
        )
        .remote(trial.model_dump_json(), ship_checkpoints=keeper is not None, resume=planned)
    )
    started = time.perf_counter()
    points: list[tuple[int, dict[str, float]]] = []
    usage: dict[str, Any] = {}
    last_report = started

    def report(final: bool, checkpoint: str = "") -> None:
        nonlocal pending, last_report
        result: dict[str, Any] = {MESSAGES_KEY: pending, "usage": usage, "final": final}
        if points:
            score = summarize(points, target=None, setup_s=None).get(M.FINAL_RETURN_MEAN)
            if score is not None:
                result[SCORE_KEY] = score
            if checkpoint or not pbt:
                result[STEPS_KEY] = pbt_clock(points[-1][0], pbt_interval) if pbt else points[-1][0]
        pending, last_report = [], time.perf_counter()
        # Returns when Tune asks for more; a stop (ASHA, PBT's pause) ends this thread here.
        tune.report(result, checkpoint=tune.Checkpoint.from_directory(checkpoint) if checkpoint else None)

    try:
        with contextlib.suppress(Exception):
            pending.append({"kind": "node", **ray.get(host.where.remote(), timeout=60)})
        while True:
            final = False
            if time.perf_counter() - started > trial.budget.wall_seconds:
                pending.append(
                    {"kind": "timeout", "reason": f"wall-clock budget of {trial.budget.wall_seconds:g} s exceeded"}
                )
                final = True
            else:
                try:
                    answer = ray.get(host.take.remote(), timeout=120)
                except Exception as e:  # the host died: its node went away, it was killed, or ran out of memory
                    first = str(e).splitlines()[0][:200] if str(e) else ""
                    if pending:
                        report(False)
                    raise TrialLost(f"trial actor died ({type(e).__name__}: {first})") from None
                usage = {k: answer[k] for k in ("peak_rss", "cpu_seconds") if k in answer} or usage
                for msg in answer["messages"]:
                    kind = msg.get("kind")
                    on_node = str(msg.get("path", ""))  # a checkpoint's folder on this node
                    if kind == "checkpoint" and "data" in msg:
                        msg = _kept(keeper, trial, msg)
                    pending.append(msg)
                    if kind == "point":
                        points.append((int(msg["step"]), msg["values"]))
                    elif kind == "checkpoint" and pbt and on_node and not _at_the_end(msg, trial):
                        report(False, checkpoint=on_node)
                    final = final or kind in ("done", "error", "verdict")
            if final:
                with contextlib.suppress(Exception):
                    log = ray.get(host.log.remote(), timeout=30)
                    pending.append({"kind": "log", "text": log.decode(errors="replace")})
                report(True)
                return
            if pending and (
                any(m.get("kind") == "point" for m in pending) or time.perf_counter() - last_report > REPORT_EVERY_S
            ):
                report(False)
    finally:
        with contextlib.suppress(Exception):
            ray.kill(host)
        shutil.rmtree(scratch, ignore_errors=True)


class TrialLost(RuntimeError):
    """A search trial's host died (its node lost, its actor killed): not the trial's own fault; Ray Tune retries it."""


def _kept(keeper: Any, trial: Trial, msg: dict[str, Any]) -> dict[str, Any]:
    """A checkpoint the host shipped, stored by the keeper under the trial's checkpoint folder at the launcher; the
    message then names it there ("" when it did not come whole) and says what shipping cost."""
    import ray

    t0 = time.perf_counter()
    data, pack_s = msg.pop("data"), float(msg.pop("pack_s", 0.0))
    root = trial.checkpoint_dir or ""
    path = ray.get(keeper.store.remote(root, Path(msg["path"]).name, data, trial.checkpoint.keep)) if root else ""
    return {**msg, "path": path, "ship_s": pack_s + time.perf_counter() - t0}


def _at_the_end(checkpoint: dict[str, Any], trial: Trial) -> bool:
    """A checkpoint written as the member's training ends (its budget sampled, or the final one) is no decision point
    for PBT: reported with its env step, synchronous PBT would pause the member there and start it again only to
    end (two set-ups a member, the last exploit copying a finished member). It goes to Tune with the final result."""
    return bool(checkpoint.get("final")) or int(checkpoint.get("env_step", 0)) >= trial.budget.env_steps


# --------------------------------------------------------------------------------------------------------------------
# The launcher's side: a Tune callback that records every trial in the store.


@dataclass
class _Member:
    trial: Trial
    rec: TrialRecorder
    started: float
    log: str = ""
    usage: dict[str, Any] = field(default_factory=dict)  # its host's, since the member (re)started
    earlier: dict[str, float] = field(default_factory=dict)  # CPU seconds and peak RSS of its hosts before this one
    timeout: str = ""
    recorded: bool = False
    values: dict[str, Any] = field(default_factory=dict)  # its hyperparameters now (PBT changes them)
    node: dict[str, str] = field(default_factory=dict)  # where its host runs


class Recorder(tune.Callback):  # type: ignore[misc]
    """Records each Tune trial of one engine's search as a crossrl trial under ``parent_id``."""

    def __init__(
        self,
        *,
        store: ResultsStore,
        parent_id: str,
        spec: ScenarioSpec,
        trials: Sequence[Trial],
        scheduler: str,
        progress: Progress,
        results: list[TrialResult],
        attempts: dict[str, list[str]] | None = None,
        carried: dict[str, Carried] | None = None,
        keeper: Any = None,
        max_retries: int = fanout.MAX_RETRIES,
    ) -> None:
        self.store, self.parent_id, self.spec, self.trials = store, parent_id, spec, trials
        self.keeper = keeper  # the launcher's CheckpointKeeper: a trial started again continues from what it planned
        self.max_retries = max_retries
        self.retries: dict[str, int] = {}  # trial -> how many times Tune started it again after its host died
        self.lost_on: dict[str, str] = {}  # trial -> what its last attempt was lost with
        self.scheduler, self.progress, self.results = scheduler, progress, results
        self.attempts, self.carried = attempts or {}, carried or {}  # a resumed search's killed attempts
        self.beat = Heartbeat(store, parent_id)
        self.members: dict[str, _Member] = {}
        self.lineage: list[dict[str, Any]] = []  # PBT's exploits, in order

    def __reduce__(self) -> Any:  # Tune pickles its run config; the store and the trials stay in this process
        return (_inert, ())

    def on_trial_start(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        if trial.trial_id in self.members:
            return
        store = self.store
        index = int(trial.config[CONFIG_KEY])
        values = {k: v for k, v in trial.config.items() if k != CONFIG_KEY}
        ours = self.trials[index]
        ours = ours.model_copy(update={"hyperparams": {**ours.hyperparams, **values}})
        with deferred_signals():
            run_id = open_trial(
                store,
                self.parent_id,
                ours,
                spec=self.spec.with_config(values, seeds=[ours.seed]),
                attempts=self.attempts,
            )
            store.set_tags(
                run_id,
                {
                    "search.config": str(index),
                    "search.values": json.dumps(values, sort_keys=True),
                    "search.scheduler": self.scheduler,
                    "search.tune_trial": str(trial.trial_id),
                },
                what="search tags",
            )
        rec = TrialRecorder(ours, store=store, run_id=run_id, progress=self.progress)
        if ours.name in self.carried:  # a resumed search, or a retry: the lost attempt's points up to its checkpoint
            with deferred_signals():
                rec.carry_over(self.carried.pop(ours.name))
        if ours.name in self.retries:
            tags = {
                fanout.ATTEMPT_TAG: str(self.retries[ours.name] + 1),
                fanout.RETRY_AFTER_TAG: self.lost_on[ours.name],
            }
            with deferred_signals():
                store.set_tags(run_id, tags, what="retry tags")
        self.members[trial.trial_id] = _Member(ours, rec, time.perf_counter(), values=values)
        self.progress("trial_start", {"trial": ours, "index": index, "total": len(self.trials)})

    def on_trial_result(
        self, iteration: int, trials: list[Any], trial: Any, result: dict[str, Any], **info: Any
    ) -> None:
        member = self.members.get(trial.trial_id)
        if member is None:
            return
        with deferred_signals():
            for msg in result.get(MESSAGES_KEY, []):
                kind = msg.get("kind")
                if kind == "node":
                    member.node = {"id": str(msg["id"]), "host": str(msg["host"])}
                    self.store.set_tags(
                        member.rec.run_id, {"node.id": msg["id"], "node.host": msg["host"]}, what="placement tags"
                    )
                elif kind == "resumed":
                    self._resumed(member, msg)
                elif kind == "log":
                    member.log = str(msg["text"])
                elif kind == "timeout":
                    member.timeout = str(msg["reason"])
                else:
                    member.rec.handle(msg)
            member.usage = result.get("usage") or member.usage
            member.rec.flush_if_due()

    def _resumed(self, member: _Member, msg: dict[str, Any]) -> None:
        """A member restarted from a checkpoint: its own (paused by synchronous PBT, nothing to record) or, PBT's
        exploit, another member's: the lineage (who copied whom, at which env step, the values before and after). A new
        host measures from zero: what the earlier ones used is kept."""
        used = member.usage
        member.earlier = {
            "cpu_seconds": member.earlier.get("cpu_seconds", 0.0) + float(used.get("cpu_seconds", 0.0)),
            "peak_rss": max(member.earlier.get("peak_rss", 0.0), float(used.get("peak_rss", 0.0))),
        }
        member.usage = {}
        values = dict(msg["values"])
        if msg["copy"]:
            donor = next((m for m in self.members.values() if m.trial.name == msg["from"]), None)
            entry = {
                "member": member.trial.name,
                "copied": msg["from"],
                "env_step": int(msg["env_step"]),
                "donor_values": dict(donor.values) if donor is not None else {},
                "own_values": dict(member.values),
                "values": values,
            }
            self.lineage.append(entry)
            n = sum(1 for e in self.lineage if e["member"] == member.trial.name)
            self.store.set_tags(
                member.rec.run_id,
                {f"pbt.exploit.{n}": json.dumps(entry, sort_keys=True), "pbt.exploits": str(n)},
                what="PBT lineage",
            )
            self.progress(
                "warning",
                {
                    "trial": member.trial,
                    "message": f"PBT: copies {msg['from']} at env step {int(msg['env_step']):,}, then {_brief(values)}",
                },
            )
        member.values = values

    def on_step_end(self, iteration: int, trials: list[Any], **info: Any) -> None:
        with deferred_signals():
            self.beat()  # the search's owner is alive: no other crossrl command marks it KILLED

    def on_trial_complete(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        self._end(trial, errored=False)

    def on_trial_error(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        self._end(trial, errored=True)

    def on_trial_recover(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        """Tune starts a failed trial again (it has retries left): its attempt ends KILLED naming its node, superseded
        by the next, which continues from the newest checkpoint the launcher holds (planned with the keeper) and carries
        the points up to it. A trial that failed on its own (its env) reports its error and is never retried: it
        ends, as the search goes on."""
        member = self.members.pop(trial.trial_id, None)
        if member is None or member.recorded:
            return
        rec, name = member.rec, member.trial.name
        lost = self._lost(member)
        self.record(member, superseded=True)
        self.retries[name] = self.retries.get(name, 0) + 1
        self.lost_on[name] = lost
        self.attempts.setdefault(name, []).append(rec.run_id)
        found = fanout.carried_from_newest(
            member.trial, rec, warn=lambda msg: self.progress("warning", {"trial": member.trial, "message": msg})
        )
        step = None
        if found is not None and self.keeper is not None:
            import ray

            step = found.env_step
            self.carried[name] = found
            ray.get(self.keeper.plan.remote(name, str(found.folder)))
        self.progress(
            "retry",
            {
                "trial": member.trial,
                "lost": lost,
                "attempt": self.retries[name] + 1,
                "of": self.max_retries + 1,
                "env_step": step,
            },
        )

    def _lost(self, member: _Member) -> str:
        """The member's attempt ends KILLED (not its fault): its node lost, or its actor alone dead (reason and tags
        as a sweep's, :meth:`~crossrl.orchestration.fanout.Sweep.judge`)."""
        rec = member.rec
        node = member.node
        alive = fanout.node_alive(node.get("id", ""))
        deadline = time.monotonic() + LOST_NODE_WAIT_S
        while alive and node and time.monotonic() < deadline:  # Ray may not have seen the node go yet
            time.sleep(1.0)
            alive = fanout.node_alive(node["id"])
        return fanout.mark_lost(rec, self.store, node, alive=alive)

    def _end(self, trial: Any, *, errored: bool) -> None:
        member = self.members.get(trial.trial_id)
        if member is None or member.recorded:
            return
        rec = member.rec
        if member.timeout:
            rec.result.status, rec.result.reason = M.TIMEOUT, member.timeout
        elif rec.done or rec.error is not None:
            rec.ended(not errored, "the trial's Tune actor ended")
        elif errored and _host_died(_tune_error(trial)):  # no retries left: KILLED naming its node, for --resume
            self._lost(member)
        elif errored:
            rec.result.status, rec.result.reason = M.FAILED, f"the Tune trial failed: {_tune_error(trial)}"
        else:  # stopped by the scheduler before its budget: it ended as the search decided
            rec.result.status = M.FINISHED
            step = rec.result.env_steps
            rec.result.reason = f"stopped by {self.scheduler} at env step {step}"
            self.store.set_tags(rec.run_id, {"search.stopped": str(step)}, what="search tags")
        self.record(member)

    def record(self, member: _Member, *, superseded: bool = False) -> None:
        """The member's end in the store; a ``superseded`` attempt (Tune starts it again) is not one of the results."""
        member.recorded = True
        with held_signals(), tempfile.TemporaryDirectory(prefix="crossrl-logs-") as tmp:
            log_path = None
            if member.log:
                log_path = Path(tmp) / f"{member.trial.name}.log"
                log_path.write_text(member.log)
            member.rec.record_end(
                wall_s=time.perf_counter() - member.started,
                peak_rss=max(member.earlier.get("peak_rss", 0.0), float(member.usage.get("peak_rss", 0.0))),
                cpu_seconds=member.earlier.get("cpu_seconds", 0.0) + float(member.usage.get("cpu_seconds", 0.0)),
                log_path=log_path,
            )
        result = member.rec.result
        if result is not None and member.values:  # PBT changed them: the member ends with the values it last took
            result.trial = result.trial.model_copy(
                update={"hyperparams": {**result.trial.hyperparams, **member.values}}
            )
            if any(member.trial.hyperparams.get(k) != v for k, v in member.values.items()):
                with deferred_signals():
                    self.store.set_tags(
                        result.run_id,
                        {"search.final_values": json.dumps(member.values, sort_keys=True)},
                        what="search tags",
                    )
        if not superseded:
            self.results.append(result)

    def unended(self, reason: str) -> None:
        """Trials Tune left running (the search was stopped): KILLED, with what they logged."""
        for member in self.members.values():
            if not member.recorded:
                member.rec.result.status, member.rec.result.reason = M.KILLED, reason
                self.record(member)


def _inert() -> tune.Callback:
    return tune.Callback()


def _within(bounds: dict[str, tuple[float, float]], values: dict[str, Any]) -> dict[str, Any]:
    """``values`` held to their search ranges: PBT's explore multiplies a copied value by 0.8 or 1.2 and may leave the
    range (an integer of 1 would become 0)."""
    out = dict(values)
    for name, (low, high) in bounds.items():
        if name in out and isinstance(out[name], int | float) and not isinstance(out[name], bool):
            held = min(max(out[name], low), high)
            out[name] = int(round(held)) if isinstance(out[name], int) else float(held)
    return out


def bounds_of(search: SearchSpec) -> dict[str, tuple[float, float]]:
    """Each ranged hyperparameter's (low, high) (choices are PBT's to step along: they stay in their list)."""
    out: dict[str, tuple[float, float]] = {}
    for name, dist in search.space.items():
        span = dist.loguniform or dist.uniform or dist.integer
        if span is not None:
            out[name] = (span[0], span[1])
    return out


def _domain(dist: Distribution) -> Any:
    """A search range as Ray Tune's domain (what PBT's explore resamples from or steps along)."""
    if dist.loguniform is not None:
        return tune.loguniform(*dist.loguniform)
    if dist.uniform is not None:
        return tune.uniform(*dist.uniform)
    if dist.integer is not None:
        return tune.randint(dist.integer[0], dist.integer[1] + 1)
    assert dist.choice is not None
    return list(dist.choice)  # PBT moves a copied choice to a neighbouring one


def _brief(values: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in values.items())


def _drawn(configs: Sequence[dict[str, Any]], name: str, config: dict[str, Any]) -> Any:
    """A Tune trial's value of ``name``: the one drawn for its configuration (every engine gets the same draws)."""
    return configs[int(config[CONFIG_KEY])][name]


LOST_NODE_WAIT_S = 30.0  # how long a retried trial's node may still count as alive before its actor alone is blamed


def _host_died(error: str) -> bool:
    """Whether a Tune trial's error is its host's (or its Tune actor's) death, not the trial's own."""
    return any(word in error for word in ("TrialLost", "trial actor died", "ActorDiedError", "RayActorError",
                                          "ActorUnavailableError", "NodeDiedError"))  # fmt: skip


def _tune_error(trial: Any) -> str:
    with contextlib.suppress(Exception):
        path = Path(trial.local_path) / "error.txt"
        if path.exists():
            lines = [line for line in path.read_text().splitlines() if line.strip()]
            return lines[-1][:300] if lines else "no error text"
    return "no error text"


# --------------------------------------------------------------------------------------------------------------------
# The search, per engine, and the test-seed runs.


@dataclass
class EngineSearch:
    """One engine's search: its parent run, every configuration's result, the best one."""

    engine: str
    parent_id: str
    results: list[TrialResult]
    best: TrialResult | None = None
    wall_s: float = 0.0
    skipped: str = ""  # why the engine was not searched (it cannot run the algorithm)
    error: str = ""  # why the search itself failed (Ray Tune raised)

    @property
    def env_steps(self) -> int:
        return sum(r.env_steps for r in self.results)

    @property
    def setup_s(self) -> float | None:
        """The median set-up time of the search's trials (their engine built, up to their first env step)."""
        times = [float(r.summary["setup_s"]) for r in self.results if r.summary.get("setup_s") is not None]
        return statistics.median(times) if times else None

    @property
    def cpu_seconds(self) -> float:
        return sum(float(r.summary.get(M.CPU_SECONDS) or 0.0) for r in self.results)


@dataclass
class TuneOutcome:
    searches: list[EngineSearch]
    shared: RunOutcome | None = None  # the scenario's own setting on the test seeds
    tuned: dict[str, RunOutcome] = field(default_factory=dict)  # engine -> its best configuration on the test seeds
    interrupted: bool = False


def rank_key(result: TrialResult, search: SearchSpec) -> tuple[float, ...]:
    """Sorts a search's results best first: configurations that ran their whole budget before those stopped early, then
    by the search's metric (fewer env steps to target, then the higher final return; or the higher final return)."""
    ran_all = result.status == M.FINISHED and result.env_steps >= search.env_steps
    final = result.summary.get(M.FINAL_RETURN_MEAN)
    ret = -float(final) if final is not None else float("inf")
    if search.metric == "steps_to_target":
        steps = result.summary.get(M.STEPS_TO_TARGET)
        return (0.0 if ran_all or steps is not None else 1.0, float(steps) if steps is not None else float("inf"), ret)
    return (0.0 if ran_all else 1.0, ret)


def best_of(results: Sequence[TrialResult], search: SearchSpec) -> TrialResult | None:
    usable = [r for r in results if r.status == M.FINISHED and r.points]
    return min(usable, key=lambda r: rank_key(r, search)) if usable else None


def search_key(spec: ScenarioSpec) -> str:
    """What makes two searches the same one (`crossrl tune --resume` takes up only that): the spec's fingerprint and its
    search section."""
    assert spec.search is not None
    blob = json.dumps(
        {"fingerprint": spec.fingerprint(), "search": spec.search.model_dump(mode="json")}, sort_keys=True
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def earlier_search(store: ResultsStore, spec: ScenarioSpec, engine: str) -> Any | None:
    """The newest parent run of this same search on ``engine`` (None when there is none). SpecError while it is still
    running (its owner alive)."""
    exp = store.experiment_id(spec.name, create=False)
    if exp is None:
        return None
    runs = store.client.search_runs(
        [exp],
        filter_string=(
            f"tags.`crossrl.kind` = '{SEARCH_KIND}' and tags.`search.engine` = '{engine}' "
            f"and tags.`search.key` = '{search_key(spec)}'"
        ),
        order_by=["attributes.start_time DESC"],
        max_results=1,
    )
    if not runs:
        return None
    run = runs[0]
    if run.info.status == "RUNNING":
        owner = f"pid {run.data.tags.get('owner.pid', '?')} on {run.data.tags.get('owner.host', '?')}"
        raise SpecError([f"--resume: {engine}'s search {run.info.run_id} is still running ({owner}); stop it first"])
    return run


def search_engine(
    spec: ScenarioSpec,
    engine: str,
    *,
    store: ResultsStore,
    address: str,
    parallel: int,
    progress: Progress,
    spec_path: Path | None,
    command: str,
    earlier: Any | None = None,
    max_retries: int = fanout.MAX_RETRIES,
) -> EngineSearch:
    """One engine's search on Ray Tune (the launcher is connected to the cluster at ``address``).

    ``earlier``: the parent run of this engine's search that a `crossrl tune --resume` takes up. A FINISHED one is read
    back as it is; otherwise its configurations that ended are kept and the others run again under the same parent run,
    each from its newest good checkpoint when it wrote one (the killed attempt's points up to it carried over, the
    attempt marked superseded), from scratch otherwise. ASHA's rungs and PBT's population start afresh (Tune keeps no
    scheduler state across runs)."""

    search = spec.search
    assert search is not None
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    root = store.results_dir / "checkpoints" / spec.name / f"search-{engine}-{stamp}-{uuid.uuid4().hex[:8]}"
    if earlier is not None and earlier.data.tags.get(CHECKPOINT_ROOT_TAG):
        root = Path(earlier.data.tags[CHECKPOINT_ROOT_TAG])
    every = None
    if search.scheduler == "pbt":  # every checkpoint kept: the engine trains on while Tune copies one, PBT decides
        keep = -(-search.env_steps // search.interval_env_steps) + 2
        every = CheckpointSpec(every_env_steps=search.interval_env_steps, keep=keep)
    trials = [
        t.model_copy(
            update={"checkpoint_dir": str(root / t.name), **({"checkpoint": every} if every is not None else {})}
        )
        for t in spec.search_trials(engine, ray_address=address)
    ]
    bad = unsupported(trials[:1])
    if earlier is not None:
        parent_id = str(earlier.info.run_id)
        kept, attempts = ended_trials(store, earlier, trials)
        if earlier.data.tags.get("status") == M.FINISHED and not attempts:
            out = EngineSearch(engine=engine, parent_id=parent_id, results=kept)
            out.best = best_of(kept, search)
            out.wall_s = float(earlier.data.tags.get("search.wall_s", "0") or 0)
            progress("warning", {"trial": trials[0], "message": f"{engine}'s search had ended: read back as it is"})
            return out
        store.reopen_parent(parent_id)
        carried = checkpoints_to_resume(store, trials, attempts, root, progress)
        # Only a checkpoint whose point reached the store continues its curve: one written just before the stop, whose
        # messages were still on their way to the launcher, would leave a gap; that configuration starts again.
        carried = {k: c for k, c in carried.items() if c.points and c.points[-1][0] == c.env_step}
        trials = [
            t.model_copy(update={"resume_from": str(carried[t.name].folder)}) if t.name in carried else t
            for t in trials
        ]
        remaining = [i for i, t in enumerate(trials) if t.name not in {r.trial.name for r in kept}]
        return _run_search(
            spec,
            engine,
            trials,
            remaining,
            store=store,
            parent_id=parent_id,
            parallel=parallel,
            progress=progress,
            out=EngineSearch(engine=engine, parent_id=parent_id, results=kept),
            attempts=attempts,
            carried=carried,
            max_retries=max_retries,
        )
    parent_id = store.start_parent(
        spec.with_config({}, engines=[engine]), spec_path=spec_path, command=command, kind=SEARCH_KIND
    )
    store.set_tags(
        parent_id,
        {
            CHECKPOINT_ROOT_TAG: str(root),
            "search.key": search_key(spec),
            "search.engine": engine,
            "search.scheduler": search.scheduler,
            "search.configurations": str(search.configurations),
            "search.env_steps": str(search.env_steps),
            "search.metric": search.metric,
            "search.space": json.dumps(search.model_dump(mode="json")["space"], sort_keys=True),
        },
        what="search tags",
    )
    out = EngineSearch(engine=engine, parent_id=parent_id, results=[])
    if bad:
        out.skipped = bad[0][1]
        store.finish_parent(parent_id, status=M.SKIPPED, counts={}, reason=out.skipped)
        return out
    return _run_search(
        spec,
        engine,
        trials,
        list(range(len(trials))),
        store=store,
        parent_id=parent_id,
        parallel=parallel,
        progress=progress,
        out=out,
        max_retries=max_retries,
    )


def scheduler_for(search: SearchSpec) -> Any:
    """Ray Tune's scheduler for the spec's ``search.scheduler`` (None: a random search, every configuration whole)."""
    from ray.tune.schedulers import AsyncHyperBandScheduler, PopulationBasedTraining

    if search.scheduler == "asha":
        return AsyncHyperBandScheduler(
            time_attr=STEPS_KEY,
            metric=SCORE_KEY,
            mode="max",
            max_t=search.env_steps,
            grace_period=min(search.grace_env_steps, search.env_steps),
            reduction_factor=search.asha.reduction_factor,
            brackets=1,
            stop_last_trials=False,  # a trial ends itself at its budget, after its final point and checkpoint
        )
    if search.scheduler == "pbt":
        return PopulationBasedTraining(
            time_attr=STEPS_KEY,
            metric=SCORE_KEY,
            mode="max",
            perturbation_interval=search.interval_env_steps,
            hyperparam_mutations={name: _domain(dist) for name, dist in search.space.items()},
            quantile_fraction=search.pbt.quantile,
            resample_probability=search.pbt.resample_probability,
            perturbation_factors=search.pbt.factors,
            synch=True,
            require_attrs=False,  # the env step comes with checkpoints only (see _trainable)
            log_config=False,  # the lineage is in the store
        )
    return None


def _tuner(
    spec: ScenarioSpec, engine: str, trials: list[Trial], indices: list[int], *, store: ResultsStore, parallel: int,
    recorder: Recorder, max_retries: int = fanout.MAX_RETRIES,
) -> Any:  # fmt: skip
    """The Tune run of configurations ``indices``: each a trial of ``trials`` (its values drawn from the search's one
    sample, so every engine gets the same), in a placement group of the trial's own bundles, reported to
    ``recorder``."""
    search = spec.search
    assert search is not None
    configs = search.sample()
    param_space: dict[str, Any] = {CONFIG_KEY: tune.grid_search(indices)}
    for name in search.space:
        param_space[name] = tune.sample_from(functools.partial(_drawn, configs, name))
    resources = tune.PlacementGroupFactory([{}, *fanout.bundles(trials[0])], strategy="STRICT_PACK")
    names = {i: t.name for i, t in enumerate(trials)}
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    return tune.Tuner(
        tune.with_resources(
            tune.with_parameters(
                _trainable,
                trials={t.name: t.model_dump_json() for t in trials},
                bounds=bounds_of(search),
                pbt_interval=search.interval_env_steps if search.scheduler == "pbt" else 0,
                keeper=recorder.keeper,
            ),
            resources,
        ),
        param_space=param_space,
        tune_config=tune.TuneConfig(
            scheduler=scheduler_for(search),
            # PBT's synchronous step needs the whole population in Tune (pending ones included): its members run as
            # the cluster's CPUs allow
            max_concurrent_trials=None if search.scheduler == "pbt" else parallel,
            trial_name_creator=lambda t: names[int(t.config[CONFIG_KEY])],
            trial_dirname_creator=lambda t: names[int(t.config[CONFIG_KEY])],
            reuse_actors=False,
        ),
        run_config=tune.RunConfig(
            name=f"{spec.name}-{engine}-{stamp}",
            storage_path=str(store.results_dir / "tune"),
            callbacks=[recorder],
            verbose=0,
            failure_config=tune.FailureConfig(max_failures=max_retries),
        ),
    )


def _record_search_end(
    store: ResultsStore, parent_id: str, out: EngineSearch, recorder: Recorder, search: SearchSpec, *, status: str,
    reason: str,
) -> None:  # fmt: skip
    """The search's ending on its parent run: its best configuration, cost and lineage, and its status."""
    recorder.unended(reason or "the search stopped before this trial ended")
    out.best = best_of(out.results, search)
    counts: dict[str, int] = {}
    for r in out.results:
        counts[r.status] = counts.get(r.status, 0) + 1
    with held_signals():
        tags = {"search.wall_s": f"{out.wall_s:.1f}", "search.env_steps_total": str(out.env_steps)}
        if out.setup_s is not None:  # from a trial's start to its first env step: what each trial costs first
            tags["search.setup_s_median"] = f"{out.setup_s:.1f}"
        if out.best is not None:  # its run id once the store has it: run_tune
            tags["search.best_config"] = json.dumps(
                {k: out.best.trial.hyperparams[k] for k in search.space}, sort_keys=True
            )
        store.set_tags(parent_id, tags, what="search tags")
        if recorder.lineage:
            store.log_text(parent_id, json.dumps(recorder.lineage, indent=2), LINEAGE_ARTIFACT)
        store.finish_parent(parent_id, status=status, counts=counts, reason=reason)


def _run_search(
    spec: ScenarioSpec,
    engine: str,
    trials: list[Trial],
    indices: list[int],
    *,
    store: ResultsStore,
    parent_id: str,
    parallel: int,
    progress: Progress,
    out: EngineSearch,
    attempts: dict[str, list[str]] | None = None,
    carried: dict[str, Carried] | None = None,
    max_retries: int = fanout.MAX_RETRIES,
) -> EngineSearch:
    """The configurations ``indices`` of ``trials`` on Ray Tune, recorded under ``parent_id`` into ``out``; then the
    search's ending (best configuration, cost, lineage) on its parent run. A configuration lost with its node (or its
    host actor) is started again by Tune from its newest checkpoint at the launcher, up to ``max_retries`` times."""
    search = spec.search
    assert search is not None
    keeper = fanout.start_keeper()  # the trials' checkpoints, in the launcher's results folder
    for t in trials:  # a resumed search's configurations continue from the checkpoints found for them
        if t.resume_from:
            keeper.plan.remote(t.name, t.resume_from)
    trials = [t.model_copy(update={"resume_from": None}) for t in trials]
    recorder = Recorder(
        store=store,
        parent_id=parent_id,
        spec=spec,
        trials=trials,
        scheduler=search.scheduler,
        progress=progress,
        results=out.results,
        attempts=attempts,
        carried=carried,
        keeper=keeper,
        max_retries=max_retries,
    )
    t0, started = time.perf_counter(), time.monotonic()
    status, reason = M.FINISHED, ""
    try:
        logging.getLogger("ray.tune").setLevel(logging.ERROR)  # the store has the results, not Tune's own files
        if indices:  # none left: a resumed search whose configurations had all ended
            with ctrl_c_as_interrupted():
                _tuner(spec, engine, trials, indices, store=store, parallel=parallel, recorder=recorder,
                       max_retries=max_retries).fit()  # fmt: skip
        stopped = stop_since(started)
        if stopped is not None:  # Tune's loop caught the stop and returned early: the search was stopped all the same
            raise Interrupted(stopped)
    except KeyboardInterrupt as e:
        stop = Interrupted.of(e)
        status, reason = M.KILLED, f"interrupted ({stop.label})"
        raise stop from None
    except Exception as e:  # Ray Tune itself stopped: the search is FAILED with why, what its trials logged is kept
        lines = [line for line in str(e).splitlines() if line.strip()]
        status = M.FAILED
        reason = out.error = f"Ray Tune stopped the search: {type(e).__name__}: {lines[-1][:300] if lines else ''}"
    finally:
        out.wall_s = time.perf_counter() - t0
        _record_search_end(store, parent_id, out, recorder, search, status=status, reason=reason)
    return out


def run_tune(
    spec: ScenarioSpec,
    *,
    store: ResultsStore,
    engines: Sequence[str] | None = None,
    ray_address: str | None = None,
    parallel: int = 1,
    max_retries: int = fanout.MAX_RETRIES,
    progress: Progress | None = None,
    spec_path: Path | None = None,
    command: str = "",
    test: bool = True,
    resume: bool = False,
    on_search: Callable[[EngineSearch], None] = lambda _s: None,
) -> TuneOutcome:
    """Each engine's search (``spec.search``), then, with ``test``, the scenario's own setting and each engine's best
    configuration on the test seeds. SpecError before anything runs for a spec without a search or a trial that cannot
    fit the cluster.

    ``resume`` takes up the newest run of this same search (its spec's fingerprint and search section) on each engine:
    see :func:`search_engine`; an engine without one is searched afresh. A test-seed run of these searches that had
    not finished is taken up as `crossrl run --resume` does (its ended trials kept, the others from their checkpoints);
    one that had finished is not run again. A stop (Ctrl-C, SIGTERM) ends the running trials KILLED and returns with
    ``interrupted``."""
    if spec.search is None:
        raise SpecError([f"scenario {spec.name!r} has no search section: add one (docs/tuning.md)"])
    if parallel < 1:
        raise SpecError([f"--parallel must be at least 1, got {parallel}"])
    notify = progress or (lambda _event, _payload: None)
    chosen = tuple(engines) if engines else spec.engines
    os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")  # the store holds the results
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    os.environ.setdefault("TUNE_DISABLE_STRICT_METRIC_CHECKING", "1")  # a result before the first episode has no score
    # Ctrl-C stops a search as SIGTERM does (KeyboardInterrupt: the running trials KILLED, exit 130), not Tune's way
    # (a graceful end that returns as if the search had finished)
    os.environ["TUNE_DISABLE_SIGINT_HANDLER"] = "1"
    outcome = TuneOutcome(searches=[])
    # A local cluster gets the CPUs the search's biggest trial asks for (its driver and workers) even when this machine
    # has fewer: a search compares what configurations learn per env step, not their speed, and runs one at a time
    # unless --parallel says otherwise.
    need = int(sum(b["CPU"] for b in fanout.bundles(spec.search_trials(chosen[0])[0])))
    address = fanout.connect_launcher(ray_address, num_cpus=max(os.cpu_count() or 1, need))
    try:
        fanout.check_fits(spec.search_trials(chosen[0], ray_address=address)[:1], placement="node")
        store.start_journal(warn=lambda msg: notify("store_warning", {"message": msg}))
        try:
            for engine in chosen:
                earlier = earlier_search(store, spec, engine) if resume else None
                found = search_engine(
                    spec,
                    engine,
                    store=store,
                    address=address,
                    parallel=parallel,
                    progress=notify,
                    spec_path=spec_path,
                    command=command,
                    earlier=earlier,
                    max_retries=max_retries,
                )
                outcome.searches.append(found)
                on_search(found)
        finally:
            store.end_journal(wait_s=60.0)
            for found in outcome.searches:
                found.parent_id = store.resolve(found.parent_id)
                for r in found.results:
                    r.run_id = store.resolve(r.run_id)
                if found.best is not None:
                    store.set_tags(found.parent_id, {"search.best_run": found.best.run_id}, what="search tags")
    finally:
        disconnect()
    if not test:
        return outcome
    search = spec.search

    def test_run(test_spec: ScenarioSpec, role: str, searches: Sequence[EngineSearch], label: str,
                 config: dict[str, Any] | None = None) -> RunOutcome | None:  # fmt: skip
        """A test-seed run: afresh, or under ``resume`` the earlier one of these searches taken up (its ended trials kept,
        the killed ones from their checkpoints); None when that one had finished."""
        tags = _tuned_tags(role, searches, config)
        earlier = _earlier_test_run(store, spec.name, tags) if resume else None
        if earlier is not None and earlier[1] == M.FINISHED:
            notify(
                "store_warning",
                {"message": f"{label} on the test seeds had finished for these searches: not run again"},
            )
            return None
        return run_scenario(
            test_spec,
            store=store,
            spec_path=spec_path,
            command=command,
            progress=notify,
            kind=TUNED_KIND,
            tags=tags,
            resume=earlier[0] if earlier is not None else None,
        )

    shared = spec.model_copy(update={"seeds": search.test_seeds, "engines": chosen})
    outcome.shared = test_run(shared, "shared", outcome.searches, "the own setting")
    if outcome.shared is not None and outcome.shared.interrupted:
        outcome.interrupted = True
        return outcome
    for found in outcome.searches:
        if found.best is None:
            continue
        config = {k: found.best.trial.hyperparams[k] for k in search.space}
        tuned = spec.with_config(config, seeds=search.test_seeds, engines=[found.engine])
        run = test_run(tuned, "tuned", [found], f"{found.engine}'s best configuration", config)
        if run is None:
            continue
        outcome.tuned[found.engine] = run
        if run.interrupted:
            outcome.interrupted = True
            break
    return outcome


def _tuned_tags(role: str, searches: Sequence[EngineSearch], config: dict[str, Any] | None) -> dict[str, str]:
    """A test-seed run's tags: its role ("shared": the spec's own setting; "tuned": a search's best configuration) and
    the searches it belongs to (their parent runs), by which the report and `--resume` find it."""
    tags = {"tuned.role": role, "tuned.searches": ",".join(s.parent_id for s in searches)}
    if config is not None:
        tags["tuned.config"] = json.dumps(config, sort_keys=True)
    return tags


def _earlier_test_run(store: ResultsStore, scenario: str, tags: Mapping[str, str]) -> tuple[str, str] | None:
    """The newest test-seed run with these role and searches: its run id and status, or None."""
    exp = store.experiment_id(scenario, create=False)
    if exp is None:
        return None
    runs = store.client.search_runs(
        [exp],
        filter_string=f"tags.`crossrl.kind` = '{TUNED_KIND}' and tags.`tuned.role` = '{tags['tuned.role']}'",
        order_by=["attribute.start_time DESC"],
    )
    for r in runs:
        if r.data.tags.get("tuned.searches") == tags["tuned.searches"]:
            return str(r.info.run_id), r.data.tags.get("status", "")
    return None
