"""`crossrl init`'s commented spec (scenarios/template.py) and `crossrl runs`' listing (reports/runs.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from crossrl.adapters.registry import engine_ids
from crossrl.orchestration.runner import run_scenario
from crossrl.reports.api import make_report, run_report_dir
from crossrl.reports.runs import past_runs
from crossrl.reports.store import ResultsStore
from crossrl.scenarios.catalog import ALGORITHMS
from crossrl.scenarios.loader import validate
from crossrl.scenarios.template import spec_template


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_the_template_validates_as_written_and_shows_every_default(algorithm: str) -> None:
    text = spec_template(name="acrobot-try", env_id="Acrobot-v1", algorithm=algorithm)
    assert text.count("#") > 10  # commented
    raw = yaml.safe_load(text)
    spec = validate(raw, label="acrobot-try.yaml")
    assert spec.env.id == "Acrobot-v1" and spec.algorithm.name == algorithm
    assert raw["algorithm"]["hyperparams"] == spec.algorithm.resolved_hyperparams()  # every value that will run


def test_the_template_refuses_what_would_not_load() -> None:
    with pytest.raises(ValueError, match="algorithm 'ppo2'"):
        spec_template(name="x", env_id="CartPole-v1", algorithm="ppo2")
    with pytest.raises(ValueError, match="name 'my spec'"):
        spec_template(name="my spec", env_id="CartPole-v1")


def test_past_runs_lists_each_run_newest_first(fault_engine: Path, results_dir: Path) -> None:
    store = ResultsStore(None, results_dir=results_dir)
    assert past_runs(store).empty
    raw = {
        "name": "listing",
        "env": {"id": "CartPole-v1"},
        "algorithm": {"name": "ppo"},
        "engines": ["fault"],
        "budget": {"env_steps": 300, "wall_seconds": 60},
        "seeds": [0, 1],  # seed 1 raises: one FINISHED, one FAILED
    }
    spec = validate(raw, label="listing.yaml", engines=engine_ids())
    first = run_scenario(spec, store=store)
    second = run_scenario(spec.model_copy(update={"seeds": (0,)}), store=store)
    runs = past_runs(store)
    assert list(runs["parent run"]) == [second.parent_id, first.parent_id]
    assert list(runs["scenario"]) == ["listing", "listing"]
    assert runs.iloc[1]["trials"] == "1 FINISHED, 1 FAILED" and runs.iloc[0]["trials"] == "1 FINISHED"
    assert set(runs["status"]) == {"FINISHED"} and set(runs["report"]) == {"-"}  # no report rendered here
    assert past_runs(store, scenario="other").empty


def test_cli_init_then_validate_and_set_overrides(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from crossrl.cli import app

    cli = CliRunner()
    spec = tmp_path / "acrobot-try.yaml"
    out = cli.invoke(app, ["init", str(spec), "--env", "Acrobot-v1", "--algorithm", "a2c"])
    assert out.exit_code == 0 and spec.exists(), out.output
    assert cli.invoke(app, ["init", str(spec)]).exit_code == 2  # never overwrites without --force
    plain = cli.invoke(app, ["validate", str(spec)])
    assert plain.exit_code == 0 and ": ok, fingerprint " in plain.output, plain.output
    tuned = cli.invoke(app, ["validate", str(spec), "--set", "algorithm.hyperparams.lr=1e-3"])
    assert tuned.exit_code == 0, tuned.output
    fingerprint = {r.output.split("fingerprint ")[1].split(",")[0] for r in (plain, tuned)}
    assert len(fingerprint) == 2  # an override is part of the conditions
    bad = cli.invoke(app, ["validate", str(spec), "--set", "algorithm.hyperparams.lr=-1"])
    assert bad.exit_code == 2 and "algorithm.hyperparams.lr" in bad.output, bad.output
    shape = cli.invoke(app, ["validate", str(spec), "--set", "lr"])
    assert shape.exit_code == 2 and "give FIELD=VALUE" in shape.output, shape.output


def test_cli_runs_lists_past_runs(fault_engine: Path, results_dir: Path) -> None:
    from typer.testing import CliRunner

    from crossrl.cli import app

    cli = CliRunner()
    empty = cli.invoke(app, ["runs", "--results-dir", str(results_dir)])
    assert empty.exit_code == 2 and "no `crossrl run`" in empty.output
    raw = {
        "name": "listed",
        "env": {"id": "CartPole-v1"},
        "algorithm": {"name": "ppo"},
        "engines": ["fault"],
        "budget": {"env_steps": 300, "wall_seconds": 60},
        "seeds": [0],
    }
    outcome = run_scenario(
        validate(raw, label="listed.yaml", engines=engine_ids()), store=ResultsStore(None, results_dir=results_dir)
    )
    listed = cli.invoke(app, ["runs", "--results-dir", str(results_dir)], env={"COLUMNS": "250"})
    assert listed.exit_code == 0, listed.output
    assert "listed" in listed.output and outcome.parent_id in listed.output and "1 FINISHED" in listed.output
    assert "crossrl report --run PARENT_RUN" in listed.output  # run_scenario wrote no report: the hint says how
    store = ResultsStore(None, results_dir=results_dir)
    make_report(store, parent_id=outcome.parent_id, out_dir=run_report_dir(results_dir, "listed", outcome.parent_id))
    again = cli.invoke(app, ["runs", "--results-dir", str(results_dir)], env={"COLUMNS": "250"})
    assert again.exit_code == 0 and "report.html" in again.output, again.output
    assert "crossrl report --run" not in again.output  # every listed run has its report: no hint


def test_each_run_keeps_its_own_report_and_runs_shows_its_settings(fault_engine: Path, results_dir: Path,
                                                                  tmp_path: Path) -> None:  # fmt: skip
    """A run with an override and --no-report, then a plain run: each has its own report folder (the first once
    `crossrl report --run` renders it), the scenario's folder keeps the newest run's, and `crossrl runs` tells the
    override apart from the spec as written."""
    import yaml
    from typer.testing import CliRunner

    from crossrl.cli import app
    from crossrl.reports.runs import past_runs

    spec = tmp_path / "own.yaml"
    spec.write_text(yaml.safe_dump({
        "name": "own", "env": {"id": "CartPole-v1"}, "algorithm": {"name": "ppo"}, "engines": ["fault"],
        "budget": {"env_steps": 300, "wall_seconds": 60}, "seeds": [0],
    }))  # fmt: skip
    cli, where = CliRunner(), ["--results-dir", str(results_dir)]
    first = cli.invoke(app, ["run", str(spec), "--set", "algorithm.hyperparams.lr=0.001", "--no-report", *where])
    assert first.exit_code == 0, first.output
    second = cli.invoke(app, ["run", str(spec), *where])
    assert second.exit_code == 0, second.output
    store = ResultsStore(None, results_dir=results_dir)
    new, old = (str(r.info.run_id) for r in store.parent_runs("own"))
    folder = results_dir / "reports" / "own"
    assert (folder / new / "report.html").is_file() and not (folder / old).exists()
    assert (folder / "report.html").read_bytes() == (folder / new / "report.html").read_bytes()  # the newest's
    listed = cli.invoke(app, ["runs", *where], env={"COLUMNS": "400"})
    assert listed.exit_code == 0 and "algorithm.hyperparams.lr=0.001" in listed.output, listed.output
    rows = {r["parent run"]: r for r in past_runs(store, scenario="own").to_dict("records")}
    assert rows[old]["settings"] == "algorithm.hyperparams.lr=0.001" and rows[old]["report"] == "-"  # none yet
    assert rows[new]["settings"] == "the spec as written" and rows[new]["report"] == str(folder / new / "report.html")
    rendered = cli.invoke(app, ["report", "--run", old, *where])
    assert rendered.exit_code == 0, rendered.output
    assert (folder / old / "report.html").is_file()
    assert (folder / "report.html").read_bytes() == (folder / new / "report.html").read_bytes()  # still the newest's
