"""The paired A/B gate (``crossrl ab BASE``): the base commit and the working tree measured side by side.

A stored baseline from another day and host cannot see a 5 % slowdown on a shared machine; a paired run
can. ``BASE`` is extracted from git into a temporary directory (``git archive``, nothing else in the
repository is touched) and run from the same Python environment, which is allowed only when its pinned
requirements (``requirements.txt``, ``constraints.txt``, ``pyproject.toml``'s dependencies) are those of
the working tree. Per engine and worker count, each side runs in a measurement process of its own code
(the sampling bench's contestants, :func:`~crossrl.measure.bench.contestants.serve`) whose env-stepping
processes are replaced, on both sides at once, for every *draw* (pairs measured in one set of processes
share part of their speed offset; docs/performance.md); inside a draw the gate alternates short slices of
iterations between the two sides (A B B A ...), because this VM's CPU speed drifts within seconds and only
sides measured in the same second see the same machine.

What is compared is **env steps per CPU-second** of the measured processes (the driver and the processes
that step the envs): what a code change costs per step, which other jobs on the machine dilute far less
than wall time (docs/performance.md, "The A/B gate"). Wall-clock steps/s is measured and reported beside
it. Each pair gives a head/base ratio; their IQM (in log terms, the report's own estimate) is the
estimate and a two-level percentile bootstrap (draws, then pairs;
:func:`crossrl.reports.stats.paired_ratio_ci`) its 95 % CI. Draws are added until every CI is narrow
enough (half-width at most ``precision``) or the time limit would be passed; the result says which.
Verdict per (engine, workers): REGRESSION when the whole CI lies below ``threshold``, improved when it
lies above ``1 / threshold``, ok otherwise.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import select
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from crossrl.core.evaluator import PLANTED_SLOWDOWN_ENV
from crossrl.measure.bench.commands import auto_fragment
from crossrl.measure.bench.samplers import DEFAULT_MODEL, SETUP_TIMEOUT_S
from crossrl.orchestration.procs import kill_tree
from crossrl.orchestration.runner import child_env
from crossrl.reports.regress import IMPROVED, OK, REGRESSION, Comparison
from crossrl.reports.stats import PairedRatio, paired_ratio_ci
from crossrl.scenarios.spec import EnvSpec, ModelSpec

REQUIREMENT_FILES = ("requirements.txt", "constraints.txt")
METRIC = "env steps per CPU-second"
WALL_METRIC = "env steps/s (wall)"
Progress = Callable[[str], None]


class ABError(Exception):
    """The gate cannot run: an unknown revision, other requirements, a base that cannot be measured (exit 2)."""


def _git(repo: Path, *args: str) -> str:
    proc = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True)
    if proc.returncode != 0:
        raise ABError(
            f"git {' '.join(args)}: {proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else 'failed'}"
        )
    return proc.stdout


def repo_root(package_dir: Path | None = None) -> Path:
    """The git work tree that holds the running crossrl (the head of the comparison)."""
    here = package_dir or Path(__file__).resolve().parents[2]
    try:
        return Path(_git(here, "rev-parse", "--show-toplevel").strip())
    except ABError:
        raise ABError(f"crossrl at {here} is not in a git work tree: the A/B gate needs the repository") from None


def resolve(repo: Path, rev: str) -> str:
    """The commit id of ``rev`` in ``repo``; ABError (one line) when there is none."""
    try:
        return _git(repo, "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}").strip()
    except ABError:
        raise ABError(
            f"base revision {rev!r} is not a commit of {repo} (fetch it first, e.g. git fetch origin main)"
        ) from None


def _pyproject_deps(text: str) -> dict[str, Any]:
    project = tomllib.loads(text).get("project", {})
    return {"dependencies": project.get("dependencies", []), "optional": project.get("optional-dependencies", {})}


def requirement_differences(repo: Path, commit: str) -> list[str]:
    """The requirement files in which ``commit`` differs from the work tree (empty: the same pinned set)."""
    out = []
    for name in REQUIREMENT_FILES:
        head = (repo / name).read_text() if (repo / name).exists() else None
        try:
            base: str | None = _git(repo, "show", f"{commit}:{name}")
        except ABError:
            base = None
        if head != base:
            out.append(name)
    try:
        base_deps = _pyproject_deps(_git(repo, "show", f"{commit}:pyproject.toml"))
    except ABError:
        base_deps = None
    head_deps = _pyproject_deps((repo / "pyproject.toml").read_text()) if (repo / "pyproject.toml").exists() else None
    if base_deps != head_deps:
        out.append("pyproject.toml dependencies")
    return out


CHILD_MODULE = "crossrl.measure.bench._child"
OLD_CHILD_MODULE = "crossrl.adapters.bench._child"  # where a base from before ``crossrl.measure`` has it


def child_module(root: Path | None) -> str:
    """The measurement process's module in the ``crossrl`` package under ``root`` (None: this installed one): a base
    commit from before the benchmarks moved to ``crossrl.measure`` has it under ``crossrl.adapters``."""
    if root is None or (root / "crossrl" / "measure" / "bench" / "_child.py").exists():
        return CHILD_MODULE
    return OLD_CHILD_MODULE


@contextmanager
def checkout(repo: Path, commit: str) -> Iterator[Path]:
    """``commit``'s tree as an importable ``crossrl`` package: yields the directory to put on PYTHONPATH."""
    tmp = Path(tempfile.mkdtemp(prefix="crossrl-ab-base-"))
    try:
        pkg = tmp / "crossrl"
        pkg.mkdir()
        archive = subprocess.Popen(["git", "-C", str(repo), "archive", commit], stdout=subprocess.PIPE)
        tar = subprocess.run(["tar", "-x", "-C", str(pkg)], stdin=archive.stdout, capture_output=True)
        if archive.stdout is not None:
            archive.stdout.close()
        if archive.wait() != 0 or tar.returncode != 0:
            raise ABError(f"could not extract {commit[:12]} from {repo}: {tar.stderr.decode(errors='replace')[-200:]}")
        layer = "measure" if child_module(tmp) == CHILD_MODULE else "adapters"
        contestants = pkg / layer / "bench" / "contestants.py"
        if not contestants.exists() or "def serve(" not in contestants.read_text():
            raise ABError(
                f"base {commit[:12]} predates the A/B gate's measurement server (measure/bench/contestants.py: "
                "serve): compare against a commit that has `crossrl ab`"
            )
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


class Server:
    """One side's measurement process (``_child --serve``): set up and warmed once, then a window per call."""

    def __init__(
        self, request: dict[str, Any], *, env: dict[str, str], workdir: Path, name: str, module: str = CHILD_MODULE
    ) -> None:
        self.name, self.log = name, workdir / f"{name}.log"
        req = workdir / f"{name}.json"
        req.write_text(json.dumps(request))
        cmd_r, cmd_w = os.pipe()
        rep_r, rep_w = os.pipe()
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", module, "--serve", str(req), str(cmd_r), str(rep_w)],
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True, env=env, pass_fds=(cmd_r, rep_w),
            )  # fmt: skip
        os.close(cmd_r)
        os.close(rep_w)
        self._cmd = os.fdopen(cmd_w, "w")
        self._rep = os.fdopen(rep_r)

    def _reply(self, timeout_s: float) -> dict[str, Any]:
        ready, _, _ = select.select([self._rep], [], [], timeout_s)
        line = self._rep.readline() if ready else ""
        if not line:
            if ready:  # the reply pipe closed: the process is ending, let it finish writing its traceback
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.proc.wait(timeout=10)
            tail = self.log.read_text(errors="replace")[-1500:] if self.log.exists() else ""
            why = f"no reply within {timeout_s:.0f} s" if not ready else "it ended"
            raise ABError(f"the {self.name} measurement process failed ({why}); its log ends:\n{tail}")
        data: dict[str, Any] = json.loads(line)
        return data

    def _ask(self, cmd: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        self._cmd.write(json.dumps(cmd) + "\n")
        self._cmd.flush()
        return self._reply(timeout_s)

    def ready(self) -> dict[str, Any]:
        """Wait for set-up and warm-up: ``iteration_s`` (the seconds one iteration took) and ``can_redraw``."""
        return self._reply(SETUP_TIMEOUT_S)

    def ask_redraw(self) -> None:
        """Ask for fresh env-stepping processes (only when :meth:`ready` said ``can_redraw``); answered by
        :meth:`redrawn`, so that both sides' replacements start and warm up at once."""
        self._cmd.write(json.dumps({"redraw": True}) + "\n")
        self._cmd.flush()

    def redrawn(self) -> float:
        """Wait for the redraw asked for; the seconds it took, warm-up included."""
        return float(self._reply(SETUP_TIMEOUT_S)["redraw_s"])

    def run(self, iterations: int) -> None:
        self._ask({"run": iterations}, SETUP_TIMEOUT_S)

    def read(self) -> dict[str, float]:
        return self._ask({"read": True}, SETUP_TIMEOUT_S)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._cmd.write("{}\n")
            self._cmd.flush()
        with contextlib.suppress(OSError):
            self._cmd.close()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            kill_tree(self.proc.pid, grace_s=0)
            self.proc.wait()
        self._rep.close()


@dataclass
class Measurement:
    """One process's figures: env steps/s over the timed window and env steps per CPU-second."""

    steps_per_s: float
    steps_per_cpu_s: float
    cpus: float  # CPU-seconds of the measured processes per second of its slices (their idle CPU included)


@dataclass
class Pair:
    base: Measurement
    head: Measurement
    first: str  # "base" or "head": which was measured first
    draw: int  # the draw of env-stepping processes (both sides' actors) that measured it: the bootstrap's group
    process: int  # the pair of measurement processes (base, head) it ran in

    @property
    def ratio(self) -> float:
        return self.head.steps_per_cpu_s / self.base.steps_per_cpu_s

    @property
    def wall_ratio(self) -> float:
        return self.head.steps_per_s / self.base.steps_per_s


@dataclass
class Cell:
    """One engine at one worker count: its pairs, and (once computed) its ratios and verdict."""

    engine: str
    workers: int
    pairs: list[Pair] = field(default_factory=list)
    draws: int = 0  # draws of env-stepping processes so far
    processes: int = 0  # pairs of measurement processes started so far
    ratio: PairedRatio | None = None
    wall_ratio: PairedRatio | None = None
    verdict: str = OK

    @property
    def key(self) -> str:
        return f"{self.engine}/w{self.workers}"

    def paired(self, figure: str, rng: np.random.Generator) -> PairedRatio:
        """Head/base of one :class:`Measurement` field over the pairs so far, CI resampling draws then pairs."""
        return paired_ratio_ci(
            [getattr(q.head, figure) for q in self.pairs],
            [getattr(q.base, figure) for q in self.pairs],
            groups=[q.draw for q in self.pairs],
            rng=rng,
        )

    def half_width(self) -> float:
        """Half the CI's width in log terms (0.01: about +-1 %); inf before there is a CI."""
        r = self.ratio
        if r is None or not (r.lo > 0 and r.hi > 0):
            return math.inf
        return (math.log(r.hi) - math.log(r.lo)) / 2


def measurement(before: dict[str, float], after: dict[str, float], name: str) -> Measurement:
    """One side's figures over a pair, from two reads of its server's totals (steps, active_s, cpu_s)."""
    steps, active, cpu = (after[k] - before[k] for k in ("steps", "active_s", "cpu_s"))
    if not (steps > 0 and active > 0 and cpu > 0):
        raise ABError(f"{name}: a pair measured no steps or no CPU time ({steps}, {active}, {cpu})")
    return Measurement(steps_per_s=steps / active, steps_per_cpu_s=steps / cpu, cpus=cpu / active)


def verdict(r: PairedRatio, threshold: float) -> str:
    """REGRESSION: the whole CI below ``threshold``; improved: the whole CI above ``1 / threshold``; else ok."""
    if r.hi < threshold:
        return REGRESSION
    if r.lo > 1 / threshold:
        return IMPROVED
    return OK


@dataclass
class ABResult:
    base_rev: str
    base_commit: str
    head_commit: str
    head_dirty: bool
    env_id: str
    conditions: dict[str, Any]
    cells: list[Cell]
    stop_reason: str
    elapsed_s: float

    def regressions(self) -> list[Cell]:
        return [c for c in self.cells if c.verdict == REGRESSION]

    @property
    def head_label(self) -> str:
        return f"{self.head_commit[:12]}{' + uncommitted changes' if self.head_dirty else ''}"

    def comparisons(self) -> list[Comparison]:
        """One row per cell, in ``crossrl regress``'s shape (its Markdown and JUnit writers take them)."""
        out = []
        for c in self.cells:
            r, w = c.ratio, c.wall_ratio
            assert r is not None and w is not None
            base = float(np.median([p.base.steps_per_cpu_s for p in c.pairs]))
            head = float(np.median([p.head.steps_per_cpu_s for p in c.pairs]))
            detail = (
                f"{len(c.pairs)} pairs in {c.draws} draws; wall steps/s ratio {w.ratio:.3f} [{w.lo:.3f}, {w.hi:.3f}]; "
                f"threshold {self.conditions['threshold']:g}"
            )
            change = f"{r.ratio:.3f} [{r.lo:.3f}, {r.hi:.3f}]"
            out.append(Comparison(c.key, METRIC, f"{base:,.0f}", f"{head:,.0f}", change, c.verdict, detail))
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "base_rev": self.base_rev,
            "base_commit": self.base_commit,
            "head_commit": self.head_commit,
            "head_dirty": self.head_dirty,
            "env_id": self.env_id,
            "conditions": self.conditions,
            "stop_reason": self.stop_reason,
            "elapsed_s": self.elapsed_s,
            "cells": [
                {
                    "engine": c.engine,
                    "workers": c.workers,
                    "verdict": c.verdict,
                    "ratio": asdict(c.ratio) if c.ratio else None,
                    "wall_ratio": asdict(c.wall_ratio) if c.wall_ratio else None,
                    "draws": c.draws,
                    "processes": c.processes,
                    "pairs": [asdict(p) for p in c.pairs],
                }
                for c in self.cells
            ],
        }

    def to_json(self, path: Path) -> Path:
        from crossrl.measure.bench.results import write_result

        return write_result(path, "ab", self.to_dict())

    def metrics(self) -> dict[str, float]:
        out: dict[str, float] = {"elapsed_s": self.elapsed_s}
        for c in self.cells:
            if c.ratio is not None and c.wall_ratio is not None:
                k = f"{c.engine}.w{c.workers}"
                out |= {f"{k}.ratio": c.ratio.ratio, f"{k}.ratio_lo": c.ratio.lo, f"{k}.ratio_hi": c.ratio.hi,
                        f"{k}.wall_ratio": c.wall_ratio.ratio, f"{k}.pairs": float(len(c.pairs))}  # fmt: skip
        return out


class Sides:
    """The two measurement processes (base and head) of each cell while they last, and its draws in them.

    A draw gives both sides fresh env-stepping processes: redrawn in the live measurement processes when both can and
    they have had fewer than ``draws_per_process`` draws, else in a fresh pair of measurement processes."""

    def __init__(self, requests: Mapping[str, dict[str, Any]], envs: Mapping[str, dict[str, str]], *,
                 draws_per_process: int) -> None:  # fmt: skip
        self.requests, self.envs, self.draws_per_process = requests, envs, draws_per_process
        self.alive: dict[str, dict[str, Server]] = {}  # per cell: its two measurement processes
        self.live: dict[str, dict[str, Any]] = {}  # per cell: iteration_s, can_redraw, draws in these processes

    def close(self, key: str) -> None:
        for srv in self.alive.pop(key, {}).values():
            srv.close()

    def close_all(self) -> None:
        for key in list(self.alive):
            self.close(key)

    def new_draw(self, cell: Cell, base_path: Path, workdir: Path) -> str:
        """Fresh env-stepping processes on both sides of ``cell``; says how they came."""
        state = self.live.get(cell.key)
        if state is not None and state["can_redraw"] and state["draws"] < self.draws_per_process:
            servers = self.alive[cell.key]
            t0 = time.monotonic()
            for side in ("base", "head"):
                servers[side].ask_redraw()
            for side in ("base", "head"):
                servers[side].redrawn()
            state["draws"] += 1
            return f"redrawn in {time.monotonic() - t0:.1f} s"
        self.close(cell.key)
        env = {"base": {**self.envs["base"], "PYTHONPATH": str(base_path)}, "head": self.envs["head"]}
        t0 = time.monotonic()
        servers = self.alive[cell.key] = {}
        for side in ("base", "head"):
            module = child_module(base_path if side == "base" else None)
            servers[side] = Server(self.requests[cell.key], env=env[side], workdir=workdir, name=side, module=module)
        ready = {side: servers[side].ready() for side in ("base", "head")}
        self.live[cell.key] = {
            "iteration_s": statistics.fmean(float(r["iteration_s"]) for r in ready.values()),
            "can_redraw": all(r.get("can_redraw") for r in ready.values()),  # a base from before redraws: no
            "draws": 1,
        }
        cell.processes += 1
        return f"fresh processes in {time.monotonic() - t0:.1f} s"


def measure_pairs(
    servers: Mapping[str, Server], cell: Cell, *, index: int, iteration_s: float, seconds: float, slice_s: float,
    pairs: int,
) -> None:  # fmt: skip
    """``pairs`` pairs of ``cell`` in one draw: each alternates slices of the same iterations on both sides (A B B A A
    B ..., the first side alternating from pair to pair) until each side has run about ``seconds``."""
    k = max(1, round(slice_s / iteration_s))  # the same iterations per slice on both sides
    rounds = max(1, round(seconds / (k * iteration_s)))
    for _ in range(pairs):
        order = ["base", "head"] if len(cell.pairs) % 2 == 0 else ["head", "base"]
        first = order[0]
        before = {side: servers[side].read() for side in order}
        for _ in range(rounds):
            for side in order:
                servers[side].run(k)
            order.reverse()  # A B B A A B ...: neither side always follows the other
        after = {side: servers[side].read() for side in order}
        got = {side: measurement(before[side], after[side], side) for side in order}
        cell.pairs.append(Pair(base=got["base"], head=got["head"], first=first, draw=index, process=cell.processes - 1))


def stop_reason(cells: Sequence[Cell], *, precision: float, min_pairs: int, max_seconds: float, elapsed_s: float,
                slowest_draw_s: float) -> str | None:  # fmt: skip
    """Why the gate stops after this draw (every CI narrow enough, or the next draw would pass the time limit), or
    None to draw again."""
    n = min(len(c.pairs) for c in cells)
    if n >= min_pairs and all(c.half_width() <= precision for c in cells):
        return f"every CI within +-{precision:.1%} after {n} pairs"
    if elapsed_s + slowest_draw_s > max_seconds:
        widest = max(c.half_width() for c in cells)
        return f"time limit {max_seconds:.0f} s: {n} pairs, the widest CI +-{widest:.1%} (asked for +-{precision:.1%})"
    return None


def _check_settings(*, threshold: float, min_pairs: int, max_pairs: int, pairs_per_draw: int,
                    draws_per_process: int) -> None:  # fmt: skip
    if not 0 < threshold < 1:
        raise ABError(f"--threshold {threshold:g} must lie between 0 and 1 (0.98: flag a 2 % slowdown)")
    if min_pairs < 2 or max_pairs < min_pairs or pairs_per_draw < 1 or draws_per_process < 1:
        raise ABError(
            f"--min-pairs {min_pairs} must be >= 2 and at most --max-pairs {max_pairs}; --pairs-per-draw "
            f"{pairs_per_draw} and --draws-per-process {draws_per_process} at least 1"
        )


def _base_commit(repo: Path, base_rev: str) -> str:
    """``base_rev`` as a commit that can run from this environment (the same pinned requirements), or ABError."""
    commit = resolve(repo, base_rev)
    differ = requirement_differences(repo, commit)
    if differ:
        raise ABError(
            f"base {base_rev} ({commit[:12]}) pins other requirements ({', '.join(differ)}): "
            "it cannot run from this environment; compare commits with the same pinned set"
        )
    return commit


def run_ab(
    base_rev: str,
    *,
    env_spec: EnvSpec,
    model: ModelSpec = DEFAULT_MODEL,
    engines: Sequence[str] = ("crossrl",),
    workers: Sequence[int] = (1,),
    envs_per_worker: int = 8,
    seconds: float = 2.0,
    warmup_s: float = 3.0,
    slice_s: float = 0.1,
    pairs_per_draw: int = 1,
    draws_per_process: int = 8,
    threshold: float = 0.98,
    precision: float = 0.015,
    min_pairs: int = 24,
    max_pairs: int = 200,
    max_seconds: float = 540.0,
    plant_slowdown: float = 0.0,
    seed: int = 0,
    repo: Path | None = None,
    progress: Progress | None = None,
) -> ABResult:
    """Measure ``base_rev`` against the running crossrl's work tree; see the module's docstring.

    Each side has a measurement process (``_child --serve``) per engine and worker count. A *draw* gives
    both sides fresh env-stepping processes (evaluator actors, env runners), warmed up for ``warmup_s``:
    in the live measurement processes (``redraw``) or, every ``draws_per_process`` draws and whenever a
    side cannot redraw (a base from before redraws, an engine without them), in a fresh pair of
    measurement processes (:class:`Sides`). Pairs measured in one set of processes share part of their speed
    offset, and a redraw costs about 4 s where fresh measurement processes cost about 9 s (docs/performance.md).
    Each draw measures ``pairs_per_draw`` pairs (:func:`measure_pairs`); a pair alternates slices of about
    ``slice_s`` (the same number of iterations on both sides), A B B A A B ..., until each side has run about
    ``seconds``. Draws repeat until the stop rule (:func:`stop_reason`: ``precision``, ``min_pairs``,
    ``max_pairs``, ``max_seconds``: no draw is started that would end past it, judged by the slowest so far). The
    CI resamples draws, then pairs inside them. ``plant_slowdown`` (test-only, for the gate's power): the head's
    evaluators burn that fraction more CPU per sample call (``crossrl.core.evaluator``).
    """
    _check_settings(threshold=threshold, min_pairs=min_pairs, max_pairs=max_pairs, pairs_per_draw=pairs_per_draw,
                    draws_per_process=draws_per_process)  # fmt: skip
    t_start = time.monotonic()
    repo = repo or repo_root()
    commit = _base_commit(repo, base_rev)
    head_commit = _git(repo, "rev-parse", "HEAD").strip()
    head_dirty = bool(_git(repo, "status", "--porcelain", "--untracked-files=no").strip())
    cells = [Cell(e, w) for e in engines for w in workers]
    rng = np.random.default_rng(seed)
    envs = {"base": child_env(), "head": child_env()}
    if plant_slowdown:
        envs["head"][PLANTED_SLOWDOWN_ENV] = repr(plant_slowdown)
    requests = {
        c.key: {
            "engine": c.engine, "env_spec": env_spec.model_dump(mode="json"), "workers": c.workers,
            "envs_per_worker": envs_per_worker, "model": model.model_dump(mode="json"),
            "fragment": auto_fragment(c.workers, envs_per_worker), "warmup_s": warmup_s,
            "optimizer": "sync_samples" if c.engine == "crossrl" else None, "pin": True,
        }
        for c in cells
    }  # fmt: skip
    sides = Sides(requests, envs, draws_per_process=draws_per_process)
    reason = f"--max-pairs {max_pairs} reached"
    slowest = 0.0
    with checkout(repo, commit) as base_path, tempfile.TemporaryDirectory(prefix="crossrl-ab-") as tmp:
        try:
            for i in range(-(-max_pairs // pairs_per_draw)):
                t_draw = time.monotonic()
                for cell in cells:
                    how = sides.new_draw(cell, base_path, Path(tmp))
                    measure_pairs(sides.alive[cell.key], cell, index=i, iteration_s=sides.live[cell.key]["iteration_s"],
                                  seconds=seconds, slice_s=slice_s, pairs=pairs_per_draw)  # fmt: skip
                    cell.draws += 1
                    cell.ratio, cell.wall_ratio = cell.paired("steps_per_cpu_s", rng), cell.paired("steps_per_s", rng)
                    if progress:
                        progress(_draw_line(cell, i, how, pairs_per_draw))
                slowest = max(slowest, time.monotonic() - t_draw)
                stop = stop_reason(cells, precision=precision, min_pairs=min_pairs, max_seconds=max_seconds,
                                   elapsed_s=time.monotonic() - t_start, slowest_draw_s=slowest)  # fmt: skip
                if stop is not None:
                    reason = stop
                    break
        finally:
            sides.close_all()
    for c in cells:
        assert c.ratio is not None
        c.verdict = verdict(c.ratio, threshold)
    conditions = {
        "engines": list(engines), "workers": list(workers), "envs_per_worker": envs_per_worker,
        "fragment": {f"w{w}": auto_fragment(w, envs_per_worker) for w in workers}, "seconds": seconds,
        "warmup_s": warmup_s, "slice_s": slice_s, "pairs_per_draw": pairs_per_draw,
        "draws_per_process": draws_per_process,
        "threshold": threshold, "precision": precision, "min_pairs": min_pairs, "max_pairs": max_pairs,
        "max_seconds": max_seconds, "model": model.model_dump(mode="json"), "metric": METRIC,
        "order": "alternating (base first in odd pairs, head first in even)", "machine_cores": os.cpu_count() or 1,
    }  # fmt: skip
    if plant_slowdown:
        conditions["planted_slowdown"] = plant_slowdown
    return ABResult(
        base_rev=base_rev,
        base_commit=commit,
        head_commit=head_commit,
        head_dirty=head_dirty,
        env_id=env_spec.id,
        conditions=conditions,
        cells=cells,
        stop_reason=reason,
        elapsed_s=time.monotonic() - t_start,
    )


def _draw_line(cell: Cell, index: int, how: str, pairs_per_draw: int) -> str:
    """The progress line of one draw: its pairs' ratios and the cell's estimate so far."""
    assert cell.ratio is not None
    last = cell.pairs[-pairs_per_draw:]
    return (
        f"draw {index + 1} {cell.key} ({how}): pair ratios "
        + " ".join(f"{q.ratio:.3f}" for q in last)
        + f"; so far {cell.ratio.ratio:.3f} [{cell.ratio.lo:.3f}, {cell.ratio.hi:.3f}] over {len(cell.pairs)}"
    )


def markdown(result: ABResult) -> str:
    """The gate's table in ``crossrl regress``'s shape, with what was compared and why it stopped."""
    from crossrl.reports.regress import markdown as table

    title = f"crossrl ab: {result.head_label} against {result.base_rev} ({result.base_commit[:12]}), {result.env_id}"
    note = (
        f"\nhead/base ratio of {METRIC} (IQM over pairs of the per-pair ratios, paired bootstrap 95 % CI); "
        f"stopped: {result.stop_reason}; {result.elapsed_s:.0f} s in all.\n"
    )
    return table(result.comparisons(), title=title) + note
