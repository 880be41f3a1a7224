"""A fanned-out sweep's bookkeeping, alone: where each trial ran and which trials shared its node while it ran; a
checkpoint a host shipped, stored in the launcher's folder; a trial lost with its node queued again from its newest
good checkpoint."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from crossrl.adapters import checkpoints as C
from crossrl.orchestration.fanout import RunningTrial, Sweep
from crossrl.orchestration.trials import TrialResult
from crossrl.scenarios.spec import ScenarioSpec, Trial


def _running(name: str, node: str, started: float, ended: float | None) -> RunningTrial:
    trial: Any = type("T", (), {"name": name})()
    r = RunningTrial(trial=trial, rec=None, group=None, group_ready=None, queued_at=0.0)  # type: ignore[arg-type]
    r.node, r.started, r.ended = {"id": node, "host": f"host-{node}"}, started, ended
    return r


def test_a_trial_names_the_trials_that_shared_its_node_while_it_ran(tmp_path: Path) -> None:
    sweep = Sweep(
        store=None, parent_id="p", spec=None, placement="node", results=[], progress=lambda *_: None,  # type: ignore[arg-type]
        log_dir=tmp_path, attempts={}, carried={}, trials=[],
    )  # fmt: skip
    a = _running("a", "n1", 0.0, 10.0)
    b = _running("b", "n1", 5.0, None)  # still running: overlaps a
    c = _running("c", "n1", 10.0, 20.0)  # started as a ended: no overlap with a
    d = _running("d", "n2", 0.0, 30.0)  # another node
    sweep.history = [a, b, c, d]
    tags = sweep.placement_tags(a)
    assert tags["node.id"] == "n1" and tags["node.host"] == "host-n1" and tags["placement"] == "node"
    assert tags["node.shared_with"] == "b" and tags["node.shared"] == "true"
    assert sweep.placement_tags(c)["node.shared_with"] == "b"
    assert sweep.placement_tags(d)["node.shared"] == "false" and "placement.free_cpus" not in sweep.placement_tags(d)


def _trial(tmp_path: Path) -> Trial:
    spec = ScenarioSpec.model_validate(
        {"name": "t", "env": {"id": "CartPole-v1"}, "algorithm": {"name": "ppo"}, "budget": {"env_steps": 10000},
         "checkpoint": {"every_env_steps": 1000, "keep": 2}}
    )  # fmt: skip
    return spec.trials()[0].model_copy(update={"checkpoint_dir": str(tmp_path / "launcher" / "ck")})


def _checkpoint(root: Path, trial: Trial, step: int) -> Path:
    meta = {"trial": trial.name, "fingerprint": trial.fingerprint, "env_steps_sampled": step, "train_s": step / 100}
    folder, _ = C.write(root, step=step, save=lambda f: (f / "w.bin").write_bytes(b"w" * step) and None, meta=meta)
    return folder


class _Rec:
    def __init__(self, trial: Trial, points: list[int]) -> None:
        self.run_id = "lost-run"
        self.result = TrialResult(trial=trial, run_id="lost-run", status="KILLED")
        self.result.points = [(s, {"episode_return_mean": float(s)}) for s in points]
        self.messages: list[dict[str, Any]] = []

    def handle(self, msg: dict[str, Any]) -> None:
        self.messages.append(msg)


def _sweep(tmp_path: Path, trial: Trial, events: list[tuple[str, dict[str, Any]]]) -> Sweep:
    return Sweep(
        store=None, parent_id="p", spec=None, placement="node", results=[],  # type: ignore[arg-type]
        progress=lambda name, payload: events.append((name, payload)), log_dir=tmp_path, attempts={}, carried={},
        trials=[trial], max_retries=1,
    )  # fmt: skip


def test_a_shipped_checkpoint_is_stored_in_the_launchers_folder_and_a_damaged_one_is_a_warning(
    tmp_path: Path,
) -> None:
    trial = _trial(tmp_path)
    sweep = _sweep(tmp_path, trial, [])
    r = RunningTrial(trial=trial, rec=_Rec(trial, []), group=None, group_ready=None, queued_at=0.0)  # type: ignore[arg-type]
    on_node = tmp_path / "node" / "ck"
    for step in (1000, 2000, 3000):
        folder = _checkpoint(on_node, trial, step)
        msg = {"kind": "checkpoint", "path": str(folder), "env_step": step, "data": C.pack(folder), "pack_s": 0.01}
        got = sweep.received(r, msg)
        assert got["path"] == str(Path(trial.checkpoint_dir or "") / folder.name) and got["ship_s"] >= 0.01
        assert "data" not in got
    assert [f.name for f in C.checkpoints(Path(trial.checkpoint_dir or ""))] == [  # keep: 2, as on the node
        "ckpt-000000003000",
        "ckpt-000000002000",
    ]
    folder = _checkpoint(on_node, trial, 4000)
    whole = C.pack(folder)
    torn = whole[: len(whole) // 2]
    got = sweep.received(r, {"kind": "checkpoint", "path": str(folder), "env_step": 4000, "data": torn})
    assert got["path"] == "" and "checkpoint at env step 4000 not stored" in r.rec.messages[-1]["message"]  # type: ignore[attr-defined]
    assert sweep.received(r, {"kind": "checkpoint", "path": "", "env_step": 4000})["path"] == ""  # pruned on its node


def test_a_lost_trial_is_queued_first_from_its_newest_good_checkpoint_with_its_points_up_to_it(tmp_path: Path) -> None:
    trial = _trial(tmp_path)
    events: list[tuple[str, dict[str, Any]]] = []
    sweep = _sweep(tmp_path, trial, events)
    sweep.waiting.clear()
    other = trial.model_copy(update={"seed": 9})
    sweep.waiting.append(other)
    root = Path(trial.checkpoint_dir or "")
    _checkpoint(root, trial, 2000)
    newest = _checkpoint(root, trial, 3000)
    (newest / "engine" / "w.bin").write_bytes(b"torn")  # the newest does not check out: the one before is taken
    rec = _Rec(trial, [1000, 2000, 2500, 3000, 3500])
    sweep.retry(trial, rec, "node h (abc) was lost")  # type: ignore[arg-type]
    again = sweep.waiting[0]
    assert again.name == trial.name and again.resume_from == str(root / "ckpt-000000002000")
    assert sweep.waiting[1] is other  # the lost trial goes before the ones not started yet
    carried = sweep.carried[trial.name]
    assert carried.env_step == 2000 and carried.run == "lost-run" and [s for s, _ in carried.points] == [1000, 2000]
    assert sweep.attempts[trial.name] == ["lost-run"] and sweep.retries[trial.name] == 1
    kinds = [name for name, _ in events]
    assert kinds == ["warning", "retry"] and "cannot be used" in events[0][1]["message"]
    assert events[1][1] == {"trial": trial, "lost": "node h (abc) was lost", "attempt": 2, "of": 2, "env_step": 2000}
    # no good checkpoint at all: from the start, nothing carried
    for folder in C.checkpoints(root):
        (folder / "crossrl.json").unlink()
    sweep.retry(trial, rec, "node h (abc) was lost")  # type: ignore[arg-type]
    assert sweep.waiting[0].resume_from is None and trial.name not in sweep.carried


def test_the_keeper_stores_what_search_trials_ship_and_hands_back_the_planned_one_once(tmp_path: Path) -> None:
    """A search's trials (run by Ray Tune's actors) ship their checkpoints to a keeper on the launcher's node."""
    from crossrl.orchestration.fanout import CheckpointKeeper

    trial = _trial(tmp_path)
    keeper = CheckpointKeeper()
    root = str(tmp_path / "launcher" / "ck")
    stored = [
        keeper.store(root, f.name, C.pack(f), 2) for f in (_checkpoint(tmp_path / "node", trial, s) for s in (1, 2, 3))
    ]
    assert [Path(p).name for p in stored] == ["ckpt-000000000001", "ckpt-000000000002", "ckpt-000000000003"]
    assert [f.name for f in C.checkpoints(Path(root))] == ["ckpt-000000000003", "ckpt-000000000002"]  # keep: 2
    whole = C.pack(Path(stored[-1]))
    assert keeper.store(root, "ckpt-000000000004", whole[: len(whole) // 2], 2) == ""  # torn on the way: not stored
    assert keeper.planned(trial.name) is None  # nothing planned: the trial starts as Tune starts it
    keeper.plan(trial.name, stored[-1])
    name, data = keeper.planned(trial.name) or ("", b"")
    assert name == "ckpt-000000000003" and C.packed_meta(data)["env_steps_sampled"] == 3
    assert keeper.planned(trial.name) is None  # once


def test_spread_fans_out_at_parallel_one_and_its_tags_say_where_the_bundles_went() -> None:
    from crossrl.orchestration.fanout import spread_tags
    from crossrl.orchestration.runner import fans_out

    assert not fans_out(1, "node") and fans_out(2, "node") and fans_out(1, "spread")
    assert spread_tags({}) == {}
    tags = spread_tags({"bbbbbbbbbbbb": 8, "aaaaaaaaaaaa": 9})
    assert tags == {"placement.nodes": "2", "placement.bundles": "aaaaaaaa:9,bbbbbbbb:8"}


def test_an_unknown_placement_is_refused_before_anything_runs() -> None:
    import pytest

    from crossrl.orchestration.runner import plan_trials
    from crossrl.scenarios.loader import SpecError

    spec = ScenarioSpec.model_validate(
        {"name": "t", "env": {"id": "CartPole-v1"}, "algorithm": {"name": "ppo"}, "budget": {"env_steps": 1000}}
    )
    with pytest.raises(SpecError, match="--placement must be one of node, spread, got 'spraed'"):
        plan_trials(spec, ray_address=None, skip_unsupported=False, parallel=1, placement="spraed")
