"""The `crossrl` command: thin; each command parses, calls one library function, prints.

Engines and heavy libraries are imported inside the commands, so `crossrl --help` answers at once.
Exit codes: 0 success, 1 a trial failed / a regression, 2 unusable input, 3 the run ended but the store does
not have all it logged yet (it is in the journal; `crossrl sync` sends it), 4 the results folder cannot be
written (a full disk); `crossrl run` stopped by a signal: 128 + its number (130 Ctrl-C, 143 SIGTERM, 129 SIGHUP),
after the summary. `crossrl ui` stopped by one: 0.
"""

from __future__ import annotations

import contextlib
import re
import shutil
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

app = typer.Typer(
    name="crossrl",
    help="Run one RL scenario on several distributed engines (crossrl, rllib, torchrl) and compare them.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

TrackingUri = Annotated[
    str | None,
    typer.Option("--tracking-uri", envvar="MLFLOW_TRACKING_URI", help="MLflow tracking URI (default: embedded store)"),
]
ResultsDir = Annotated[Path, typer.Option("--results-dir", help="folder of the embedded store (sqlite + artifacts)")]
Sets = Annotated[
    list[str] | None,
    typer.Option(
        "--set",
        metavar="FIELD=VALUE",
        help="override a spec field, validated as if written in the spec (and so part of its fingerprint), e.g. "
        "--set algorithm.hyperparams.lr=1e-3; repeat for more",
    ),
]
Engines = Annotated[str | None, typer.Option("--engines", help="comma-separated subset, e.g. crossrl,rllib")]
RayAddress = Annotated[
    str | None, typer.Option("--ray-address", help="join this Ray cluster (HOST:PORT) instead of a local one")
]
JsonOut = Annotated[Path | None, typer.Option("--json", help="also write the figures as JSON")]
NoStore = Annotated[bool, typer.Option("--no-store", help="do not log the figures to the store")]


def _console() -> Any:
    import sys

    from rich.console import Console

    # Piped or captured output (CI logs, `| tee`) gets a width that fits the bench and summary tables (a
    # `bench scaling` fragment sweep's, with its fragment column, is the widest: ~175 columns).
    return Console(stderr=False, highlight=False, width=None if sys.stdout.isatty() else 180)


def _fail(problems: list[str], code: int = 2) -> None:
    for line in problems:
        typer.echo(f"error: {line}", err=True)
    raise typer.Exit(code)


EXIT_UNSENT = 3
EXIT_UNWRITABLE = 4
SYNC_ON_OPEN_S = 30.0


def _open_store(tracking_uri: str | None, results_dir: Path) -> Any:
    """The results store, after sending what earlier runs left in their journals (for up to SYNC_ON_OPEN_S) and
    marking KILLED any run whose process died without closing it (one line each)."""
    from crossrl.reports.journal import sync
    from crossrl.reports.store import ResultsStore

    store = ResultsStore(tracking_uri, results_dir=results_dir)
    sent, pending = sync(lambda uri: store, results_dir, wait_s=SYNC_ON_OPEN_S, only_uri=store.uri, warn=_note)
    if sent:
        _note(f"sent {sent} writes that earlier runs had left in their journals to {store.uri}")
    if pending:
        _note(f"{pending} writes of earlier runs are still not in {store.uri}: `crossrl sync {results_dir}` sends them")
    try:
        reaped = store.reap_orphans()
    except Exception as e:  # an unreachable server: the command's own store calls will say so
        typer.echo(f"note: could not check {store.uri} for runs left RUNNING: {type(e).__name__}: {e}", err=True)
        return store
    for parent_id, reason in reaped.items():
        typer.echo(f"note: run {parent_id} was left RUNNING and is now marked KILLED: {reason}", err=True)
    return store


def _store_or_fail(tracking_uri: str | None, results_dir: Path) -> Any:
    """:func:`_open_store`, or exit 2 with one line naming the store (a bad URI, an unreachable server)."""
    try:
        return _open_store(tracking_uri, results_dir)
    except Exception as e:
        _fail([f"results store {tracking_uri or results_dir}: {e}"])
    return None


def _note(message: str) -> None:
    typer.echo(f"note: {message}", err=True)


def _csv_ints(text: str | None, flag: str) -> list[int] | None:
    if text is None:
        return None
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        _fail([f"{flag}: {text!r} must be comma-separated integers, e.g. 1,2"])
    return None


def _positive_ints(text: str, flag: str) -> list[int]:
    values = _csv_ints(text, flag) or []
    if not values or any(v < 1 for v in values):
        _fail([f"{flag}: {text!r} must be one or more whole numbers >= 1, comma-separated, e.g. 64 or 64,128"])
    return values


def _version(value: bool) -> None:
    if value:
        import crossrl

        typer.echo(f"crossrl {crossrl.__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="print the version and exit")
    ] = False,
) -> None:
    """crossrl: a cross-framework comparison suite for distributed reinforcement learning."""


def _load(spec: str, overrides: dict[str, Any] | None = None) -> Any:
    """The checked spec and its path; exit 2 with one line per problem, including an env that cannot be
    built with the spec's kwargs (built once, as the engines build it, before anything runs or is stored) and spaces
    the algorithm or the model cannot take; warnings (hyperparameters the algorithm does not read) go to stderr."""
    from crossrl.orchestration.probes import validate_probes
    from crossrl.scenarios.checks import check_scenario

    checked = check_scenario(spec, validate_probes(), overrides=overrides, trials=False)
    for line in checked.warnings:
        typer.echo(f"warning: {line}", err=True)
    if checked.problems:
        _fail(checked.problems)
    return checked.spec, checked.path


def _best_layouts(scenario: Any, store: Any) -> dict[tuple[str, int], dict[str, Any]] | None:
    """The layouts of the engines whose ``execution.layout`` says ``best``, each printed with the sweep it came from
    (a sweep measured first where none is stored, its cost printed); None when none says it."""
    if not scenario.execution.layout.best_engines():
        return None
    from crossrl.measure.bench import best_layout

    console = _console()
    try:
        resolved = best_layout.resolve(scenario, store, progress=console.print)
    except ValueError as e:
        _fail([str(e)])
    for choice in resolved.choices:
        console.print(f"execution.layout best: {best_layout.describe(choice)}")
    return resolved.layouts


def _refused(trials: list[Any], *, label: str, skip_unsupported: bool, what: str) -> dict[str, str]:
    """The trials `crossrl validate` refuses, checked as it checks them (the engine registry, then each engine's own
    checks of the settings it would start with): exit 2 naming each, unless ``skip_unsupported``; then trial name ->
    why, for the caller to skip (each listed on stderr)."""
    from crossrl.orchestration.probes import validate_probes

    probes = validate_probes()
    unsupported = list(probes.unsupported(trials))
    names = {t.name for t, _ in unsupported}
    spaces = None
    if any(t.engine == "torchrl" for t in trials):  # its refusals read the env's spaces (_load built the env already)
        with contextlib.suppress(Exception):
            spaces = probes.env_spaces(trials[0].env)
    failing = probes.failing([t for t in trials if t.name not in names], spaces)
    lines = [f"{label}: unsupported: {t.name}: {why}" for t, why in unsupported]
    lines += [f"{label}: would fail: {t.name}: {why}" for t, why in failing]
    if lines and not skip_unsupported:
        _fail([*lines, f"{label}: {what} refuses these (as `crossrl validate` does); --skip-unsupported skips them"])
    for line in lines:
        typer.echo(f"skipped: {line}", err=True)
    return {t.name: why for t, why in [*unsupported, *failing]}


@app.command()
def validate(
    spec: Annotated[str, typer.Argument(help="built-in scenario or table name, or a scenario or table YAML path")],
    show: Annotated[
        bool, typer.Option("--show", help="also print the resolved trials and each engine's resolved settings")
    ] = False,
    sets: Sets = None,
    skip_unsupported: Annotated[
        bool,
        typer.Option(
            "--skip-unsupported",
            help="exit 0 when the trials an engine refuses would be skipped (as `run --skip-unsupported` does)",
        ),
    ] = False,
) -> None:
    """Check a scenario (or table) spec as `crossrl run` (`crossrl table run`) takes it, every problem in one pass:
    fields, values, env id and kwargs (the env is built once), its spaces against the algorithm and the model,
    batch sizes, what each engine can run (RLlib's own config checks too); exit 2 when something is wrong, no
    trial can run, or a trial would be refused (`run` refuses it, or its engine would at start) unless
    --skip-unsupported. Nothing trains and no Ray starts."""
    from crossrl.orchestration.probes import validate_probes
    from crossrl.scenarios.checks import check_scenario, check_table, show_lines
    from crossrl.scenarios.table import is_table

    probes = validate_probes()
    table = is_table(spec)
    if table and sets:
        _fail([f"--set applies to scenario specs; {spec} is a table (its cells take `crossrl table run`'s options)"])
    checked = (
        check_table(spec, probes)
        if table
        else check_scenario(spec, probes, overrides=_overrides(None, None, None, None, sets))
    )
    for line in checked.warnings:
        typer.echo(f"warning: {line}", err=True)
    if checked.problems:
        _fail(checked.problems)
    if not table:
        scenario = checked.spec
        refused = len(checked.unsupported) + len(checked.failing)
        if refused and not skip_unsupported:
            label = checked.label
            _fail(
                [f"{label}: unsupported: {t.name}: {reason}" for t, reason in checked.unsupported]
                + [f"{label}: would fail: {t.name}: {reason}" for t, reason in checked.failing]
                + [
                    f"{label}: {refused} of {len(checked.trials)} trials would be refused (`crossrl run` refuses "
                    "them too); --skip-unsupported skips them"
                ]
            )
        typer.echo(f"{checked.path}: ok, fingerprint {scenario.fingerprint()}, {len(checked.trials)} trials")
        _list_refused(checked, "  ", "skipped: crossrl run --skip-unsupported records these as SKIPPED")
        if show:
            for line in show_lines(checked, probes):
                typer.echo(line)
        return
    cells = checked.cells
    typer.echo(
        f"{checked.path}: ok, table {checked.table.name}, {len(cells)} cell{'s' if len(cells) != 1 else ''} "
        f"({len(checked.table.rows)} rows x {len(checked.table.columns)} columns), "
        f"{sum(len(c.trials) for c in cells)} trials"
    )
    for cell in cells:
        typer.echo(f"  {cell.spec.name}: fingerprint {cell.spec.fingerprint()}, {len(cell.trials)} trials")
        _list_refused(cell, "    ", "crossrl table run records these as SKIPPED")
        if show:
            for line in show_lines(cell, probes):
                typer.echo(f"    {line}")


def _list_refused(checked: Any, indent: str, unsupported_note: str) -> None:
    for trial, reason in checked.unsupported:
        typer.echo(f"{indent}unsupported: {trial.name}: {reason}")
    if checked.unsupported:
        typer.echo(f"{indent}({unsupported_note})")
    for trial, reason in checked.failing:
        typer.echo(f"{indent}would fail: {trial.name}: {reason}")
    if checked.failing:
        typer.echo(f"{indent}(the engine refuses these once they start; skipped as SKIPPED with --skip-unsupported)")


@app.command()
def init(
    path: Annotated[Path, typer.Argument(help="the spec file to write, e.g. acrobot.yaml")],
    env: Annotated[str, typer.Option("--env", help="gymnasium env id")] = "CartPole-v1",
    algorithm: Annotated[str, typer.Option("--algorithm", help="ppo, a2c, a3c, impala, dqn, apex or sac")] = "ppo",
    force: Annotated[bool, typer.Option("--force", help="overwrite an existing file")] = False,
) -> None:
    """Write a commented scenario spec to start from (every default written out), then check it as `validate` does."""
    from crossrl.scenarios.loader import env_id_problem
    from crossrl.scenarios.template import spec_template

    if path.exists() and not force:
        _fail([f"{path}: exists; choose another path or pass --force to overwrite it"])
    problem = env_id_problem({"id": env}, label="--env")
    if problem:
        _fail([problem])
    name = re.sub(r"[^A-Za-z0-9_.-]", "-", path.stem).strip("-.") or "my-scenario"
    from crossrl.adapters.registry import engines as registered
    from crossrl.scenarios.catalog import ENGINES

    runs = [e for e in ENGINES if registered()[e].reason_unsupported(algorithm) is None]  # validate would refuse others
    try:
        text = spec_template(name=name, env_id=env, algorithm=algorithm, path=str(path), engines=runs)
    except ValueError as e:
        _fail([f"--algorithm: {e}" if "algorithm" in str(e) else str(e)])
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as e:
        _fail([f"{path}: cannot write it ({e.strerror or e})"])
    typer.echo(
        f"wrote {path}: {algorithm} on {env}, "
        + ("every engine" if len(runs) == len(ENGINES) else f"{', '.join(runs)} (the engines that run {algorithm})")
        + f"; next: crossrl validate {path}, then crossrl run {path}"
    )


@app.command("random-return")
def random_return(
    spec: Annotated[str, typer.Argument(help="built-in scenario name or YAML path")],
    episodes: Annotated[int, typer.Option(help="episodes of random play", min=1)] = 200,
    seed: Annotated[int, typer.Option(help="episode i is reset with seed + i")] = 0,
) -> None:
    """Random play's return on a scenario's env (a multi-agent env's team return, and each agent's): the
    baseline a learning row is read against."""
    import statistics

    from crossrl.core.envs import random_returns

    scenario, _ = _load(spec)
    team, per_agent = random_returns(scenario.env, episodes=episodes, seed=seed)

    def line(name: str, xs: list[float]) -> str:
        sem = statistics.stdev(xs) / len(xs) ** 0.5 if len(xs) > 1 else float("nan")
        return f"{name}: {statistics.fmean(xs):.2f} ± {sem:.2f} (mean ± standard error, {len(xs)} episodes)"

    what = "team return (sum over agents)" if per_agent else "return"
    typer.echo(f"{scenario.env.id}, random actions, seeds {seed}-{seed + episodes - 1}")
    typer.echo(line(what, team))
    for agent, xs in per_agent.items():
        typer.echo("  " + line(agent, xs))


@app.command()
def scenarios() -> None:
    """List the built-in scenarios."""
    from rich.table import Table

    from crossrl.scenarios.loader import builtin, load

    table = Table("name", "algorithm", "env", "engines", "workers", "seeds", "budget")
    for name in builtin():
        s, _ = load(name)
        table.add_row(
            name,
            s.algorithm.name,
            s.env.id,
            ",".join(s.engines),
            ",".join(map(str, s.execution.workers)),
            str(len(s.seeds)),
            f"{s.budget.env_steps:,}" if s.budget.env_steps else f"{s.budget.train_seconds:g} s of training",
        )
    console = _console()
    console.print(table)
    for name, path in builtin().items():
        s, _ = load(str(path))
        console.print(f"[bold]{name}[/bold]: {' '.join(s.description.split())}")
    from crossrl.scenarios.table import builtin_tables

    if builtin_tables():
        console.print(f"tables (`crossrl table list`, `crossrl table run NAME`): {', '.join(builtin_tables())}")


@app.command()
def engines() -> None:
    """The capability matrix: which algorithm each engine runs, how, and why not where it does not."""
    from rich.markup import escape
    from rich.table import Table

    from crossrl.adapters.registry import engines as all_engines
    from crossrl.scenarios.catalog import ALGORITHMS

    infos = all_engines()
    table = Table("algorithm", *infos, show_lines=True)
    for algo in ALGORITHMS:
        cells = []
        for info in infos.values():
            reason = info.reason_unsupported(algo)  # the engines' own text: "[obs, action]" is not markup
            cells.append(
                f"[red]no[/red]: {escape(reason)}"
                if reason
                else f"[green]yes[/green]: {escape(info.supported[algo])} [dim]({escape(info.spaces(algo))})[/dim]"
            )
        table.add_row(algo, *cells)
    _console().print(table)


def _overrides(
    engines: str | None,
    workers: str | None,
    seeds: str | None,
    steps: int | None = None,
    sets: list[str] | None = None,
) -> dict[str, Any]:
    """The spec fields that `--set`, `--engines`, `--workers`, `--seeds` and `--steps` override (the named options
    win over a `--set` of the same field)."""
    from crossrl.scenarios.loader import SpecError, parse_sets

    try:
        out: dict[str, Any] = parse_sets(sets or [])
    except SpecError as e:
        _fail(e.problems)
    if engines:
        out["engines"] = [e.strip() for e in engines.split(",") if e.strip()]
    if workers:
        out["execution.workers"] = _csv_ints(workers, "--workers")
    if seeds:
        out["seeds"] = _csv_ints(seeds, "--seeds")
    if steps is not None:
        out["budget.env_steps"] = steps
    return out


def _overrides_text(overrides: dict[str, Any]) -> str:
    """The flags that set a run apart from its spec file, as `crossrl runs` shows them."""
    return "; ".join(f"{k}={','.join(map(str, v)) if isinstance(v, list) else v}" for k, v in overrides.items())


def _spec_to_resume(scenario: Any, path: Path, overrides: dict[str, Any], resume: str, store: Any) -> Any:
    """The spec the run to resume stored at its start (its overrides and its selection of engines, workers and seeds
    applied): no flag needs repeating. Exit 2 naming the fields when the spec file changed since, or when flags given
    now describe another run."""
    import yaml

    from crossrl.orchestration.runner import parent_to_resume, spec_differences, stored_spec
    from crossrl.reports.store import StoreError
    from crossrl.scenarios.loader import SpecError

    try:
        parent = parent_to_resume(store, scenario.name, resume)
        stored = stored_spec(store, parent, label=f"run {parent.info.run_id}")
    except (StoreError, SpecError) as e:
        _fail(e.problems if isinstance(e, SpecError) else [str(e)])
    run_id = parent.info.run_id
    if overrides:  # flags again: fine when they say what the run had
        differ = spec_differences(stored.model_dump(mode="json"), scenario.model_dump(mode="json"))
        if differ:
            _fail([f"--resume: run {run_id} ran {', '.join(differ)} otherwise than these flags say; --resume takes "
                   "up the run as it was started (drop the flags), or start a new run without --resume"])  # fmt: skip
        return stored
    try:
        [source] = [a.path for a in store.client.list_artifacts(run_id, "spec_source")]
        then = yaml.safe_load(store.artifact_bytes(run_id, source))
    except Exception:  # a run that did not keep its spec file: its stored spec is all there is
        return stored
    differ = spec_differences(then or {}, yaml.safe_load(path.read_text()) or {})
    if differ:
        _fail([f"--resume: {path} changed since run {run_id} started ({', '.join(differ)} differ); put it back as it "
               "was (the run's spec_source artifact) to finish that run, or start a new run without --resume"])  # fmt: skip
    return stored


@app.command()
def run(
    spec: Annotated[str, typer.Argument(help="built-in scenario name or YAML path")],
    engines_: Engines = None,
    workers: Annotated[str | None, typer.Option("--workers", help="worker counts, e.g. 1,2")] = None,
    seeds: Annotated[str | None, typer.Option("--seeds", help="seeds, e.g. 0,1,2")] = None,
    steps: Annotated[int | None, typer.Option("--steps", help="env-step budget per trial")] = None,
    sets: Sets = None,
    tracking_uri: TrackingUri = None,
    results_dir: ResultsDir = Path("crossrl-results"),
    ray_address: RayAddress = None,
    skip_unsupported: Annotated[
        bool, typer.Option("--skip-unsupported", help="record trials an engine cannot run as SKIPPED")
    ] = False,
    no_report: Annotated[bool, typer.Option("--no-report", help="do not render the report at the end")] = False,
    report_dir: Annotated[Path | None, typer.Option("-o", "--report-dir", help="where the report goes")] = None,
    resume: Annotated[
        str | None,
        typer.Option(
            "--resume",
            metavar="[PARENT_ID]",
            help="take up the scenario's newest run (or PARENT_ID): rerun only its trials that did not end",
        ),
    ] = None,
    store_wait: Annotated[
        float,
        typer.Option(
            "--store-wait",
            metavar="SECONDS",
            help="at the end, wait this long for an unreachable store before leaving the rest to `crossrl sync`",
        ),
    ] = 60.0,
    parallel: Annotated[
        int,
        typer.Option(
            "--parallel",
            metavar="N",
            help="run up to N trials at once on the Ray cluster (--ray-address, else a local one); 1 (the "
            "default) runs them one after another, as speed comparisons need",
        ),
    ] = 1,
    placement: Annotated[
        str,
        typer.Option(
            "--placement",
            help="with --parallel: `node` keeps each trial's processes on one node, `spread` lets Ray spread them "
            "over the nodes (also at --parallel 1: one trial at a time, its workers on several nodes)",
        ),
    ] = "node",
    max_retries: Annotated[
        int | None,
        typer.Option(
            "--max-retries",
            metavar="N",
            help="with --parallel: start a trial lost with its node (or its actor) again from its newest checkpoint "
            "up to N times (default 2)",
        ),
    ] = None,
) -> None:
    """Run every trial of a scenario (engines x workers x seeds), log it to MLflow, render the report."""
    from crossrl.orchestration.runner import run_scenario
    from crossrl.orchestration.signals import Interrupted, stop_on_signals
    from crossrl.reports import api
    from crossrl.reports.console import RunDisplay
    from crossrl.reports.journal import JournalError
    from crossrl.reports.store import StoreError
    from crossrl.scenarios import metrics as M
    from crossrl.scenarios.loader import SpecError

    if max_retries is not None and (max_retries < 0 or (parallel < 2 and placement != "spread")):
        _fail([f"--max-retries {max_retries}: " + ("it cannot be negative" if max_retries < 0 else "retries are for "
               "trials fanned out over a Ray cluster; add --parallel 2 or more, or --placement spread")])  # fmt: skip
    overrides = _overrides(engines_, workers, seeds, steps, sets)
    scenario, path = _load(spec, overrides)
    store = None  # opened once a run is sure to start (bad input stores nothing), or at once to resume one
    if resume is not None:  # finish what that run set out to do: its own spec, overrides and selection
        store = _store_or_fail(tracking_uri, results_dir)
        scenario = _spec_to_resume(scenario, path, overrides, resume, store)
    refused = _refused(scenario.trials(), label=path.name, skip_unsupported=skip_unsupported, what="crossrl run")
    store = store or _store_or_fail(tracking_uri, results_dir)
    layouts = _best_layouts(scenario, store)
    display = RunDisplay(_console(), scenario)
    try:
        with stop_on_signals(), display:  # SIGTERM and SIGHUP stop the run as Ctrl-C does
            outcome = run_scenario(
                scenario,
                store=store,
                spec_path=path,
                ray_address=ray_address,
                skip_unsupported=skip_unsupported,
                refused=refused,
                tags={api.OVERRIDES_TAG: _overrides_text(overrides)} if overrides and resume is None else None,
                progress=display.event,
                command=" ".join(sys.argv),
                resume=resume,
                store_wait_s=store_wait,
                parallel=parallel,
                placement=placement,
                max_retries=max_retries,
                layouts=layouts,
            )
    except SpecError as e:
        _fail(e.problems)
    except StoreError as e:
        _fail([str(e)])
    except JournalError as e:  # e.g. a full disk: the running trial was stopped; what was journaled goes on
        _fail(
            [
                f"{e}; the run stopped. Free space under {results_dir}, then `crossrl sync {results_dir}` and "
                f"`crossrl run {spec} --resume`"
            ],
            EXIT_UNWRITABLE,
        )
    except KeyboardInterrupt as e:  # stopped while the parent run was being opened (the next command closes it)
        raise typer.Exit(Interrupted.of(e).exit_code) from None
    display.summary(outcome, store)
    if outcome.unsent:
        why = f" ({outcome.store_error})" if outcome.store_error else ""
        typer.echo(
            f"error: {outcome.unsent} writes are not in {store.uri} yet{why}; they are kept in {outcome.journal}: "
            f"`crossrl sync {results_dir}` sends them",
            err=True,
        )
        raise typer.Exit(Interrupted(outcome.stop_signal).exit_code if outcome.interrupted else EXIT_UNSENT)
    if not no_report and not outcome.interrupted:
        _render_report(store, parent_id=outcome.parent_id, out_dir=report_dir, scenario=scenario.name,
                       results_dir=results_dir)  # fmt: skip
    if outcome.interrupted:
        raise typer.Exit(Interrupted(outcome.stop_signal or signal.SIGINT).exit_code)
    lost = [r.trial.name for r in outcome.results if r.status == M.KILLED]
    if lost:  # lost with their node (or actor) and not started again: the run is not whole
        typer.echo(
            f"{len(lost)} trial{'s' * (len(lost) != 1)} did not end ({', '.join(lost)}): `crossrl run {spec} --resume` "
            "runs them again from their newest checkpoints",
            err=True,
        )
    if lost or any(r.status in (M.FAILED, M.TIMEOUT) for r in outcome.results):
        raise typer.Exit(1)


@app.command()
def tune(
    spec: Annotated[str, typer.Argument(help="built-in scenario name or YAML path (with a search section)")],
    engines_: Engines = None,
    sets: Sets = None,
    tracking_uri: TrackingUri = None,
    results_dir: ResultsDir = Path("crossrl-results"),
    ray_address: RayAddress = None,
    parallel: Annotated[
        int, typer.Option("--parallel", metavar="N", help="run up to N configurations of a search at once")
    ] = 1,
    no_test: Annotated[
        bool, typer.Option("--no-test", help="search only: do not run the chosen configurations on the test seeds")
    ] = False,
    resume: Annotated[
        bool,
        typer.Option(
            "--resume",
            help="take up this search's newest run on each engine: keep its ended configurations, run the others again "
            "(from their checkpoints when they wrote one)",
        ),
    ] = False,
    skip_unsupported: Annotated[
        bool, typer.Option("--skip-unsupported", help="leave out the engines that refuse the search's trials")
    ] = False,
    max_retries: Annotated[
        int,
        typer.Option(
            "--max-retries",
            metavar="N",
            help="start a configuration lost with its node (or its actor) again from its newest checkpoint up to N "
            "times",
        ),
    ] = 2,
) -> None:
    """Search each engine's hyperparameters on Ray Tune (the spec's search section: the same space and budget for
    every engine), then run each engine's best configuration and the spec's own setting on the test seeds. An engine
    that would refuse its trials (`crossrl validate` says which) is refused before anything starts."""
    from crossrl.orchestration.signals import Interrupted, stop_on_signals
    from crossrl.orchestration.tuning import run_tune
    from crossrl.reports.console import RunDisplay, tune_summary
    from crossrl.reports.store import StoreError
    from crossrl.scenarios import metrics as M
    from crossrl.scenarios.loader import SpecError

    if max_retries < 0:
        _fail([f"--max-retries {max_retries}: it cannot be negative"])
    scenario, path = _load(spec, _overrides(engines_, None, None, None, sets))
    if scenario.search is None:
        _fail([f"{path}: no search section: add `search: {{space: ..., env_steps: N}}` (docs/tuning.md)"])
    # each engine's first search configuration and its own setting on a test seed, checked as validate checks them
    first = [t for e in scenario.engines for t in scenario.search_trials(e)[:1]]
    refused = _refused(
        first + scenario.trials(), label=path.name, skip_unsupported=skip_unsupported, what="crossrl tune"
    )
    left = [e for e in scenario.engines if not any(t.engine == e and t.name in refused for t in first)]
    if not left:
        _fail([f"{path}: every engine refuses the search's trials (skipped above): nothing to search"])
    if left != list(scenario.engines):
        scenario = scenario.model_copy(update={"engines": tuple(left)})
    store = _store_or_fail(tracking_uri, results_dir)
    console = _console()
    display = RunDisplay(console, scenario)
    try:
        with stop_on_signals(), display:
            outcome = run_tune(
                scenario,
                store=store,
                ray_address=ray_address,
                parallel=parallel,
                progress=display.event,
                spec_path=path,
                command=" ".join(sys.argv),
                test=not no_test,
                resume=resume,
                max_retries=max_retries,
            )
    except SpecError as e:
        _fail(e.problems)
    except StoreError as e:
        _fail([str(e)])
    except KeyboardInterrupt as e:
        raise typer.Exit(Interrupted.of(e).exit_code) from None
    tune_summary(console, scenario, outcome)
    if outcome.interrupted:
        stops = [r.stop_signal for r in [outcome.shared, *outcome.tuned.values()] if r is not None and r.stop_signal]
        raise typer.Exit(Interrupted(stops[0] if stops else signal.SIGINT).exit_code)
    if outcome.searches:  # with --no-test, the searches' own tables and figures
        from crossrl.reports.tuned import write_report

        try:
            typer.echo(f"report: {write_report(store, scenario.name, results_dir / 'reports' / scenario.name)}")
        except StoreError as e:  # the store does not have the runs yet (an outage): `crossrl report --tuned` later
            _note(f"no tuned report yet: {e}")
    for found in outcome.searches:
        if found.error:
            typer.echo(f"error: {found.engine}: {found.error}", err=True)
    ended = [r for s in outcome.searches for r in s.results]
    for run in [outcome.shared, *outcome.tuned.values()]:
        if run is not None:
            ended += run.results
    if any(r.status in (M.FAILED, M.TIMEOUT) for r in ended) or any(f.error for f in outcome.searches):
        raise typer.Exit(1)


@app.command()
def fidelity(
    spec: Annotated[str, typer.Argument(help="built-in scenario name or YAML path")],
    engine: Annotated[str, typer.Option("--engine", help="rllib or torchrl: the engine checked against its own loop")],
    seeds: Annotated[str | None, typer.Option("--seeds", help="comma-separated seeds (default: the spec's)")] = None,
    steps: Annotated[int | None, typer.Option("--steps", min=1, help="env-step budget per trial")] = None,
    sets: Sets = None,
    tracking_uri: TrackingUri = None,
    results_dir: ResultsDir = Path("crossrl-results"),
) -> None:
    """Check that an engine learns through crossrl as it does in its own minimal loop: the spec's trials on ENGINE
    through crossrl's adapter, then the same seeds through the engine's own loop (RLlib: build_algo() and train() on
    the adapter's stored config; TorchRL: its PPO, IMPALA, SAC or DreamerV3 reference loop), then env steps to target,
    final return and env steps per second compared with CIs (docs/fidelity.md)."""
    from crossrl.measure.fidelity.compare import fidelity_problems, run_fidelity
    from crossrl.orchestration.signals import Interrupted, stop_on_signals
    from crossrl.reports.console import RunDisplay
    from crossrl.reports.fidelity import load_fidelity, markdown, write_report
    from crossrl.reports.store import StoreError
    from crossrl.scenarios import metrics as M
    from crossrl.scenarios.loader import SpecError

    scenario, path = _load(spec, _overrides(engine, None, seeds, steps, sets))
    problems = fidelity_problems(scenario, engine)
    if problems:
        _fail(problems)
    store = _store_or_fail(tracking_uri, results_dir)
    console = _console()
    try:
        with stop_on_signals(), RunDisplay(console, scenario) as display:
            outcome = run_fidelity(
                scenario,
                engine=engine,
                store=store,
                results_dir=results_dir,
                progress=display.event,
                spec_path=path,
                command=" ".join(sys.argv),
            )
    except SpecError as e:
        _fail(e.problems)
    except StoreError as e:
        _fail([str(e)])
    except KeyboardInterrupt as e:
        raise typer.Exit(Interrupted.of(e).exit_code) from None
    if outcome.interrupted:
        raise typer.Exit(Interrupted(outcome.run.stop_signal or signal.SIGINT).exit_code)
    try:
        data = load_fidelity(store, scenario.name, key=outcome.key)
    except StoreError as e:
        _fail([str(e)])
    typer.echo(markdown(data))
    typer.echo(f"report: {write_report(store, data, results_dir / 'reports' / scenario.name)}")
    if any(r.status in (M.FAILED, M.TIMEOUT) for r in outcome.run.results):
        raise typer.Exit(1)


def _render_report(store: Any, *, parent_id: str, out_dir: Path | None, scenario: str, results_dir: Path) -> None:
    """The run's report in ``out_dir``, or by default in its own folder ``<results>/reports/<scenario>/<run id>/``,
    copied to ``<results>/reports/<scenario>/`` when it is the scenario's newest run (that folder holds the newest's)."""
    from crossrl.reports.api import make_report, run_report_dir

    own = out_dir or run_report_dir(results_dir, scenario, parent_id)
    paths = make_report(store, parent_id=parent_id, out_dir=own)
    typer.echo(f"report: {paths.html}")
    typer.echo(f"        {paths.markdown}")
    parents = store.parent_runs(scenario) if out_dir is None else []
    if parents and str(parents[0].info.run_id) == parent_id:
        newest = own.parent
        for item in own.iterdir():
            if item.is_dir():
                shutil.copytree(item, newest / item.name, dirs_exist_ok=True)
            else:
                shutil.copy2(item, newest / item.name)
        typer.echo(f"newest: {newest / paths.html.name}")


@app.command()
def report(
    scenario: Annotated[str | None, typer.Argument(help="scenario name (its newest run)")] = None,
    run_id: Annotated[str | None, typer.Option("--run", help="a `crossrl run` parent run id")] = None,
    out_dir: Annotated[Path | None, typer.Option("-o", "--out", help="output folder")] = None,
    tracking_uri: TrackingUri = None,
    results_dir: ResultsDir = Path("crossrl-results"),
    tuned: Annotated[
        bool, typer.Option("--tuned", help="the scenario's newest `crossrl tune` instead: tuned.md (docs/tuning.md)")
    ] = False,
) -> None:
    """Render report.html, report.md and report.json for a scenario's newest run (or --run ID); with --tuned, tuned.md
    for its newest `crossrl tune`."""
    from crossrl.reports.store import StoreError

    if not scenario and not run_id:
        _fail(["name a scenario or give --run PARENT_RUN_ID"])
    store = _open_store(tracking_uri, results_dir)
    try:
        if tuned:
            from crossrl.reports.tuned import write_report

            if not scenario:
                _fail(["--tuned needs a scenario name"])
            typer.echo(
                f"report: {write_report(store, scenario or '', out_dir or results_dir / 'reports' / (scenario or ''))}"
            )
            return
        if run_id is None:
            parents = store.parent_runs(scenario or "")
            if not parents:
                _fail([f"no `crossrl run` of scenario {scenario!r} in {store.uri}"])
            run_id = parents[0].info.run_id
        name = scenario or str(store.parent_run(run_id).data.tags.get("scenario", run_id))
        _render_report(store, parent_id=run_id, out_dir=out_dir, scenario=name, results_dir=results_dir)
    except StoreError as e:
        _fail([str(e)])


@app.command()
def compare(
    scenarios: Annotated[list[str], typer.Argument(help="two or more scenarios on one env, one algorithm each")],
    out_dir: Annotated[Path | None, typer.Option("-o", "--out", help="output folder")] = None,
    tracking_uri: TrackingUri = None,
    results_dir: ResultsDir = Path("crossrl-results"),
) -> None:
    """Algorithms compared in one report (compare.html/.md/.json): each scenario's newest run, per engine, which
    algorithm reaches the target first in env steps and in seconds (docs/measures.md)."""
    from crossrl.reports.compare import CompareError, build, load
    from crossrl.reports.store import StoreError

    store = _open_store(tracking_uri, results_dir)
    try:
        trials, points, env_id = load(store, scenarios)
    except (CompareError, StoreError) as e:
        _fail([f"compare {' '.join(scenarios)}: {e}"])
        return
    out = out_dir or results_dir / "reports" / ("compare-" + "-".join(scenarios))
    paths = build(trials, points, env_id=env_id, scenarios=scenarios, out_dir=out,
                  command="crossrl compare " + " ".join(scenarios))  # fmt: skip
    typer.echo(f"report: {paths.html}")
    typer.echo(f"report: {paths.markdown}")


@app.command()
def evaluate(
    target: Annotated[
        str, typer.Argument(metavar="RUN_OR_TRIAL", help="a trial's run id, a `crossrl run`'s run id, or a scenario")
    ],
    episodes: Annotated[int, typer.Option("--episodes", min=1, help="episodes per trial")] = 10,
    greedy: Annotated[
        bool, typer.Option("--greedy/--sample", help="the argmax action, or one sampled from the policy")
    ] = True,
    tracking_uri: TrackingUri = None,
    results_dir: ResultsDir = Path("crossrl-results"),
) -> None:
    """Reload trained policies from their trials' newest checkpoints and play them, without training: the return's
    mean and 95 % CI per trial (also stored as the trial run's evaluate.* tags)."""
    from rich.table import Table

    from crossrl.orchestration.evaluate import EVAL_TAGS, evaluate

    store = _open_store(tracking_uri, results_dir)
    table = Table(title=f"{target}: {episodes} episodes each, {'greedy' if greedy else 'sampled'} actions")
    for col in ("trial", "checkpoint env step", "return mean", "95% CI", "min", "max", "mean length"):
        table.add_column(col)

    def play(trial: Any, run: Any, folder: Path, meta: dict[str, Any]) -> None:
        result = evaluate(trial, str(run.info.run_id), folder, meta, episodes=episodes, greedy=greedy)
        low, high = result.ci()
        table.add_row(
            trial.name,
            f"{result.env_step:,}",
            f"{result.mean:.1f}",
            f"[{low:.1f}, {high:.1f}]",
            f"{min(result.returns):.1f}",  # to the mean's precision (:g printed -123.4567 beside a mean of -120.3)
            f"{max(result.returns):.1f}",
            f"{sum(result.lengths) / len(result.lengths):.0f}",
        )
        values = (f"{result.mean:g}", f"{low:g}", f"{high:g}", str(episodes), "greedy" if greedy else "sample")
        store.set_tags(str(run.info.run_id), dict(zip(EVAL_TAGS, values, strict=True)), what="evaluation")

    problems = _each_newest_checkpoint(store, target, play)
    if table.row_count:
        _console().print(table)
    if problems:
        _fail(problems)


def _each_newest_checkpoint(
    store: Any, target: str, work: Callable[[Any, Any, Path, dict[str, Any]], None], *errors: type[Exception]
) -> list[str]:
    """``work(trial, run, folder, meta)`` on the newest checkpoint of each trial ``target`` names (`crossrl evaluate`,
    `crossrl export`); a target naming nothing fails at once, a trial that cannot be worked on is a line (returned)."""
    from crossrl.adapters.checkpoints import CheckpointMismatch
    from crossrl.orchestration.evaluate import EvaluateError, newest_checkpoint, trials_to_evaluate
    from crossrl.reports.store import StoreError

    try:
        todo = trials_to_evaluate(store, target)
    except (EvaluateError, StoreError) as e:
        _fail([str(e)])
    problems = []
    for trial, run in todo:
        try:
            folder, meta = newest_checkpoint(trial, run)
            work(trial, run, folder, meta)
        except (EvaluateError, CheckpointMismatch, ValueError, *errors) as e:
            problems.append(f"{trial.name}: {e}" if not str(e).startswith(trial.name) else str(e))
    return problems


@app.command()
def export(
    target: Annotated[
        str, typer.Argument(metavar="RUN_OR_TRIAL", help="a trial's run id, a `crossrl run`'s run id, or a scenario")
    ],
    out: Annotated[
        Path | None, typer.Option("--out", help="folder for <trial>.pt and <trial>.json (default: RESULTS_DIR/export)")
    ] = None,
    tracking_uri: TrackingUri = None,
    results_dir: ResultsDir = Path("crossrl-results"),
) -> None:
    """Write trained policies from their trials' newest checkpoints as TorchScript files (observations -> greedy
    actions; they load with torch alone: torch.jit.load) with a JSON sidecar of their inputs and outputs."""
    from crossrl.orchestration.export import ExportError, export_policy

    store = _open_store(tracking_uri, results_dir)
    folder_out = out if out is not None else results_dir / "export"

    def write(trial: Any, run: Any, folder: Path, meta: dict[str, Any]) -> None:
        done = export_policy(trial, str(run.info.run_id), folder, meta, folder_out)
        output = done.info["output"]
        typer.echo(
            f"{trial.name}: {done.path} ({output['dtype']} actions {output['shape']}, checkpoint env step "
            f"{done.info['checkpoint']['env_steps_sampled']:,}); sidecar {done.sidecar}"
        )

    problems = _each_newest_checkpoint(store, target, write, ExportError, TypeError, NotImplementedError)
    if problems:
        _fail(problems)


@app.command()
def runs(
    scenario: Annotated[str | None, typer.Argument(help="only this scenario's runs")] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, help="at most this many, newest first")] = 50,
    tracking_uri: TrackingUri = None,
    results_dir: ResultsDir = Path("crossrl-results"),
) -> None:
    """List past `crossrl run`s in the store, newest first: scenario, parent run, start, status, trials, the flags that
    set each apart from its spec file, and its own report."""
    from rich.table import Table

    from crossrl.reports.runs import COLUMNS, past_runs

    store = _open_store(tracking_uri, results_dir)
    rows = past_runs(store, scenario=scenario, limit=limit)
    if rows.empty:
        where = f"of scenario {scenario!r} " if scenario else ""
        _fail([f"no `crossrl run` {where}in {store.uri}; start one with `crossrl run SPEC`"])
    table = Table(title=f"crossrl runs in {store.uri}")
    for col in COLUMNS:
        table.add_column(col, overflow="fold")
    for row in rows.itertuples(index=False):
        table.add_row(*(str(v) for v in row))
    _console().print(table)
    if (rows["report"] == "-").any():  # the hint only where a listed run has no report of its own
        _console().print(
            "a run without a report (--no-report, stopped): crossrl report --run PARENT_RUN renders its own"
        )


@app.command()
def regress(
    baseline: Annotated[Path, typer.Option("--baseline", help="baseline JSON (crossrl baseline update)")],
    scenario: Annotated[str | None, typer.Argument(help="scenario name (default: the baseline's)")] = None,
    run_id: Annotated[str | None, typer.Option("--run", help="a `crossrl run` parent run id")] = None,
    allow_spec_change: Annotated[
        bool, typer.Option("--allow-spec-change", help="compare even when the spec fingerprints differ")
    ] = False,
    markdown_out: Annotated[Path | None, typer.Option("--markdown", help="also write the table here")] = None,
    junit_out: Annotated[Path | None, typer.Option("--junit", help="write JUnit XML here")] = None,
    speed: Annotated[
        bool,
        typer.Option(
            "--speed", help="also check the throughput ratio (machine load moves it; learning checks alone by default)"
        ),
    ] = False,
    tracking_uri: TrackingUri = None,
    results_dir: ResultsDir = Path("crossrl-results"),
) -> None:
    """Compare a run with a baseline: final return and steps to target, and with --speed the sampling throughput.
    Exit 0: no regression; 1: a regression; 2: unusable input."""
    from crossrl.reports.api import run_regress
    from crossrl.reports.regress import BaselineError
    from crossrl.reports.store import StoreError

    store = _open_store(tracking_uri, results_dir)
    try:
        code, md = run_regress(
            store,
            baseline_path=baseline,
            scenario=scenario,
            parent_id=run_id,
            allow_spec_change=allow_spec_change,
            markdown_out=markdown_out,
            junit_out=junit_out,
            speed=speed,
        )
    except (BaselineError, StoreError) as e:
        _fail([str(e)])
    typer.echo(md)
    raise typer.Exit(code)


@app.command()
def ab(
    base: Annotated[str, typer.Argument(help="base git revision (e.g. origin/main); the head is this work tree")],
    scenario: Annotated[
        str, typer.Option("--scenario", help="take the env and the model from this scenario")
    ] = "smoke",
    engines_: Annotated[str, typer.Option("--engines", help="engines to compare, e.g. crossrl,rllib")] = "crossrl",
    workers: Annotated[str, typer.Option("--workers", help="worker counts, e.g. 1,2")] = "1",
    envs_per_worker: Annotated[int, typer.Option("--envs-per-worker")] = 8,
    seconds: Annotated[float, typer.Option("--seconds", help="seconds each side runs per pair")] = 2.0,
    pairs_per_draw: Annotated[
        int, typer.Option("--pairs-per-draw", help="pairs per draw of fresh env-stepping processes on both sides")
    ] = 1,
    draws_per_process: Annotated[
        int, typer.Option("--draws-per-process", help="draws before both measurement processes are replaced")
    ] = 8,
    threshold: Annotated[
        float, typer.Option("--threshold", help="REGRESSION when the whole CI of head/base lies below this")
    ] = 0.98,
    precision: Annotated[
        float, typer.Option("--precision", help="add pairs until every CI is within +- this (0.015: 1.5 %)")
    ] = 0.015,
    min_pairs: Annotated[int, typer.Option("--min-pairs")] = 24,
    max_pairs: Annotated[int, typer.Option("--max-pairs")] = 200,
    max_minutes: Annotated[float, typer.Option("--max-minutes", help="start no pair that would end later")] = 9.0,
    plant_slowdown: Annotated[
        float, typer.Option("--plant-slowdown", hidden=True, help="test-only: the head burns this fraction more CPU")
    ] = 0.0,
    markdown_out: Annotated[Path | None, typer.Option("--markdown", help="also write the table here")] = None,
    junit_out: Annotated[Path | None, typer.Option("--junit", help="write JUnit XML here")] = None,
    json_out: JsonOut = None,
    tracking_uri: TrackingUri = None,
    results_dir: ResultsDir = Path("crossrl-results"),
    no_store: NoStore = False,
) -> None:
    """Paired A/B gate: BASE and this work tree measured alternately on this machine, head/base ratio with a CI.

    Exit 0: no regression; 1: a regression; 2: unusable input (unknown revision, other pinned requirements).
    """
    from crossrl.measure.bench.ab import ABError, markdown, run_ab
    from crossrl.measure.bench.commands import SAMPLING_ENGINES
    from crossrl.orchestration.signals import Interrupted, stop_on_signals
    from crossrl.reports.regress import junit_xml

    engines = tuple(e.strip() for e in engines_.split(",") if e.strip())
    unknown = [e for e in engines if e not in SAMPLING_ENGINES]
    if unknown or not engines:
        _fail([f"--engines: unknown {unknown or engines_!r}; known: {', '.join(SAMPLING_ENGINES)}"])
    if envs_per_worker < 1 or seconds <= 0 or max_minutes <= 0 or not 0 < precision < 1 or plant_slowdown < 0:
        _fail(["--envs-per-worker must be >= 1; --seconds, --max-minutes > 0; --precision between 0 and 1"])
    loaded, _ = _load(scenario)
    console = _console()
    try:
        # SIGTERM/SIGHUP (a cancelled CI job) end it as Ctrl-C does: both sides' measurement processes and the
        # base's temporary checkout are removed on the way out
        with stop_on_signals():
            result = run_ab(
                base,
                env_spec=loaded.env,
                model=loaded.algorithm.model,
                engines=engines,
                workers=tuple(_csv_ints(workers, "--workers") or ()),
                envs_per_worker=envs_per_worker,
                seconds=seconds,
                pairs_per_draw=pairs_per_draw,
                draws_per_process=draws_per_process,
                threshold=threshold,
                precision=precision,
                min_pairs=min_pairs,
                max_pairs=max_pairs,
                max_seconds=max_minutes * 60,
                plant_slowdown=plant_slowdown,
                progress=console.print,
            )
    except ABError as e:
        _fail([str(e)])
    except KeyboardInterrupt as e:
        stop = Interrupted.of(e)
        console.print(f"crossrl ab: stopped by {stop.label}; nothing was compared")
        raise typer.Exit(stop.exit_code) from None
    md = markdown(result)
    typer.echo(md)
    if markdown_out:
        markdown_out.parent.mkdir(parents=True, exist_ok=True)
        markdown_out.write_text(md)
    if junit_out:
        junit_out.parent.mkdir(parents=True, exist_ok=True)
        junit_out.write_text(junit_xml(result.comparisons(), suite="crossrl ab"))
    if json_out:
        result.to_json(json_out)
    if not no_store:
        _store_bench("ab", result, tracking_uri=tracking_uri, results_dir=results_dir, console=console)
    raise typer.Exit(1 if result.regressions() else 0)


table_app = typer.Typer(
    help="Comparison tables: games x (engine, algorithm, workers), e.g. the reference comparison's Atari table.",
    no_args_is_help=True,
)
app.add_typer(table_app, name="table")

TableRows = Annotated[
    str | None, typer.Option("--rows", help="only these rows (env ids, comma-separated), e.g. ALE/Breakout-v5")
]
TableWorkers = Annotated[int | None, typer.Option("--workers", help="every column's worker count")]
TableTrainSeconds = Annotated[
    float | None, typer.Option("--train-seconds", help="training wall time per trial (the time budget)")
]
TableSteps = Annotated[int | None, typer.Option("--steps", help="env-step budget per trial")]
RandomEpisodes = Annotated[
    int, typer.Option("--random-episodes", help="episodes of random play per row for the table (0: none)")
]
TableName = Annotated[str, typer.Argument(help="built-in table name or table YAML path (`crossrl table list`)")]
TableReportDir = Annotated[Path | None, typer.Option("-o", "--report-dir", help="where the table goes")]


def _load_table(
    name: str,
    rows: str | None,
    *,
    engines: str | None = None,
    workers: int | None = None,
    seeds: str | None = None,
    train_seconds: float | None = None,
    steps: int | None = None,
) -> Any:
    """The table and its cells (exit 2 with one line per problem, each row's env built once)."""
    from crossrl.adapters.registry import engine_ids
    from crossrl.core.envs import env_problems
    from crossrl.scenarios.loader import SpecError
    from crossrl.scenarios.table import load_table

    overrides: dict[str, Any] = {}
    if engines:
        overrides["engines"] = [e.strip() for e in engines.split(",") if e.strip()]
    if workers is not None:
        overrides["workers"] = workers
    if seeds:
        overrides["seeds"] = _csv_ints(seeds, "--seeds")
    if train_seconds is not None:
        overrides["train_seconds"] = train_seconds
    if steps is not None:
        overrides["env_steps"] = steps
    wanted = [r.strip() for r in rows.split(",") if r.strip()] if rows else None
    try:
        table, cells = load_table(name, rows=wanted, overrides=overrides, engines=engine_ids())
    except SpecError as e:
        _fail(e.problems)
    problems = []
    for row_cell in {c.env.id: c for c in cells}.values():
        problems += [f"{table.name}: {p}" for p in env_problems(row_cell.env)]
    if problems:
        _fail(problems)
    return table, cells


def _table_report(store: Any, table: Any, cells: Any, *, random_episodes: int, out_dir: Path) -> None:
    from crossrl.core.envs import random_returns
    from crossrl.reports.table import collect, render, tables

    random_scores: dict[str, float] = {}
    if random_episodes > 0:
        for cell in {c.env.id: c for c in cells}.values():
            team, _ = random_returns(cell.env, episodes=random_episodes)
            random_scores[cell.env.id] = sum(team) / len(team)
    parts = tables(table, collect(store, table, cells), random_scores=random_scores)
    md, page = render(table, parts, out_dir=out_dir, command=" ".join(sys.argv))
    _console().print(md.read_text())
    typer.echo(f"table: {page}")
    typer.echo(f"       {md}")


@table_app.command("list")
def table_list() -> None:
    """The built-in tables, with their rows and columns."""
    from crossrl.scenarios.table import builtin_tables, load_table

    console = _console()
    for name in builtin_tables():
        table, cells = load_table(name)
        cols = ", ".join(f"{c.algorithm} x {c.workers} workers" for c in table.columns)
        console.print(f"[bold]{name}[/bold]: {len(table.rows)} rows ({', '.join(table.rows)}) x {cols}; "
                      f"{len(cells)} cells")  # fmt: skip
        console.print(f"  {' '.join(table.description.split())}")


@table_app.command("run")
def table_run(
    name: TableName,
    rows: TableRows = None,
    engines_: Annotated[str | None, typer.Option("--engines", help="comma-separated subset")] = None,
    workers: TableWorkers = None,
    seeds: Annotated[str | None, typer.Option("--seeds", help="seeds, e.g. 0,1,2")] = None,
    train_seconds: TableTrainSeconds = None,
    steps: TableSteps = None,
    random_episodes: RandomEpisodes = 5,
    tracking_uri: TrackingUri = None,
    results_dir: ResultsDir = Path("crossrl-results"),
    report_dir: TableReportDir = None,
) -> None:
    """Run every cell of a table (each an ordinary scenario, one after another; cells an engine cannot run are
    recorded SKIPPED with the reason), then render the table from the store."""
    from crossrl.orchestration.runner import run_scenario
    from crossrl.orchestration.signals import Interrupted, stop_on_signals
    from crossrl.reports.console import RunDisplay
    from crossrl.reports.store import StoreError
    from crossrl.scenarios import metrics as M
    from crossrl.scenarios.loader import SpecError

    table, cells = _load_table(
        name, rows, engines=engines_, workers=workers, seeds=seeds, train_seconds=train_seconds, steps=steps
    )
    store = _store_or_fail(tracking_uri, results_dir)
    bad = False
    for i, cell in enumerate(cells, 1):
        _console().print(f"[bold]{table.name}[/bold]: cell {i} of {len(cells)}, {cell.name}")
        display = RunDisplay(_console(), cell)
        try:
            with stop_on_signals(), display:
                outcome = run_scenario(
                    cell, store=store, skip_unsupported=True, progress=display.event, command=" ".join(sys.argv)
                )
        except (SpecError, StoreError) as e:
            _fail(e.problems if isinstance(e, SpecError) else [str(e)])
        except KeyboardInterrupt as e:
            raise typer.Exit(Interrupted.of(e).exit_code) from None
        display.summary(outcome, store)
        if outcome.interrupted:
            raise typer.Exit(Interrupted(outcome.stop_signal or signal.SIGINT).exit_code)
        if outcome.unsent:
            _fail([f"{outcome.unsent} writes are not in {store.uri} yet; `crossrl sync {results_dir}` sends them"],
                  EXIT_UNSENT)  # fmt: skip
        bad |= any(r.status in (M.FAILED, M.TIMEOUT) for r in outcome.results)
    _table_report(store, table, cells, random_episodes=random_episodes,
                  out_dir=report_dir or results_dir / "reports" / table.name)  # fmt: skip
    if bad:
        raise typer.Exit(1)


@table_app.command("report")
def table_report(
    name: TableName,
    rows: TableRows = None,
    workers: TableWorkers = None,
    train_seconds: TableTrainSeconds = None,
    steps: TableSteps = None,
    random_episodes: RandomEpisodes = 5,
    tracking_uri: TrackingUri = None,
    results_dir: ResultsDir = Path("crossrl-results"),
    report_dir: TableReportDir = None,
) -> None:
    """Render a table from the store: each cell's newest run (give the --workers, --train-seconds and --steps it
    ran with: they are part of the cells' names and specs)."""
    table, cells = _load_table(name, rows, workers=workers, train_seconds=train_seconds, steps=steps)
    store = _store_or_fail(tracking_uri, results_dir)
    _table_report(store, table, cells, random_episodes=random_episodes,
                  out_dir=report_dir or results_dir / "reports" / table.name)  # fmt: skip


baseline_app = typer.Typer(help="Baselines for `crossrl regress`.", no_args_is_help=True)
app.add_typer(baseline_app, name="baseline")


@baseline_app.command("update")
def baseline_update(
    out: Annotated[Path, typer.Option("-o", "--out", help="baseline JSON to write")],
    scenario: Annotated[str | None, typer.Argument(help="scenario name (its newest run)")] = None,
    run_id: Annotated[str | None, typer.Option("--run", help="a `crossrl run` parent run id")] = None,
    tracking_uri: TrackingUri = None,
    results_dir: ResultsDir = Path("crossrl-results"),
) -> None:
    """Write a baseline (schema version, fingerprint, versions, machine, per-seed values) from a run."""
    from crossrl.reports.api import update_baseline
    from crossrl.reports.store import StoreError

    store = _open_store(tracking_uri, results_dir)
    try:
        data = update_baseline(store, scenario=scenario, parent_id=run_id, out=out)
    except StoreError as e:
        _fail([str(e)])
    typer.echo(f"baseline written: {out} ({len(data['entries'])} entries, fingerprint {data['fingerprint']})")


def _positive_int(text: str, flag: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        _fail([f"{flag}: {text!r} is not a positive whole number (or auto)"])
    return value


bench_app = typer.Typer(
    help="Benchmarks, measured side by side in one run (ratios, not absolute speeds).", no_args_is_help=True
)
app.add_typer(bench_app, name="bench")


def _emit_bench(
    kind: str,
    result: Any,
    printer: Callable[..., None],
    *,
    json_out: Path | None,
    tracking_uri: str | None,
    results_dir: Path,
    store: bool,
    console: Any,
) -> None:
    """A bench result's way out, the same for every bench command: printed, JSON if asked, the store."""
    printer(result, console=console)
    if json_out:
        result.to_json(json_out)
    if store:
        _store_bench(kind, result, tracking_uri=tracking_uri, results_dir=results_dir, console=console)


def _store_bench(kind: str, result: Any, *, tracking_uri: str | None, results_dir: Path, console: Any) -> None:
    """Log a benchmark's figures as one run of experiment ``bench-<kind>``; a store failure only warns."""
    import sys

    from crossrl.reports.store import ResultsStore

    try:
        store = ResultsStore(tracking_uri, results_dir=results_dir)
        data = {"bench": kind, **result.to_dict()}
        run_id = store.log_bench(kind, data=data, metrics=result.metrics(), command=" ".join(sys.argv))
    except Exception as e:  # noqa: BLE001 - the figures are printed (and in --json) already
        console.print(f"[yellow]warning: the figures were not logged to the store: {e}[/yellow]")
        return
    console.print(f"logged to {store.uri}: experiment bench-{kind}, run {run_id}")


Transports = Annotated[
    str,
    typer.Option(
        "--transports",
        help="crossrl's sample transports, e.g. calls,stream: one crossrl row each (calls rows end in +calls)",
    ),
]


def _transports(text: str) -> tuple[str, ...]:
    """``--transports`` parsed; an unknown one is a usage error naming the known ones."""
    from crossrl.scenarios.spec import TRANSPORTS

    names = tuple(dict.fromkeys(t.strip() for t in text.split(",") if t.strip()))
    bad = [t for t in names if t not in TRANSPORTS]
    if bad or not names:
        _fail([f"--transports: {text!r} names no known transport ({', '.join(bad) or 'none given'}); known: "
               f"{', '.join(TRANSPORTS)}, e.g. --transports calls,stream"])  # fmt: skip
    return names


@bench_app.command("sampling")
def bench_sampling_cmd(
    env: Annotated[str, typer.Option("--env", help="gymnasium env id")] = "CartPole-v1",
    scenario: Annotated[
        str | None,
        typer.Option(
            "--scenario", help="take the env (with its kwargs and multi-agent mapping) and the model from a scenario"
        ),
    ] = None,
    workers: Annotated[str, typer.Option("--workers", help="worker counts, e.g. 1,2")] = "1,2",
    envs_per_worker: Annotated[int, typer.Option("--envs-per-worker")] = 8,
    repeat: Annotated[int, typer.Option("--repeat", help="interleaved rounds")] = 3,
    seconds: Annotated[float, typer.Option("--seconds", help="timed seconds per measurement")] = 3.0,
    engines_: Annotated[
        str,
        typer.Option(
            "--engines",
            help="raw: the env with random actions; limit: the env and the same network's forward pass, no framework",
        ),
    ] = "raw,limit,crossrl,rllib,torchrl",
    fragment: Annotated[
        str,
        typer.Option(
            "--fragment", help="env steps per env per iteration, every engine; auto: ceil(4000 / (workers x envs))"
        ),
    ] = "auto",
    transports: Transports = "stream",
    sweep: Annotated[
        bool,
        typer.Option(
            "--sweep",
            help="per engine, a grid over its own execution layouts (env runners, vectorisation, collectors, batched "
            "envs, fragment) for the same envs: each engine's best beside the fixed layout; JSON and PNG of the grid",
        ),
    ] = False,
    points: Annotated[
        int | None,
        typer.Option(
            "--points",
            min=1,
            help="--sweep: at most this many layouts of each engine, fixed first (crossrl has two)",
        ),
    ] = None,
    stop_below: Annotated[
        float,
        typer.Option(
            "--stop-below",
            min=0.0,
            help="--sweep: after a round, stop layouts below this x their engine's best so far (0: never)",
        ),  # fmt: skip
    ] = 0.5,
    json_out: JsonOut = None,
    tracking_uri: TrackingUri = None,
    results_dir: ResultsDir = Path("crossrl-results"),
    no_store: NoStore = False,
) -> None:
    """Env steps/s of pure sampling: raw vector env, the limit, crossrl, RLlib, TorchRL (same network), interleaved.

    The network: the scenario's model with --scenario; else the suite's conv model for a pixel env (MinAtar's one
    conv, Atari's Nature CNN), a 64x64 tanh MLP otherwise. Peak RSS per env-stepping process is reported.
    With --sweep: crossrl, RLlib and TorchRL only, each over its layouts at one worker count (the largest of
    --workers); the figures go to --json (default: RESULTS_DIR/bench/sampling-sweep-ENV-TIME.json) and a PNG beside it.
    """
    from crossrl.measure.bench.commands import bench_sampling
    from crossrl.measure.bench.results import print_speed_table

    console = _console()
    spec_kw: dict[str, Any] = {}
    if scenario is not None:
        loaded, _ = _load(scenario)
        spec_kw = {"env_spec": loaded.env, "model": loaded.algorithm.model}
    engine_names = tuple(e.strip() for e in engines_.split(",") if e.strip())
    if sweep:
        import time

        from crossrl.measure.bench.commands import bench_sampling_sweep
        from crossrl.measure.bench.layouts import SWEEP_ENGINES
        from crossrl.measure.bench.results import layout_sweep_figure, print_layout_sweep

        counts = _csv_ints(workers, "--workers") or [2]
        swept = tuple(e for e in engine_names if e in SWEEP_ENGINES)
        left = [e for e in engine_names if e not in SWEEP_ENGINES]
        if left:
            console.print(f"--sweep: {', '.join(left)} not swept (layouts exist for {', '.join(SWEEP_ENGINES)})")
        if len(counts) > 1:
            console.print(f"--sweep: one grid per run, at {max(counts)} workers (the largest of --workers)")
        if not swept:
            _fail([f"--sweep: --engines {engines_!r} names none of {', '.join(SWEEP_ENGINES)}"])
        try:
            result = bench_sampling_sweep(
                env_id=env, **spec_kw, workers=max(counts), envs_per_worker=envs_per_worker, repeat=repeat,
                seconds=seconds, engines=swept, points=points, stop_below=stop_below, progress=console.print,
                fragment=None if fragment == "auto" else _positive_int(fragment, "--fragment"),
            )  # fmt: skip
        except ValueError as e:
            _fail([str(e)])
        stem = "".join(ch if ch.isalnum() or ch in "-_." else "-" for ch in result.env_id)
        out = json_out or results_dir / "bench" / f"sampling-sweep-{stem}-{time.strftime('%Y%m%d-%H%M%S')}.json"
        result.figure = str(layout_sweep_figure(result, Path(out).with_suffix(".png")))
        _emit_bench("sampling-sweep", result, print_layout_sweep, json_out=Path(out), tracking_uri=tracking_uri,
                    results_dir=results_dir, store=not no_store, console=console)  # fmt: skip
        console.print(f"grid: {out}")
        return
    table = bench_sampling(
        env_id=env,
        **spec_kw,
        workers=tuple(_csv_ints(workers, "--workers") or ()),
        envs_per_worker=envs_per_worker,
        repeat=repeat,
        seconds=seconds,
        engines=engine_names,
        fragment=None if fragment == "auto" else _positive_int(fragment, "--fragment"),
        progress=console.print,
        transports=_transports(transports),
    )
    _emit_bench("sampling", table, print_speed_table, json_out=json_out, tracking_uri=tracking_uri,
                results_dir=results_dir, store=not no_store, console=console)  # fmt: skip


@bench_app.command("scaling")
def bench_scaling_cmd(
    env_latency_ms: Annotated[float, typer.Option("--env-latency-ms", help="wall time per env step")] = 2.0,
    workers: Annotated[str, typer.Option("--workers")] = "1,2,4,8,16",
    engines_: Annotated[
        str, typer.Option("--engines", help="raw: the machine's own limit")
    ] = "raw,crossrl,rllib,torchrl",
    optimizers: Annotated[str, typer.Option("--optimizers")] = "sync_samples,async_samples",
    seconds: Annotated[float, typer.Option("--seconds")] = 3.0,
    repeat: Annotated[int, typer.Option("--repeat", help="interleaved rounds")] = 1,
    fragment: Annotated[
        str,
        typer.Option(
            "--fragment",
            help="env steps per worker per iteration, every engine and worker count; several (64,128): "
            "a sweep in the same rounds, efficiency per fragment",
        ),
    ] = "64",
    transports: Transports = "stream",
    json_out: JsonOut = None,
    tracking_uri: TrackingUri = None,
    results_dir: ResultsDir = Path("crossrl-results"),
    no_store: NoStore = False,
) -> None:
    """Speedup and parallel efficiency against workers on an env whose steps cost wall time, not CPU."""
    from crossrl.measure.bench.commands import bench_scaling
    from crossrl.measure.bench.results import print_speed_table

    console = _console()
    table = bench_scaling(
        env_latency_ms=env_latency_ms,
        workers=tuple(_csv_ints(workers, "--workers") or ()),
        engines=tuple(e.strip() for e in engines_.split(",") if e.strip()),
        optimizers=tuple(o.strip() for o in optimizers.split(",") if o.strip()),
        seconds=seconds,
        repeat=repeat,
        fragments=_positive_ints(fragment, "--fragment"),
        progress=console.print,
        transports=_transports(transports),
    )
    _emit_bench("scaling", table, print_speed_table, json_out=json_out, tracking_uri=tracking_uri,
                results_dir=results_dir, store=not no_store, console=console)  # fmt: skip


@bench_app.command("transport")
def bench_transport_cmd(
    env: Annotated[str, typer.Option("--env", help="gymnasium env id")] = "CartPole-v1",
    fragment: Annotated[int, typer.Option("--fragment", min=1, help="env steps per env per fragment")] = 64,
    envs: Annotated[int, typer.Option("--envs", min=1, help="envs in the evaluator")] = 1,
    fragments: Annotated[int, typer.Option("--fragments", min=1, help="fragments per transport per round")] = 300,
    repeat: Annotated[int, typer.Option("--repeat", min=1, help="interleaved rounds")] = 3,
    transports: Transports = "calls,stream",
    json_out: JsonOut = None,
    tracking_uri: TrackingUri = None,
    results_dir: ResultsDir = Path("crossrl-results"),
    no_store: NoStore = False,
) -> None:
    """What carrying one fragment (and new weights) costs on each sample transport, with sampling taken out: CPU of
    the evaluator and the driver, and wall time, per fragment, interleaved rounds."""
    from crossrl.measure.bench.transport import bench_transport, print_transport_table

    console = _console()
    table = bench_transport(env_id=env, fragment=fragment, envs=envs, fragments=fragments, repeat=repeat,
                            transports=_transports(transports), progress=console.print)  # fmt: skip
    _emit_bench("transport", table, print_transport_table, json_out=json_out, tracking_uri=tracking_uri,
                results_dir=results_dir, store=not no_store, console=console)  # fmt: skip


@bench_app.command("e2e")
def bench_e2e_cmd(
    engines_: Annotated[str, typer.Option("--engines")] = "crossrl,rllib,torchrl",
    seeds: Annotated[str, typer.Option("--seeds")] = "0,1,2",
    limit: Annotated[
        bool,
        typer.Option(
            "--limit/--no-limit",
            help="also time the raw env alone and crossrl's learner alone, and give wall time against their sum",
        ),
    ] = True,
    scenario: Annotated[
        str,
        typer.Option("--scenario", help="a built-in scenario or spec file with a target (PPO: the limit's learner)"),
    ] = "cartpole-ppo",
    sweep: Annotated[
        bool,
        typer.Option(
            "--sweep",
            help="run each engine in each of its layouts (crossrl's transports, RLlib's vectorisation, TorchRL's "
            "batched env): one row per engine and layout, IQM wall seconds to target with its 95% CI",
        ),
    ] = False,
    sets: Sets = None,
    tracking_uri: TrackingUri = None,
    results_dir: ResultsDir = Path("crossrl-results"),
    json_out: JsonOut = None,
) -> None:
    """Wall seconds to the target per engine (PPO CartPole-v1 to 450 by default, the real runner, each trial
    stopping at its target, set-up excluded), and each against the limit: its env steps through the raw env alone
    plus crossrl's learner alone, timed in the same run. --sweep: each engine in each of its layouts."""
    from crossrl.measure.bench.commands import bench_e2e
    from crossrl.measure.bench.results import print_e2e_table
    from crossrl.reports.store import ResultsStore
    from crossrl.scenarios.loader import SpecError, load

    overrides = _overrides(None, None, None, None, sets)
    try:
        spec, _ = load(scenario, overrides=overrides)
    except SpecError as e:
        _fail(e.problems)
    if spec.target.episode_return_mean is None:
        _fail([f"bench e2e: {scenario} has no target.episode_return_mean to time; give one with "
               "--set target.episode_return_mean=VALUE or a spec that sets it"])  # fmt: skip
    if spec.algorithm.name != "ppo":
        limit = False  # the limit's learner is crossrl's PPO learner
    console = _console()
    table = bench_e2e(
        engines=tuple(e.strip() for e in engines_.split(",") if e.strip()),
        seeds=tuple(_csv_ints(seeds, "--seeds") or ()),
        store=ResultsStore(tracking_uri, results_dir=results_dir),
        scenario=scenario,
        progress=console.print,
        limit=limit,
        sweep=sweep,
        sets=overrides,
    )
    _emit_bench("e2e", table, print_e2e_table, json_out=json_out, tracking_uri=tracking_uri,
                results_dir=results_dir, store=True, console=console)  # fmt: skip


@bench_app.command("sac")
def bench_sac_cmd(
    env_id: Annotated[str, typer.Option("--env", help="a gymnasium id with bounded Box actions")] = "Pendulum-v1",
    engines_: Annotated[str, typer.Option("--engines")] = "crossrl,rllib,torchrl",
    env_steps: Annotated[int, typer.Option("--env-steps", min=200, help="env steps per trial")] = 2500,
    learning_starts: Annotated[int, typer.Option("--learning-starts", min=1)] = 500,
    json_out: JsonOut = None,
    tracking_uri: TrackingUri = None,
    results_dir: ResultsDir = Path("crossrl-results"),
    no_store: NoStore = False,
) -> None:
    """SAC's speed in the learner: env steps and gradient updates per second per engine (one worker, one update of
    256 per env step, MLPs [256, 256]), against a plain torch SAC update loop measured in the same run."""
    from crossrl.measure.bench.commands import bench_sac
    from crossrl.measure.bench.results import print_sac_table

    if learning_starts >= env_steps:
        _fail([f"--learning-starts ({learning_starts}) must be below --env-steps ({env_steps}): nothing would train"])
    console = _console()
    try:
        table = bench_sac(
            env_id=env_id,
            engines=tuple(e.strip() for e in engines_.split(",") if e.strip()),
            env_steps=env_steps,
            learning_starts=learning_starts,
            progress=console.print,
        )
    except ValueError as e:
        _fail([str(e)])
    _emit_bench("sac", table, print_sac_table, json_out=json_out, tracking_uri=tracking_uri,
                results_dir=results_dir, store=not no_store, console=console)  # fmt: skip


@bench_app.command("dreamer")
def bench_dreamer_cmd(
    env_id: Annotated[str, typer.Option("--env", help="a gymnasium id with flat observations")] = "CartPole-v1",
    engines_: Annotated[str, typer.Option("--engines")] = "crossrl,rllib,torchrl",
    env_steps: Annotated[int, typer.Option("--env-steps", min=200, help="env steps per trial")] = 2000,
    json_out: JsonOut = None,
    tracking_uri: TrackingUri = None,
    results_dir: ResultsDir = Path("crossrl-results"),
    no_store: NoStore = False,
) -> None:
    """DreamerV3's speed in the learner: env steps and updates per second per engine (one worker, nano, B=16 x T=64,
    one update per 16 env steps), against crossrl's DreamerV3 update alone in a bare loop, measured in the same run."""
    from crossrl.measure.bench.commands import bench_dreamer
    from crossrl.measure.bench.results import print_dreamer_table

    console = _console()
    try:
        table = bench_dreamer(
            env_id=env_id,
            engines=tuple(e.strip() for e in engines_.split(",") if e.strip()),
            env_steps=env_steps,
            progress=console.print,
        )
    except ValueError as e:
        _fail([str(e)])
    _emit_bench("dreamer", table, print_dreamer_table, json_out=json_out, tracking_uri=tracking_uri,
                results_dir=results_dir, store=not no_store, console=console)  # fmt: skip


@bench_app.command("sweep")
def bench_sweep_cmd(
    scenario: Annotated[str, typer.Argument(help="built-in scenario name or YAML path")] = "smoke",
    ray_address: Annotated[str, typer.Option("--ray-address", help="the Ray cluster (HOST:PORT)")] = "",
    parallel: Annotated[
        int, typer.Option("--parallel", metavar="N", help="trials at once in the fanned-out sweep")
    ] = 2,
    engines_: Annotated[str | None, typer.Option("--engines")] = None,
    workers: Annotated[str | None, typer.Option("--workers")] = None,
    seeds: Annotated[str | None, typer.Option("--seeds")] = None,
    json_out: JsonOut = None,
    tracking_uri: TrackingUri = None,
    results_dir: ResultsDir = Path("crossrl-results"),
    no_store: NoStore = False,
) -> None:
    """A scenario's sweep on a Ray cluster, fanned out (--parallel N) then one trial at a time: both wall times."""
    from crossrl.measure.bench.commands import bench_sweep
    from crossrl.measure.bench.results import print_sweep_table
    from crossrl.scenarios.loader import SpecError

    if not ray_address:
        _fail(["--ray-address is needed: the sweep is measured on a cluster (HOST:PORT)"])
    overrides = _overrides(engines_, workers, seeds)
    _load(scenario, overrides)  # a bad spec or override: exit 2 with its problems, before anything runs
    console = _console()
    try:
        table = bench_sweep(
            ray_address=ray_address, scenario=scenario, parallel=parallel, overrides=overrides, progress=console.print
        )
    except SpecError as e:
        _fail(e.problems)
    _emit_bench("sweep", table, print_sweep_table, json_out=json_out, tracking_uri=tracking_uri,
                results_dir=results_dir, store=not no_store, console=console)  # fmt: skip


@bench_app.command("overhead")
def bench_overhead_cmd(
    json_out: JsonOut = None,
    tracking_uri: TrackingUri = None,
    results_dir: ResultsDir = Path("crossrl-results"),
    no_store: NoStore = False,
) -> None:
    """crossrl's own cost: store logging share, report build time, CLI start time, RSS per worker."""
    from crossrl.measure.bench.commands import bench_overhead
    from crossrl.measure.bench.results import print_overhead

    console = _console()
    overhead = bench_overhead(progress=console.print)
    _emit_bench("overhead", overhead, print_overhead, json_out=json_out, tracking_uri=tracking_uri,
                results_dir=results_dir, store=not no_store, console=console)  # fmt: skip


@app.command()
def sync(
    results_dir: Annotated[
        Path, typer.Argument(help="results folder whose journals to send (default: crossrl-results)")
    ] = Path("crossrl-results"),
    tracking_uri: Annotated[
        str | None,
        typer.Option("--tracking-uri", help="send to this store instead of the one each journal was written for"),
    ] = None,
    wait: Annotated[float, typer.Option("--wait", metavar="SECONDS", help="give up after this long")] = 600.0,
) -> None:
    """Send what runs left in their journals (the store was unreachable, or the run was killed) to the store."""
    from crossrl.reports.journal import pending_journals, sync
    from crossrl.reports.store import ResultsStore

    if not results_dir.is_dir():
        _fail([f"{results_dir}: no such results folder"])
    journals = pending_journals(results_dir)
    if not journals:
        typer.echo(f"nothing to send: every journal under {results_dir} is in its store")
        return
    stores: dict[str, Any] = {}

    def store_for(uri: str) -> Any:
        target = tracking_uri or uri
        if target not in stores:
            stores[target] = ResultsStore(target, results_dir=results_dir)
        return stores[target]

    try:
        sent, pending = sync(store_for, results_dir, wait_s=wait, warn=_note)
    except Exception as e:  # a bad URI
        _fail([f"results store {tracking_uri or results_dir}: {type(e).__name__}: {e}"])
    typer.echo(f"sent {sent} writes from {len(journals)} journals under {results_dir}")
    if pending:
        typer.echo(
            f"error: {pending} writes are still not in their store (unreachable?); run `crossrl sync` again", err=True
        )
        raise typer.Exit(EXIT_UNSENT)


@app.command()
def ui(
    scenario: Annotated[
        str | None, typer.Argument(help="open on this scenario's runs: its trials' return curves first")
    ] = None,
    port: Annotated[int, typer.Option("--port", help="port on 127.0.0.1")] = 5000,
    tracking_uri: TrackingUri = None,
    results_dir: ResultsDir = Path("crossrl-results"),
) -> None:
    """Start the MLflow UI on 127.0.0.1 over the same store and print its URL (with SCENARIO: the URL of that
    scenario's runs in the classic chart view); Ctrl-C, SIGTERM or SIGHUP stop it."""
    from crossrl.orchestration.procs import run_until_stopped
    from crossrl.reports.store import is_embedded, resolve_tracking_uri
    from crossrl.reports.ui_server import server_command

    embedded = is_embedded(resolve_tracking_uri(tracking_uri, results_dir))
    store = _open_store(tracking_uri, results_dir) if embedded else None
    experiment_id, view = None, False
    if scenario:
        store = store or _store_or_fail(tracking_uri, results_dir)
        try:
            experiment_id = store.experiment_id(scenario, create=False)
        except Exception as e:
            _fail([f"results store {store.uri}: {type(e).__name__}: {e}"])
        if experiment_id is None:
            _fail([f"no runs of scenario {scenario!r} in {store.uri}: `crossrl runs` lists the stored ones"])
        try:  # crossrl's view is of trial runs (a bench-* experiment has none: MLflow's own charts then)
            kind = "tags.`crossrl.kind` = 'trial'"
            view = bool(store.client.search_runs([experiment_id], filter_string=kind, max_results=1))
            if view:
                store.set_ui_view(experiment_id)  # an experiment made before crossrl set its view
        except Exception as e:  # the link still opens the classic chart view, with MLflow's own charts
            view = False
            _note(f"could not set crossrl's chart view on experiment {experiment_id}: {type(e).__name__}: {e}")
    cmd = server_command(
        tracking_uri=tracking_uri, results_dir=results_dir, port=port, experiment_id=experiment_id, view=view
    )
    raise typer.Exit(0 if cmd is None else run_until_stopped(cmd))


def main() -> None:
    import os

    # MLflow's INFO lines (schema creation on a fresh store, ...) are not the user's business; warnings are.
    os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")
    # A write to an unreachable server is retried by crossrl's journal sender for as long as it takes; MLflow's
    # own retries inside one call (about four minutes by default) would only delay the catch-up.
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "3")
    os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")  # MLflow's "View run" lines
    sys.argv[1:] = _optional_resume_value(sys.argv[1:])
    from crossrl.scenarios.loader import user_import_path

    user_import_path()  # a spec's 'module:Id' env finds the user's module here and in every process a run starts
    app()


def _optional_resume_value(args: list[str]) -> list[str]:
    """`crossrl run`'s ``--resume`` may stand alone (the scenario's newest run): give it the value ``latest`` then
    (`crossrl tune --resume` is a flag)."""
    if "run" not in args[:1]:
        return args
    out = []
    for i, arg in enumerate(args):
        out.append(arg)
        if arg == "--resume" and (i + 1 == len(args) or args[i + 1].startswith("-")):
            out.append("latest")
    return out


if __name__ == "__main__":
    main()
