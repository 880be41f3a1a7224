"""The layers point one way, and no module imports another module's private names.

``scenarios/`` is the ground floor (it imports nothing else from crossrl); ``core/`` (the crossrl
engine) and ``reports/`` stand on it and never on each other; ``adapters/`` (the engines) stands on all
three; ``orchestration/`` (running, supervising, resuming, fanning out and searching trials) on the
engines; ``measure/`` (benchmarks, the A/B gate, the engines' own loops) on orchestration; ``cli.py``
sits on top. Inside a layer no two modules import each other (directly or round a longer cycle). Read
from the source with ``ast``, so an import inside a function counts too.
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
    "orchestration": {"scenarios", "core", "reports", "adapters", "orchestration"},
    "measure": {"scenarios", "core", "reports", "adapters", "orchestration", "measure"},
    "cli": {"scenarios", "core", "reports", "adapters", "orchestration", "measure", "cli"},
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
            # `from crossrl import cli` names its layers in the names taken
            targets = {parts[1]} if len(parts) > 1 else set(names)
            what = f"from {module} import {', '.join(names)}" if names else f"import {module}"
            if any(t in LAYERS and t not in ALLOWED[layer] for t in targets):
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
    for name in ("scenarios", "core", "reports", "adapters", "orchestration", "measure"):
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
    (tmp_path / "adapters" / "planted.py").write_text("from crossrl.orchestration.runner import run_scenario\n")
    (tmp_path / "orchestration" / "planted.py").write_text("import crossrl.measure.bench.ab\n")
    (tmp_path / "measure" / "planted.py").write_text("from crossrl import cli\n")
    problems = check_layers(tmp_path)
    assert problems == [
        "adapters/planted.py:1: `from crossrl.orchestration.runner import run_scenario`: adapters/ may import only"
        " adapters, core, reports, scenarios",
        "core/planted.py:1: `from crossrl.reports import stats`: core/ may import only core, scenarios",
        "measure/planted.py:1: `from crossrl import cli`: measure/ may import only adapters, core, measure,"
        " orchestration, reports, scenarios",
        "orchestration/planted.py:1: `import crossrl.measure.bench.ab`: orchestration/ may import only adapters,"
        " core, orchestration, reports, scenarios",
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
    (tmp_path / "measure" / "bench" / "planted_a.py").write_text("from crossrl.measure.bench import planted_b\n")
    (tmp_path / "measure" / "bench" / "planted_b.py").write_text(
        "def f():\n    from crossrl.measure.bench.planted_a import g\n"
    )
    assert find_cycle(_module_graph(tmp_path)) == [
        "crossrl.measure.bench.planted_a",
        "crossrl.measure.bench.planted_b",
        "crossrl.measure.bench.planted_a",
    ]


def _may_import(docstring: str) -> set[str]:
    """The layers a package's opening docstring says it may import (its ``May import:`` paragraph)."""
    said = docstring.split("May import:", 1)[1].split("never", 1)[0].split("\n\n", 1)[0]
    return {word.split(".")[1] for word in said.replace("`", " ").split() if word.startswith("crossrl.")}


def test_each_layer_says_what_it_holds_and_what_it_may_import() -> None:
    """Each layer package opens with a docstring whose ``May import:`` is the rule this test holds."""
    for layer in LAYERS:
        if layer == "cli":
            continue
        doc = ast.get_docstring(ast.parse((ROOT / layer / "__init__.py").read_text()))
        assert doc and "May import:" in doc, f"{layer}/__init__.py: no opening docstring with 'May import:'"
        assert _may_import(doc) == ALLOWED[layer] - {layer}, (layer, _may_import(doc))
