"""The journal: durable appends, idempotent sending, writes the store refuses, an unreachable store."""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

import pytest

from crossrl.reports import journal as J
from crossrl.reports.store import ResultsStore
from crossrl.scenarios.loader import validate


def _spec():  # type: ignore[no-untyped-def]
    return validate(
        {
            "name": "journal-test",
            "env": {"id": "CartPole-v1"},
            "algorithm": {"name": "ppo"},
            "engines": ["crossrl"],
            "budget": {"env_steps": 1000},
            "seeds": [0],
        },
        label="journal.yaml",
    )


POINTS = [(100 * i, {"episode_return_mean": float(i), "wall_time_s": 0.1 * i}) for i in range(1, 41)]


def _journaled_run(store: ResultsStore) -> tuple[str, str]:
    """A parent and one trial with 40 points, a text artifact, ended: every write through the journal."""
    spec = _spec()
    parent = store.start_parent(spec, spec_path=None, command="crossrl run journal-test")
    trial = store.start_trial(parent, spec.trials()[0], spec=spec)
    for i in range(0, len(POINTS), 10):
        store.log_points(trial, POINTS[i : i + 10])
    store.log_text(trial, "hello", "notes/hello.txt")
    store.finish_trial(trial, status="FINISHED", summary={"final_return_mean": 40.0}, history=POINTS, last_step=4000)
    store.finish_parent(parent, status="FINISHED", counts={"FINISHED": 1})
    return parent, trial


def _copy_journal(journal: J.Journal, dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copy(journal.path, dest / journal.path.name)
    shutil.copytree(journal.files, dest / journal.files.name)


def _trial_runs(store: ResultsStore) -> list:  # type: ignore[type-arg]
    exp = store.experiment_id("journal-test", create=False)
    return store.client.search_runs([exp], filter_string="tags.`crossrl.kind` = 'trial'")


def test_a_cut_line_is_ignored_and_a_failed_append_is_cut_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    journal = J.Journal.create(tmp_path)
    for i in range(3):
        journal.append({"op": "batch", "run": "@1", "tags": {"i": str(i)}})
    before = journal.path.read_bytes()
    real_write = os.write

    def disk_full(fd: int, data: bytes) -> int:  # half the line reaches the disk, then it is full
        real_write(fd, data[: len(data) // 2])
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(J.os, "write", disk_full)
    with pytest.raises(J.JournalError, match=r"cannot write the journal .*\.jsonl: No space left on device"):
        journal.append({"op": "batch", "run": "@1", "tags": {"i": "3"}})
    monkeypatch.undo()
    assert journal.path.read_bytes() == before  # cut back to its last whole line
    assert [r["seq"] for r in journal.records()] == [1, 2, 3]
    with open(journal.path, "ab") as f:  # a crash mid-line (power loss): the cut line is not a write
        f.write(b'{"seq":4,"op":"ba')
    assert [r["seq"] for r in journal.records()] == [1, 2, 3]


def test_sending_a_journal_twice_stores_every_write_once(results_dir: Path, tmp_path: Path) -> None:
    store = ResultsStore(None, results_dir=results_dir)
    journal = store.start_journal()
    parent_ref, trial_ref = _journaled_run(store)
    _copy_journal(journal, tmp_path / "copy")  # what a run that died before its acks reached the disk leaves
    assert store.end_journal(wait_s=60) == 0
    assert not journal.path.exists()  # the store has it whole: the journal is gone
    trial_id = store.resolve(trial_ref)
    assert trial_id != trial_ref and store.resolve(parent_ref) != parent_ref

    # the same journal again, with nothing acknowledged, then again with half of it acknowledged
    for through in (0, len(J.Journal(tmp_path / "copy" / journal.path.name).records()) // 2):
        shutil.copytree(tmp_path / "copy", journal.path.parent, dirs_exist_ok=True)
        if through:
            journal.mark({"through": through})
        sent, pending = J.sync(lambda _uri: store, results_dir, wait_s=60)
        assert pending == 0 and sent > 0 and not journal.path.exists()
        runs = _trial_runs(store)
        assert [r.info.run_id for r in runs] == [trial_id]  # found by its journal key, not created again
        history = store.client.get_metric_history(trial_id, "episode_return_mean")
        assert sorted(m.step for m in history) == [s for s, _ in POINTS]  # each point once, none skipped
    run = store.client.get_run(trial_id)
    assert run.info.status == "FINISHED" and run.data.tags["status"] == "FINISHED"
    assert run.data.tags[J.KEY_TAG] == f"{journal.id}/{trial_ref}"
    assert run.data.tags["mlflow.parentRunId"] == store.resolve(parent_ref)
    assert Path(store.client.download_artifacts(trial_id, "notes/hello.txt")).read_text() == "hello"


def test_a_write_the_store_refuses_is_tagged_and_the_rest_go_on(results_dir: Path) -> None:
    store = ResultsStore(None, results_dir=results_dir)
    warnings: list[str] = []
    store.start_journal(warn=warnings.append)
    spec = _spec()
    parent = store.start_parent(spec, spec_path=None)
    trial = store.start_trial(parent, spec.trials()[0], spec=spec)
    store.set_tags(trial, {"engine_version": "1"})
    store.log_native_config(trial, {"lr": 0.1})
    store.log_native_config(trial, {"lr": 0.2})  # MLflow never lets a param change its value
    store.log_points(trial, POINTS[:5])
    assert store.end_journal(wait_s=60) == 0
    run = store.client.get_run(store.resolve(trial))
    assert run.data.params["native.lr"] == "0.1"
    assert "native.lr" in run.data.tags["store_warning.native config"]
    assert len(store.client.get_metric_history(run.info.run_id, "wall_time_s")) == 5  # later writes went on
    assert len(warnings) == 1 and "refused a write (native config)" in warnings[0]


def test_writes_never_wait_for_an_unreachable_store_and_sync_sends_them_later(
    results_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mlflow_server import free_port

    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    down = ResultsStore(f"http://127.0.0.1:{free_port()}", results_dir=results_dir)  # nothing listens there
    journal = down.start_journal()
    _journaled_run(down)  # every call returns: the writes are on disk, the sender keeps trying
    unsent = down.end_journal(wait_s=1.0)
    assert unsent == journal.seq - 1 and journal.path.exists()  # all but its header
    assert down.sender is not None and down.sender.failures >= 1 and "connection refused" in down.sender.last_error
    assert down.sender.join(30)  # told to stop: it lets the journal go
    assert J.pending_journals(results_dir)[0].path == journal.path
    reachable = ResultsStore(None, results_dir=results_dir)  # the same writes, sent to a store that answers
    sent, pending = J.sync(lambda _uri: reachable, results_dir, wait_s=60)
    assert (sent, pending) == (unsent, 0) and not journal.path.exists()
    [run] = _trial_runs(reachable)
    assert len(reachable.client.get_metric_history(run.info.run_id, "episode_return_mean")) == len(POINTS)
