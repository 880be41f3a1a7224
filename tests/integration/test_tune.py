"""`crossrl tune` end to end on the real engines and Ray Tune: each engine's search recorded in the store as a parent
run of kind `search` with a child per configuration; then the chosen configuration and the spec's own setting on the
test seeds, as parent runs of kind `tuned` the scenario's own report leaves out. Population Based Training on every
engine: a member copies another's checkpoint, and the lineage (who copied whom, at which env step, with which values)
is in the store."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from crossrl.orchestration.tuning import LINEAGE_ARTIFACT, SEARCH_KIND, TUNED_KIND
from crossrl.reports.store import ResultsStore

CLI = [sys.executable, "-m", "crossrl.cli"]


ENGINES = ["crossrl", "rllib", "torchrl"]


def _spec(tmp_path: Path, name: str, engines: list[str], search: dict[str, Any]) -> Path:
    spec = {
        "name": name,
        "env": {"id": "CartPole-v1"},
        "algorithm": {"name": "ppo", "hyperparams": {"train_batch": 250, "minibatch": 125, "epochs": 1}},
        "engines": engines,
        "execution": {"workers": [1], "envs_per_worker": 2},
        "budget": {"env_steps": 500, "wall_seconds": 300},
        "search": {"space": {"lr": {"loguniform": [1e-4, 3e-3]}}, "tuning_seeds": [7], "test_seeds": [0], **search},
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def _runs(store: ResultsStore, scenario: str, kind: str) -> list[Any]:
    exp = store.experiment_id(scenario, create=False)
    return list(store.client.search_runs([exp], filter_string=f"tags.`crossrl.kind` = '{kind}'"))


@pytest.mark.integration
def test_tune_without_a_search_section_is_one_line(results_dir: Path) -> None:
    out = subprocess.run(
        [*CLI, "tune", "smoke", "--results-dir", str(results_dir)], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "no search section" in lines[0], lines


def _tune(spec: Path, results_dir: Path, *flags: str) -> str:
    """`crossrl tune SPEC` to its end. A search on every engine takes 4-6 minutes on two idle cores and up to 15 on a
    loaded CI host (each engine's trials start their own processes, TorchRL's a Ray collector, and PBT restarts
    every member at its decision step), so the limit is 25 minutes; past it the test fails with what the command
    printed, which names the engine and trial it was on."""
    try:
        out = subprocess.run(
            [*CLI, "tune", str(spec), "--results-dir", str(results_dir), *flags],
            capture_output=True,
            text=True,
            timeout=1500,
        )
    except subprocess.TimeoutExpired as e:
        printed = [
            (s or b"").decode(errors="replace") if isinstance(s, bytes) else (s or "") for s in (e.stdout, e.stderr)
        ]
        pytest.fail(f"crossrl tune ran past 1,500 s; it printed:\n{printed[0][-3000:]}\n{printed[1][-3000:]}")
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "Traceback" not in out.stderr
    return out.stdout


def _searches(store: ResultsStore, scenario: str) -> dict[str, Any]:
    searches = {r.data.tags["search.engine"]: r for r in _runs(store, scenario, SEARCH_KIND)}
    assert sorted(searches) == ENGINES
    return searches


# make test: one tiny ASHA search (it draws its configurations as a random search does, so it checks those too) and one
# tiny PBT search, each on every engine (one `crossrl tune`: the engines' searches run one after another on one local
# cluster); a random search end to end is `make test-system`'s (stopped by SIGTERM and resumed, below). Measured on an
# idle machine: docs/tuning.md.
@pytest.mark.timeout(1800)  # `_tune`'s own limit (1,500 s) ends it first, with what it printed
@pytest.mark.integration
@pytest.mark.system
@pytest.mark.long(7)
def test_asha_searches_then_the_best_configuration_and_the_own_setting_run_on_the_test_seeds(
    results_dir: Path, tmp_path: Path
) -> None:
    search_section = {"scheduler": "asha", "configurations": 2, "env_steps": 1000, "asha": {"grace_env_steps": 250}}
    spec = _spec(tmp_path, "tune-asha", ENGINES, search_section)
    stdout = _tune(spec, results_dir)
    assert "on the test seeds 0" in stdout
    store = ResultsStore(None, results_dir=results_dir)
    tuned_runs = _runs(store, "tune-asha", TUNED_KIND)
    [shared] = [r for r in tuned_runs if r.data.tags["tuned.role"] == "shared"]  # the spec's own setting, every engine
    own = {r.data.tags["engine"]: r for r in store.children(shared)}
    tuned = {r.data.tags["tuned.searches"]: r for r in tuned_runs if r.data.tags["tuned.role"] == "tuned"}
    report = (results_dir / "reports" / "tune-asha" / "tuned.md").read_text()  # written at the end
    assert "Sensitivity" in report
    drawn = {}
    for engine, search in _searches(store, "tune-asha").items():
        assert f"{engine}: asha search, 2 configurations" in stdout
        assert search.data.tags["status"] == "FINISHED" and search.data.tags["search.scheduler"] == "asha"
        configs = store.children(search)
        assert sorted(r.data.tags["search.config"] for r in configs) == ["0", "1"]
        assert {r.data.tags["status"] for r in configs} == {"FINISHED"}
        assert all(r.data.tags["seed"] == "7" and "env_steps_sampled" in r.data.metrics for r in configs)
        drawn[engine] = sorted(float(r.data.params["hp.lr"]) for r in configs)
        assert float(search.data.tags["search.setup_s_median"]) > 0  # each trial's set-up is measured
        best = json.loads(search.data.tags["search.best_config"])
        chosen = next(r for r in configs if r.info.run_id == search.data.tags["search.best_run"])
        assert float(chosen.data.params["hp.lr"]) == pytest.approx(best["lr"])

        [trial] = store.children(tuned[search.info.run_id])  # its best configuration on the test seed
        assert trial.data.tags["engine"] == engine and trial.data.tags["seed"] == "0"
        assert trial.data.tags["status"] == "FINISHED"
        assert float(trial.data.params["hp.lr"]) == pytest.approx(best["lr"])
        assert own[engine].data.tags["seed"] == "0" and own[engine].data.tags["status"] == "FINISHED"
        assert float(own[engine].data.params["hp.lr"]) == pytest.approx(3e-4)  # PPO's default: the spec's own setting
        assert f"| {engine} | " in report and f"lr={best['lr']:.3g}" in report
    assert drawn["crossrl"] == drawn["rllib"] == drawn["torchrl"] and len(set(drawn["crossrl"])) == 2  # the same draws
    assert store.parent_runs("tune-asha") == []  # `crossrl report` and `--resume latest` see none of these


@pytest.mark.timeout(1800)  # `_tune`'s own limit (1,500 s) ends it first, with what it printed
@pytest.mark.integration
@pytest.mark.system
@pytest.mark.long(6)
def test_pbt_members_copy_each_other_and_the_lineage_is_stored(results_dir: Path, tmp_path: Path) -> None:
    search_section = {
        "scheduler": "pbt",
        "configurations": 2,
        "env_steps": 1000,
        "pbt": {"interval_env_steps": 500, "quantile": 0.5},
    }
    spec = _spec(tmp_path, "tune-pbt", ENGINES, search_section)
    _tune(spec, results_dir, "--no-test")
    store = ResultsStore(None, results_dir=results_dir)
    for engine, search in _searches(store, "tune-pbt").items():
        members = {r.info.run_name: r for r in store.children(search)}
        assert len(members) == 2 and {r.data.tags["status"] for r in members.values()} == {"FINISHED"}, engine
        # With two members and quantile 0.5, at the synchronous step (500; 1,000 ends the budget) the worse copies
        # the better.
        lineage = json.loads(store.artifact_bytes(search.info.run_id, LINEAGE_ARTIFACT))
        assert len(lineage) == 1, (engine, lineage)
        for entry in lineage:
            assert {entry["member"], entry["copied"]} == set(members) and entry["env_step"] >= 500
            assert set(entry["values"]) == {"lr"} and 1e-4 <= entry["values"]["lr"] <= 3e-3
            run = members[entry["member"]]
            assert int(run.data.tags["pbt.exploits"]) == 1 and "pbt.exploit.1" in run.data.tags
            assert json.loads(run.data.tags["search.final_values"]) == entry["values"]  # it ended with these
            # its engine's config after the copy, with the copied lr: an artifact of its own (MLflow params cannot
            # change their values)
            after = _restarted_configs(store, run)
            assert after, engine
            native = json.loads(store.artifact_bytes(run.info.run_id, after[-1]))
            assert any(math.isclose(v, entry["values"]["lr"]) for v in _numbers(native)), (engine, native)
        for run in members.values():  # one continuous curve per member, to its whole budget
            steps = [m.step for m in store.client.get_metric_history(run.info.run_id, "env_steps_sampled")]
            assert steps == sorted(steps) and steps[-1] >= 1000
            # the store refused no write (a param changing its value would be)
            assert not [k for k in run.data.tags if k.startswith("store_warning")], (engine, run.data.tags)
    # --no-test still writes the searches' report: cost, sensitivity and the population's curves
    folder = results_dir / "reports" / "tune-pbt"
    report = (folder / "tuned.md").read_text()
    assert "no test-seed runs" in report and "| torchrl | pbt |" in report and "(tuned-pbt.svg)" in report
    svg = (folder / "tuned-pbt.svg").read_text()
    assert all(engine in svg for engine in ENGINES) and "&lt;- c0" in svg  # a panel per engine, the exploit marked


def _restarted_configs(store: ResultsStore, run: Any) -> list[str]:
    """The native configs a run's later starts logged (those that differ from the start before), in env-step order."""
    names = [a.path for a in store.client.list_artifacts(run.info.run_id) if a.path.startswith("native_config.from-")]
    return sorted(names, key=lambda name: int(name.split("-")[1].split(".")[0]))


def _numbers(tree: Any) -> list[float]:
    """Every number in a JSON tree."""
    if isinstance(tree, dict):
        return [x for v in tree.values() for x in _numbers(v)]
    if isinstance(tree, list):
        return [x for v in tree for x in _numbers(v)]
    return [float(tree)] if isinstance(tree, (int, float)) and not isinstance(tree, bool) else []


def _sigterm_once(cmd: list[str], results_dir: Path, written: str) -> None:
    """Runs ``cmd`` until a file matching ``written`` (a glob under the results folder) appears, then SIGTERMs it: it
    must end with 143."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 600
    while not list(results_dir.glob(written)):
        assert proc.poll() is None and time.monotonic() < deadline, f"{cmd[3]} ended before it wrote {written}"
        time.sleep(0.5)
    os.kill(proc.pid, signal.SIGTERM)
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 143, out[-2000:] + err[-2000:]


@pytest.mark.system
def test_a_search_stopped_by_sigterm_is_resumed_and_completed(results_dir: Path, tmp_path: Path) -> None:
    """SIGTERM while a configuration trains: that trial KILLED (nothing left RUNNING), exit 143; `--resume` keeps the
    configuration that had ended, runs the killed one again (from its checkpoint when the checkpoint's point had
    reached the store) and completes the search under the same parent run."""
    # 10,000 env steps: crossrl's core trains 2,500 in about a second on an idle machine, so a smaller budget could
    # end before the SIGTERM lands
    spec = _spec(tmp_path, "tune-resume", ["crossrl"], {"scheduler": "random", "configurations": 2, "env_steps": 10000})
    raw = yaml.safe_load(spec.read_text())
    raw["checkpoint"] = {"every_env_steps": 500, "keep": 3}
    spec.write_text(yaml.safe_dump(raw))
    cmd = [*CLI, "tune", str(spec), "--no-test", "--results-dir", str(results_dir)]
    second = "crossrl-ppo-w1-s7-c01"
    _sigterm_once(cmd, results_dir, f"checkpoints/tune-resume/search-*/{second}/ckpt-*")
    store = ResultsStore(None, results_dir=results_dir)
    [search] = _runs(store, "tune-resume", SEARCH_KIND)
    assert search.data.tags["status"] == "KILLED"
    statuses = {r.info.run_name: r.data.tags["status"] for r in store.children(search)}
    assert statuses == {"crossrl-ppo-w1-s7-c00": "FINISHED", second: "KILLED"}, statuses
    killed = next(r.info.run_id for r in store.children(search) if r.info.run_name == second)

    again = subprocess.run([*cmd, "--resume"], capture_output=True, text=True, timeout=900)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    [search] = _runs(store, "tune-resume", SEARCH_KIND)  # the same search, taken up: not a new one
    assert search.data.tags["status"] == "FINISHED" and search.data.tags["resumes"] == "1"
    runs = store.children(search)
    assert sorted(r.info.run_name for r in runs) == ["crossrl-ppo-w1-s7-c00", second]  # c00 did not run again
    [resumed] = [r for r in runs if r.info.run_name == second]
    assert resumed.data.tags["status"] == "FINISHED"
    if "resumed.from_run" in resumed.data.tags:  # its checkpoint's point had reached the store: the curve goes on
        assert resumed.data.tags["resumed.from_run"] == killed
        steps = [m.step for m in store.client.get_metric_history(resumed.info.run_id, "env_steps_sampled")]
        # <= at the end: the SIGTERM may land after the trial's final checkpoint and before its end was recorded
        assert steps[0] <= int(resumed.data.tags["resumed.env_step"]) <= steps[-1] and steps[-1] >= 10000
    assert len(store.children(search, superseded=True)) == 3  # the killed attempt is kept, marked superseded


@pytest.mark.system
def test_test_seed_runs_stopped_by_sigterm_are_taken_up_by_resume(results_dir: Path, tmp_path: Path) -> None:
    """SIGTERM while the own setting runs on its second test seed: `--resume` reads the finished search back, takes up
    that same test-seed run (its first trial kept, the second from its checkpoint) and then runs the tuned one."""
    spec = _spec(tmp_path, "tune-test-resume", ["crossrl"], {"scheduler": "random", "configurations": 1,
                                                             "env_steps": 500, "test_seeds": [0, 1]})  # fmt: skip
    raw = yaml.safe_load(spec.read_text())
    raw["budget"]["env_steps"] = 10000  # the test-seed runs' budget (the search's is 500)
    raw["checkpoint"] = {"every_env_steps": 500, "keep": 3}
    spec.write_text(yaml.safe_dump(raw))
    cmd = [*CLI, "tune", str(spec), "--results-dir", str(results_dir)]
    second = "crossrl-ppo-w1-s1"
    _sigterm_once(cmd, results_dir, f"checkpoints/tune-test-resume/2*/{second}/ckpt-*")
    store = ResultsStore(None, results_dir=results_dir)
    [shared] = _runs(store, "tune-test-resume", TUNED_KIND)
    assert shared.data.tags["tuned.role"] == "shared" and shared.data.tags["status"] == "KILLED"
    before = {r.info.run_name: (r.info.run_id, r.data.tags["status"]) for r in store.children(shared)}
    assert {name: status for name, (_, status) in before.items()} == {"crossrl-ppo-w1-s0": "FINISHED", second: "KILLED"}

    wide = {**os.environ, "COLUMNS": "300"}  # the summary table's rows on one line each
    again = subprocess.run([*cmd, "--resume"], capture_output=True, text=True, timeout=900, env=wide)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    # the summary's own setting and tuned columns count both test seeds, the one kept from before the SIGTERM too
    assert again.stdout.count("(n=2)") == 2, again.stdout[-3000:]
    [search] = _runs(store, "tune-test-resume", SEARCH_KIND)  # read back, not searched again
    assert "resumes" not in search.data.tags or search.data.tags["resumes"] == "0"
    tested = _runs(store, "tune-test-resume", TUNED_KIND)
    runs = {r.data.tags["tuned.role"]: r for r in tested}
    assert len(tested) == 2 and sorted(runs) == ["shared", "tuned"]  # the own-setting run taken up, not a second one
    assert runs["shared"].info.run_id == shared.info.run_id
    shared = runs["shared"]
    assert shared.data.tags["status"] == "FINISHED" and shared.data.tags["resumes"] == "1"
    after = {r.info.run_name: r for r in store.children(shared)}
    assert after["crossrl-ppo-w1-s0"].info.run_id == before["crossrl-ppo-w1-s0"][0]  # the finished trial kept
    assert after[second].data.tags["status"] == "FINISHED" and after[second].info.run_id != before[second][0]
    assert runs["tuned"].data.tags["status"] == "FINISHED"
