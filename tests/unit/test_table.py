"""Table specs (scenarios/table.py): cells as ordinary scenarios, the CLI's overrides, and bad input."""

from __future__ import annotations

from pathlib import Path

import pytest

from crossrl.scenarios.loader import SpecError
from crossrl.scenarios.table import builtin_tables, cell_name, is_table, load_table, row_slug


def test_the_seed_table_has_the_seeds_shape() -> None:
    table, cells = load_table("atari-seed-table")
    assert table.rows == ("ALE/BeamRider-v5", "ALE/Breakout-v5", "ALE/Qbert-v5", "ALE/SpaceInvaders-v5")
    assert [(c.algorithm, c.workers) for c in table.columns] == [("impala", 32), ("a2c", 5), ("a3c", 16)]
    assert len(cells) == 12 and len({c.name for c in cells}) == 12
    for cell in cells:
        assert cell.budget.train_seconds == 3600 and cell.budget.env_steps is None
        assert cell.env.resolved_preprocessing == "atari" and cell.env.resolved_reward_clip
        assert cell.algorithm.model.conv == ((32, 8, 4), (64, 4, 2), (64, 3, 1))
    assert {p.label for p in table.published} >= {"RLlib IMPALA 32 workers (2018)", "RLlib A2C 5 workers (2018)"}


def test_the_machine_scale_run_overrides_rows_workers_and_time() -> None:
    table, cells = load_table(
        "atari-seed-table", rows=["ALE/Breakout-v5"], overrides={"workers": 2, "train_seconds": 900}
    )
    assert [c.name for c in cells] == [
        "atari-seed-table.breakout.impala-w2",
        "atari-seed-table.breakout.a2c-w2",
        "atari-seed-table.breakout.a3c-w2",
    ]
    for cell in cells:
        assert cell.execution.workers == (2,)
        assert cell.budget.train_seconds == 900 and cell.budget.wall_seconds == 1500  # the guard follows


def test_row_slugs_and_cell_names() -> None:
    assert row_slug("ALE/SpaceInvaders-v5") == "spaceinvaders"
    assert row_slug("MinAtar/Breakout-v1") == "breakout"
    assert row_slug("mod:Some_Env-v0") == "some-env"
    table, _ = load_table("atari-seed-table")
    assert cell_name("t", "ALE/Qbert-v5", table.columns[0]) == "t.qbert.impala-w32"


def _write(tmp_path: Path, text: str) -> str:
    f = tmp_path / "t.yaml"
    f.write_text(text)
    return str(f)


GOOD = """kind: table
name: t
rows: [MinAtar/Breakout-v1]
columns: [{algorithm: ppo, workers: 1}]
model: {conv: [[16, 3, 1]], hidden: [128], activation: relu}
budget: {train_seconds: 10}
"""


def test_a_table_file_is_recognised_by_its_kind(tmp_path: Path) -> None:
    assert is_table("atari-seed-table") and "atari-seed-table" in builtin_tables()
    assert is_table(_write(tmp_path, GOOD))
    assert not is_table("smoke") and not is_table(str(tmp_path / "missing.yaml"))


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (GOOD.replace("kind: table\n", ""), "t.yaml: not a table spec (a table's YAML says `kind: table`)"),
        (GOOD.replace("workers: 1", "workers: 0"), "t.yaml: columns.0.workers:"),
        (GOOD.replace("algorithm: ppo", "algorithm: ppo2"), "t.yaml: columns.0.algorithm: 'ppo2' is not one of"),
        (GOOD.replace("[MinAtar/Breakout-v1]", "[MinAtar/Breakout-v1, MinAtar/Breakout-v1]"), "listed twice"),
        (GOOD.replace("[[16, 3, 1]]", "[[16, 30, 1]]"), "(cell t.breakout.ppo-w1)"),
        (GOOD.replace("budget: {train_seconds: 10}", "budget: {}"), "give env_steps, train_seconds or both"),
    ],
)
def test_bad_tables_name_the_file_the_field_and_the_fix(tmp_path: Path, text: str, expected: str) -> None:
    with pytest.raises(SpecError) as e:
        load_table(_write(tmp_path, text))
    assert any(expected in line for line in e.value.problems), e.value.problems


def test_unknown_rows_are_refused_with_the_tables_rows(tmp_path: Path) -> None:
    with pytest.raises(SpecError) as e:
        load_table(_write(tmp_path, GOOD), rows=["MinAtar/Asterix-v1"])
    [line] = e.value.problems
    assert "rows MinAtar/Asterix-v1 are not in the table (its rows: MinAtar/Breakout-v1)" in line
