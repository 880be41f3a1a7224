"""The layers point one way, and no module imports another module's private names.

``scenarios/`` is the ground floor (it imports nothing else from crossrl); ``core/`` (the crossrl
engine) and ``reports/`` stand on it and never on each other; ``adapters/`` stands on all three;
``cli.py`` sits on top. Inside a layer no two modules import each other (directly or round a longer
cycle). Read from the source with ``ast``, so an import inside a function counts too.
"""

from __future__ import annotations

import ast
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# layer -> the crossrl layers it may import (itself included)
ALLOWED: dict[str, set[str]] = {
    "scenarios": {"scenarios"},
    "core": {"scenarios", "core"},
    "reports": {"scenarios", "reports"},
    "adapters": {"scenarios", "core", "reports", "adapters"},
    "cli": {"scenarios", "core", "reports", "adapters", "cli"},
}
LAYERS = tuple(ALLOWED)


def _layer(rel: Path) -> str | None:
    head = rel.parts[0]
    if head == "cli.py":
        return "cli"
    return head if head in ALLOWED else None


def _imports(tree: ast.AST) -> list[tuple[int, str, list[str]]]:
    """(line, imported crossrl module, names taken from it) for every import of crossrl in ``tree``."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name, []) for a in node.names if a.name.split(".")[0] == "crossrl"]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "crossrl":
            assert node.module is not None
            out.append((node.lineno, node.module, [a.name for a in node.names]))
    return out


def check_layers(root: Path) -> list[str]:
    """One line per violation: the file, the line, the import, and the rule it breaks."""
    problems = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        layer = _layer(rel)
        if layer is None:
            continue
        for line, module, names in _imports(ast.parse(path.read_text(), filename=str(rel))):
            parts = module.split(".")
            target = parts[1] if len(parts) > 1 else None
            what = f"from {module} import {', '.join(names)}" if names else f"import {module}"
            if target in LAYERS and target not in ALLOWED[layer]:
                problems.append(f"{rel}:{line}: `{what}`: {layer}/ may import only {', '.join(sorted(ALLOWED[layer]))}")
            private = [n for n in names if n.startswith("_") and not n.startswith("__")]
            if private:
                problems.append(f"{rel}:{line}: `{what}`: imports a private name of another module")
    return problems


def _module_graph(root: Path) -> dict[str, set[str]]:
    """crossrl module -> the crossrl modules it imports (at any depth of the file), for the layered files."""
    files = {}
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if _layer(rel) is None:
            continue
        parts = list(rel.with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        files[".".join(["crossrl", *parts])] = path
    graph: dict[str, set[str]] = {}
    for module, path in files.items():
        edges = graph.setdefault(module, set())
        for _, imported, names in _imports(ast.parse(path.read_text())):
            edges |= {f"{imported}.{n}" for n in names if f"{imported}.{n}" in files}
            if imported in files and not any(f"{imported}.{n}" in files for n in names):
                edges.add(imported)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str]:
    """One import cycle (its modules in order, the first repeated at the end), or [] when there is none."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str]:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return []

    for start in sorted(graph):
        if start not in state and (cycle := visit(start)):
            return cycle
    return []


def _copy_layers(dst: Path) -> None:
    for name in ("scenarios", "core", "reports", "adapters"):
        shutil.copytree(ROOT / name, dst / name, ignore=shutil.ignore_patterns("__pycache__", "*.yaml", "*.json"))
    shutil.copy(ROOT / "cli.py", dst / "cli.py")


def test_the_layers_point_one_way() -> None:
    assert check_layers(ROOT) == []


def test_a_planted_reverse_import_is_named(tmp_path: Path) -> None:
    _copy_layers(tmp_path)
    assert check_layers(tmp_path) == []
    (tmp_path / "scenarios" / "planted.py").write_text(
        "def f():\n    from crossrl.adapters.registry import engine_ids\n    return engine_ids()\n"
    )
    (tmp_path / "reports" / "planted.py").write_text("import crossrl.core.evaluator\n")
    (tmp_path / "core" / "planted.py").write_text("from crossrl.reports import stats\n")
    problems = check_layers(tmp_path)
    assert problems == [
        "core/planted.py:1: `from crossrl.reports import stats`: core/ may import only core, scenarios",
        "reports/planted.py:1: `import crossrl.core.evaluator`: reports/ may import only reports, scenarios",
        "scenarios/planted.py:2: `from crossrl.adapters.registry import engine_ids`: scenarios/ may import only"
        " scenarios",
    ]


def test_a_planted_private_import_is_named(tmp_path: Path) -> None:
    _copy_layers(tmp_path)
    (tmp_path / "adapters" / "planted.py").write_text("from crossrl.core.envs import _private, make_env\n")
    assert check_layers(tmp_path) == [
        "adapters/planted.py:1: `from crossrl.core.envs import _private, make_env`: imports a private name of"
        " another module"
    ]


def test_no_two_modules_import_each_other() -> None:
    assert find_cycle(_module_graph(ROOT)) == []


def test_a_planted_import_cycle_is_named(tmp_path: Path) -> None:
    _copy_layers(tmp_path)
    (tmp_path / "adapters" / "bench" / "planted_a.py").write_text("from crossrl.adapters.bench import planted_b\n")
    (tmp_path / "adapters" / "bench" / "planted_b.py").write_text(
        "def f():\n    from crossrl.adapters.bench.planted_a import g\n"
    )
    assert find_cycle(_module_graph(tmp_path)) == [
        "crossrl.adapters.bench.planted_a",
        "crossrl.adapters.bench.planted_b",
        "crossrl.adapters.bench.planted_a",
    ]
