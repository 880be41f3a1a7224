"""Every hyperparameter crossrl's core reads has its default in the catalog, and only there.

The core indexes ``hp["name"]`` (no ``hp.get(name, default)``), so a name missing from
``HYPERPARAM_DEFAULTS`` and ``CROSSRL_SETTINGS`` would be a KeyError at run time; this test finds it
from the source, for every algorithm that can reach the code that reads it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from crossrl.adapters.registry import BUILTIN
from crossrl.core import algorithms
from crossrl.scenarios.catalog import ALGORITHMS, CROSSRL_SETTINGS, HYPERPARAM_DEFAULTS, OPTIMIZERS, VALID_OPTIMIZERS

CORE = Path(__file__).resolve().parents[2] / "core"


def _is_hp(node: ast.AST | None) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "hp"


def _reads(path: Path) -> tuple[set[str], list[int]]:
    """Names read as ``<x>.hp["name"]`` and the lines of any ``<x>.hp.get(...)`` in a module."""
    names, gets = set(), []
    for node in ast.walk(ast.parse(path.read_text())):
        if _is_hp(node.value if isinstance(node, ast.Subscript) else None):
            assert isinstance(node, ast.Subscript)
            if isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str):
                names.add(node.slice.value)
        func = node.func if isinstance(node, ast.Call) else None
        if isinstance(func, ast.Attribute) and func.attr == "get" and _is_hp(func.value):
            gets.append(node.lineno)
    return names, gets


# The algorithms crossrl's core runs (the others, such as dreamer, never reach its code: the registry refuses them).
CORE_ALGORITHMS = tuple(a for a in ALGORITHMS if a in BUILTIN["crossrl"].supported)


def _algorithms_reaching(path: Path) -> tuple[str, ...]:
    """The algorithms whose trials can run the code in ``path``."""
    if path.parent.name == "optimizers" and path.stem in OPTIMIZERS:
        return tuple(a for a in CORE_ALGORITHMS if path.stem in VALID_OPTIMIZERS[a])
    if path.parent.name == "algorithms" and path.stem in ALGORITHMS:
        return (path.stem,)
    # the policies: whichever algorithm's policy class is (or subclasses) a class defined in this module
    module = f"crossrl.core.{path.stem}"
    return tuple(
        a for a in CORE_ALGORITHMS if any(c.__module__ == module for c in algorithms.load(a).policy_cls.__mro__)
    )


MODULES = sorted(p for p in CORE.rglob("*.py") if _reads(p)[0] or _reads(p)[1])


@pytest.mark.parametrize("path", MODULES, ids=[str(p.relative_to(CORE)) for p in MODULES])
def test_every_hyperparameter_read_has_a_catalog_default(path: Path) -> None:
    names, gets = _reads(path)
    assert not gets, f"core/{path.relative_to(CORE)}:{gets}: hp.get(...) hides a default outside the catalog"
    reaching = _algorithms_reaching(path)
    assert reaching, f"core/{path.relative_to(CORE)} reads hyperparameters but no algorithm reaches it"
    for alg in reaching:
        missing = names - set(HYPERPARAM_DEFAULTS[alg]) - set(CROSSRL_SETTINGS[alg])
        assert not missing, f"core/{path.relative_to(CORE)} reads {sorted(missing)}, which {alg} has no default for"


def test_crossrl_settings_never_shadow_a_shared_default() -> None:
    """A shared name's default lives in HYPERPARAM_DEFAULTS only; CROSSRL_SETTINGS may add a name for an
    algorithm whose shared defaults lack it (e.g. PPO's epochs for A2C's single pass), never restate one."""
    for alg in ALGORITHMS:
        both = set(HYPERPARAM_DEFAULTS[alg]) & set(CROSSRL_SETTINGS[alg])
        assert not both, f"{alg}: {sorted(both)} defaulted in both tables"


def test_the_spec_wins_over_crossrl_settings() -> None:
    alg = algorithms.load("a2c")
    hp = alg.hyperparams({**HYPERPARAM_DEFAULTS["a2c"], "epochs": 3})
    assert hp["epochs"] == 3 and hp["adam_eps"] == CROSSRL_SETTINGS["a2c"]["adam_eps"]
