"""Finding, parsing and checking scenario files, with errors that say what, where and how to fix."""

from __future__ import annotations

from collections.abc import Collection
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from crossrl.scenarios.catalog import ENGINES
from crossrl.scenarios.spec import ScenarioSpec


class SpecError(Exception):
    """A spec that cannot run; ``problems`` holds one line per problem, each naming file and field."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


def builtin_dir() -> Path:
    return Path(str(resources.files("crossrl.scenarios") / "builtin"))


def builtin() -> dict[str, Path]:
    """Built-in scenarios by name."""
    return {p.stem: p for p in sorted(builtin_dir().glob("*.yaml"))}


def resolve(name_or_path: str) -> Path:
    """A built-in scenario name or a path to a YAML file."""
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml") or path.exists():
        if not path.is_file():
            raise SpecError([f"{name_or_path}: no such file"])
        return path
    builtins = builtin()
    if name_or_path in builtins:
        return builtins[name_or_path]
    raise SpecError([f"{name_or_path}: not a file and not a built-in scenario (built-in: {', '.join(builtins)})"])


def load(
    name_or_path: str, *, overrides: dict[str, Any] | None = None, engines: Collection[str] = ENGINES
) -> tuple[ScenarioSpec, Path]:
    """Parse and validate a scenario; ``overrides`` maps dotted field paths to values (CLI flags).

    ``engines`` are the engine ids a spec may name: the built-in ones, or the engine registry's
    (``crossrl.adapters.registry.engine_ids()``, which adds ``CROSSRL_EXTRA_ENGINES``).
    """
    path = resolve(name_or_path)
    label = path.name
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = getattr(e, "problem", None) or str(e)
        raise SpecError([f"{label}: {where}YAML syntax error: {problem}"]) from None
    except OSError as e:
        raise SpecError([f"{label}: cannot read: {e.strerror}"]) from None
    if not isinstance(raw, dict):
        raise SpecError([f"{label}: the top level must be a mapping of fields (name, env, algorithm, ...)"])
    for dotted, value in (overrides or {}).items():
        _set_dotted(raw, dotted, value)
    return validate(raw, label=label, engines=engines), path


def validate(raw: dict[str, Any], *, label: str, engines: Collection[str] = ENGINES) -> ScenarioSpec:
    """Validate a parsed spec, collecting every problem (types, values, engine ids, env id) before raising."""
    try:
        spec = ScenarioSpec.model_validate(raw, context={"engines": tuple(engines)})
    except ValidationError as e:
        problems = [f"{label}: {_describe(err)}" for err in e.errors()]
        env_problem = _env_problem(raw.get("env"), label)
        if env_problem:
            problems.append(env_problem)
        raise SpecError(problems) from None
    env_problem = _env_problem(spec.env.model_dump(), label)
    if env_problem:
        raise SpecError([env_problem])
    return spec


def _describe(err: Any) -> str:
    loc = ".".join(str(p) for p in err["loc"]) or "(top level)"
    kind = err["type"]
    value = err.get("input")
    if kind == "extra_forbidden":
        return f"{loc}: unknown field (value {value!r}); check its spelling against the spec's fields"
    if kind == "missing":
        return f"{loc}: required field is missing"
    if kind == "literal_error":
        expected = err.get("ctx", {}).get("expected", "")
        allowed = expected.replace("'", "").replace(" or ", ", ")
        return f"{loc}: {value!r} is not one of {allowed}"
    msg = err["msg"].removeprefix("Value error, ")
    if kind == "value_error":
        return f"{loc}: {msg}" if loc != "(top level)" else msg
    return f"{loc}: {value!r}: {msg}"


def _env_problem(env: Any, label: str) -> str | None:
    if not isinstance(env, dict) or not isinstance(env.get("id"), str):
        return None
    env_id = env["id"]
    try:
        registered_spec(env_id)
    except Exception as e:  # gymnasium raises several error types (NameNotFound, VersionNotFound, ...)
        hint = str(e).splitlines()[0] if str(e) else type(e).__name__
        return f"{label}: env.id: {env_id!r} is not a registered gymnasium env ({hint})"
    return None


def _set_dotted(raw: dict[str, Any], dotted: str, value: Any) -> None:
    node = raw
    *parents, leaf = dotted.split(".")
    for key in parents:
        child = node.get(key)
        if not isinstance(child, dict):
            child = {}
            node[key] = child
        node = child
    node[leaf] = value


def registered_spec(env_id: str) -> Any:
    """gymnasium's registry entry for ``env_id``; ``module:Id`` imports ``module`` first (as gymnasium.make does)."""
    import importlib

    import gymnasium as gym

    module, sep, name = env_id.rpartition(":")
    if sep:
        importlib.import_module(module)
    return gym.spec(name)
