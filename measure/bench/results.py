"""The benchmarks' results as plain data: pure functions that compute tables from measured figures,
rich printers, and JSON writers (``to_json(path)`` on every result, the same figures the tables show).
"""

from __future__ import annotations

import json
import math
import re
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from crossrl.measure.bench.samplers import SamplerResult

SCHEMA_VERSION = 1


def write_result(path: Path, kind: str, data: dict[str, Any]) -> Path:
    """A bench result's JSON file: schema version, kind, then the result's own fields."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"schema_version": SCHEMA_VERSION, "bench": kind, **data}, indent=1) + "\n")
    return path


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


@dataclass
class SpeedRow:
    """One contestant at one size: env steps/s median and spread over its measurements."""

    engine: str  # "raw", "limit", "crossrl", "rllib", "torchrl"; crossrl with an optimizer: "crossrl/async_samples"
    workers: int
    envs_per_worker: int
    samples: list[float]
    fragment: int | None = None  # env steps per env per iteration (None: not recorded)
    ratio_to_raw: float | None = None  # median / raw's median at the same size and fragment, same run
    ratio_to_crossrl: float | None = None  # median / crossrl's median at the same size and fragment, same run
    ratio_to_limit: float | None = None  # median / the limit contestant's median at the same size and fragment
    speedup: float | None = None  # scaling: median / this contestant's median at the fewest workers
    efficiency: float | None = None  # scaling: speedup / (workers / fewest workers)
    # medians over measurements of the CPUs in use while timed (CpuMeter) and of cpu_us_per_step
    cpus: dict[str, float] = field(default_factory=dict)
    # peak RSS (VmHWM, MiB) of each env-stepping process, the highest over the row's measurements; None: not read
    peak_rss_mb: list[float] | None = None

    @property
    def median(self) -> float:
        return float(statistics.median(self.samples))

    @property
    def min(self) -> float:
        return float(min(self.samples))

    @property
    def max(self) -> float:
        return float(max(self.samples))

    def to_dict(self) -> dict[str, Any]:
        """engine, workers, envs_per_worker, steps_per_s {median, min, max, samples}, and the ratios."""
        out: dict[str, Any] = {
            "engine": self.engine,
            "workers": self.workers,
            "envs_per_worker": self.envs_per_worker,
            "fragment": self.fragment,
            "steps_per_s": {"median": self.median, "min": self.min, "max": self.max, "samples": self.samples},
            "ratio_to_raw": self.ratio_to_raw,
            "ratio_to_crossrl": self.ratio_to_crossrl,
        }
        if self.ratio_to_limit is not None:
            out["ratio_to_limit"] = self.ratio_to_limit
        if self.peak_rss_mb is not None:
            out["peak_rss_mb"] = self.peak_rss_mb
        if self.speedup is not None:
            out |= {"speedup": self.speedup, "efficiency": self.efficiency}
        if self.cpus:
            out["cpus"] = self.cpus
        return out


def speed_rows(results: Iterable[SamplerResult], *, crossrl_label: str = "crossrl") -> list[SpeedRow]:
    """Group measurements by (contestant, workers, fragment) and compute each median's ratios to raw, to the limit
    and to crossrl.

    Ratios are of medians measured in the same run at the same workers x envs per worker and fragment; a
    ratio is None when its reference was not measured. Peak RSS per env-stepping process: the highest of
    each process (by position) over the row's measurements.
    """
    grouped: dict[tuple[str, int, int, int | None], list[float]] = {}
    cpus: dict[tuple[str, int, int, int | None], dict[str, list[float]]] = {}
    rss: dict[tuple[str, int, int, int | None], list[float]] = {}
    for r in results:
        key = (r.label, r.workers, r.envs_per_worker, r.fragment)
        grouped.setdefault(key, []).extend(r.steps_per_s)
        for name, value in {**(r.cpu or {}), **_cpu_per_step(r)}.items():
            cpus.setdefault(key, {}).setdefault(name, []).append(value)
        if r.peak_rss_mb:
            old, new = rss.get(key, []), list(r.peak_rss_mb)
            n = max(len(old), len(new))
            old, new = old + [0.0] * (n - len(old)), new + [0.0] * (n - len(new))
            rss[key] = [max(a, b) for a, b in zip(old, new, strict=True)]
    rows = [
        SpeedRow(
            engine=k[0],
            workers=k[1],
            envs_per_worker=k[2],
            fragment=k[3],
            samples=v,
            cpus={name: float(statistics.median(xs)) for name, xs in cpus.get(k, {}).items()},
            peak_rss_mb=rss.get(k),
        )
        for k, v in grouped.items()
        if v
    ]
    ref = {(row.engine, row.workers, row.envs_per_worker, row.fragment): row.median for row in rows}
    for row in rows:
        size = (row.workers, row.envs_per_worker, row.fragment)
        row.ratio_to_raw = _ratio(row.median, ref.get(("raw", *size)))
        row.ratio_to_crossrl = _ratio(row.median, ref.get((crossrl_label, *size)))
        row.ratio_to_limit = _ratio(row.median, ref.get(("limit", *size)))
    return rows


def _cpu_per_step(r: SamplerResult) -> dict[str, float]:
    """CPU microseconds per env step of the contestant's processes (env-stepping ones and the driver).

    Tells a latency-bound measurement from a CPU-bound one: where a 2 ms sleep costs a virtual machine
    ~80 us of CPU (docs/performance.md), 16 workers stepping a 2 ms latency env already fill 2 cores.
    """
    cpu = r.cpu or {}
    if "workers_cpus" not in cpu or not r.steps_per_s:
        return {}
    steps_per_s = statistics.fmean(r.steps_per_s)
    # sampling_cpus: every process once (a driver that steps the envs itself is also among the workers)
    used = cpu.get("sampling_cpus", cpu["workers_cpus"] + cpu.get("driver_cpus", 0.0))
    return {"cpu_us_per_step": 1e6 * used / steps_per_s} if steps_per_s > 0 else {}


# A measurement with the machine's CPUs at least this busy is bounded by CPU per env step: its figure
# says how much CPU the contestant needs per step, not how well it coordinates its workers.
CPU_BOUND_SHARE = 0.8


def cpu_bound(row: SpeedRow, cores: int) -> bool:
    """Whether ``row`` was timed with the machine's ``cores`` >= CPU_BOUND_SHARE busy (False when unknown: 0)."""
    busy = row.cpus.get("machine_busy_cpus")
    return cores > 0 and busy is not None and busy >= CPU_BOUND_SHARE * cores


def add_scaling(rows: Sequence[SpeedRow]) -> None:
    """Set speedup and parallel efficiency of each row against the same contestant's fewest-workers row at
    the same fragment."""
    base: dict[tuple[str, int | None], SpeedRow] = {}
    for row in rows:
        key = (row.engine, row.fragment)
        if key not in base or row.workers < base[key].workers:
            base[key] = row
    for row in rows:
        b = base[row.engine, row.fragment]
        row.speedup = _ratio(row.median, b.median)
        row.efficiency = row.speedup / (row.workers / b.workers) if row.speedup is not None else None


# The other engines crossrl's sampling is compared with ("crossrl / the faster of RLlib and TorchRL").
OTHER_ENGINES = ("rllib", "torchrl")


@dataclass
class Headline:
    """crossrl against the others at one size of a sampling table."""

    workers: int
    envs_per_worker: int
    fragment: int | None
    faster_other: str | None  # the faster of RLlib and TorchRL here (None: neither measured)
    ratio_to_faster_other: float | None  # crossrl's median / that engine's median
    ratio_to_limit: float | None  # crossrl's median / the limit contestant's median


@dataclass
class SpeedTable:
    """``bench sampling`` or ``bench scaling``: rows plus the conditions they were measured under."""

    kind: str  # "sampling" or "scaling"
    env_id: str
    rows: list[SpeedRow]
    conditions: dict[str, Any] = field(default_factory=dict)  # seconds, repeat, fragment, latency, model...

    def row(self, engine: str, workers: int, fragment: int | None = None) -> SpeedRow:
        """The row of ``engine`` at ``workers`` (and ``fragment``, where the table has several)."""
        for r in self.rows:
            if r.engine == engine and r.workers == workers and fragment in (None, r.fragment):
                return r
        raise KeyError(f"no row for {engine} at {workers} workers" + (f", fragment {fragment}" if fragment else ""))

    @property
    def fragment_sweep(self) -> bool:
        """Whether some contestant was timed at one worker count with several fragments (``bench scaling
        --fragment 64,128``): then rows are told apart by fragment too."""
        seen = [(r.engine, r.workers, r.envs_per_worker) for r in self.rows]
        return len(seen) != len(set(seen))

    def headlines(self, crossrl_label: str = "crossrl") -> list[Headline]:
        """Per size (workers, envs per worker, fragment) with a crossrl row: crossrl's median over the faster of
        RLlib's and TorchRL's medians, and over the limit contestant's (None where not measured)."""
        out = []
        for c in self.rows:
            if c.engine != crossrl_label:
                continue
            size = (c.workers, c.envs_per_worker, c.fragment)
            same = {r.engine: r for r in self.rows if (r.workers, r.envs_per_worker, r.fragment) == size}
            others = [same[e] for e in OTHER_ENGINES if e in same]
            faster = max(others, key=lambda r: r.median, default=None)
            out.append(
                Headline(
                    workers=c.workers,
                    envs_per_worker=c.envs_per_worker,
                    fragment=c.fragment,
                    faster_other=faster.engine if faster else None,
                    ratio_to_faster_other=_ratio(c.median, faster.median if faster else None),
                    ratio_to_limit=c.ratio_to_limit,
                )
            )
        return out

    def to_dict(self) -> dict[str, Any]:
        out = {"env_id": self.env_id, "conditions": self.conditions, "rows": [r.to_dict() for r in self.rows]}
        if self.kind == "sampling":
            out["headlines"] = [asdict(h) for h in self.headlines()]
        return out

    def metrics(self) -> dict[str, float]:
        """Flat figures for the store, e.g. ``crossrl.w2.steps_per_s`` (median) and ``crossrl.w2.ratio_to_raw``;
        in a fragment sweep ``crossrl.f128.w2.steps_per_s``; a calls-transport row ``crossrl/sync_samples:calls.w2...``."""
        out: dict[str, float] = {}
        sweep = self.fragment_sweep
        for r in self.rows:
            engine = r.engine.replace("+", ":")  # MLflow refuses "+" in a name: crossrl/sync_samples:calls.w16...
            key = f"{engine}.f{r.fragment}.w{r.workers}" if sweep else f"{engine}.w{r.workers}"
            figures = {
                "steps_per_s": r.median,
                "steps_per_s_min": r.min,
                "steps_per_s_max": r.max,
                "ratio_to_raw": r.ratio_to_raw,
                "ratio_to_crossrl": r.ratio_to_crossrl,
                "ratio_to_limit": r.ratio_to_limit,
                "peak_rss_mb_max": max(r.peak_rss_mb) if r.peak_rss_mb else None,
                "speedup": r.speedup,
                "efficiency": r.efficiency,
                **r.cpus,
            }
            out.update({f"{key}.{k}": float(v) for k, v in figures.items() if v is not None})
        if self.kind == "sampling" and not sweep:
            for h in self.headlines():
                if h.ratio_to_faster_other is not None:
                    out[f"crossrl.w{h.workers}.ratio_to_faster_other"] = h.ratio_to_faster_other
        return out

    def to_json(self, path: Path) -> Path:
        return write_result(path, self.kind, self.to_dict())


def _fmt(x: float | None, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def print_speed_table(table: SpeedTable, *, console: Any = None) -> None:
    """A rich table: median (min-max) steps/s and ratios; scaling adds speedup and efficiency."""
    from rich.console import Console
    from rich.table import Table

    scaling = table.kind == "scaling"
    t = Table(title=f"bench {table.kind}: {table.env_id} ({_conditions_line(table.conditions)})")
    t.add_column("engine", no_wrap=True, min_width=max((len(r.engine) for r in table.rows), default=6))
    sweep = table.fragment_sweep
    if sweep:
        t.add_column("fragment", justify="right")
    with_limit = any(r.ratio_to_limit is not None for r in table.rows)
    with_rss = any(r.peak_rss_mb for r in table.rows)
    cols = ("workers", "envs/worker", "steps/s median", "min-max", "x raw", *(("x limit",) if with_limit else ()))
    for col in (*cols, "x crossrl"):
        t.add_column(col, justify="right", no_wrap=col == "min-max")
    if scaling:
        t.add_column("speedup", justify="right")
        t.add_column("efficiency", justify="right")
    t.add_column("CPUs busy: machine / workers", justify="right")
    t.add_column("CPU us/step", justify="right")
    if with_rss:
        t.add_column("peak RSS MiB per worker", justify="right")
    cores = int(table.conditions.get("machine_cores") or 0)  # absent in older bench results
    any_bound = False
    for r in sorted(table.rows, key=lambda r: ((r.fragment or 0) if sweep else 0, r.workers, r.engine)):
        cells = [
            r.engine,
            *([str(r.fragment)] if sweep else []),
            str(r.workers),
            str(r.envs_per_worker),
            f"{r.median:,.0f}",
            f"{r.min:,.0f}-{r.max:,.0f} (n={len(r.samples)})",
            _fmt(r.ratio_to_raw, ".2f"),
            *([_fmt(r.ratio_to_limit, ".2f")] if with_limit else []),
            _fmt(r.ratio_to_crossrl, ".3f"),
        ]
        if scaling:
            cells += [_fmt(r.speedup, ".2f"), _fmt(None if r.efficiency is None else 100 * r.efficiency, ".0f") + "%"]
        bound = cpu_bound(r, cores)
        any_bound |= bound
        busy = f"{_fmt(r.cpus.get('machine_busy_cpus'), '.2f')} / {_fmt(r.cpus.get('workers_cpus'), '.2f')}"
        cells += [busy + (" *" if bound else ""), _fmt(r.cpus.get("cpu_us_per_step"), ",.0f")]
        if with_rss:
            cells.append(", ".join(f"{x:,.0f}" for x in r.peak_rss_mb) if r.peak_rss_mb else "-")
        t.add_row(*cells)
    out = console or Console()
    out.print(t)
    if table.kind == "sampling":
        for h in table.headlines():
            where = f"{h.workers} x {h.envs_per_worker}" + (f", fragment {h.fragment}" if h.fragment else "")
            faster = f" ({h.faster_other})" if h.faster_other else ""
            out.print(
                f"{where}: crossrl / faster of rllib, torchrl{faster}: {_fmt(h.ratio_to_faster_other, '.2f')}; "
                f"crossrl / limit: {_fmt(h.ratio_to_limit, '.2f')}"
            )
    if any_bound:
        out.print(
            f"* the machine's {cores} cores were >= {CPU_BOUND_SHARE:.0%} busy: CPU-bound, so the figure reflects "
            "CPU per env step (CPU us/step) more than how the contestant coordinates its workers"
        )


def _conditions_line(cond: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in cond.items() if not isinstance(v, dict))


@dataclass
class E2ERow:
    """One engine's PPO CartPole wall seconds to the target over seeds (None: not reached)."""

    engine: str
    wall_s: list[float | None]
    steps: list[float | None]
    statuses: list[str]
    # per seed: seconds the raw env alone plus the learner alone need for its env steps to the target
    limit_s: list[float | None] = field(default_factory=list)
    layout: str = ""  # `bench e2e --sweep`: the engine's layout (its `layout` tag); "" for the default one
    default_layout: bool = True  # the layout a spec without execution.layout runs
    setup_s: list[float | None] = field(default_factory=list)  # per seed: set-up seconds, left out of wall_s

    @property
    def iqm_wall_s(self) -> float | None:
        """IQM over the seeds that reached the target (None if none did)."""
        from crossrl.reports.stats import iqm

        got = [w for w in self.wall_s if w is not None]
        return float(iqm(got)) if got else None

    @property
    def wall_s_ci(self) -> tuple[float, float] | None:
        """95 % bootstrap CI of :attr:`iqm_wall_s` (None with fewer than two seeds reaching)."""
        import numpy as np

        from crossrl.reports.stats import iqm, stratified_bootstrap_ci

        got = [w for w in self.wall_s if w is not None]
        if len(got) < 2:
            return None
        lo, hi = stratified_bootstrap_ci([got], statistic=lambda a: iqm(a, axis=-1), rng=np.random.default_rng(0))
        return float(lo), float(hi)

    @property
    def to_limit(self) -> float | None:
        """Median over seeds of wall seconds / limit seconds (None without a limit or a seed that reached)."""
        got = [w / x for w, x in zip(self.wall_s, self.limit_s, strict=False) if w is not None and x]
        return float(statistics.median(got)) if got else None

    @property
    def reached(self) -> int:
        return sum(w is not None for w in self.wall_s)

    @property
    def median_wall_s(self) -> float | None:
        """Median over seeds that reached the target (None if none did; see ``reached``)."""
        got = [w for w in self.wall_s if w is not None]
        return float(statistics.median(got)) if got else None


@dataclass
class E2ETable:
    scenario: str
    target: float | None
    rows: list[E2ERow]
    parent_run_id: str = ""
    parts: dict[str, float] = field(default_factory=dict)  # the limit's parts (commands.e2e_parts), same run

    def ratio(self, engine: str = "crossrl", reference: str = "rllib") -> float | None:
        """Median wall seconds to target of ``engine`` / ``reference`` in their default layouts (target: <= 0.5
        for crossrl/rllib)."""
        med = {r.engine: r.median_wall_s for r in self.rows if r.default_layout}
        return _ratio(med.get(engine), med.get(reference))

    def fastest(self, engine: str) -> E2ERow | None:
        """``engine``'s row with the lowest IQM wall seconds to target among those where every seed reached it."""
        done = [r for r in self.rows if r.engine == engine and r.wall_s and r.reached == len(r.wall_s)]
        return min(done, key=lambda r: r.iqm_wall_s or math.inf, default=None)

    def to_dict(self) -> dict[str, Any]:
        return {
            "scenario": self.scenario,
            "target": self.target,
            "parent_run_id": self.parent_run_id,
            "ratio_crossrl_to_rllib": self.ratio(),
            "parts": self.parts,
            "rows": [
                {
                    **asdict(r),
                    "reached": r.reached,
                    "median_wall_s": r.median_wall_s,
                    "to_limit": r.to_limit,
                    "iqm_wall_s": r.iqm_wall_s,
                    "wall_s_ci": r.wall_s_ci,
                }
                for r in self.rows
            ],  # fmt: skip
        }

    def to_json(self, path: Path) -> Path:
        return write_result(path, "e2e", self.to_dict())

    def metrics(self) -> dict[str, float]:
        def key(r: E2ERow) -> str:  # a sweep's other layouts: engine/layout (MLflow takes no other separator)
            return r.engine if r.default_layout else f"{r.engine}/{_metric_safe(r.layout)}"

        out = {f"{key(r)}.seeds_reaching": float(r.reached) for r in self.rows}
        out.update({f"{key(r)}.median_wall_s": r.median_wall_s for r in self.rows if r.median_wall_s is not None})
        out.update({f"{key(r)}.iqm_wall_s": r.iqm_wall_s for r in self.rows if r.iqm_wall_s is not None})
        out.update({f"{key(r)}.to_limit": r.to_limit for r in self.rows if r.to_limit is not None})
        out.update({f"limit.{k}": v for k, v in self.parts.items()})
        ratio = self.ratio()
        if ratio is not None:
            out["ratio_crossrl_to_rllib"] = ratio
        return out


def _metric_safe(text: str) -> str:
    """``text`` as an MLflow metric name part (letters, digits, ``_ - .`` and spaces)."""
    return re.sub(r"[^A-Za-z0-9_\-. ]", "_", text)


def print_e2e_table(table: E2ETable, *, console: Any = None) -> None:
    from rich.console import Console
    from rich.table import Table

    sweep = any(r.layout for r in table.rows)
    t = Table(title=f"bench e2e: {table.scenario}, wall seconds to return {table.target:g} (set-up excluded)")
    cols = ["engine"] + (["layout", "IQM wall s [95% CI]", "median set-up s"] if sweep else [])
    cols += ["seeds reaching", "median wall s", "per seed wall s", "per seed env steps"]
    if table.parts:
        cols += ["per seed limit s", "x limit"]
    for col in cols:
        t.add_column(col, justify="left" if col in ("engine", "layout") else "right")
    for r in table.rows:
        cells = [r.engine]
        if sweep:
            fastest = table.fastest(r.engine)
            marks = [m for m, on in (("default", r.default_layout), ("fastest", fastest is r)) if on]
            ci = r.wall_s_ci
            setups = [x for x in r.setup_s if x is not None]
            cells += [
                r.layout + (f" ({', '.join(marks)})" if marks else ""),
                _fmt(r.iqm_wall_s, ".1f") + (f" [{ci[0]:.1f}, {ci[1]:.1f}]" if ci else ""),
                _fmt(statistics.median(setups) if setups else None, ".1f"),
            ]
        cells += [
            f"{r.reached}/{len(r.wall_s)}",
            _fmt(r.median_wall_s, ".1f"),
            ", ".join(_fmt(w, ".1f") for w in r.wall_s),
            ", ".join(_fmt(s, ".0f") for s in r.steps),
        ]
        if table.parts:
            cells += [", ".join(_fmt(x, ".1f") for x in r.limit_s), _fmt(r.to_limit, ".2f")]
        t.add_row(*cells)
    con = console or Console()
    con.print(t)
    con.print(f"crossrl / rllib median wall seconds to target: {_fmt(table.ratio(), '.2f')} (target <= 0.5)")
    if table.parts:
        p = table.parts
        con.print(
            f"limit = env steps / raw env alone ({p['raw_env_steps_per_s']:,.0f} steps/s) + env steps / crossrl's "
            f"learner alone ({p['learner_s_per_iteration']:.3f} s per {p['train_batch']:.0f}-step iteration); "
            "x limit: median over seeds of wall / limit (crossrl target <= 1.25)"
        )


@dataclass
class Overhead:
    """crossrl's own costs (targets from issue 7 in the comments)."""

    run_wall_s: float  # one smoke-sized `run_scenario`, whole
    log_points_s: float  # of which in ResultsStore.log_points (buffered log_batch); target share <= 2 %
    store_writes_s: float  # all store writes (runs, params, tags, artifacts, points)
    report_build_s: list[float]  # build_report on 100 runs x 200 points; target < 5 s
    help_s: list[float]  # `crossrl --help`, whole process; target < 0.5 s
    evaluator_peak_rss_mb: list[float]  # per crossrl evaluator actor (VmHWM); target <= 300 MB
    rllib_env_runner_peak_rss_mb: list[float] = field(default_factory=list)  # reference (about 400 MB)
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def log_share(self) -> float:
        return self.log_points_s / self.run_wall_s if self.run_wall_s else 0.0

    def to_dict(self) -> dict[str, Any]:
        med = statistics.median
        return {
            **asdict(self),
            "log_share": self.log_share,
            "store_share": self.store_writes_s / self.run_wall_s if self.run_wall_s else 0.0,
            "report_build_s_median": med(self.report_build_s) if self.report_build_s else None,
            "help_s_median": med(self.help_s) if self.help_s else None,
            "evaluator_peak_rss_mb_max": max(self.evaluator_peak_rss_mb, default=None),
        }

    def to_json(self, path: Path) -> Path:
        return write_result(path, "overhead", self.to_dict())

    def metrics(self) -> dict[str, float]:
        d = self.to_dict()
        keys = ("run_wall_s", "log_points_s", "store_writes_s", "log_share", "store_share", "report_build_s_median")
        out = {k: float(d[k]) for k in (*keys, "help_s_median", "evaluator_peak_rss_mb_max") if d.get(k) is not None}
        if self.rllib_env_runner_peak_rss_mb:
            out["rllib_env_runner_peak_rss_mb_max"] = max(self.rllib_env_runner_peak_rss_mb)
        return out


def print_overhead(o: Overhead, *, console: Any = None) -> None:
    from rich.console import Console
    from rich.table import Table

    d = o.to_dict()
    t = Table(title="bench overhead: crossrl's own costs")
    for col in ("what", "measured", "target"):
        t.add_column(col)
    rss = o.evaluator_peak_rss_mb
    t.add_row(
        "store logging (log_points) share of run wall time",
        f"{100 * o.log_share:.2f}% ({o.log_points_s:.2f} of {o.run_wall_s:.1f} s)",
        "<= 2%",
    )
    t.add_row("all store writes, share", f"{100 * d['store_share']:.2f}% ({o.store_writes_s:.2f} s)", "-")
    t.add_row("report build, 100 runs x 200 points", f"{_fmt(d['report_build_s_median'], '.2f')} s median", "< 5 s")
    t.add_row("`crossrl --help`", f"{_fmt(d['help_s_median'], '.2f')} s median of {len(o.help_s)}", "< 0.5 s")
    t.add_row("peak RSS per crossrl evaluator", ", ".join(f"{x:.0f}" for x in rss) + " MiB", "<= 300 MB")
    if o.rllib_env_runner_peak_rss_mb:
        t.add_row("peak RSS per RLlib env runner (reference)",
                  ", ".join(f"{x:.0f}" for x in o.rllib_env_runner_peak_rss_mb) + " MiB", "-")  # fmt: skip
    (console or Console()).print(t)


@dataclass
class SweepRow:
    parallel: int  # trials at once (1: one after another)
    trials: int
    finished: int
    wall_s: float  # the whole sweep, from `crossrl run`'s start to its end
    parent_run_id: str = ""


@dataclass
class SweepTable:
    """One scenario swept over a Ray cluster twice in one run: ``--parallel N`` and one trial at a time."""

    scenario: str
    ray_address: str
    rows: list[SweepRow]

    def speedup(self) -> float | None:
        """Sequential wall seconds / fanned-out wall seconds (> 1: fanning out saved time)."""
        by = {r.parallel: r.wall_s for r in self.rows}
        return _ratio(by.get(1), max((r.wall_s for r in self.rows if r.parallel > 1), default=None))

    def to_dict(self) -> dict[str, Any]:
        return {
            "scenario": self.scenario,
            "ray_address": self.ray_address,
            "speedup": self.speedup(),
            "rows": [asdict(r) for r in self.rows],
        }

    def to_json(self, path: Path) -> Path:
        return write_result(path, "sweep", self.to_dict())

    def metrics(self) -> dict[str, float]:
        out = {f"parallel{r.parallel}.wall_s": r.wall_s for r in self.rows}
        out.update({f"parallel{r.parallel}.finished": float(r.finished) for r in self.rows})
        speedup = self.speedup()
        if speedup is not None:
            out["speedup"] = speedup
        return out


def print_sweep_table(table: SweepTable, *, console: Any = None) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"bench sweep: {table.scenario} on {table.ray_address}")
    for col in ("trials at once", "trials", "FINISHED", "wall s", "parent run"):
        t.add_column(col, justify="right")
    for r in table.rows:
        t.add_row(str(r.parallel), str(r.trials), str(r.finished), f"{r.wall_s:.1f}", r.parent_run_id)
    (console or Console()).print(t)
    speedup = table.speedup()
    if speedup is not None:
        (console or Console()).print(f"speedup (one at a time / fanned out, wall seconds): {speedup:.2f}x")


def cpu_figures(r: SamplerResult) -> dict[str, float]:
    """One measurement's CPU figures: the CPUs in use while timed (CpuMeter) and CPU microseconds per env step."""
    return {**(r.cpu or {}), **_cpu_per_step(r)}


@dataclass
class SweepPoint:
    """One layout of one engine in ``bench sampling --sweep`` (:mod:`.layouts`), with its measurements so far."""

    engine: str
    layout: dict[str, Any]
    label: str
    processes: int  # sampling processes (layouts.processes)
    fixed: bool = False  # the layout ``bench sampling`` times this engine in
    index: int = 0  # position in its engine's grid (the fixed one is 0)
    samples: list[float] = field(default_factory=list)  # env steps/s, one per measurement
    cpu_samples: dict[str, list[float]] = field(default_factory=dict)  # per figure, one per measurement
    info: dict[str, Any] = field(default_factory=dict)  # the last measurement's (how the engine was built)
    peak_rss_mb: list[float] | None = None  # per env-stepping process, the highest over the measurements
    stopped_after: int | None = None  # the round (0-based) after which it was no longer measured
    stopped_early: bool = False  # stopped for being far below its engine's best so far
    error: str | None = None  # the end of a failed measurement's log (the point is then left out)

    def add(self, r: SamplerResult) -> None:
        self.samples.extend(r.steps_per_s)
        for name, value in cpu_figures(r).items():
            self.cpu_samples.setdefault(name, []).append(value)
        self.info = dict(r.info)
        if r.peak_rss_mb:
            old = self.peak_rss_mb or []
            n = max(len(old), len(r.peak_rss_mb))
            a, b = old + [0.0] * (n - len(old)), list(r.peak_rss_mb) + [0.0] * (n - len(r.peak_rss_mb))
            self.peak_rss_mb = [max(x, y) for x, y in zip(a, b, strict=True)]

    @property
    def median(self) -> float:
        return float(statistics.median(self.samples)) if self.samples else 0.0

    @property
    def cpus(self) -> dict[str, float]:
        return {k: float(statistics.median(v)) for k, v in self.cpu_samples.items() if v}

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "engine": self.engine,
            "label": self.label,
            "layout": self.layout,
            "processes": self.processes,
            "fixed": self.fixed,
            "steps_per_s": {
                "median": self.median if self.samples else None,
                "min": min(self.samples, default=None),
                "max": max(self.samples, default=None),
                "samples": self.samples,
            },
            "cpus": self.cpus,
            "stopped_early": self.stopped_early,
            "measured_rounds": len(self.samples),
            "info": self.info,
        }
        if self.peak_rss_mb is not None:
            out["peak_rss_mb"] = self.peak_rss_mb
        if self.error:
            out["error"] = self.error
        return out


@dataclass
class LayoutSweep:
    """``bench sampling --sweep``: every engine's layouts timed in one run; each engine's best beside its fixed."""

    env_id: str
    points: list[SweepPoint]
    conditions: dict[str, Any] = field(default_factory=dict)
    figure: str | None = None  # the PNG's path, once drawn

    @property
    def engines(self) -> list[str]:
        return list(dict.fromkeys(p.engine for p in self.points))

    def of(self, engine: str) -> list[SweepPoint]:
        return [p for p in self.points if p.engine == engine]

    def fixed(self, engine: str) -> SweepPoint:
        return next(p for p in self.of(engine) if p.fixed)

    def best(self, engine: str) -> SweepPoint:
        """The engine's measured point with the highest median (the fixed one on a tie)."""
        measured = [p for p in self.of(engine) if p.samples]
        return max(measured, key=lambda p: (p.median, p.fixed))

    def ratios(self) -> dict[str, dict[str, float | None]]:
        """Per peer of crossrl (RLlib, TorchRL) measured: crossrl's fixed median / the peer's best (the headline),
        crossrl's best / the peer's best, crossrl's fixed / the peer's fixed (what ``bench sampling`` quotes)."""
        if "crossrl" not in self.engines:
            return {}
        c_fixed, c_best = self.fixed("crossrl").median, self.best("crossrl").median
        out = {}
        for peer in OTHER_ENGINES:
            if peer in self.engines:
                best, fixed = self.best(peer).median, self.fixed(peer).median
                out[peer] = {
                    "crossrl_fixed_over_best": _ratio(c_fixed, best),
                    "crossrl_best_over_best": _ratio(c_best, best),
                    "crossrl_fixed_over_fixed": _ratio(c_fixed, fixed),
                }
        return out

    def summary(self) -> dict[str, dict[str, Any]]:
        """Per engine: its fixed and best layouts, their medians and CPU per env step, best / fixed."""
        out = {}
        for e in self.engines:
            f, b = self.fixed(e), self.best(e)
            out[e] = {
                "fixed": f.label,
                "fixed_layout": f.layout,
                "fixed_steps_per_s": f.median,
                "fixed_cpu_us_per_step": f.cpus.get("cpu_us_per_step"),
                "best": b.label,
                "best_layout": b.layout,
                "best_steps_per_s": b.median,
                "best_cpu_us_per_step": b.cpus.get("cpu_us_per_step"),
                "best_over_fixed": _ratio(b.median, f.median),
                "points": len(self.of(e)),
                "stopped_early": [p.label for p in self.of(e) if p.stopped_early],
                "failed": [p.label for p in self.of(e) if p.error],
            }
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "env_id": self.env_id,
            "conditions": self.conditions,
            "figure": self.figure,
            "engines": self.summary(),
            "ratios": self.ratios(),
            "points": [p.to_dict() for p in self.points],
        }

    def to_json(self, path: Path) -> Path:
        return write_result(path, "sampling-sweep", self.to_dict())

    def metrics(self) -> dict[str, float]:
        """``rllib.fixed.steps_per_s``, ``rllib.best.steps_per_s``, ``rllib.best_over_fixed``, ``...cpu_us_per_step``,
        every point's ``rllib.p3.steps_per_s`` (its index in the grid; labels in bench.json), and
        ``crossrl.fixed_over_rllib_best`` and the like."""
        out: dict[str, float | None] = {}
        for e, s in self.summary().items():
            for which in ("fixed", "best"):
                out[f"{e}.{which}.steps_per_s"] = s[f"{which}_steps_per_s"]
                out[f"{e}.{which}.cpu_us_per_step"] = s[f"{which}_cpu_us_per_step"]
            out[f"{e}.best_over_fixed"] = s["best_over_fixed"]
        for p in self.points:
            if p.samples:
                out[f"{p.engine}.p{p.index}.steps_per_s"] = p.median
        for peer, r in self.ratios().items():
            out[f"crossrl.fixed_over_{peer}_best"] = r["crossrl_fixed_over_best"]
            out[f"crossrl.best_over_{peer}_best"] = r["crossrl_best_over_best"]
            out[f"crossrl.fixed_over_{peer}_fixed"] = r["crossrl_fixed_over_fixed"]
        return {k: float(v) for k, v in out.items() if v is not None}


def print_layout_sweep(sweep: LayoutSweep, *, console: Any = None) -> None:
    """Per engine its fixed and best layouts (env steps/s medians, CPU per env step, best / fixed), crossrl's ratio
    to each peer's best, then the whole grid and what stopped early, failed or was left out for the process cap."""
    from rich.console import Console
    from rich.table import Table

    c = sweep.conditions
    out = console or Console()
    title = (f"bench sampling --sweep: {sweep.env_id}, {c.get('workers')} x {c.get('envs_per_worker')} envs "
             f"({c.get('total_envs')} in all), {c.get('batch_env_steps')} env steps per iteration, "
             f"<= {c.get('max_processes')} sampling processes on {c.get('machine_cores')} cores")  # fmt: skip
    t = Table(title=title)
    for col in ("engine", "fixed layout", "steps/s", "CPU us/step", "best layout", "steps/s ", "CPU us/step ",
                "best / fixed"):  # fmt: skip
        t.add_column(col, justify="left" if "layout" in col or col == "engine" else "right")
    for e, s in sweep.summary().items():
        t.add_row(e, s["fixed"], f"{s['fixed_steps_per_s']:,.0f}", _fmt(s["fixed_cpu_us_per_step"], ",.0f"),
                  s["best"], f"{s['best_steps_per_s']:,.0f}", _fmt(s["best_cpu_us_per_step"], ",.0f"),
                  _fmt(s["best_over_fixed"], ".2f"))  # fmt: skip
    out.print(t)
    for peer, r in sweep.ratios().items():
        out.print(f"crossrl (fixed) / {peer}'s best: {_fmt(r['crossrl_fixed_over_best'], '.2f')}; crossrl's best / "
                  f"{peer}'s best: {_fmt(r['crossrl_best_over_best'], '.2f')}; crossrl / {peer}, both fixed: "
                  f"{_fmt(r['crossrl_fixed_over_fixed'], '.2f')}")  # fmt: skip
    g = Table(title="every layout (median over rounds; * fixed, ^ best)")
    for col in ("engine", "layout", "processes", "steps/s median", "min-max", "CPU us/step", "CPUs busy: machine"):
        g.add_column(col, justify="left" if col in ("engine", "layout") else "right", no_wrap=col == "min-max")
    for e in sweep.engines:
        best = sweep.best(e)
        for p in sweep.of(e):
            mark = ("*" if p.fixed else "") + ("^" if p is best else "")
            note = " (stopped early)" if p.stopped_early else " (failed)" if p.error else ""
            spread = f"{min(p.samples):,.0f}-{max(p.samples):,.0f} (n={len(p.samples)})" if p.samples else "-"
            g.add_row(e, f"{p.label}{note} {mark}".rstrip(), str(p.processes),
                      f"{p.median:,.0f}" if p.samples else "-", spread, _fmt(p.cpus.get("cpu_us_per_step"), ",.0f"),
                      _fmt(p.cpus.get("machine_busy_cpus"), ".2f"))  # fmt: skip
    out.print(g)
    stopped = [f"{p.engine} ({p.label})" for p in sweep.points if p.stopped_early]
    if stopped:
        out.print(
            f"stopped early (below {c.get('stop_below')} x their engine's best after a round): {'; '.join(stopped)}"
        )
    failed = [f"{p.engine} ({p.label}): {_last_line(p.error)}" for p in sweep.points if p.error]
    if failed:
        out.print(f"failed, left out: {'; '.join(failed)}", markup=False)
    for e, labels in (c.get("over_cap") or {}).items():
        if labels:
            out.print(f"{e}: left out for more than {c.get('max_processes')} sampling processes: {'; '.join(labels)}")
    if sweep.figure:
        out.print(f"figure: {sweep.figure}")


def _last_line(text: str | None) -> str:
    lines = [ln.strip() for ln in (text or "").splitlines() if ln.strip()]
    return lines[-1][:200] if lines else "-"


def layout_sweep_figure(sweep: LayoutSweep, path: Path) -> Path:
    """A PNG with one horizontal bar per layout (env steps/s median, min-max whiskers), grouped by engine in the
    report's engine colours; the fixed layout hatched, the best one outlined, stopped or failed ones faded."""
    import matplotlib
    from matplotlib.figure import Figure as MplFigure
    from matplotlib.ticker import EngFormatter

    from crossrl.reports.figures import RC, engine_colours

    rows: list[SweepPoint | str] = []  # a str: the engine's heading
    for e in sweep.engines:
        rows += [e, *sweep.of(e)]
    colours = engine_colours(sweep.engines)
    labels: list[str] = []
    for row in rows:
        if isinstance(row, str):
            labels.append(row)
            continue
        tags = [t for t, on in (("fixed", row.fixed), ("best", sweep.best(row.engine) is row),
                                ("stopped early", row.stopped_early), ("failed", row.error is not None)) if on]  # fmt: skip
        labels.append(row.label + (f"  [{', '.join(tags)}]" if tags else ""))
    left = 0.3 + 0.058 * max(len(x) for x in labels)  # inches for the labels at font size 9
    width, height = left + 5.5, 1.3 + 0.27 * len(rows)
    with matplotlib.rc_context(RC):
        fig = MplFigure(figsize=(width, height))
        fig.subplots_adjust(left=left / width, right=1 - 0.25 / width, top=1 - 0.7 / height, bottom=0.6 / height)
        ax = fig.add_subplot()
        for y, row in enumerate(rows):
            if isinstance(row, str):
                continue
            best = sweep.best(row.engine) is row
            med = row.median
            faded = row.stopped_early or row.error is not None
            ax.barh(y, med, color=colours[row.engine], alpha=0.35 if faded else 0.9, hatch="//" if row.fixed else None,
                    edgecolor="black" if best else colours[row.engine], linewidth=1.6 if best else 0.5)  # fmt: skip
            if row.samples:
                lo, hi = min(row.samples), max(row.samples)
                ax.errorbar(med, y, xerr=[[med - lo], [hi - med]], color="#333333", lw=0.8, capsize=2)
        ax.set_yticks(range(len(rows)), labels)
        for tick, row in zip(ax.get_yticklabels(), rows, strict=True):
            if isinstance(row, str):
                tick.set_fontweight("bold")
                tick.set_color(colours[row])
        ax.invert_yaxis()
        ax.xaxis.set_major_formatter(EngFormatter())
        ax.set_xlabel("env steps/s (median over rounds; whiskers: min-max)")
        c = sweep.conditions
        ax.set_title(f"{sweep.env_id}: each engine's sampling layouts\n{c.get('total_envs')} envs, "
                     f"{c.get('batch_env_steps')} env steps per iteration, <= {c.get('max_processes')} sampling "
                     f"processes on {c.get('machine_cores')} cores", fontsize=9)  # fmt: skip
        ax.grid(axis="x", color="#dddddd", lw=0.6)
        ax.set_axisbelow(True)
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        # "tight" grows the canvas to what was drawn: the width estimate above can fall short of a long label
        fig.savefig(path, format="png", dpi=120, bbox_inches="tight", pad_inches=0.1)
    return path


@dataclass
class SacRow:
    """One engine's SAC trial in ``crossrl bench sac``: env steps and gradient updates per second of training after
    learning started (from its first point past ``learning_starts`` to its last)."""

    engine: str
    status: str
    env_steps_per_s: float | None
    updates_per_s: float | None


class _AgainstLimit:
    """A learner benchmark's rows (:class:`SacRow`) against its limit, measured before and after the trials."""

    rows: list[SacRow]
    limit_updates_per_s: list[float]

    @property
    def limit(self) -> float | None:
        return statistics.median(self.limit_updates_per_s) if self.limit_updates_per_s else None

    def to_limit(self, engine: str) -> float | None:
        """``engine``'s updates/s over the limit's (the median of its measurements)."""
        row = next((r for r in self.rows if r.engine == engine), None)
        return _ratio(row.updates_per_s if row else None, self.limit)

    def rows_dict(self) -> list[dict[str, Any]]:
        return [{**asdict(r), "to_limit": self.to_limit(r.engine)} for r in self.rows]

    def metrics(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for r in self.rows:
            if r.updates_per_s is not None:
                out[f"{r.engine}.updates_per_s"] = r.updates_per_s
            if r.env_steps_per_s is not None:
                out[f"{r.engine}.env_steps_per_s"] = r.env_steps_per_s
        if self.limit is not None:
            out["limit.updates_per_s"] = self.limit
        return out


@dataclass
class SacTable(_AgainstLimit):
    env: str
    hidden: list[int]
    train_batch: int
    rows: list[SacRow]
    limit_updates_per_s: list[float]  # the plain torch loop, measured before and after the trials
    parent_run_id: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "env": self.env,
            "hidden": self.hidden,
            "train_batch": self.train_batch,
            "parent_run_id": self.parent_run_id,
            "limit_updates_per_s": self.limit_updates_per_s,
            "rows": self.rows_dict(),
        }

    def to_json(self, path: Path) -> Path:
        return write_result(path, "sac", self.to_dict())


@dataclass
class DreamerTable(_AgainstLimit):
    """``crossrl bench dreamer``: each engine's env steps and updates per second (rows as SAC's), and the limit."""

    env: str
    model_size: str
    batch: str  # "B x T"
    horizon: int
    rows: list[SacRow]
    limit_updates_per_s: list[float]  # crossrl's update alone, measured before and after the trials
    parent_run_id: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "env": self.env,
            "model_size": self.model_size,
            "batch": self.batch,
            "horizon": self.horizon,
            "parent_run_id": self.parent_run_id,
            "limit_updates_per_s": self.limit_updates_per_s,
            "rows": self.rows_dict(),
        }

    def to_json(self, path: Path) -> Path:
        return write_result(path, "dreamer", self.to_dict())


def _print_against_limit(table: _AgainstLimit, *, title: str, limit_text: str, digits: int, console: Any) -> None:
    """A learner benchmark's table: each engine's env steps and updates per second and its ratio to the limit, then a
    line saying what the limit is and its measurements."""
    from rich.console import Console
    from rich.table import Table

    t = Table(title=title)
    for col in ("engine", "status", "env steps/s", "updates/s", "x limit"):
        t.add_column(col, justify="left" if col in ("engine", "status") else "right")
    for r in table.rows:
        t.add_row(
            r.engine, r.status, _fmt(r.env_steps_per_s, ".1f"), _fmt(r.updates_per_s, f".{digits}f"),
            _fmt(table.to_limit(r.engine), ".2f"),
        )  # fmt: skip
    con = console or Console()
    con.print(t)
    limits = ", ".join(f"{x:.{digits}f}" for x in table.limit_updates_per_s)
    con.print(f"limit: {limit_text}: {limits} updates/s (before and after the trials; x limit against their median)")


def print_dreamer_table(table: DreamerTable, *, console: Any = None) -> None:
    _print_against_limit(
        table,
        title=f"bench dreamer: {table.env}, {table.model_size}, batches of {table.batch}, horizon {table.horizon}",
        limit_text="crossrl's DreamerV3 update of the same networks and batch in a bare loop (no env, replay or Ray), "
        "one thread",
        digits=2,
        console=console,
    )


def print_sac_table(table: SacTable, *, console: Any = None) -> None:
    _print_against_limit(
        table,
        title=f"bench sac: {table.env}, MLPs {table.hidden}, batches of {table.train_batch}",
        limit_text="a plain torch SAC update loop, the same networks and batch, one thread",
        digits=1,
        console=console,
    )
