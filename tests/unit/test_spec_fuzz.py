"""Bad input, wide: mutated built-in specs either load as a valid spec or fail with one line per problem.

Property-based (hypothesis, derandomized so every run draws the same examples): each built-in spec
is mutated (a field dropped, a key given twice, a field of another type, random bytes as the whole
file, deep nesting, huge and non-finite numbers, unicode names, random env kwargs) and loaded from a
file. Then a handful of `crossrl` runs check the command line: exit 2, one line on stderr per
problem, never a traceback.
"""

from __future__ import annotations

import copy
import errno
import os
import string
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from crossrl.core.envs import check_env
from crossrl.scenarios.loader import SpecError, builtin, load, spec_label
from crossrl.scenarios.spec import ScenarioSpec

RAWS: dict[str, dict[str, Any]] = {name: yaml.safe_load(path.read_text()) for name, path in builtin().items()}
FUZZ = settings(
    max_examples=50,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
SENTINEL = "__crossrl_fuzz__"


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every place in a parsed spec: mapping keys and list indices, at every depth."""
    out = []
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for key, child in items:
        out.append((*prefix, key))
        out += _paths(child, (*prefix, key))
    return out


def _set(raw: Any, path: tuple[Any, ...], value: Any) -> None:
    for key in path[:-1]:
        raw = raw[key]
    raw[path[-1]] = value


def _yaml(raw: Any, literal: str | None = None) -> bytes:
    """``raw`` as block-style YAML; ``literal`` (YAML text) takes the place of the SENTINEL value."""
    text = yaml.safe_dump(raw, sort_keys=False, allow_unicode=True)
    if literal is not None:
        text = text.replace(SENTINEL, literal, 1)
    return text.encode()


@st.composite
def _spec_and_path(draw: st.DrawFn) -> tuple[dict[str, Any], tuple[Any, ...]]:
    raw = copy.deepcopy(RAWS[draw(st.sampled_from(sorted(RAWS)))])
    return raw, draw(st.sampled_from(_paths(raw)))


FILE_NAMES = st.one_of(
    st.just("spec"),
    st.text(st.characters(exclude_categories=["Cs"], exclude_characters="/\0"), min_size=1, max_size=16),
)
VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(),
    st.text(max_size=12),
    st.lists(st.integers() | st.text(max_size=4), max_size=3),
    st.dictionaries(st.text(max_size=6), st.integers() | st.none(), max_size=3),
)
NUMBER_LITERALS = [
    ".nan",
    ".NaN",
    ".inf",
    "-.inf",
    "1e999",
    "-1e999",
    "1.0e+308",
    "4.9e-324",
    "9" * 19,
    "-" + "9" * 19,
    "9" * 400,
    "9" * 5000,
    "0x" + "f" * 600,
    ":".join(["59"] * 40),  # YAML 1.1 base 60
    str(2**31),
    str(2**63),
    "-1",
    "0",
]


def _nested(depth: int, kind: str) -> str:
    return "[" * depth + "]" * depth if kind == "list" else "{a: " * depth + "1" + "}" * depth


def _check(data: bytes, file_name: str, tmp: Path) -> ScenarioSpec | None:
    """Load ``data`` from a file: a usable spec, or a SpecError of one-line problems naming the file."""
    path = tmp / f"{file_name}.yaml"
    path.write_bytes(data)
    try:
        spec, _ = load(str(path))
    except SpecError as e:
        label = spec_label(path)
        assert label.isprintable()
        assert e.problems, "a SpecError without problems"
        for line in e.problems:
            assert isinstance(line, str) and len(line.splitlines()) == 1, repr(line)
            assert line.startswith(f"{label}: ") and line.strip() != f"{label}:", repr(line)
        return None
    finally:
        path.unlink()
    assert isinstance(spec, ScenarioSpec)
    assert len(spec.fingerprint()) == 16 and spec.trials()  # a valid spec is a usable one
    return spec


@pytest.fixture(scope="module")
def tmp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


def test_builtins_load_unchanged(tmp: Path) -> None:
    for name, raw in RAWS.items():
        assert _check(_yaml(raw), name, tmp) is not None


@FUZZ
@given(spec_path=_spec_and_path(), file_name=FILE_NAMES)
def test_dropped_field(tmp: Path, spec_path: tuple[dict[str, Any], tuple[Any, ...]], file_name: str) -> None:
    raw, path = spec_path
    node = raw
    for key in path[:-1]:
        node = node[key]
    del node[path[-1]]
    _check(_yaml(raw), file_name, tmp)


@FUZZ
@given(spec_path=_spec_and_path(), value=VALUES)
def test_retyped_field(tmp: Path, spec_path: tuple[dict[str, Any], tuple[Any, ...]], value: Any) -> None:
    raw, path = spec_path
    _set(raw, path, value)
    _check(_yaml(raw), "retyped", tmp)


@FUZZ
@given(spec_path=_spec_and_path(), data=st.data())
def test_key_given_twice(tmp: Path, spec_path: tuple[dict[str, Any], tuple[Any, ...]], data: st.DataObject) -> None:
    raw, _ = spec_path
    lines = _yaml(raw).decode().splitlines(keepends=True)
    i = data.draw(st.integers(0, len(lines) - 1))
    spec = _check("".join([*lines[: i + 1], lines[i], *lines[i + 1 :]]).encode(), "twice", tmp)
    if lines[i].split(":")[0] in raw and not lines[i].startswith(" "):  # a top-level field given twice
        assert spec is None


@FUZZ
@given(spec_path=_spec_and_path(), literal=st.sampled_from(NUMBER_LITERALS), value=st.integers() | st.floats())
def test_huge_and_non_finite_numbers(
    tmp: Path, spec_path: tuple[dict[str, Any], tuple[Any, ...]], literal: str, value: Any
) -> None:
    raw, path = spec_path
    _set(raw, path, SENTINEL)
    _check(_yaml(raw, literal), "numbers", tmp)
    _set(raw, path, value)
    _check(_yaml(raw), "numbers", tmp)


@FUZZ
@given(
    spec_path=_spec_and_path(), depth=st.integers(1, 3000), kind=st.sampled_from(["list", "mapping"]), top=st.booleans()
)
def test_deep_nesting(
    tmp: Path, spec_path: tuple[dict[str, Any], tuple[Any, ...]], depth: int, kind: str, top: bool
) -> None:
    raw, path = spec_path
    if top:  # the whole file
        _check(_nested(depth, kind).encode(), "deep", tmp)
        return
    _set(raw, path, SENTINEL)
    _check(_yaml(raw, _nested(depth, kind)), "deep", tmp)


@FUZZ
@given(data=st.binary(max_size=600) | st.text(max_size=300).map(str.encode), file_name=FILE_NAMES)
def test_random_bytes_as_the_file(tmp: Path, data: bytes, file_name: str) -> None:
    _check(data, file_name, tmp)


@FUZZ
@given(spec_path=_spec_and_path(), name=st.text(max_size=40), file_name=FILE_NAMES)
def test_unicode_names(tmp: Path, spec_path: tuple[dict[str, Any], tuple[Any, ...]], name: str, file_name: str) -> None:
    raw, _ = spec_path
    raw["name"] = name
    spec = _check(_yaml(raw), file_name, tmp)
    assert spec is None or spec.name == name


KWARG_NAMES = st.text(string.ascii_lowercase + "_", min_size=1, max_size=12) | st.sampled_from(
    ["sutton_barto_reward", "max_episode_steps", "g", "render_mode"]
)
KWARG_VALUES = st.one_of(st.none(), st.booleans(), st.integers(-5, 500), st.floats(-10, 10), st.text(max_size=6))


@settings(FUZZ, max_examples=15)
@given(
    env_id=st.sampled_from(["CartPole-v1", "Pendulum-v1"]),
    kwargs=st.dictionaries(KWARG_NAMES, KWARG_VALUES, max_size=2),
)
def test_env_kwargs_are_checked_by_building_the_env(tmp: Path, env_id: str, kwargs: dict[str, Any]) -> None:
    raw = copy.deepcopy(RAWS["smoke"])
    raw["env"] = {"id": env_id, "kwargs": kwargs}
    spec = _check(_yaml(raw), "kwargs", tmp)
    assert spec is not None
    problem = check_env(spec.env)
    assert problem is None or (problem.startswith("env: ") and len(problem.splitlines()) == 1), problem
    if set(kwargs) - {"sutton_barto_reward", "max_episode_steps", "g", "render_mode"}:
        assert problem is not None  # a name neither env takes


SMOKE = builtin()["smoke"].read_text()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", "the file is empty; a spec is a mapping of fields (name, env, algorithm, budget, ...)"),
        ("- a\n", "the top level is a list; it must be a mapping of fields (name, env, algorithm, ...)"),
        (SMOKE.replace("lr: 3.0e-4", "lr: .nan"), "algorithm.hyperparams.lr: nan is not a finite number; give"),
        (SMOKE.replace("wall_seconds: 240", "wall_seconds: .inf"), "budget.wall_seconds: inf is not a finite number"),
        (SMOKE.replace("env_steps: 1536", "env_steps: " + "9" * 30), "budget.env_steps: a 100-bit number is too large"),
        (SMOKE.replace("env_steps: 1536", "env_steps: " + "9" * 5000), "line 12, column 21: the number is too large"),
        (SMOKE.replace("seeds: [0, 1]", "seeds: [4294967296]"), "seeds: seeds must be distinct and 0..2147483647"),
        (SMOKE + "name: other\n", "line 18, column 1: 'name' is given twice in the same mapping; keep one"),
        (SMOKE.replace("seeds: [0, 1]", "seeds: " + "[" * 40 + "]" * 40), "seeds.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0"),
        ("a: " + "[" * 5000 + "]" * 5000, "nested too deeply to read; a spec nests a few levels (at most 32)"),
        (SMOKE.replace("seeds: [0, 1]", "seeds: &s [*s]"), "seeds.0: contains itself (a YAML alias inside its own"),
        (SMOKE.replace("name: smoke", "name: 2024-01-01"), "name: 2024-01-01 is read as a date; quote it to make it"),
        (SMOKE.replace("name: smoke", "1: smoke"), "(top level): the key 1 is not text; quote it (or rename it)"),
        ("a: \x07\n", "line 1, column 4: YAML syntax error: special characters are not allowed ('\\x07'); remove it"),
    ],
)
def test_bad_input_lines(tmp: Path, text: str, expected: str) -> None:
    path = tmp / "bad.yaml"
    path.write_text(text)
    with pytest.raises(SpecError) as e:
        load(str(path))
    assert len(e.value.problems) == 1 and e.value.problems[0].startswith(f"bad.yaml: {expected}"), e.value.problems


def test_unreadable_file(tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """chmod 000 stops no one running as root, so the refusal is simulated where the file is opened."""
    path = tmp / "locked.yaml"
    path.write_text(yaml.safe_dump(RAWS["smoke"]))
    real_open = Path.open

    def refuse(self: Path, *args: Any, **kwargs: Any) -> Any:
        if self == path:
            raise PermissionError(errno.EACCES, "Permission denied", str(self))
        return real_open(self, *args, **kwargs)

    monkeypatch.setattr(Path, "open", refuse)
    with pytest.raises(SpecError) as e:
        load(str(path))
    assert e.value.problems == ["locked.yaml: cannot read: Permission denied; check the file's permissions"]


# -- the command line: exit 2, one line per problem on stderr, no traceback --------------------------


def _crossrl(*args: str, code: str = "from crossrl.cli import main; main()") -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-c", f"import sys; sys.argv = ['crossrl', *sys.argv[1:]]; {code}", *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120)


def _one_error_line(out: subprocess.CompletedProcess[str], *expected: str) -> str:
    assert out.returncode == 2, out.stdout + out.stderr
    assert "Traceback" not in out.stdout + out.stderr
    [line] = out.stderr.splitlines()
    assert line.startswith("error: ") and all(s in line for s in expected), line
    return line


def _bad_kwarg_spec(tmp_path: Path) -> Path:
    raw = copy.deepcopy(RAWS["smoke"])
    raw["env"]["kwargs"] = {"no_such_arg": 1}
    path = tmp_path / "kwarg.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def test_cli_non_utf8_file(tmp_path: Path) -> None:
    path = tmp_path / "latin1.yaml"
    path.write_bytes("name: café\n".encode("latin-1"))
    line = _one_error_line(_crossrl("validate", str(path)))
    assert line == "error: latin1.yaml: not UTF-8 text (byte 0xe9 at line 1, column 10); save it as UTF-8"


def test_cli_binary_file(tmp_path: Path) -> None:
    path = tmp_path / "image.yaml"
    path.write_bytes(bytes(range(256)) * 4)
    _one_error_line(_crossrl("validate", str(path)), "image.yaml: a binary file")


def test_cli_directory(tmp_path: Path) -> None:
    (tmp_path / "specs.yaml").mkdir()
    _one_error_line(_crossrl("validate", str(tmp_path / "specs.yaml")), "specs.yaml: is a directory")
    _one_error_line(_crossrl("validate", str(tmp_path)), "is a directory")


def test_cli_unreadable_file(tmp_path: Path) -> None:
    path = tmp_path / "locked.yaml"
    path.write_text(yaml.safe_dump(RAWS["smoke"]))
    if os.geteuid() != 0:  # root reads a chmod 000 file, so there the refusal is simulated
        path.chmod(0)
    deny = (
        "import errno, pathlib; real = pathlib.Path.open\n"
        "def deny(self, *a, **k):\n"
        "    if self.name == 'locked.yaml': raise PermissionError(errno.EACCES, 'Permission denied', str(self))\n"
        "    return real(self, *a, **k)\n"
        "pathlib.Path.open = deny\n"
        "from crossrl.cli import main; main()"
    )
    _one_error_line(_crossrl("validate", str(path), code=deny), "locked.yaml: cannot read: Permission denied")


def test_cli_validate_builds_the_env_with_its_kwargs(tmp_path: Path) -> None:
    line = _one_error_line(_crossrl("validate", str(_bad_kwarg_spec(tmp_path))))
    assert line.startswith("error: kwarg.yaml: env: gymnasium.make('CartPole-v1', **kwargs) failed: ")
    assert "unexpected keyword argument 'no_such_arg'" in line


def test_cli_run_refuses_a_bad_kwarg_before_storing(tmp_path: Path) -> None:
    results = tmp_path / "results"
    out = _crossrl("run", str(_bad_kwarg_spec(tmp_path)), "--results-dir", str(results), "--no-report")
    _one_error_line(out, "kwarg.yaml: env: gymnasium.make('CartPole-v1', **kwargs) failed: ")
    assert not results.exists()  # no store, so no FAILED trials
