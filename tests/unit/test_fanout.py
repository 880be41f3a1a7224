"""A fanned-out sweep's bookkeeping, alone: where each trial ran and which trials shared its node while it ran."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from crossrl.orchestration.fanout import RunningTrial, Sweep


def _running(name: str, node: str, started: float, ended: float | None) -> RunningTrial:
    trial: Any = type("T", (), {"name": name})()
    r = RunningTrial(trial=trial, rec=None, group=None, group_ready=None, queued_at=0.0)  # type: ignore[arg-type]
    r.node, r.started, r.ended = {"id": node, "host": f"host-{node}"}, started, ended
    return r


def test_a_trial_names_the_trials_that_shared_its_node_while_it_ran(tmp_path: Path) -> None:
    sweep = Sweep(
        store=None, parent_id="p", spec=None, placement="node", results=[], progress=lambda *_: None,  # type: ignore[arg-type]
        log_dir=tmp_path, attempts={}, carried={}, total=4,
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
