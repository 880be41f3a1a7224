"""The results store: the one module that knows crossrl's MLflow layout, to write it and to read it.

Layout (DESIGN.md): one experiment per scenario; one parent run per ``crossrl run`` (spec
fingerprint, versions, machine; the spec and the report as artifacts); one child run per trial, named
like ``rllib-ppo-w2-s0`` (flattened spec and native config as params, engine/seed/... as tags, the
common metrics with step = env steps sampled, the native config, metric history and, on failure,
the traceback and log as artifacts).

Default: an embedded store (sqlite + artifact folder under ``./crossrl-results``); a tracking URI
(``--tracking-uri`` or ``MLFLOW_TRACKING_URI``) selects a server instead.
"""

from __future__ import annotations

import io
import json
import math
import os
import platform
import re
import socket
import subprocess
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import pandas as pd
from filelock import FileLock
from filelock import Timeout as LockTimeout
from mlflow.entities import Metric, Param, RunTag
from mlflow.tracking import MlflowClient

import crossrl
from crossrl.reports.journal import KEY_TAG, Journal, Sender, is_ref
from crossrl.scenarios import metrics as M
from crossrl.scenarios.catalog import batch_per_worker_key
from crossrl.scenarios.spec import ScenarioSpec, Trial, native_text

DEFAULT_RESULTS_DIR = Path("crossrl-results")
HISTORY_ARTIFACT = "metrics.csv"
NATIVE_CONFIG_ARTIFACT = "native_config.json"
NATIVE_OVERRIDES_TAG = "native.overrides"
"""A trial's engine-native settings on one line (``training.vf_clip_param=5.0``); absent when it ran with none."""
SPEC_ARTIFACT = "spec.json"
CANONICAL_SPEC_ARTIFACT = "spec_canonical.json"


def native_config_artifact(from_env_step: int) -> str:
    """The artifact of a run's native config from ``from_env_step`` on (its first is ``NATIVE_CONFIG_ARTIFACT``)."""
    return f"native_config.from-{from_env_step}.json"


# The MLflow run status each of our statuses maps to (the `status` tag keeps ours exactly).
_MLFLOW_STATUS = {
    M.FINISHED: "FINISHED",
    M.FAILED: "FAILED",
    M.KILLED: "KILLED",
    M.TIMEOUT: "KILLED",
    M.SKIPPED: "KILLED",
}
# A parent run names its owner (host, pid and the pid's start time, so a reused pid is not taken for it)
# and beats every HEARTBEAT_S. A RUNNING parent whose owner is gone (same host: the pid is dead or
# another process; another host: no beat for STALE_AFTER_S) is an orphan: SIGKILL, OOM, power loss.
HEARTBEAT_S = 30.0
STALE_AFTER_S = 600.0
PARENT_KINDS = ("parent", "search", "tuned")  # runs that hold trials: `crossrl run`'s, `crossrl tune`'s two kinds
SUPERSEDED_TAG = "crossrl.superseded_by"  # on a trial run that `crossrl run --resume` ran again
_TRIAL_TAGS = ("engine", "engine_version", "algorithm", "optimizer", "workers", "envs_per_worker", "seed", "layout")


class StoreError(Exception):
    """The store cannot be reached or does not hold what was asked for."""


def resolve_tracking_uri(tracking_uri: str | None, results_dir: Path | None = None) -> str:
    """Explicit URI, else ``MLFLOW_TRACKING_URI``, else the embedded sqlite store under ``results_dir``."""
    uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
    if uri:
        return uri
    folder = (results_dir or DEFAULT_RESULTS_DIR).resolve()
    folder.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{folder / 'mlflow.db'}"


def is_embedded(uri: str) -> bool:
    return uri.startswith("sqlite:")


# Several `crossrl run`, `report` and `ui` may share one embedded store. MLflow creates the sqlite schema
# when a client first opens the store, and two processes doing it at once break it (`table latest_metrics
# already exists`): opening the store holds a lock file next to the db. A connection that finds the db
# busy with another process's write waits for it: MLflow's own sessions up to 20 s (its PRAGMA
# busy_timeout), its other connections (the schema checks on opening) BUSY_TIMEOUT_S instead of
# sqlite3's 5 s.
BUSY_TIMEOUT_S = 60
OPEN_LOCK_TIMEOUT_S = 300.0


def with_busy_timeout(uri: str) -> str:
    """``uri`` with sqlite's busy timeout (``?timeout=``, read by SQLAlchemy's sqlite driver) unless it has one."""
    if not is_embedded(uri) or "timeout=" in uri.partition("?")[2]:
        return uri
    return f"{uri}{'&' if '?' in uri else '?'}timeout={BUSY_TIMEOUT_S}"


def _open_client(uri: str) -> MlflowClient:
    """MLflow's client on ``uri``; on an sqlite file, opened (schema created if new) under ``<db>.lock``."""
    if not is_embedded(uri):
        return MlflowClient(tracking_uri=uri)
    db = uri.removeprefix("sqlite:///").partition("?")[0]
    if not uri.startswith("sqlite:///") or db in ("", ":memory:"):
        return MlflowClient(tracking_uri=with_busy_timeout(uri))
    try:
        with FileLock(f"{db}.lock", timeout=OPEN_LOCK_TIMEOUT_S):
            return MlflowClient(tracking_uri=with_busy_timeout(uri))
    except LockTimeout:
        raise StoreError(
            f"{db}.lock: another process has held the store's lock for {OPEN_LOCK_TIMEOUT_S:g} s (a hung opening?)"
        ) from None


def versions() -> dict[str, str]:
    """Versions of python, crossrl (with git commit) and every engine, without importing them."""
    out = {"python": platform.python_version(), "crossrl": crossrl.__version__}
    for dist in ("torch", "ray", "torchrl", "tensordict", "gymnasium", "mlflow"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = "absent"
    out["crossrl_commit"] = _git_commit()
    return out


def machine() -> dict[str, str]:
    return {
        "host": socket.gethostname(),
        "cpu_count": str(os.cpu_count()),
        "platform": platform.platform(),
        "processor": platform.machine(),
    }


def _git_commit() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short=12", "HEAD"],
            cwd=Path(crossrl.__file__).parent,
            capture_output=True,
            text=True,
            timeout=5,
        )
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def flatten(data: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": "1"}``; lists become JSON; values cut to MLflow's limit."""
    out: dict[str, str] = {}
    for k, v in data.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping) and v:
            out.update(flatten(v, prefix=f"{key}."))
        else:
            text = v if isinstance(v, str) else json.dumps(v, default=str)
            out[key] = text[:500]
    return out


@dataclass
class Loaded:
    """What a report reads: one row per trial, the tidy metric history, and the parent's facts."""

    trials: pd.DataFrame
    points: pd.DataFrame
    meta: dict[str, Any] = field(default_factory=dict)


class ResultsStore:
    """Writes and reads crossrl's layout through MLflow's own client (no global active-run state)."""

    def __init__(self, tracking_uri: str | None = None, *, results_dir: Path | None = None) -> None:
        self.results_dir = (results_dir or DEFAULT_RESULTS_DIR).resolve()
        self.uri = resolve_tracking_uri(tracking_uri, self.results_dir)
        self.client = _open_client(self.uri)
        self._journal: Journal | None = None  # where writes go first, while a run journals them
        self._journaled: Journal | None = None  # the last journal, to resolve its refs
        self._sender: Sender | None = None

    # -- writing -----------------------------------------------------------------------------------
    def experiment_id(self, scenario: str, *, create: bool = True, ui_view: bool = True) -> str | None:
        """The experiment of ``scenario`` (a deleted one restored); made when missing and ``create``, with the view
        `crossrl ui` opens it in (``ui_view``: for experiments of trial runs)."""
        exp = self.client.get_experiment_by_name(scenario)
        if exp is not None:
            if exp.lifecycle_stage == "deleted":
                self.client.restore_experiment(exp.experiment_id)
            return str(exp.experiment_id)
        if not create:
            return None
        location = (self.results_dir / "artifacts").as_uri() if is_embedded(self.uri) else None
        exp_id = str(self.client.create_experiment(scenario, artifact_location=location))
        if ui_view:
            self.set_ui_view(exp_id)
        return exp_id

    def set_ui_view(self, experiment_id: str) -> None:
        """The view MLflow's UI opens the experiment with from `crossrl ui`'s link (reports/ui.py): the trials,
        their return curves first. Set as an experiment tag, rewritten only when it differs."""
        from crossrl.reports.ui import VIEW_TAG, view_state_json

        value = view_state_json()
        if self.client.get_experiment(experiment_id).tags.get(VIEW_TAG) != value:
            self.client.set_experiment_tag(experiment_id, VIEW_TAG, value)

    def start_parent(
        self, spec: ScenarioSpec, *, spec_path: Path | None, command: str = "", kind: str = "parent"
    ) -> str:
        """A parent run: a `crossrl run` (``kind`` "parent"), or a run `crossrl tune` makes (its searches: "search";
        its test-seed runs: "tuned"), which the scenario's own report and `--resume latest` leave out."""
        tags = {
            "crossrl.kind": kind,
            "scenario": spec.name,
            "fingerprint": spec.fingerprint(),
            "command": command[:5000],
            **_owner_tags(),
            **{f"version.{k}": v for k, v in versions().items()},
            **{f"machine.{k}": v for k, v in machine().items()},
        }
        run_id = self._create_run(spec.name, f"{spec.name}-{time.strftime('%Y%m%d-%H%M%S')}", tags)
        self.log_text(run_id, json.dumps(spec.model_dump(mode="json"), indent=2), SPEC_ARTIFACT)
        self.log_text(run_id, json.dumps(spec.canonical(), indent=2), CANONICAL_SPEC_ARTIFACT)
        if spec_path is not None:
            self.log_text(run_id, spec_path.read_text(), f"spec_source/{spec_path.name}")
        return run_id

    def start_trial(self, parent_id: str, trial: Trial, *, spec: ScenarioSpec) -> str:
        tags = {
            "mlflow.parentRunId": parent_id,
            "crossrl.kind": "trial",
            "scenario": trial.scenario,
            "fingerprint": trial.fingerprint,
            "engine": trial.engine,
            "algorithm": trial.algorithm,
            "optimizer": trial.optimizer if trial.engine == "crossrl" else "native",
            "workers": str(trial.workers),
            "envs_per_worker": str(trial.envs_per_worker),
            "seed": str(trial.seed),
            "status": "RUNNING",
            "target_return": "" if trial.target_return is None else str(trial.target_return),
            "budget_env_steps": "" if trial.budget.env_steps is None else str(trial.budget.env_steps),
            "budget_train_seconds": "" if trial.budget.train_seconds is None else f"{trial.budget.train_seconds:g}",
            # budget.stop_at_target: its trials end at different env steps by design (the report compares their
            # final returns as they are, not at the env steps every one reached)
            "budget.stop_at_target": str(trial.budget.stop_at_target).lower(),
            # execution.scaling as this trial ran it, and the batch it sized (the report says which each figure used)
            "scaling": trial.batch_scaling,
            "scaling.batch": f"{batch_per_worker_key(trial.algorithm)}={trial.hp(batch_per_worker_key(trial.algorithm))}",
        }
        if trial.native:  # engine-native settings: this trial does not follow the equal-settings rule
            tags[NATIVE_OVERRIDES_TAG] = native_text(trial.native)
        run_id = self._create_run(trial.scenario, trial.name, tags, ref_tags=("mlflow.parentRunId",))
        params = flatten(spec.model_dump(mode="json", exclude={"description"}), prefix="spec.")
        params.update(flatten(trial.hyperparams, prefix="hp."))
        self._log_params(run_id, params)
        return run_id

    def log_points(self, run_id: str, points: Sequence[tuple[int, Mapping[str, float]]]) -> None:
        """Points, stamped now (a journaled point keeps its stamp, so sending it twice stores it once)."""
        now = int(time.time() * 1000)
        metrics = [
            [k, float(v), now, int(step)]
            for step, values in points
            for k, v in values.items()
            if v is not None and math.isfinite(float(v))
        ]
        if metrics:
            self._emit({"op": "batch", "run": run_id, "metrics": metrics})

    def set_tags(
        self, run_id: str, tags: Mapping[str, str], *, what: str = "tags", ref_tags: Sequence[str] = ()
    ) -> None:
        """Tags on a run; those named in ``ref_tags`` hold a run id that may still be a journal ref (resolved to the
        store's id as it is sent)."""
        op: dict[str, Any] = {"op": "batch", "run": run_id, "tags": {k: str(v)[:5000] for k, v in tags.items()}}
        if ref_tags:
            op["ref_tags"] = list(ref_tags)
        self._emit({**op, "what": what})

    def log_native_config(self, run_id: str, config: Mapping[str, Any], *, from_env_step: int | None = None) -> None:
        """The engine's own config: as ``native.*`` params and an artifact. A later config of the same run (a PBT
        member restarted with a copied configuration at ``from_env_step``) is an artifact of its own: MLflow never
        lets a param change its value."""
        text = json.dumps(dict(config), indent=2, default=str)
        if from_env_step is not None:
            self.log_text(run_id, text, native_config_artifact(from_env_step))
            return
        self.log_text(run_id, text, NATIVE_CONFIG_ARTIFACT)
        self._log_params(run_id, flatten(config, prefix="native."), what="native config")

    def log_text(self, run_id: str, text: str, name: str) -> None:
        self._emit({"op": "artifact", "run": run_id, "name": name, "text": text})

    def log_file(self, run_id: str, path: Path, artifact_path: str | None = None) -> None:
        name = f"{artifact_path}/{path.name}" if artifact_path else path.name
        self._emit({"op": "artifact", "run": run_id, "name": name, "file": str(path)})

    def finish_trial(
        self,
        run_id: str,
        *,
        status: str,
        reason: str = "",
        summary: Mapping[str, float | None] | None = None,
        history: Sequence[tuple[int, Mapping[str, float]]] = (),
        last_step: int = 0,
    ) -> None:
        if status not in M.STATUSES:
            raise ValueError(f"status {status!r} is not one of {M.STATUSES}")
        final = {k: float(v) for k, v in (summary or {}).items() if v is not None and math.isfinite(v)}
        if final:
            self.log_points(run_id, [(last_step, final)])
        if history:
            self.log_text(run_id, _history_csv(history), HISTORY_ARTIFACT)
        self.set_tags(run_id, {"status": status, "reason": reason[:4000]})
        self._emit({"op": "terminate", "run": run_id, "status": _MLFLOW_STATUS[status], "time_ms": _now_ms()})

    def finish_parent(self, run_id: str, *, status: str, counts: Mapping[str, int], reason: str = "") -> None:
        tags = {"status": status, **{f"trials.{k}": str(v) for k, v in counts.items()}}
        if reason:
            tags["reason"] = reason[:4000]
        self.set_tags(run_id, tags)
        self._emit(
            {"op": "terminate", "run": run_id, "status": _MLFLOW_STATUS.get(status, "FINISHED"), "time_ms": _now_ms()}
        )

    # -- the journal: every write above is an op, applied now or journaled first ---------------------
    def start_journal(self, *, warn: Callable[[str], None] = lambda _msg: None) -> Journal:
        """From now on every write goes to a new journal under the results folder, and from there to the
        store in a sender thread (reports/journal.py); runs are named by journal refs until sent."""
        journal = Journal.create(self.results_dir)
        self._sender = Sender(self, warn=warn).start(live=journal)
        self._journal = self._journaled = journal
        self._emit({"op": "header", "uri": self.uri, "host": socket.gethostname(), "pid": os.getpid()})
        return journal

    def end_journal(self, *, wait_s: float) -> int:
        """No more journaled writes; wait up to ``wait_s`` for the store to have them. Returns how many it has not."""
        if self._journal is None or self._sender is None:
            return 0
        journal, self._journal = self._journal, None
        self._sender.close(wait_s)
        return self._sender.unsent(journal)

    @property
    def sender(self) -> Sender | None:
        return self._sender

    def resolve(self, run_id: str) -> str:
        """A journal ref's store run id once the store has it (else the ref itself)."""
        if not is_ref(run_id) or self._sender is None or self._journaled is None:
            return run_id
        return self._sender.run_id(self._journaled, run_id) or run_id

    def wait_resolved(self, run_id: str, *, timeout_s: float) -> str:
        """:meth:`resolve`, waiting up to ``timeout_s`` for the store to create the run."""
        deadline = time.monotonic() + timeout_s
        while is_ref(out := self.resolve(run_id)) and time.monotonic() < deadline:
            time.sleep(0.05)
        return out

    def _emit(self, op: dict[str, Any]) -> None:
        if self._journal is not None and self._sender is not None:
            self._sender.submit(self._journal.append(op))
        else:
            self.apply(op)

    def _create_run(
        self, experiment: str, run_name: str, tags: Mapping[str, str], *, ref_tags: Sequence[str] = ()
    ) -> str:
        op: dict[str, Any] = {
            "op": "create_run",
            "experiment": experiment,
            "run_name": run_name,
            "tags": dict(tags),
            "time_ms": _now_ms(),
            "ref_tags": list(ref_tags),
        }
        if self._journal is not None and self._sender is not None:
            op["ref"] = self._journal.new_ref()
            self._emit(op)
            return str(op["ref"])
        run_id = self.apply(op)
        assert run_id is not None
        return run_id

    def apply(self, op: Mapping[str, Any], *, files: Path | None = None, key: str = "") -> str | None:
        """Carry out one write op (run ids already resolved) on the store; a created run's id is returned.

        ``key`` (a journal's ``<id>/<ref>``) makes creating a run idempotent: the run is tagged with it and
        looked up by it first. ``files`` holds a journal's copies of artifact contents.
        """
        kind, run = op["op"], str(op.get("run", ""))
        if kind == "create_run":
            exp = self.experiment_id(op["experiment"])
            assert exp is not None
            if key:
                found = self.client.search_runs([exp], filter_string=f"tags.`{KEY_TAG}` = '{key}'", max_results=1)
                if found:
                    return str(found[0].info.run_id)
            tags = {**op["tags"], **({KEY_TAG: key} if key else {})}
            created = self.client.create_run(exp, start_time=op.get("time_ms"), tags=tags, run_name=op["run_name"])
            return str(created.info.run_id)
        if kind == "batch":
            metrics = [Metric(key=k, value=v, timestamp=ts, step=step) for k, v, ts, step in op.get("metrics", ())]
            params = [Param(k, v) for k, v in op.get("params", {}).items()]
            run_tags = [RunTag(k, v) for k, v in op.get("tags", {}).items()]
            for i in range(0, len(metrics), 1000):
                self.client.log_batch(run, metrics=metrics[i : i + 1000], synchronous=True)
            for i in range(0, len(params), 100):
                self.client.log_batch(run, params=params[i : i + 100], synchronous=True)
            for i in range(0, len(run_tags), 100):
                self.client.log_batch(run, tags=run_tags[i : i + 100], synchronous=True)
        elif kind == "delete_tags":
            present = self.client.get_run(run).data.tags
            for k in op["keys"]:
                if k in present:
                    self.client.delete_tag(run, k)
        elif kind == "artifact":
            name = str(op["name"])
            folder = os.path.dirname(name) or None
            if "text" in op:
                self.client.log_text(run, op["text"], name)
                return None
            path = Path(op["file"]) if "file" in op else Path(files or ".") / op["journal_file"]
            if path.name == os.path.basename(name):
                self.client.log_artifact(run, str(path), folder)
            else:
                self.client.log_text(run, path.read_text(errors="replace"), name)
        elif kind == "terminate":
            self.client.set_terminated(run, status=op["status"], end_time=op.get("time_ms"))
        elif kind == "reopen":
            self.client.update_run(run, status="RUNNING")
        elif kind != "header":
            raise ValueError(f"unknown store op {kind!r}")
        return None

    # -- owners, orphans, resume -------------------------------------------------------------------
    def heartbeat(self, parent_id: str) -> None:
        """The owner of a running parent run is alive (see HEARTBEAT_S)."""
        self.set_tags(parent_id, {"heartbeat": f"{time.time():.0f}"})

    def reap_orphans(self) -> dict[str, str]:
        """Mark KILLED, with the reason, every RUNNING parent run whose owner is gone, and its RUNNING trials.

        Called by the commands that open the store, so a run that died without cleanup (SIGKILL, OOM, power
        loss) does not stay RUNNING for ever. Returns the parent run ids it marked, each with its reason.
        """
        exps = [e.experiment_id for e in self.client.search_experiments()]
        if not exps:
            return {}
        running = self.client.search_runs(exps, filter_string="attributes.status = 'RUNNING'", max_results=5000)
        marked: dict[str, str] = {}
        for parent in running:
            if parent.data.tags.get("crossrl.kind") not in PARENT_KINDS:  # `crossrl run`'s, and `crossrl tune`'s
                continue
            reason = _orphan_reason(parent.data.tags, started_s=parent.info.start_time / 1000)
            if reason is None:
                continue
            statuses = []
            for child in self.children(parent):
                status = child.data.tags.get("status", "")
                if child.info.status == "RUNNING" or status == "RUNNING":
                    self.finish_trial(child.info.run_id, status=M.KILLED, reason=reason)
                    status = M.KILLED
                statuses.append({"status": status})
            self.finish_parent(parent.info.run_id, status=M.KILLED, counts=iter_statuses(statuses), reason=reason)
            marked[str(parent.info.run_id)] = reason
        return marked

    def children(self, parent: Any, *, superseded: bool = False) -> list[Any]:
        """The trial runs of a parent run (a run object); those a resume ran again only when asked."""
        runs = self.client.search_runs(
            [parent.info.experiment_id],
            filter_string=f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'",
            max_results=5000,
        )
        return [r for r in runs if superseded or SUPERSEDED_TAG not in r.data.tags]

    def parent_run(self, parent_id: str) -> Any:
        try:
            return self.client.get_run(parent_id)
        except Exception as e:
            raise StoreError(f"run {parent_id!r} not found in {self.uri}: {e}") from None

    def reopen_parent(self, parent_id: str) -> None:
        """A parent run taken up again by `crossrl run --resume`: RUNNING, owned by this process."""
        run = self.parent_run(parent_id)
        resumes = int(run.data.tags.get("resumes", "0") or 0) + 1
        stale = [k for k in run.data.tags if k.startswith("trials.") or k == "reason"]  # its last ending's
        if stale:
            self._emit({"op": "delete_tags", "run": parent_id, "keys": stale})
        self.set_tags(parent_id, {**_owner_tags(), "status": "RUNNING", "resumes": str(resumes)})
        self._emit({"op": "reopen", "run": parent_id})

    def supersede(self, trial_run_id: str, *, by: str) -> None:
        """An interrupted trial run that a resume ran again: kept, but no longer one of the parent's trials."""
        self._emit({"op": "batch", "run": trial_run_id, "tags": {SUPERSEDED_TAG: by}, "ref_tags": [SUPERSEDED_TAG]})

    def log_bench(self, kind: str, *, data: Mapping[str, Any], metrics: Mapping[str, float], command: str = "") -> str:
        """One run in experiment ``bench-<kind>``: the figures as metrics, the whole result as ``bench.json``.

        Tagged with the package versions and the machine like a scenario's parent run, so benchmark
        runs from different commits or machines can be told apart in the MLflow UI.
        """
        exp = self.experiment_id(f"bench-{kind}", ui_view=False)  # no trials: MLflow's own charts
        assert exp is not None
        tags = {
            "crossrl.kind": "bench",
            "bench": kind,
            "command": command[:5000],
            **{f"version.{k}": v for k, v in versions().items()},
            **{f"machine.{k}": v for k, v in machine().items()},
        }
        run = self.client.create_run(exp, run_name=f"bench-{kind}-{time.strftime('%Y%m%d-%H%M%S')}", tags=tags)
        run_id = str(run.info.run_id)
        conditions = data.get("conditions")
        if isinstance(conditions, Mapping):
            self._log_params(run_id, flatten(conditions, prefix="conditions."))
        self.log_points(run_id, [(0, metrics)])
        self.client.log_dict(run_id, dict(data), "bench.json")
        self.client.set_terminated(run_id, status="FINISHED")
        return run_id

    def _log_params(self, run_id: str, params: Mapping[str, str], *, what: str = "params") -> None:
        self._emit(
            {"op": "batch", "run": run_id, "params": {_param_key(k): v for k, v in params.items()}, "what": what}
        )

    # -- reading -----------------------------------------------------------------------------------
    def parent_runs(self, scenario: str) -> list[Any]:
        """Parent runs of a scenario, newest first."""
        exp = self.experiment_id(scenario, create=False)
        if exp is None:
            raise StoreError(f"no results for scenario {scenario!r} in {self.uri} (run `crossrl run {scenario}`)")
        return list(
            self.client.search_runs(
                [exp], filter_string="tags.`crossrl.kind` = 'parent'", order_by=["attributes.start_time DESC"]
            )
        )

    def layout_sweeps(self, env_id: str, *, newest: int = 20) -> list[dict[str, Any]]:
        """The ``crossrl bench sampling --sweep`` results stored for ``env_id`` (their ``bench.json`` with the run's
        ``start_time`` in ms), newest first, among the ``newest`` sweep runs of any env."""
        exp = self.experiment_id("bench-sampling-sweep", create=False)
        if exp is None:
            return []
        runs = self.client.search_runs([exp], order_by=["attributes.start_time DESC"], max_results=newest)
        out = []
        for run in runs:
            try:
                data = json.loads(self.artifact_bytes(run.info.run_id, "bench.json"))
            except Exception:  # noqa: BLE001 - a sweep without its JSON is skipped, not fatal to a report
                continue
            if data.get("env_id") == env_id:
                out.append({**data, "start_time": run.info.start_time, "run_id": run.info.run_id})
        return out

    def spec(self, parent_id: str, *, canonical: bool = False) -> dict[str, Any]:
        """The spec a `crossrl run` stored (as validated; or its canonical form, the fingerprint's input)."""
        path = self.client.download_artifacts(parent_id, CANONICAL_SPEC_ARTIFACT if canonical else SPEC_ARTIFACT)
        return json.loads(Path(path).read_text())  # type: ignore[no-any-return]

    def load(self, *, scenario: str | None = None, parent_id: str | None = None, latest_only: bool = True) -> Loaded:
        """Trials and metric history of one parent run (by id, or a scenario's newest), or all of a scenario's.

        ``latest_only=False`` takes every parent run of the scenario (for comparisons across runs).
        """
        if parent_id:
            parents = [self.parent_run(parent_id)]
        elif scenario:
            parents = self.parent_runs(scenario)
            if not parents:
                raise StoreError(f"no `crossrl run` of scenario {scenario!r} in {self.uri}")
            if latest_only:
                parents = parents[:1]
        else:
            raise StoreError("name a scenario or a parent run id")
        trials, frames = [], []
        for parent in parents:
            for run in self.children(parent):
                trials.append(_trial_row(run))
                frames.append(self._history(run))
        points = (
            pd.concat(frames, ignore_index=True)
            if frames
            else pd.DataFrame({"run_id": [], "metric": [], "step": [], "value": []})
        )
        trials_df = pd.DataFrame(trials)
        if not trials_df.empty:
            trials_df = trials_df.sort_values(["engine", "workers", "seed"], kind="stable").reset_index(drop=True)
        meta = _meta(parents[0])
        raw = [m.value for m in self.client.get_metric_history(parents[0].info.run_id, M.RAW_ENV_STEPS_PER_S)]
        meta[M.RAW_ENV_STEPS_PER_S] = sum(raw) / len(raw) if raw else math.nan
        return Loaded(trials=trials_df, points=points, meta=meta)

    def artifact_bytes(self, run_id: str, name: str) -> bytes:
        """The contents of one artifact of a run (e.g. a trial's ``clip.gif``)."""
        import tempfile

        with tempfile.TemporaryDirectory(prefix="crossrl-artifact-") as tmp:
            return Path(self.client.download_artifacts(run_id, name, tmp)).read_bytes()

    def points_of(self, run_id: str) -> list[tuple[int, dict[str, float]]]:
        """A trial run's points as its trial logged them: (env step, {metric: value}) in step order, point metrics
        only (what ``crossrl run --resume`` carries over into the attempt that continues it)."""
        df = self._history(self.client.get_run(run_id))
        out: dict[int, dict[str, float]] = {}
        for metric, step, value in zip(df.metric, df.step, df.value, strict=True):
            if M.is_point_metric(str(metric)):
                out.setdefault(int(step), {})[str(metric)] = float(value)
        return sorted(out.items())

    def _history(self, run: Any) -> pd.DataFrame:
        run_id = run.info.run_id
        try:
            text = self.client.download_artifacts(run_id, HISTORY_ARTIFACT)
            df = pd.read_csv(text)
        except Exception:  # no history artifact (a run cut off before the end): ask MLflow per metric
            rows = [
                (run_id, key, m.step, m.value)
                for key in run.data.metrics
                if key not in M.SUMMARY_METRICS
                for m in self.client.get_metric_history(run_id, key)
            ]
            return pd.DataFrame(rows, columns=["run_id", "metric", "step", "value"])
        df.insert(0, "run_id", run_id)
        return df


def _param_key(key: str) -> str:
    """MLflow allows alphanumerics, ``_ - . space : /`` in names (250 characters): replace the rest."""
    return re.sub(r"[^A-Za-z0-9_\-. :/]", "_", key)[:250]


def _history_csv(history: Sequence[tuple[int, Mapping[str, float]]]) -> str:
    buf = io.StringIO()
    buf.write("metric,step,value\n")
    for step, values in history:
        for k, v in values.items():
            buf.write(f"{k},{int(step)},{float(v)!r}\n")
    return buf.getvalue()


def _int_or_zero(text: str | None) -> int:
    value = _num(text)
    return int(value) if math.isfinite(value) else 0


def _now_ms() -> int:
    return int(time.time() * 1000)


def _num(text: str | None) -> float:
    try:
        return float(text) if text not in (None, "") else math.nan
    except ValueError:
        return math.nan


def _trial_row(run: Any) -> dict[str, Any]:
    tags, metrics = run.data.tags, run.data.metrics
    row: dict[str, Any] = {
        "run_id": run.info.run_id,
        "trial": run.info.run_name,
        "scenario": tags.get("scenario", ""),
        "fingerprint": tags.get("fingerprint", ""),
        **{k: tags.get(k, "") for k in _TRIAL_TAGS},
        "status": tags.get("status", "UNKNOWN"),
        "reason": tags.get("reason", ""),
        "target_return": _num(tags.get("target_return")),
        "budget_env_steps": _int_or_zero(tags.get("budget_env_steps")),  # 0: a time budget only
        "stop_at_target": tags.get("budget.stop_at_target") == "true",
        "scaling": tags.get("scaling", ""),  # strong / weak ("" before execution.scaling existed)
        "scaling_batch": tags.get("scaling.batch", ""),  # e.g. train_batch=4000
        # a sweep's trial (`crossrl run --parallel`) that ran beside others on its node: contended speed
        "node_shared": tags.get("node.shared") == "true",
        # a pixel env's clip of the final policy (crossrl.adapters.base.send_clip): artifact name, raw score, steps
        "clip": tags.get("clip", ""),
        "clip_score": _num(tags.get("clip.score")),
        "clip_length": _num(tags.get("clip.length")),
        "clip_ended": tags.get("clip.ended", "") != "false",
        "clip_policy": tags.get("clip.policy", ""),
        # engine-native settings the trial ran with (the spec's native section): outside the equal-settings rule
        "native_overrides": tags.get(NATIVE_OVERRIDES_TAG, ""),
    }
    for k in ("workers", "envs_per_worker", "seed"):
        row[k] = int(row[k]) if str(row[k]).isdigit() else -1
    for k in (*M.SUMMARY_METRICS, "setup_s"):
        row[k] = metrics.get(k, math.nan)
    return row


def _meta(parent: Any) -> dict[str, Any]:
    tags = parent.data.tags
    return {
        "scenario": tags.get("scenario", ""),
        "fingerprint": tags.get("fingerprint", ""),
        "parent_run_id": parent.info.run_id,
        "experiment_id": parent.info.experiment_id,
        "versions": {k.removeprefix("version."): v for k, v in tags.items() if k.startswith("version.")},
        "machine": {k.removeprefix("machine."): v for k, v in tags.items() if k.startswith("machine.")},
        "command": tags.get("command", ""),
        "status": tags.get("status", ""),
        "created": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(parent.info.start_time / 1000)),
    }


def _owner_tags() -> dict[str, str]:
    """Who runs a parent run: this host and process (with its start time), and a first heartbeat."""
    import psutil

    pid = os.getpid()
    return {
        "owner.host": socket.gethostname(),
        "owner.pid": str(pid),
        "owner.pid_start": f"{psutil.Process(pid).create_time():.2f}",
        "heartbeat": f"{time.time():.0f}",
    }


def _orphan_reason(tags: Mapping[str, str], *, started_s: float, now: float | None = None) -> str | None:
    """Why a RUNNING parent run's owner is gone, or None while it may still be alive."""
    import psutil

    now = time.time() if now is None else now
    host, pid, pid_start = tags.get("owner.host"), tags.get("owner.pid", ""), tags.get("owner.pid_start", "")
    beat = _num(tags.get("heartbeat"))
    last = beat if math.isfinite(beat) else started_s
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(last))
    if host == socket.gethostname() and pid.isdigit():
        try:
            alive = abs(psutil.Process(int(pid)).create_time() - float(pid_start or "nan")) < 1.0
        except (psutil.Error, ValueError):
            alive = False
        if alive:
            return None
        return f"its process (pid {pid} on {host}) ended without closing the run (last heartbeat {when})"
    if now - last > STALE_AFTER_S:
        owner = f"pid {pid} on {host}" if host else "an unrecorded owner"
        return f"no heartbeat from its process ({owner}) since {when}"
    return None


def iter_statuses(rows: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for r in rows:
        counts[str(r["status"])] = counts.get(str(r["status"]), 0) + 1
    return counts
