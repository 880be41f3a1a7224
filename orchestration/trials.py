"""A trial's result, and the recorder that turns its messages into the result and the store's writes:
shared by trials run in a child process (``crossrl.orchestration.runner``) and trials fanned out over a Ray
cluster (``crossrl.orchestration.fanout``)."""

from __future__ import annotations

import base64
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from crossrl.orchestration.watch import Verdict
from crossrl.reports.store import ResultsStore
from crossrl.scenarios import metrics as M
from crossrl.scenarios.spec import ScenarioSpec, Trial

FAULT_TIME_TAG = "fault.time"  # unix time of an env fault, or of the last env step before a stall
FLUSH_EVERY_S = 5.0  # buffered points reach the store at least this often
FLUSH_EVERY_POINTS = 200


@dataclass
class TrialResult:
    trial: Trial
    run_id: str
    status: str
    reason: str = ""
    points: list[tuple[int, dict[str, float]]] = field(default_factory=list)
    summary: dict[str, float | None] = field(default_factory=dict)
    wall_s: float = 0.0

    @property
    def env_steps(self) -> int:
        return self.points[-1][0] if self.points else 0

    @property
    def median_throughput(self) -> float | None:
        vals = [p[M.SAMPLE_THROUGHPUT] for _, p in self.points if M.SAMPLE_THROUGHPUT in p]
        return statistics.median(vals) if vals else None


Progress = Callable[[str, dict[str, Any]], None]  # event name, payload

CHECKPOINT_LATEST_TAG = "checkpoint.latest"  # a trial's newest checkpoint folder
RESUMED_TAGS = ("resumed.from_run", "resumed.env_step", "resumed.checkpoint")
# Logged at a checkpoint's env step: how long writing it took, its size, the training seconds it holds.
CHECKPOINT_WRITE_S, CHECKPOINT_MB, CHECKPOINT_TRAIN_S = "checkpoint.write_s", "checkpoint.mb", "checkpoint.train_s"
CHECKPOINT_SHIP_S = "checkpoint.ship_s"


@dataclass(frozen=True)
class Carried:
    """A resumed trial's start: the checkpoint it continues from and the points its interrupted attempt (``run``)
    logged up to that checkpoint's env step; the points after it stay in that attempt only, which is superseded."""

    folder: Path
    env_step: int
    train_s: float
    points: list[tuple[int, dict[str, float]]]
    run: str


def summarize(
    points: list[tuple[int, dict[str, float]]], *, target: float | None, setup_s: float | None
) -> dict[str, float | None]:
    """Per-trial summary from the points alone, the same way for every engine.

    ``final_return_mean``: mean return over the episodes completed in the last 10% of the env steps
    sampled (each point's mean weighted by its episode count). ``steps_to_target``: env steps at the
    first point whose episode_return_mean >= target (absent when never reached).
    """
    out: dict[str, float | None] = {"setup_s": setup_s}
    with_return = [(s, p) for s, p in points if M.EPISODE_RETURN_MEAN in p]
    if with_return:
        last = with_return[-1][0]
        tail = [(s, p) for s, p in with_return if s >= 0.9 * last] or with_return[-1:]
        weights = [p.get(M.EPISODES_THIS_POINT, 1.0) for _, p in tail]
        out[M.FINAL_RETURN_MEAN] = sum(
            w * p[M.EPISODE_RETURN_MEAN] for w, (_, p) in zip(weights, tail, strict=True)
        ) / sum(weights)
    if target is not None:
        hit = next(((s, p) for s, p in with_return if p[M.EPISODE_RETURN_MEAN] >= target), None)
        if hit:
            out[M.STEPS_TO_TARGET] = float(hit[0])
            out[M.WALL_S_TO_TARGET] = hit[1].get(M.WALL_TIME_S)
    return out


class TrialRecorder:
    """A trial's messages (``point``, ``setup``, ``tags``, ``native_config``, ``artifact``, ``error``, ``done``) into
    its result and the store, points in batches; then its end. Used for trials in a child process (:func:`_run_one`)
    and for trials fanned out over a Ray cluster (``crossrl.orchestration.fanout``)."""

    def __init__(self, trial: Trial, *, store: ResultsStore, run_id: str, progress: Progress) -> None:
        self.trial, self.store, self.run_id, self.progress = trial, store, run_id, progress
        self.result = TrialResult(trial=trial, run_id=run_id, status=M.FAILED)
        self.pending: list[tuple[int, dict[str, float]]] = []
        self.last_flush = time.perf_counter()
        self.setup_s: float | None = None
        self.error: dict[str, str] | None = None
        self.done = False
        self.warned = False
        self.checkpoint_s = 0.0  # seconds the trial spent writing checkpoints
        self.native_config: dict[str, Any] | None = None  # the last one the trial's code sent

    def carry_over(self, carried: Carried) -> None:
        """A resumed trial's run starts with the points its interrupted attempt logged up to the checkpoint, so it
        holds the trial's one continuous curve."""
        self.result.points = list(carried.points)
        self.pending = list(carried.points)
        tags = dict(zip(RESUMED_TAGS, (carried.run, str(carried.env_step), str(carried.folder)), strict=True))
        self.store.set_tags(self.run_id, tags, what="resume tags", ref_tags=RESUMED_TAGS[:1])

    def handle(self, msg: dict[str, Any]) -> None:
        kind = msg.get("kind")
        if kind == "point":
            step, values = int(msg["step"]), msg["values"]
            self.result.points.append((step, values))
            self.pending.append((step, values))
            self.progress("point", {"trial": self.trial, "step": step, "values": values})
        elif kind == "setup":
            self.setup_s = float(msg["setup_s"])
        elif kind == "checkpoint":
            step = int(msg["env_step"])
            self.checkpoint_s += float(msg["write_s"])
            values = {
                CHECKPOINT_WRITE_S: float(msg["write_s"]),
                CHECKPOINT_MB: float(msg["bytes"]) / 2**20,
                CHECKPOINT_TRAIN_S: float(msg["train_s"]),
            }
            if "ship_s" in msg:  # a fanned-out trial's: the seconds it took to reach the launcher's folder
                values[CHECKPOINT_SHIP_S] = float(msg["ship_s"])
            self.pending.append((step, values))
            self.flush()  # every point up to the checkpoint is journaled: a resume after a kill carries them over
            if msg["path"]:  # "" for one that never reached the launcher's folder
                self.store.set_tags(self.run_id, {CHECKPOINT_LATEST_TAG: str(msg["path"])}, what="checkpoint")
        elif kind == "tags":
            self.store.set_tags(self.run_id, msg["tags"], what="engine tags")
        elif kind == "native_config":
            config = msg["config"]
            if self.native_config is None:
                self.store.log_native_config(self.run_id, config)
            elif config != self.native_config:  # a later start (a PBT member's, with copied values; a new seed)
                step = self.result.points[-1][0] if self.result.points else 0
                self.store.log_native_config(self.run_id, config, from_env_step=step)
            self.native_config = config
            self.progress("native_config", {"trial": self.trial, "config": config})
        elif kind == "artifact":
            self.log_artifact(str(msg["name"]), base64.b64decode(msg["data"]))
        elif (
            kind == "verdict"
        ):  # a sweep's host ended the trial for an env fault or a stall (crossrl.orchestration.watch)
            self.failed(Verdict(**{k: v for k, v in msg.items() if k != "kind"}))
        elif kind == "warning":
            self.warn([str(msg["message"])])
        elif kind == "error":
            self.error = msg
        elif kind == "done":
            self.done = True

    def failed(self, verdict: Verdict) -> None:
        """The trial ends FAILED for ``verdict`` (an env fault, a stall): its reason, and its detail as an artifact."""
        self.result.status, self.result.reason = M.FAILED, verdict.reason
        self.error = {"error": verdict.reason, "traceback": verdict.detail, "artifact": verdict.name}
        if verdict.at is not None:  # how long the trial ran on after it broke: its end time minus this
            self.store.set_tags(self.run_id, {FAULT_TIME_TAG: f"{verdict.at:.3f}"}, what="fault time")

    def warn(self, messages: list[str]) -> None:
        """Warnings from the trial's envs (``env.nonfinite: warn``): the first one as the run's ``env.warning`` tag."""
        if messages and not self.warned:
            self.warned = True
            self.store.set_tags(self.run_id, {"env.warning": messages[0]}, what="env warning")
            self.progress("warning", {"trial": self.trial, "message": messages[0]})

    def log_artifact(self, name: str, data: bytes) -> None:
        """A binary artifact of the trial (the store, or its journal, copies the file before this returns)."""
        with tempfile.TemporaryDirectory(prefix="crossrl-artifact-") as tmp:
            path = Path(tmp) / Path(name).name
            path.write_bytes(data)
            self.store.log_file(self.run_id, path)

    def flush(self) -> None:
        if self.pending:
            self.store.log_points(self.run_id, self.pending)
            self.pending = []
        self.last_flush = time.perf_counter()

    def flush_if_due(self) -> None:
        if len(self.pending) >= FLUSH_EVERY_POINTS or time.perf_counter() - self.last_flush > FLUSH_EVERY_S:
            self.flush()

    def ended(self, exit_ok: bool, how: str) -> None:
        """The trial's code stopped: FINISHED when it said done and ``exit_ok``, else FAILED with its error or ``how``."""
        if self.done and exit_ok and self.error is None:
            self.result.status = M.FINISHED
        elif self.error is not None:
            self.result.status, self.result.reason = M.FAILED, self.error["error"]
        else:
            self.result.status, self.result.reason = M.FAILED, f"{how} without reporting an error (crash?)"

    def record_end(self, *, wall_s: float, peak_rss: float, cpu_seconds: float, log_path: Path | None) -> None:
        """The trial's end, whole: summary, remaining points, traceback, log, final status."""
        result = self.result
        result.wall_s = wall_s
        result.summary = summarize(result.points, target=self.trial.target_return, setup_s=self.setup_s)
        result.summary[M.PEAK_RSS_MB] = peak_rss / 2**20
        result.summary[M.CPU_SECONDS] = cpu_seconds
        self.flush()
        if self.error is not None:
            self.store.log_text(self.run_id, self.error["traceback"], self.error.get("artifact", "traceback.txt"))
        if log_path is not None:
            self.store.log_file(self.run_id, log_path)
        self.store.finish_trial(
            self.run_id,
            status=result.status,
            reason=result.reason,
            summary=result.summary,
            history=result.points,
            last_step=result.env_steps,
        )
        self.progress("trial_end", {"result": result})


def open_trial(
    store: ResultsStore, parent_id: str, trial: Trial, *, spec: ScenarioSpec, attempts: dict[str, list[str]]
) -> str:
    """The trial's run under ``parent_id``; a resumed run's earlier attempts of it are marked superseded by it."""
    run_id = store.start_trial(parent_id, trial, spec=spec)
    for earlier in attempts.get(trial.name, []):
        store.supersede(earlier, by=run_id)
    return run_id
