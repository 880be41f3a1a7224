"""A comparison table: games x (engine, algorithm, workers), the shape of the reference comparison's Atari table.

A table spec names rows (envs) and columns (an algorithm with its worker count), and what every cell shares
(model, engines, envs per worker, budget, seeds). Each row x column cell is an ordinary scenario
(:class:`~crossrl.scenarios.spec.ScenarioSpec`, named ``<table>.<row>.<algorithm>``), validated, run and
stored like any other; the table's report reads the cells' newest runs back (``crossrl.reports.table``).
Built-in tables live in ``scenarios/builtin/tables/``; ``crossrl table run NAME`` runs one.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from crossrl.scenarios.catalog import ENGINES, AlgorithmName
from crossrl.scenarios.loader import SpecError, builtin_dir, read_yaml, spec_label, validate, validation_problems
from crossrl.scenarios.spec import NAME_PATTERN, ScenarioSpec

_STRICT = ConfigDict(extra="forbid", frozen=True)


class TableColumn(BaseModel):
    """One column group: an algorithm (with its hyperparameters) at a worker count, run on every engine."""

    model_config = _STRICT

    algorithm: AlgorithmName
    hyperparams: dict[str, Any] = Field(default_factory=dict, description="as a scenario's algorithm.hyperparams")
    workers: int = Field(ge=1, le=256)
    optimizer: str | None = Field(default=None, description="crossrl's policy optimizer; null: the algorithm's")


class Published(BaseModel):
    """Scores someone published for the same games (the reference comparison's table), shown beside the measured ones."""

    model_config = _STRICT

    label: str = Field(min_length=1, description="the column's heading, e.g. 'RLlib IMPALA 32 workers (2018)'")
    scores: dict[str, float] = Field(description="env id -> the published score")


class TableSpec(BaseModel):
    """Rows (env ids) x columns (algorithm, workers); every cell runs on every engine that has the algorithm."""

    model_config = _STRICT

    name: str = Field(pattern=NAME_PATTERN)
    description: str = ""
    rows: tuple[str, ...] = Field(min_length=1, description="env ids, one row each")
    columns: tuple[TableColumn, ...] = Field(min_length=1)
    model: dict[str, Any] = Field(default_factory=dict, description="as a scenario's algorithm.model, every cell")
    env: dict[str, Any] = Field(
        default_factory=dict, description="env fields every row shares (kwargs, preprocessing, reward_clip)"
    )
    engines: tuple[str, ...] = ENGINES
    envs_per_worker: int = Field(default=1, ge=1, le=1024)
    budget: dict[str, Any] = Field(description="as a scenario's budget, every cell (e.g. {train_seconds: 3600})")
    seeds: tuple[int, ...] = (0,)
    published: tuple[Published, ...] = ()

    @field_validator("rows")
    @classmethod
    def _distinct_rows(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        twice = sorted({r for r in v if v.count(r) > 1})
        if twice:
            raise ValueError(f"{', '.join(twice)} listed twice; list each env once")
        return v

    @model_validator(mode="after")
    def _distinct_cells(self) -> TableSpec:
        names = [cell_name(self.name, row, col) for row in self.rows for col in self.columns]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(
                f"cells {', '.join(twice)} would share a name; give each column a distinct algorithm and workers"
            )
        return self

    def cell_raw(self, row: str, col: TableColumn) -> dict[str, Any]:
        """The scenario (as parsed YAML) of one cell."""
        return {
            "name": cell_name(self.name, row, col),
            "description": f"{self.name}: {row} x {col.algorithm}, {col.workers} workers",
            "env": {**self.env, "id": row},
            "algorithm": {"name": col.algorithm, "hyperparams": dict(col.hyperparams), "model": dict(self.model)},
            "engines": list(self.engines),
            "execution": {
                "workers": [col.workers],
                "envs_per_worker": self.envs_per_worker,
                "optimizer": col.optimizer,
            },
            "budget": dict(self.budget),
            "seeds": list(self.seeds),
            # a table compares scores, and no baseline of it is kept for `crossrl regress`
            "regress": {"final_return": False},
        }


def row_slug(env_id: str) -> str:
    """A row's short name in cell names: ``ALE/Breakout-v5`` -> ``breakout``."""
    name = env_id.rpartition(":")[2].rpartition("/")[2]
    name = re.sub(r"-v\d+$", "", name)
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "env"


def cell_name(table: str, row: str, col: TableColumn) -> str:
    return f"{table}.{row_slug(row)}.{col.algorithm}-w{col.workers}"


def tables_dir() -> Path:
    return builtin_dir() / "tables"


def builtin_tables() -> dict[str, Path]:
    """Built-in tables by name."""
    return {p.stem: p for p in sorted(tables_dir().glob("*.yaml"))}


def is_table(name_or_path: str) -> bool:
    """Whether a name or path is a table spec (a built-in table's name, or a YAML file whose ``kind`` is table)."""
    if name_or_path in builtin_tables():
        return True
    path = Path(name_or_path)
    try:
        if path.suffix in (".yaml", ".yml") and path.is_file():
            raw = read_yaml(path, spec_label(path))
            return isinstance(raw, dict) and raw.get("kind") == "table"
    except (OSError, SpecError):
        return False
    return False


def read_table(name_or_path: str, *, overrides: Mapping[str, Any] | None = None) -> tuple[TableSpec, Path]:
    """A table spec (a built-in table's name or a YAML path) parsed and validated, and its path; ``overrides`` as
    :func:`load_table` takes them. Its cells are not validated (:func:`load_table` does it)."""
    tables = builtin_tables()
    path = tables[name_or_path] if name_or_path in tables else Path(name_or_path)
    label = spec_label(path)
    if not path.is_file():
        raise SpecError([f"{label}: no such table (built-in tables: {', '.join(tables) or 'none'})"])
    raw = read_yaml(path, label)
    if not isinstance(raw, dict) or raw.get("kind") != "table":
        raise SpecError([f"{label}: not a table spec (a table's YAML says `kind: table`)"])
    raw = {k: v for k, v in raw.items() if k != "kind"}
    overrides = dict(overrides or {})
    if "engines" in overrides:
        raw["engines"] = overrides.pop("engines")
    if "seeds" in overrides:
        raw["seeds"] = overrides.pop("seeds")
    if "workers" in overrides:
        workers = overrides.pop("workers")
        raw["columns"] = [{**c, "workers": workers} if isinstance(c, dict) else c for c in raw.get("columns") or []]
    budget = dict(raw.get("budget") or {})
    for key in ("train_seconds", "env_steps"):
        if key in overrides:
            budget[key] = overrides.pop(key)
            if key == "train_seconds":
                budget.pop("wall_seconds", None)  # the default guard follows the new training time
    raw["budget"] = budget
    if overrides:
        raise ValueError(f"load_table: unknown overrides {sorted(overrides)}")
    try:
        return TableSpec.model_validate(raw), path
    except ValidationError as e:
        raise SpecError(validation_problems(e, label, TableSpec)) from None


def load_table(
    name_or_path: str,
    *,
    rows: Collection[str] | None = None,
    overrides: Mapping[str, Any] | None = None,
    engines: Collection[str] = ENGINES,
) -> tuple[TableSpec, list[ScenarioSpec]]:
    """A table and its cells, every cell validated as a scenario (problems name the table file and the cell).

    ``rows``: run only these env ids (each must be one of the table's). ``overrides``: ``engines``, ``workers``
    (every column's), ``seeds``, ``train_seconds``, ``env_steps``, as `crossrl table run` flags set them.
    """
    table, path = read_table(name_or_path, overrides=overrides)
    label = spec_label(path)
    if rows:
        unknown = [r for r in rows if r not in table.rows]
        if unknown:
            raise SpecError(
                [f"{label}: rows {', '.join(unknown)} are not in the table (its rows: {', '.join(table.rows)})"]
            )
        table = table.model_copy(update={"rows": tuple(r for r in table.rows if r in rows)})
    cells: list[ScenarioSpec] = []
    problems: list[str] = []
    for row in table.rows:
        for col in table.columns:
            cell = cell_name(table.name, row, col)
            try:
                cells.append(validate(table.cell_raw(row, col), label=f"{label} (cell {cell})", engines=engines))
            except SpecError as e:
                problems.extend(e.problems)
    if problems:
        raise SpecError(problems)
    return table, cells
