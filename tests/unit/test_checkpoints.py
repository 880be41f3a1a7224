"""Checkpoint folders: written whole or not at all, checked before they are trusted, pruned to the newest few; the
sink leaves the time spent writing them out of training time."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from crossrl.adapters import checkpoints as C
from crossrl.adapters.base import ListSink
from crossrl.scenarios.spec import CheckpointSpec, ScenarioSpec, Trial


def _save(payload: bytes = b"x" * 1000):
    def save(folder: Path) -> dict[str, str]:
        (folder / "state.bin").write_bytes(payload)
        (folder / "sub").mkdir()
        (folder / "sub" / "more.bin").write_bytes(payload[::-1])
        return {"holds": "test"}

    return save


META = {"trial": "t", "fingerprint": "f" * 16, "env_steps_sampled": 10, "env_steps_trained": 10, "iterations": 1}


def _write(root: Path, step: int, **meta: object) -> Path:
    folder, size = C.write(root, step=step, save=_save(), meta={**META, "env_steps_sampled": step, **meta})
    assert size > 2000
    return folder


def test_a_checkpoint_is_written_whole_and_read_back(tmp_path: Path) -> None:
    folder = _write(tmp_path, 1234)
    assert folder.name == "ckpt-000000001234"
    meta = C.read_meta(folder)
    assert meta["env_step"] == 1234 and meta["engine_state"] == {"holds": "test"}
    assert set(meta["files"]) == {"engine/state.bin", "engine/sub/more.bin", C.RNG_FILE}
    assert not list(tmp_path.glob(".tmp-*"))


def test_a_write_that_fails_leaves_nothing_and_a_stale_temporary_folder_is_removed(tmp_path: Path) -> None:
    (tmp_path / ".tmp-ckpt-000000000005-999").mkdir()  # a write killed half-way

    def broken(folder: Path) -> None:
        (folder / "half").write_bytes(b"1")
        raise OSError("No space left on device")

    with pytest.raises(OSError, match="No space"):
        C.write(tmp_path, step=7, save=broken, meta=META)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("damage", "says"),
    [
        (lambda f: (f / "engine" / "state.bin").write_bytes(b"x" * 10), "truncated"),
        (lambda f: (f / "engine" / "state.bin").write_bytes(b"y" * 1000), "sha256"),
        (lambda f: (f / "engine" / "sub" / "more.bin").unlink(), "missing"),
        (lambda f: (f / C.META).unlink(), "no crossrl.json"),
        (lambda f: (f / C.META).write_text("{"), "unreadable"),
    ],
)
def test_a_damaged_checkpoint_is_refused_with_what_is_wrong(tmp_path: Path, damage, says: str) -> None:
    folder = _write(tmp_path, 5)
    damage(folder)
    with pytest.raises(C.CheckpointError, match=says):
        C.read_meta(folder)


def test_the_newest_good_one_is_taken_a_damaged_newer_one_passed_over_with_one_line(tmp_path: Path) -> None:
    _write(tmp_path, 100, trial="t")
    newest = _write(tmp_path, 200, trial="t")
    (newest / "engine" / "state.bin").write_bytes(b"")
    lines: list[str] = []
    found = C.newest_good(tmp_path, fingerprint="f" * 16, trial="t", warn=lines.append)
    assert found is not None and found[0].name == "ckpt-000000000100"
    assert (
        len(lines) == 1
        and lines[0].startswith("checkpoint ckpt-000000000200 cannot be used")
        and "truncated" in lines[0]
    )
    assert C.newest_good(tmp_path / "none", fingerprint="f" * 16, trial="t") is None


def test_a_checkpoint_of_another_spec_is_refused(tmp_path: Path) -> None:
    _write(tmp_path, 100, trial="t")
    with pytest.raises(C.CheckpointMismatch, match="fingerprint"):
        C.newest_good(tmp_path, fingerprint="0" * 16, trial="t")


def test_prune_keeps_the_newest(tmp_path: Path) -> None:
    for step in (10, 20, 30, 40):
        _write(tmp_path, step)
    gone = C.prune(tmp_path, 2)
    assert [f.name for f in gone] == ["ckpt-000000000020", "ckpt-000000000010"]
    assert [f.name for f in C.checkpoints(tmp_path)] == ["ckpt-000000000040", "ckpt-000000000030"]


def _trial(tmp_path: Path, **checkpoint: object) -> Trial:
    spec = ScenarioSpec.model_validate(
        {
            "name": "t",
            "env": {"id": "CartPole-v1"},
            "algorithm": {"name": "ppo"},
            "budget": {"env_steps": 1000},
            "checkpoint": checkpoint,
        }
    )
    return spec.trials()[0].model_copy(update={"checkpoint_dir": str(tmp_path / "ck")})


def test_the_sink_writes_at_its_interval_and_leaves_the_writing_out_of_training_time(tmp_path: Path) -> None:
    sink = ListSink(_trial(tmp_path, every_env_steps=300, keep=2))
    sink.start_clock()

    def slow(folder: Path) -> None:
        (folder / "w").write_bytes(b"1")
        time.sleep(0.3)

    for step in range(100, 1001, 100):
        sink.point(env_steps_sampled=step, episode_returns=[1.0])
        sink.checkpoint_if_due(slow)
    sink.final_checkpoint(slow)
    written = [m for m in sink.messages if m["kind"] == "checkpoint"]
    assert [m["env_step"] for m in written] == [300, 600, 900, 1000]
    assert written[-1]["final"] and not written[0]["final"]
    assert all(m["write_s"] >= 0.3 for m in written)
    assert sink.points[-1]["wall_time_s"] < 0.3  # four writes of 0.3 s each, none counted as training
    assert [f.name for f in C.checkpoints(tmp_path / "ck")] == ["ckpt-000000001000", "ckpt-000000000900"]


def test_a_resumed_sink_continues_its_counters_and_training_time(tmp_path: Path) -> None:
    trial = _trial(tmp_path, every_seconds=None)
    first = ListSink(trial)
    first.start_clock()
    first.point(env_steps_sampled=400, env_steps_trained=380, episode_returns=[5.0, 7.0])
    time.sleep(0.2)
    folder = first.checkpoint(_save())
    assert folder is not None
    meta = json.loads((folder / C.META).read_text())
    assert meta["env_steps_sampled"] == 400 and meta["env_steps_trained"] == 380 and meta["episodes"] == 2
    second = ListSink(trial.model_copy(update={"resume_from": str(folder)}))
    resumed = second.resumed()
    assert resumed is not None and resumed.path == folder / "engine" and resumed.env_steps_sampled == 400
    second.start_clock()
    second.point(env_steps_sampled=500, episode_returns=[9.0])
    point = second.points[0]
    assert point["wall_time_s"] >= meta["train_s"] >= 0.2
    assert point["episodes_total"] == 3
    assert not second.exhausted
    second.point(env_steps_sampled=1000)
    assert second.exhausted


def test_one_interval_alone_or_both_whichever_passes_first() -> None:
    """A minute by default, so a trial of a few minutes has something to resume from; every_env_steps alone replaces
    it, and beside an every_seconds (as `crossrl init` writes one) both count."""
    assert CheckpointSpec().every_seconds == 60 and CheckpointSpec().every_env_steps is None
    assert CheckpointSpec.model_validate({"every_env_steps": 5000}).every_seconds is None
    both = CheckpointSpec.model_validate({"every_env_steps": 5000, "every_seconds": 60})
    assert (both.every_env_steps, both.every_seconds) == (5000, 60)


@pytest.mark.parametrize("algorithm", ["ppo", "dqn"])
def test_leaving_the_replay_buffer_out_is_for_sac_only(algorithm: str) -> None:
    """checkpoint.replay_buffer: false (sac's checkpoints without the buffer) on another algorithm names the field."""
    raw = {
        "name": "x",
        "env": {"id": "CartPole-v1"},
        "algorithm": {"name": algorithm},
        "engines": ["crossrl"],
        "budget": {"env_steps": 1000},
        "checkpoint": {"replay_buffer": False},
    }
    with pytest.raises(ValueError, match=rf"checkpoint.replay_buffer: false applies to sac only \({algorithm} keeps"):
        ScenarioSpec.model_validate(raw)
    assert ScenarioSpec.model_validate({**raw, "checkpoint": {}}).checkpoint.replay_buffer is True
    sac = {**raw, "env": {"id": "Pendulum-v1"}, "algorithm": {"name": "sac"}}
    assert ScenarioSpec.model_validate(sac).checkpoint.replay_buffer is False


def test_a_packed_checkpoint_unpacks_whole_elsewhere_and_a_damaged_one_leaves_nothing(tmp_path: Path) -> None:
    """What a fanned-out trial ships to the launcher (and the launcher back to the node that resumes it)."""
    folder = _write(tmp_path / "node", 4000)
    data = C.pack(folder)
    there = C.unpack(tmp_path / "launcher", folder.name, data)
    assert there == tmp_path / "launcher" / folder.name
    assert C.read_meta(there)["files"] == C.read_meta(folder)["files"]
    assert (there / "engine" / "sub" / "more.bin").read_bytes() == (folder / "engine" / "sub" / "more.bin").read_bytes()
    # a byte changed on the way: refused, nothing left behind (not even a temporary folder)
    bad = bytearray(data)
    bad[data.index(b"x" * 100) + 50] ^= 1
    with pytest.raises(C.CheckpointError, match="sha256"):
        C.unpack(tmp_path / "other", folder.name, bytes(bad))
    assert list((tmp_path / "other").iterdir()) == []
    with pytest.raises(C.CheckpointError, match="could not be unpacked"):
        C.unpack(tmp_path / "other", folder.name, data[: len(data) // 3])
    with pytest.raises(C.CheckpointError, match="not a checkpoint folder name"):
        C.unpack(tmp_path / "other", "../escape", data)
    assert list((tmp_path / "other").iterdir()) == []
