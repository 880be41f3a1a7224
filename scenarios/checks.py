"""What `crossrl validate` checks beyond a spec's own fields, so that it accepts what `crossrl run` runs.

:func:`check_scenario` (and :func:`check_table`, cell by cell) collects in one pass:

- the spec's fields (:func:`crossrl.scenarios.loader.validate`: types, values, names, sections against each other);
- the env, built once as the engines build it (its id, kwargs and a multi-agent mapping), then its spaces against
  the algorithm (DQN and Ape-X need discrete actions) and the model (a conv stack needs image observations its
  layers fit in);
- hyperparameters the algorithm does not read (a warning: the engines ignore them, or RLlib refuses them);
- each trial against its engine: what the engine registry says it cannot run (`crossrl run` refuses those unless
  --skip-unsupported), and what the engine's adapter refuses once the trial starts (such a trial would end FAILED).

Building envs and knowing the engines belong to the layers above this one (crossrl.core, crossrl.adapters): they
come in as :class:`Probes`, which `crossrl validate` fills with crossrl's own (``crossrl.orchestration.probes.validate_probes``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import ValidationError

from crossrl.scenarios.catalog import ALGORITHMS, CROSSRL_SETTINGS, DEFAULT_OPTIMIZER, HYPERPARAM_DEFAULTS
from crossrl.scenarios.loader import (
    SpecError,
    capped,
    env_id_problem,
    first_line,
    load_raw,
    section,
    shape_problems,
    spec_label,
    validate,
)
from crossrl.scenarios.spec import (
    FRAME_SIZES,
    AgentGroups,
    AlgorithmSpec,
    BudgetSpec,
    EnvSpec,
    Hyperparams,
    ScenarioSpec,
    TargetSpec,
    Trial,
    conv_problem,
    native_text,
    suggest,
)

# Shared names an algorithm has a default for that no engine reads for it (the engines' own mapping tables say so).
_NEVER_READ: dict[str, dict[str, str]] = {
    # crossrl's VTracePolicy computes no GAE (use_gae = False); RLlib: NOT_EQUALIZABLE["impala"]["gae_lambda"];
    # TorchRL: its HYPERPARAM_MAP marks gae_lambda "unused" for impala.
    "impala": {"gae_lambda": "V-trace has no GAE lambda on any engine"},
}


def hyperparams_read(algorithm: str) -> frozenset[str]:
    """The shared hyperparameters ``algorithm`` reads on some engine: those it has a default for
    (``HYPERPARAM_DEFAULTS``), and the shared names crossrl's core gives it a value for (``CROSSRL_SETTINGS``:
    epochs and minibatch for A2C, A3C and IMPALA, num_replay_shards for DQN under async_replay), less those no
    engine reads (:data:`_NEVER_READ`)."""
    shared = set(Hyperparams.model_fields)
    names = set(HYPERPARAM_DEFAULTS[algorithm]) | (set(CROSSRL_SETTINGS[algorithm]) & shared)
    return frozenset(names - set(_NEVER_READ.get(algorithm, {})))


def unread_hyperparams(algorithm: AlgorithmSpec, optimizer: str) -> dict[str, str]:
    """The hyperparameters a spec sets that its algorithm (under crossrl's ``optimizer``) does not read -> why."""
    given = algorithm.hyperparams.model_dump(exclude_none=True)
    defaults = HYPERPARAM_DEFAULTS[algorithm.name]
    reads = hyperparams_read(algorithm.name)
    out: dict[str, str] = {}
    for name in given:
        if name in _NEVER_READ.get(algorithm.name, {}):
            if given[name] != defaults.get(name):  # the default written out (`crossrl init` does) changes nothing
                out[name] = _NEVER_READ[algorithm.name][name]
        elif name not in reads:
            readers = [a for a in ALGORITHMS if name in hyperparams_read(a)]
            out[name] = f"read by {', '.join(readers)}" if readers else "read by no algorithm"
    hp = algorithm.resolved_hyperparams()
    if algorithm.name in ("dqn", "apex"):
        # Read under some settings only; a spec that writes out the default (`crossrl init`'s does) is told nothing.
        unused: dict[str, str] = {}
        if optimizer == "sync_replay" and not hp.get("prioritized_replay"):
            # sync_replay (and RLlib, and TorchRL) read the priorities' exponents only for a prioritized buffer
            unused |= dict.fromkeys(("priority_alpha", "priority_beta"), "read only with prioritized_replay: true")
        if optimizer != "async_replay":
            unused["num_replay_shards"] = "read only with execution.optimizer: async_replay"
        for name, why in unused.items():
            if name in given and given[name] != defaults.get(name):
                out[name] = why
    return out


def hyperparam_warnings(algorithm: AlgorithmSpec, optimizer: str) -> list[str]:
    """One line naming the hyperparameters the algorithm does not read, or none."""
    unread = unread_hyperparams(algorithm, optimizer)
    if not unread:
        return []
    names = ", ".join(f"{name} ({why})" for name, why in unread.items())
    return [
        f"algorithm.hyperparams: {algorithm.name} does not read {names}; remove {'it' if len(unread) == 1 else 'them'}"
    ]


@dataclass(frozen=True)
class EnvSpaces:
    """An env's spaces as the engines see them: agent id ('' for a single-agent env) -> (observation, action)."""

    spaces: dict[str, tuple[Any, Any]]


@dataclass(frozen=True)
class Probes:
    """What the checks learn from the layers above this one (scenarios/ imports nothing else from crossrl):
    crossrl.core builds envs, crossrl.adapters knows the engines. `crossrl validate` passes crossrl's own
    (``crossrl.orchestration.probes.validate_probes``)."""

    engine_ids: Collection[str]
    env_problems: Callable[[EnvSpec], list[str]]  # the env built as the engines build it: one line per problem
    env_spaces: Callable[[EnvSpec], EnvSpaces]  # the env built once more, its spaces read (it may raise)
    unsupported: Callable[[list[Trial]], list[tuple[Trial, str]]]  # the engine registry's refusals
    # trials the registry lets through that the engine's adapter refuses once started (each would end FAILED)
    failing: Callable[[list[Trial], EnvSpaces | None], list[tuple[Trial, str]]] = lambda trials, spaces: []
    # engine id -> the lines of its resolved settings for one trial (`crossrl validate --show`)
    settings: Mapping[str, Callable[[Trial], list[str]]] = field(default_factory=dict)
    # the spec's engine-native settings against the engines' own classes, for the engines the spec runs: one line each
    native_problems: Callable[[ScenarioSpec], list[str]] = lambda spec: []


def env_checks(
    env: EnvSpec, algorithm: AlgorithmSpec | None, probes: Probes, cache: dict[str, Any] | None = None
) -> tuple[list[str], EnvSpaces | None]:
    """The env built as the engines build it (one line per problem), then its spaces against the algorithm and the
    model; and the spaces, when the env builds. ``cache`` keeps each env's outcome (a table's rows)."""
    key = env.model_dump_json()
    if cache is not None and key in cache:
        problems, spaces = cache[key]
    else:
        problems, spaces = list(probes.env_problems(env)), None
        if not problems:
            try:
                spaces = probes.env_spaces(env)
            except Exception as e:  # it built in env_problems; say so if it does not now
                problems = [f"env: building it to read its spaces failed: {first_line(e)}; check env.id and env.kwargs"]
        if cache is not None:
            cache[key] = (problems, spaces)
    lines = list(problems)
    if spaces is not None and algorithm is not None:
        lines += space_problems(env, algorithm, spaces)
    return lines, spaces


def space_problems(env: EnvSpec, algorithm: AlgorithmSpec, spaces: EnvSpaces) -> list[str]:
    """The env's observation and action spaces against the algorithm and the model, one line per problem."""
    from gymnasium import spaces as gs

    lines: list[str] = []
    seen: set[tuple[str, str]] = set()
    for agent, (obs, act) in spaces.spaces.items():
        if (str(obs), str(act)) in seen:
            continue
        seen.add((str(obs), str(act)))
        who = f" (agent {agent})" if agent else ""
        if not isinstance(obs, gs.Box):
            lines.append(
                f"env.id: {env.id}{who} observes {obs}, not arrays; every engine's model reads array (Box) "
                "observations, or Dict / Tuple ones of vectors (flattened, single-agent envs): pick such an env, or "
                "wrap this one (e.g. one-hot) in a module named as 'module:Id'"
            )
        if algorithm.name in ("dqn", "apex") and not isinstance(act, gs.Discrete):
            lines.append(
                f"algorithm.name: {algorithm.name} needs discrete actions (one Q-value per action), but {env.id}{who} "
                f"has {act}; use sac (continuous actions), ppo, a2c, a3c or impala (they take continuous actions too), "
                "or an env with discrete actions"
            )
        elif algorithm.name == "sac" and not isinstance(act, gs.Box):
            lines.append(
                f"algorithm.name: sac needs continuous (Box) actions (a squashed Gaussian policy), but {env.id}{who} "
                f"has {act}; use dqn, ppo, a2c, a3c or impala for discrete actions, or an env with continuous actions "
                "(e.g. Pendulum-v1, HalfCheetah-v5)"
            )
        elif algorithm.name == "sac" and not (np.all(np.isfinite(act.low)) and np.all(np.isfinite(act.high))):
            lines.append(
                f"algorithm.name: sac squashes its actions into the env's bounds, but {env.id}{who} has unbounded "
                f"actions {act}; wrap the env with finite bounds, or use ppo"
            )
        elif isinstance(act, gs.MultiDiscrete) and act.nvec.ndim != 1:
            lines.append(
                f"env.id: {env.id}{who} has {act} actions, a MultiDiscrete of {act.nvec.ndim} dimensions; the engines' "
                "factored categorical heads take one-dimensional MultiDiscrete actions (flatten its nvec)"
            )
        elif not isinstance(act, gs.Discrete | gs.Box | gs.MultiDiscrete):
            lines.append(
                f"env.id: {env.id}{who} has {act} actions; the engines' policies take discrete (Discrete), several "
                "discrete controls at once (MultiDiscrete: ppo, a2c, a3c, impala) or continuous (Box) actions"
            )
        conv = algorithm.model.conv
        if conv and algorithm.name == "sac":
            lines.append("algorithm.model.conv: sac runs MLP models only on every engine; remove conv")
        elif conv and isinstance(obs, gs.Box):
            if len(obs.shape) != 3:
                lines.append(
                    f"algorithm.model.conv: a conv stack needs image observations [H, W, C], but {env.id}{who} gives "
                    f"shape {list(obs.shape)}; remove conv (the MLP reads flat observations)"
                )
            elif env.resolved_preprocessing not in FRAME_SIZES:  # pixel preprocessings: checked when the spec loads
                problem = conv_problem(int(obs.shape[0]), int(obs.shape[1]), conv)
                if problem:
                    lines.append(f"algorithm.model.conv: {problem} ({env.id}{who})")
    return lines


# -- one scenario, one table -----------------------------------------------------------------------------------


@dataclass
class Checked:
    """What :func:`check_scenario` found: the spec when its fields are valid, error lines (``problems``, each
    "FILE: field: what is wrong; how to fix"), warning lines, and the trials an engine cannot run."""

    label: str
    spec: ScenarioSpec | None = None
    path: Path | None = None
    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    unsupported: list[tuple[Trial, str]] = field(default_factory=list)  # the registry's: `crossrl run` refuses them
    failing: list[tuple[Trial, str]] = field(default_factory=list)  # the adapters': they would start and fail
    spaces: EnvSpaces | None = None

    @property
    def trials(self) -> list[Trial]:
        return self.spec.trials() if self.spec is not None else []

    @property
    def runnable(self) -> list[Trial]:
        """The trials no engine refuses."""
        bad = {t.name for t, _ in [*self.unsupported, *self.failing]}
        return [t for t in self.trials if t.name not in bad]


def check_scenario(
    name_or_path: str, probes: Probes, *, overrides: dict[str, Any] | None = None, trials: bool = True
) -> Checked:
    """Every problem of a scenario spec in one pass (see the module's doc). ``trials``: check each trial against
    its engine too, and count it a problem when no trial can run."""
    try:
        raw, path, label = load_raw(name_or_path, overrides=overrides)
    except SpecError as e:
        return Checked(label=name_or_path, problems=e.problems)
    if "kind" in raw:  # a table spec says `kind: table` (and `crossrl validate` takes it as one); a scenario has none
        hint = suggest(raw["kind"], ["table"])
        return Checked(
            label=label,
            path=path,
            problems=[
                f"{label}: kind: {raw['kind']!r} is no kind of spec: a table spec says `kind: table`, a scenario spec "
                f"has no kind{'; ' + hint if hint else ''}"
            ],
        )
    checked = check_raw(raw, probes, label=label, trials=trials, require_runnable=trials)
    checked.path = path
    return checked


def check_raw(
    raw: dict[str, Any],
    probes: Probes,
    *,
    label: str,
    trials: bool = True,
    require_runnable: bool = True,
    env_cache: dict[str, Any] | None = None,
) -> Checked:
    """:func:`check_scenario` on a parsed spec (a table's cell, say); ``env_cache`` shares built envs' outcomes."""
    out = Checked(label=label)
    try:
        out.spec = validate(raw, label=label, engines=probes.engine_ids)
    except SpecError as e:
        out.problems += e.problems
        if shape_problems(raw):  # values no field takes (aliases into themselves, ...): nothing else to check
            return out
    spec = out.spec
    budget = spec.budget if spec is not None else section(raw, "budget")
    target = spec.target if spec is not None else section(raw, "target")
    out.problems += [f"{label}: {line}" for line in target_problems(budget, target)]
    algorithm = spec.algorithm if spec is not None else section(raw, "algorithm")
    if algorithm is not None:
        execution = spec.execution if spec is not None else section(raw, "execution")
        optimizer = (execution.optimizer if execution is not None else None) or DEFAULT_OPTIMIZER[algorithm.name]
        out.warnings += [f"{label}: {line}" for line in hyperparam_warnings(algorithm, optimizer)]
    env = spec.env if spec is not None else _env_part(raw.get("env"))
    if env is not None and (spec is not None or env_id_problem(env.model_dump(), label) is None):
        lines, out.spaces = env_checks(env, algorithm, probes, env_cache)
        out.problems += [f"{label}: {line}" for line in lines]
    if spec is not None:
        out.problems += [f"{label}: {line}" for line in probes.native_problems(spec)]
    if spec is not None and not out.problems and trials:
        all_trials = spec.trials()
        out.unsupported = probes.unsupported(all_trials)
        refused = {t.name for t, _ in out.unsupported}
        out.failing = probes.failing([t for t in all_trials if t.name not in refused], out.spaces)
        if require_runnable and not out.runnable:
            out.problems += no_trial_lines(out)
    out.problems = capped(out.problems, label)
    return out


def target_problems(budget: BudgetSpec | None, target: TargetSpec | None) -> list[str]:
    """``stop_at_target`` without a target: the trial would run its whole budget, which the spec says it should not
    (a spec may still be built so, the sink then stops at the budget: crossrl.adapters.base.MetricSink)."""
    if budget is None or target is None or not budget.stop_at_target or target.episode_return_mean is not None:
        return []
    return [
        "budget.stop_at_target: true ends a trial at target.episode_return_mean, which is not set; set "
        "target.episode_return_mean, or remove stop_at_target"
    ]


def no_trial_lines(checked: Checked, what: str = "spec") -> list[str]:
    """One line per engine (and reason) when no trial of a spec (``what``: of a table) can run."""
    seen: dict[tuple[str, str], None] = {}
    for trial, reason in [*checked.unsupported, *checked.failing]:
        seen.setdefault((trial.engine, reason), None)
    lines = []
    for engine, reason in seen:
        said = reason if reason.startswith(engine) else f"{engine}: {reason}"
        lines.append(f"{checked.label}: engines: no trial of this {what} can run; {said}")
    return lines


def _env_part(raw_env: Any) -> EnvSpec | None:
    """The env section validated on its own so that it can be built (None when it cannot be). A group mapping whose
    shape has problems (reported already) is kept as written, so the env still checks its agents; a mapping that is
    no mapping is left out (the env is built for its kwargs only)."""
    if not isinstance(raw_env, dict):
        return None
    try:
        return EnvSpec.model_validate(raw_env)
    except ValidationError as e:
        if any(err["loc"][:1] != ("agents",) for err in e.errors()):
            return None
    try:
        env = EnvSpec.model_validate({**raw_env, "agents": "independent"})
    except ValidationError:
        return None
    groups = raw_env["agents"].get("groups") if isinstance(raw_env.get("agents"), dict) else None
    well_formed = isinstance(groups, dict) and all(
        isinstance(name, str) and isinstance(members, list) and members and all(isinstance(a, str) for a in members)
        for name, members in groups.items()
    )
    if not well_formed or not groups:
        return env
    return env.model_copy(
        update={"agents": AgentGroups.model_construct(groups={k: tuple(v) for k, v in groups.items()})}
    )


@dataclass
class TableChecked:
    """What :func:`check_table` found: the table, each cell's :class:`Checked`, the table's own problems."""

    label: str
    table: Any = None  # crossrl.scenarios.table.TableSpec
    path: Path | None = None
    cells: list[Checked] = field(default_factory=list)
    table_problems: list[str] = field(default_factory=list)

    @property
    def problems(self) -> list[str]:
        lines = [*self.table_problems, *(line for cell in self.cells for line in cell.problems)]
        return capped(_collapse(lines), self.label)

    @property
    def warnings(self) -> list[str]:
        return _collapse([line for cell in self.cells for line in cell.warnings])


def check_table(name_or_path: str, probes: Probes, *, trials: bool = True) -> TableChecked:
    """Every problem of a table spec in one pass: the table's fields, then each cell as :func:`check_raw` checks a
    scenario (each row's env built once). A cell whose trials no engine runs is no problem (`crossrl table run`
    records them SKIPPED), a table none of whose trials can run is."""
    from crossrl.scenarios.table import cell_name, read_table

    try:
        table, path = read_table(name_or_path)
    except SpecError as e:
        return TableChecked(label=name_or_path, table_problems=e.problems)
    label = spec_label(path)
    out = TableChecked(label=label, table=table, path=path)
    cache: dict[str, Any] = {}
    for row in table.rows:
        for col in table.columns:
            cell = table.cell_raw(row, col)
            where = f"{label} (cell {cell_name(table.name, row, col)})"
            out.cells.append(
                check_raw(cell, probes, label=where, trials=trials, require_runnable=False, env_cache=cache)
            )
    if trials and not out.problems and not any(cell.runnable for cell in out.cells):
        for cell in out.cells:  # no trial of the whole table can run: each cell says why
            out.table_problems += no_trial_lines(cell, "table")
    return out


def _collapse(lines: list[str]) -> list[str]:
    """A table's lines that differ only in the cell they name, once, counting the other cells."""
    groups: dict[str, list[str]] = {}
    for line in lines:
        groups.setdefault(re.sub(r" \(cell [^)]*\)", "", line, count=1), []).append(line)
    return [same[0] + (f" (and {len(same) - 1} more cells)" if len(same) > 1 else "") for same in groups.values()]


# -- what each engine would run: `crossrl validate --show` -------------------------------------------------------


def show_lines(checked: Checked, probes: Probes) -> list[str]:
    """The resolved trials, then each engine's resolved settings per worker count (a trial's seed changes none):
    the engine's own (``probes.settings``) where it has them, else crossrl's resolved ones."""
    spec = checked.spec
    if spec is None:
        return []
    refused = {t.name: reason for t, reason in [*checked.unsupported, *checked.failing]}
    lines = [f"resolved trials ({len(checked.trials)}: engine x workers x seed):"]
    for trial in checked.trials:
        state = f"; cannot run: {refused[trial.name]}" if trial.name in refused else ""
        lines.append(
            f"  {trial.name}: {workers_text(trial.workers)} x {trial.envs_per_worker} envs, seed {trial.seed}{state}"
        )
    firsts: dict[tuple[str, int], Trial] = {}
    for trial in checked.trials:
        firsts.setdefault((trial.engine, trial.workers), trial)
    for (engine, workers), trial in firsts.items():
        if trial.name in refused:
            lines.append(f"{engine}, {workers_text(workers)}: cannot run ({refused[trial.name]})")
            continue
        show = probes.settings.get(engine, shared_settings)
        try:
            lines += show(trial)
        except Exception as e:  # the settings could not be resolved: say so, the checks above passed
            lines.append(f"{engine}, {workers_text(workers)}: its settings could not be resolved: {first_line(e)}")
        if trial.native:
            lines.append(
                f"  native (engine-native settings, passed as written; they break the equal-settings rule): "
                f"{native_text(trial.native)}"
            )
    return lines


def shared_settings(trial: Trial) -> list[str]:
    """A trial's resolved settings in crossrl's names: its hyperparameters, model and execution."""
    return [
        f"{trial.engine}, {workers_text(trial.workers)} (crossrl's resolved settings; its adapter maps them onto the "
        "engine when the trial starts):",
        f"  execution: {workers_text(trial.workers)} x {trial.envs_per_worker} envs",
        f"  hyperparams: {pairs(trial.hyperparams)}",
        f"  model: {pairs(trial.model.model_dump(mode='json'))}",
    ]


def workers_text(n: int) -> str:
    return f"{n} worker" if n == 1 else f"{n} workers"


def pairs(values: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={_value(v)}" for k, v in sorted(values.items()))


def _value(v: Any) -> str:
    if isinstance(v, bool) or v is None:
        return json.dumps(v)
    if isinstance(v, float):
        return f"{v:g}"
    if isinstance(v, list | tuple):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    if isinstance(v, Mapping):
        return "{" + pairs(v) + "}"
    return str(v)
