"""Finding, parsing and checking scenario files, with errors that say what, where and how to fix."""

from __future__ import annotations

import codecs
import datetime
import math
import os
import re
import reprlib
import sys
import types
import typing
from collections.abc import Collection, MutableMapping, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from crossrl.scenarios.catalog import ENGINES
from crossrl.scenarios.spec import NAME_PATTERN, ScenarioSpec, close_matches, cross_field_problems, suggest


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
    shown = _printable(name_or_path)
    try:
        exists, is_dir, is_file = path.exists(), path.is_dir(), path.is_file()
    except (OSError, ValueError) as e:  # a name too long for the file system, a NUL byte
        reason = getattr(e, "strerror", None) or str(e)
        raise SpecError(
            [f"{shown}: not a usable path ({reason}); give a scenario YAML file or a built-in name"]
        ) from None
    if path.suffix in (".yaml", ".yml") or exists:
        if is_dir:
            raise SpecError([f"{shown}: is a directory; give a scenario YAML file in it, or a built-in scenario name"])
        if not exists:
            raise SpecError([f"{shown}: no such file"])
        if not is_file:
            raise SpecError([f"{shown}: not a regular file (a device, pipe or socket); give a scenario YAML file"])
        return path
    builtins = builtin()
    if name_or_path in builtins:
        return builtins[name_or_path]
    raise SpecError([f"{shown}: not a file and not a built-in scenario (built-in: {', '.join(builtins)})"])


def spec_label(path: Path) -> str:
    """How problem lines name a spec file: its name, with anything unprintable escaped."""
    return _printable(path.name)


def load_raw(name_or_path: str, *, overrides: dict[str, Any] | None = None) -> tuple[dict[str, Any], Path, str]:
    """A spec file found (:func:`resolve`) and parsed, with ``overrides`` (dotted field paths -> values) applied:
    the mapping, its path and its label (:func:`spec_label`); SpecError when it is not a mapping of fields."""
    path = resolve(name_or_path)
    label = spec_label(path)
    raw = read_yaml(path, label)
    if raw is None:
        raise SpecError(
            [f"{label}: the file is empty; a spec is a mapping of fields (name, env, algorithm, budget, ...)"]
        )
    if not isinstance(raw, dict):
        raise SpecError(
            [f"{label}: the top level is {_kind(raw)}; it must be a mapping of fields (name, env, algorithm, ...)"]
        )
    for dotted, value in (overrides or {}).items():
        _set_dotted(raw, dotted, value)
    return raw, path, label


def load(
    name_or_path: str, *, overrides: dict[str, Any] | None = None, engines: Collection[str] = ENGINES
) -> tuple[ScenarioSpec, Path]:
    """Parse and validate a scenario; ``overrides`` maps dotted field paths to values (CLI flags).

    ``engines`` are the engine ids a spec may name: the built-in ones, or the engine registry's
    (``crossrl.adapters.registry.engine_ids()``, which adds ``CROSSRL_EXTRA_ENGINES``).
    """
    raw, path, label = load_raw(name_or_path, overrides=overrides)
    return validate(raw, label=label, engines=engines), path


def read_yaml(path: Path, label: str) -> Any:
    """A spec file parsed (UTF-8 text, YAML with crossrl's checks: duplicate keys, depth, numbers); SpecError
    with the file and line otherwise."""
    return _parse(_read_text(path, label), label)


def validation_problems(err: ValidationError, label: str, model: type[BaseModel] | None = None) -> list[str]:
    """One line per problem of a pydantic error, each naming the file and the field; ``model`` (the class that was
    validated) lets a misspelt field get the names it may have meant."""
    errors = err.errors()
    # A misspelt required field is one problem, not two: its "unknown field" line names it, its "missing" one goes.
    missing = {tuple(e["loc"]) for e in errors if e["type"] == "missing"}
    meant = {tuple(e["loc"]): _meant(e["loc"], model) for e in errors if e["type"] == "extra_forbidden"}
    covered = {(*loc[:-1], name) for loc, names in meant.items() if len(names) == 1 for name in names} & missing
    return [
        f"{label}: {line}"
        for e in errors
        if not (e["type"] == "missing" and tuple(e["loc"]) in covered)
        for line in _describe_lines(e, model)
    ]


# The sections of a scenario that spec.cross_field_problems checks against each other.
_SECTIONS = ("env", "algorithm", "execution")


def validate(raw: dict[str, Any], *, label: str, engines: Collection[str] = ENGINES) -> ScenarioSpec:
    """Validate a parsed spec, collecting every problem (types, values, engine ids, env id, fields that contradict
    each other) before raising."""
    shape = shape_problems(raw)
    if shape:
        raise SpecError(capped([f"{label}: {line}" for line in shape], label))
    try:
        spec = ScenarioSpec.model_validate(raw, context={"engines": tuple(engines)})
    except ValidationError as e:
        problems = validation_problems(e, label, ScenarioSpec)
        if any(err["loc"] for err in e.errors()):
            # A field failed, so the checks across sections did not run: run those whose sections are fine alone.
            failed = {err["loc"][0] for err in e.errors() if err["loc"]}
            parts = {key: part for key in _SECTIONS if key not in failed if (part := section(raw, key)) is not None}
            problems += [f"{label}: {line}" for line in cross_field_problems(**parts)]
        env_problem = env_id_problem(raw.get("env"), label)
        if env_problem:
            problems.append(env_problem)
        raise SpecError(capped(problems, label)) from None
    env_problem = env_id_problem(spec.env.model_dump(), label)
    if env_problem:
        raise SpecError([env_problem])
    return spec


def section(raw: dict[str, Any], key: str) -> Any:
    """One section of a parsed scenario (``env``, ``algorithm``, ...) validated on its own (its default when the spec
    leaves it out), or None when it does not validate."""
    field = ScenarioSpec.model_fields[key]
    cls = _model_in(field.annotation)
    if cls is None:
        return None
    if key not in raw:
        return None if field.is_required() else field.get_default(call_default_factory=True)
    try:
        return cls.model_validate(raw[key])
    except ValidationError:
        return None


def _describe_lines(err: Any, model: type[BaseModel] | None = None) -> list[str]:
    """:func:`_describe`, one line per problem: a validator may report several, one per line of its message."""
    msg = err["msg"]
    if err["type"] != "value_error" or "\n" not in msg.strip():
        return [_describe(err, model)]
    return [_describe({**err, "msg": line}, model) for line in msg.strip().splitlines() if line.strip()]


# What pydantic's error types mean, in the suite's words (the value comes first: "<value> is not a whole number").
_MEANINGS: dict[str, str] = {
    "int_type": "is not a whole number; give one such as 1000 (or 1e3)",
    "int_parsing": "is not a whole number; give one such as 1000 (or 1e3)",
    "int_from_float": "is not a whole number; give one such as 1000 (or 1e3)",
    "float_type": "is not a number; give one such as 0.5 (or 5e-1)",
    "float_parsing": "is not a number; give one such as 0.5 (or 5e-1)",
    "finite_number": "is not a finite number; give a number such as 0.5",
    "bool_type": "is not true or false",
    "bool_parsing": "is not true or false",
    "string_type": "is not text",
    "dict_type": "is not a mapping; give {key: value, ...}",
    "model_type": "is not a mapping of fields; give {field: value, ...}",
    "model_attributes_type": "is not a mapping of fields; give {field: value, ...}",
}
_LISTS = {"tuple_type", "list_type", "set_type", "frozen_set_type", "iterable_type"}
_LIST_EXAMPLES = {
    "hidden": "[64, 64]",
    "workers": "[1, 2]",
    "seeds": "[0, 1, 2]",
    "engines": "[crossrl, rllib]",
    "conv": "[[16, 3, 1]]",
    "rows": "[CartPole-v1]",
    "columns": "[{algorithm: ppo, workers: 1}]",
    "published": "[{label: ..., scores: {...}}]",
}
_BOUNDS = {
    "greater_than": ("gt", "must be more than"),
    "greater_than_equal": ("ge", "must be at least"),
    "less_than": ("lt", "must be less than"),
    "less_than_equal": ("le", "must be at most"),
}
# Other RL libraries' names for crossrl's shared hyperparameters (RLlib, Stable-Baselines3/RL Zoo, TorchRL), so a
# spec written from one of them gets the crossrl name.
_ALIASES: dict[str, str] = {
    "learning_rate": "lr",
    "lambda": "gae_lambda",
    "lambda_": "gae_lambda",
    "lmbda": "gae_lambda",
    "clip_param": "clip",
    "clip_range": "clip",
    "clip_epsilon": "clip",
    "vf_clip_param": "vf_clip",
    "clip_range_vf": "vf_clip",
    "num_epochs": "epochs",
    "n_epochs": "epochs",
    "num_sgd_iter": "epochs",
    "minibatch_size": "minibatch",
    "sgd_minibatch_size": "minibatch",
    "train_batch_size": "train_batch",
    "train_batch_size_per_learner": "train_batch",
    "ent_coef": "entropy_coeff",
    "entropy_coef": "entropy_coeff",
    "vf_coef": "vf_coeff",
    "vf_loss_coeff": "vf_coeff",
    "max_grad_norm": "grad_clip",
    "rollout_fragment_length": "rollout_fragment",
    "replay_buffer_size": "buffer_size",
    "num_steps_sampled_before_learning_starts": "learning_starts",
    "target_update_interval": "target_update",
    "target_network_update_freq": "target_update",
    "exploration_initial_eps": "epsilon_initial",
    "exploration_final_eps": "epsilon_final",
    "training_intensity": "replay_ratio",
    "double_dqn": "double_q",
    "seed": "seeds",
    "engine": "engines",
}


def _describe(err: Any, model: type[BaseModel] | None = None) -> str:
    loc = _dotted(err["loc"]) or "(top level)"
    kind = err["type"]
    value = _short(err.get("input"))
    ctx = err.get("ctx") or {}
    if kind == "extra_forbidden":
        return f"{loc}: unknown field; {_field_hint(err['loc'], model)}"
    if kind == "missing":
        return f"{loc}: required field is missing"
    if kind == "literal_error":
        expected = str(ctx.get("expected", ""))
        choices = re.findall(r"'([^']*)'", expected) or [expected.replace(" or ", ", ")]
        hint = suggest(err.get("input"), choices)
        return f"{loc}: {value} is not one of {', '.join(choices)}{'; ' + hint if hint else ''}"
    if kind == "value_error":
        msg = _one_line(err["msg"].removeprefix("Value error, "))
        return f"{loc}: {msg}" if loc != "(top level)" else msg
    leaf = next((p for p in reversed(err["loc"]) if isinstance(p, str)), "")
    if kind in _MEANINGS:
        return f"{loc}: {value} {_MEANINGS[kind]}"
    if kind in _LISTS:
        example = _LIST_EXAMPLES.get(leaf, "[a, b]")
        return f"{loc}: {value} is not a list; give a list such as {example}"
    if kind in _BOUNDS:
        key, words = _BOUNDS[kind]
        return f"{loc}: {value} {words} {_number(ctx.get(key))}"
    if kind == "string_pattern_mismatch" and ctx.get("pattern") == NAME_PATTERN:
        return (
            f"{loc}: {value} must start with a letter or digit and hold only letters, digits, '_', '.' and '-' "
            "(it names runs and files)"
        )
    if kind == "string_pattern_mismatch":
        return f"{loc}: {value} does not have the form this field takes"
    if kind in ("too_short", "string_too_short"):
        least = ctx.get("min_length", 1)
        return f"{loc}: {value} is empty; give at least {least}" if least == 1 else f"{loc}: give at least {least}"
    if kind in ("too_long", "string_too_long"):
        return f"{loc}: {value} is too long; give at most {ctx.get('max_length')}"
    # Anything else: pydantic's message, in the suite's form.
    msg = _one_line(err["msg"]).replace("Input should be", "must be").replace("Value error, ", "")
    return f"{loc}: {value}: {msg}"


def _number(x: Any) -> str:
    return f"{x:g}" if isinstance(x, float) else str(x)


def _field_hint(loc: Sequence[Any], model: type[BaseModel] | None) -> str:
    """For an unknown field: the field it may have meant, else the fields that may be given where it is."""
    parent = _model_at(model, loc[:-1]) if model is not None else None
    if parent is None:
        return "check its spelling against the spec's fields"
    names = _meant(loc, model)
    if names:
        required = len(names) == 1 and parent.model_fields[names[0]].is_required()
        return f"did you mean {' or '.join(names)}?" + (f" ({names[0]} is required)" if required else "")
    return f"the fields here are: {', '.join(parent.model_fields)}"


def _meant(loc: Sequence[Any], model: type[BaseModel] | None) -> list[str]:
    """The fields an unknown field at ``loc`` may have meant: another library's name for one, or names close to it."""
    parent = _model_at(model, loc[:-1]) if model is not None else None
    key = loc[-1] if loc else None
    if parent is None or not isinstance(key, str):
        return []
    fields = list(parent.model_fields)
    if _ALIASES.get(key) in fields:
        return [_ALIASES[key]]
    return close_matches(key, fields)


def _model_at(model: type[BaseModel] | None, loc: Sequence[Any]) -> type[BaseModel] | None:
    """The model class whose fields are at ``loc`` below ``model`` (list indices skipped), or None."""
    for part in loc:
        if model is None:
            return None
        if not isinstance(part, str):
            continue  # an index into a list of models
        field = model.model_fields.get(part)
        if field is None:
            return None
        model = _model_in(field.annotation)
    return model


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The model class inside a field's type (``X``, ``X | None``, ``tuple[X, ...]``), or None."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if typing.get_origin(annotation) in (typing.Union, types.UnionType, tuple, list):
        for arg in typing.get_args(annotation):
            found = _model_in(arg)
            if found is not None:
                return found
    return None


def env_id_problem(env: Any, label: str) -> str | None:
    """Why a (parsed) env section's id names no env, on one line with the file and the field, or None."""
    if not isinstance(env, dict) or not isinstance(env.get("id"), str):
        return None
    env_id = env["id"]
    if env.get("agents") is not None:
        try:
            pettingzoo_module(env_id)
        except Exception as e:
            hint = _pettingzoo_hint(env_id)
            reason = f"; {hint}" if hint else f" ({first_line(e)})"
            return f"{label}: env.id: {_short(env_id)} is not a PettingZoo env module{reason}"
        return None
    module = env_id.rpartition(":")[0]
    try:
        registered_spec(env_id)
    except ImportError as e:  # the user's module of a 'module:Id' id (or something it imports) did not import
        return (
            f"{label}: env.id: {_short(env_id)}: module {module!r} did not import ({type(e).__name__}: "
            f"{first_line(e)}); crossrl imports it from the current directory and the folders in {ENV_PATH_VAR}: run "
            f"from the folder that holds it, or set {ENV_PATH_VAR}=/path/to/that/folder"
            + (f" (or, for a registered gymnasium env: {hint})" if (hint := _gymnasium_hint(env_id)) else "")
        )
    except Exception as e:  # gymnasium raises several error types (NameNotFound, VersionNotFound, ...)
        hint = _gymnasium_hint(env_id)
        if module:  # the user's module imported: what it registered is not this id
            return (
                f"{label}: env.id: {_short(env_id)}: module {module!r} imported, but no env it registered is "
                f"{env_id.rpartition(':')[2]!r} ({first_line(e)})" + (f"; {hint}" if hint else "")
            )
        if hint:
            return f"{label}: env.id: {_short(env_id)} is not a registered gymnasium env; {hint}"
        return (
            f"{label}: env.id: {_short(env_id)} is not a registered gymnasium env ({first_line(e)}); give an id such "
            "as CartPole-v1, or 'module:Id' to import a module first"
        )
    return None


ENV_PATH_VAR = "CROSSRL_ENV_PATH"
"""Folders (``os.pathsep``-separated) to import a user's env modules from, beside the current directory."""


def user_import_path(environ: MutableMapping[str, str] | None = None, cwd: str | None = None) -> list[str]:
    """Puts the current directory and the folders in ``CROSSRL_ENV_PATH`` on this process's import path (after its
    own entries, so an installed package is never shadowed here) and on ``PYTHONPATH`` for every process it starts
    (trials, Ray workers, collectors' workers), so a spec's ``module:Id`` env id finds the user's module in each;
    returns the folders added."""
    env = os.environ if environ is None else environ
    folders = [cwd or os.getcwd(), *filter(None, env.get(ENV_PATH_VAR, "").split(os.pathsep))]
    added = []
    for folder in dict.fromkeys(os.path.abspath(f) for f in folders):
        if folder not in sys.path:
            sys.path.append(folder)
        python_path = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        if folder not in python_path:
            env["PYTHONPATH"] = os.pathsep.join([*python_path, folder])
            added.append(folder)
    return added


def _gymnasium_hint(env_id: str) -> str | None:
    """Suggestions ("did you mean ...?") from gymnasium's registry, for a misspelt id."""
    try:
        import gymnasium as gym

        name = env_id.rpartition(":")[2]
        return suggest(name, list(gym.registry))
    except Exception:
        return None


def _pettingzoo_hint(env_id: str) -> str | None:
    """Suggestions ("did you mean ...?") from the env modules of the package an id names (``package:module``)."""
    import importlib
    import pkgutil

    package, sep, name = env_id.rpartition(":")
    if not sep:
        return None
    try:
        modules = [m.name for m in pkgutil.iter_modules(importlib.import_module(package).__path__)]
    except Exception:
        return None
    return suggest(name, modules, prefix=f"{package}:")


MAX_BYTES = 1_000_000
"""The largest spec file read (a spec is a short YAML file; this keeps a wrong path from filling memory)."""
MAX_DEPTH = 32
"""The deepest nesting of lists and mappings a spec may have (its own fields nest three levels)."""
MAX_VALUES = 100_000
"""The most values a spec may hold once YAML aliases are expanded (a built-in one holds about fifty)."""
MAX_PROBLEMS = 20
"""Problem lines shown for one spec; the rest are counted in one last line."""
_INT64 = 2**63
_MAX_FLOW_DEPTH = 200


def first_line(e: BaseException) -> str:
    """An exception's message on one line (its first line), or its type name when it has none."""
    lines = str(e).strip().splitlines()
    return _one_line(lines[0]) if lines else type(e).__name__


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _printable(text: str) -> str:
    """``text``, or its escaped form when it holds line breaks, control characters or undecodable bytes."""
    return text if text.isprintable() else text.encode("unicode_escape", "backslashreplace").decode("ascii")


def _short(value: Any) -> str:
    """A value's repr, cut to a readable length (deep, long or huge values included), always on one line."""
    try:
        return _REPR.repr(value)
    except Exception:  # an int too long to print, a repr that fails: name the type
        return f"<{type(value).__name__}>"


def _make_repr() -> reprlib.Repr:
    r = reprlib.Repr()
    r.maxlevel, r.maxdict, r.maxlist, r.maxtuple, r.maxset = 3, 4, 6, 6, 6
    r.maxstring, r.maxother, r.maxlong = 60, 60, 40
    return r


_REPR = _make_repr()


def _dotted(loc: Any) -> str:
    return ".".join(_printable(str(p)) if isinstance(p, str) else _short(p) for p in loc)


def _kind(value: Any) -> str:
    kinds = {list: "a list", str: "text", bool: "true or false", int: "a number", float: "a number"}
    return kinds.get(type(value), "a single value")


def capped(problems: list[str], label: str) -> list[str]:
    if len(problems) <= MAX_PROBLEMS:
        return problems
    rest = len(problems) - MAX_PROBLEMS
    return [*problems[:MAX_PROBLEMS], f"{label}: and {rest} more problems; fix these and check again"]


def _read_text(path: Path, label: str) -> str:
    """The file's text; a SpecError when it cannot be read, is too large, binary or not UTF-8."""
    try:
        with path.open("rb") as f:
            data = f.read(MAX_BYTES + 1)
    except OSError as e:
        reason = e.strerror or first_line(e)
        hint = "; check the file's permissions" if isinstance(e, PermissionError) else ""
        raise SpecError([f"{label}: cannot read: {reason}{hint}"]) from None
    if len(data) > MAX_BYTES:
        raise SpecError([f"{label}: larger than {MAX_BYTES:,} bytes; a scenario spec is a short YAML file"])
    if data.startswith((codecs.BOM_UTF32_LE, codecs.BOM_UTF32_BE, codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        raise SpecError([f"{label}: UTF-16/32 text; save the spec as UTF-8"])
    binary = SpecError([f"{label}: a binary file, not YAML text; give a scenario YAML file"])
    if b"\0" in data:
        raise binary
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        head = data[:4096]
        if sum(c < 0x20 and c not in b"\t\n\r\f" for c in head) > len(head) // 20:  # > 5% control bytes
            raise binary from None
        line = data.count(b"\n", 0, e.start) + 1
        column = e.start - (data.rfind(b"\n", 0, e.start) + 1) + 1
        raise SpecError(
            [f"{label}: not UTF-8 text (byte 0x{data[e.start]:02x} at line {line}, column {column}); save it as UTF-8"]
        ) from None


class _ValueError(yaml.MarkedYAMLError):
    """A value YAML parsed but could not build, or a key given twice; ``problem`` says which and how to fix."""


class _Loader(yaml.SafeLoader):
    """yaml.SafeLoader that refuses a key given twice in one mapping and says where a value cannot be built."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
                continue  # a merge (<<) may override keys; SafeLoader reports an unhashable key
            key = self.construct_object(key_node)
            if key in seen:
                raise _ValueError(
                    problem=f"{_short(key)} is given twice in the same mapping; keep one",
                    problem_mark=key_node.start_mark,
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)

    def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
        try:
            return super().construct_object(node, deep=deep)
        except (ValueError, TypeError, OverflowError) as e:
            if "integer string conversion" in str(e):  # Python's limit on the digits of an int
                problem = "the number is too large; numbers in a spec fit in 64 bits"
            else:
                problem = f"{_short(node.value) if isinstance(node, yaml.ScalarNode) else 'this value'} cannot be "
                problem += f"read as {node.tag.rpartition(':')[2]} ({first_line(e)}); quote it to make it text"
            raise _ValueError(problem=problem, problem_mark=node.start_mark) from None


# PyYAML reads YAML 1.1, where a float needs a dot and a signed exponent ("3.0e-4"): "1e3", "1.5e3" and "1e+3"
# would be text, and an integer field would refuse them. They are numbers here, as in YAML 1.2 (an integer field
# takes one when it is a whole number: env_steps: 1e6).
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"),
    list("-+0123456789."),
)


def _parse(text: str, label: str) -> Any:
    """The YAML document in ``text``; a SpecError with line and column when it is not valid YAML."""
    too_deep = SpecError([f"{label}: nested too deeply to read; a spec nests a few levels (at most {MAX_DEPTH})"])
    if _flow_depth(text) > _MAX_FLOW_DEPTH:  # PyYAML takes time quadratic in this depth, and then recurses too deep
        raise too_deep
    try:
        return yaml.load(text, Loader=_Loader)  # _Loader is a SafeLoader: plain data only
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        what = "" if isinstance(e, _ValueError) else "YAML syntax error: "
        raise SpecError([f"{label}: {where}{what}{_one_line(e.problem or first_line(e))}"]) from None
    except yaml.reader.ReaderError as e:  # a character YAML does not allow
        line = text.count("\n", 0, e.position) + 1
        column = e.position - (text.rfind("\n", 0, e.position) + 1) + 1
        raise SpecError(
            [f"{label}: line {line}, column {column}: YAML syntax error: {e.reason} ({chr(e.character)!r}); remove it"]
        ) from None
    except yaml.YAMLError as e:
        raise SpecError([f"{label}: YAML syntax error: {first_line(e)}"]) from None
    except RecursionError:
        raise too_deep from None


def _flow_depth(text: str) -> int:
    """The deepest run of open ``[``/``{`` in ``text`` (quotes ignored: an overestimate, never less)."""
    if text.count("[") + text.count("{") <= _MAX_FLOW_DEPTH:
        return 0
    depth = deepest = 0
    for char in text:
        if char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}" and depth:
            depth -= 1
    return deepest


def shape_problems(raw: dict[str, Any]) -> list[str]:
    """What no field accepts, wherever it is (env.kwargs too): nesting deeper than MAX_DEPTH, more than
    MAX_VALUES values, a value that contains itself (YAML aliases), keys that are not text, numbers that
    are not finite or do not fit in 64 bits, and YAML values (dates, bytes, sets) JSON cannot hold."""
    problems: list[str] = []
    sizes: dict[int, int] = {}  # id of a list/mapping -> values in it, so an alias is counted, not walked, again
    ancestors: set[int] = set()

    def walk(node: Any, path: tuple[Any, ...]) -> int:
        where = _dotted(path) or "(top level)"
        if isinstance(node, (dict, list, tuple)):
            if id(node) in ancestors:
                problems.append(f"{where}: contains itself (a YAML alias inside its own anchor); write it out")
                return 1
            if id(node) in sizes:
                return sizes[id(node)]
            if len(path) >= MAX_DEPTH:
                problems.append(f"{where}: nested more than {MAX_DEPTH} levels deep; a spec nests a few levels")
                return 1
            ancestors.add(id(node))
            size = 1
            items = node.items() if isinstance(node, dict) else enumerate(node)
            for key, child in items:
                if isinstance(node, dict) and not isinstance(key, str):
                    problems.append(f"{where}: the key {_short(key)} is not text; quote it (or rename it)")
                    continue
                size += walk(child, (*path, key))
                if size > MAX_VALUES:
                    break
            ancestors.discard(id(node))
            sizes[id(node)] = size
            if size > MAX_VALUES and not path:
                problems.append(f"holds more than {MAX_VALUES:,} values (YAML aliases expanded); a spec is short")
            return size
        if isinstance(node, bool) or node is None or isinstance(node, str):
            return 1
        if isinstance(node, int):
            if not -_INT64 <= node < _INT64:
                problems.append(f"{where}: a {node.bit_length()}-bit number is too large; numbers fit in 64 bits")
        elif isinstance(node, float):
            if not math.isfinite(node):
                problems.append(f"{where}: {node!r} is not a finite number; give a number such as 0.5")
        elif isinstance(node, (datetime.date, datetime.datetime)):
            problems.append(f"{where}: {node.isoformat()} is read as a date; quote it to make it text")
        elif isinstance(node, (set, frozenset)):
            problems.append(f"{where}: a YAML set (!!set); write a list [a, b] instead")
        else:
            problems.append(f"{where}: a YAML {type(node).__name__} value; give text, a number, a list or a mapping")
        return 1

    walk(raw, ())
    return problems


def parse_sets(items: Collection[str]) -> dict[str, Any]:
    """``--set KEY=VALUE`` options as overrides (dotted field path -> value). VALUE is read as YAML as a spec's
    values are (``1e-3`` a number, ``[64, 64]`` a list, ``true`` a bool); SpecError, one line per bad item."""
    out: dict[str, Any] = {}
    problems = []
    for item in items:
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep or not key or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*", key):
            problems.append(
                f"--set {_short(item)}: give FIELD=VALUE with a dotted field path, e.g. "
                "--set algorithm.hyperparams.lr=1e-3"
            )
            continue
        try:
            out[key] = _parse(text, f"--set {key}") if text.strip() else None
        except SpecError as e:
            problems += e.problems
    if problems:
        raise SpecError(problems)
    return out


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
    register_suite(name)
    return gym.spec(name)


def pettingzoo_module(env_id: str) -> Any:
    """The PettingZoo env module ``env_id`` names (``package:module`` or a dotted module path, e.g.
    ``mpe2:simple_spread_v3``), imported; a multi-agent env is its ``parallel_env(**kwargs)``."""
    import importlib

    package, sep, name = env_id.rpartition(":")
    module = importlib.import_module(f"{package}.{name}" if sep else name)
    if not callable(getattr(module, "parallel_env", None)):
        raise ValueError(f"module {module.__name__} has no parallel_env(); give a PettingZoo env module")
    return module


def register_suite(env_id: str) -> None:
    """Register the env suite an id names, where gymnasium does not: ``ALE/...`` (ale-py) and ``MinAtar/...``.

    gymnasium 1.x loads no entry points, so their ids exist only once their package has registered
    them; this does it once per process (every process that makes envs calls it: engines' workers too).
    """
    import gymnasium as gym

    name = env_id.rpartition(":")[2]
    if name.startswith("ALE/") and name not in gym.registry:
        import ale_py

        ale_py.ALEInterface.setLoggerMode(ale_py.LoggerMode.Error)  # no version banner in every process
        gym.register_envs(ale_py)
    elif name.startswith("MinAtar/") and not any(key.startswith("MinAtar/") for key in gym.registry):
        import minatar.gym

        minatar.gym.register_envs()
