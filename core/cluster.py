"""Starting or joining a Ray cluster, always on loopback unless an address is given."""

from __future__ import annotations

import os
from typing import Any

# Ray picks the machine's network address for a local cluster; with this set to 0 it binds
# 127.0.0.1 (measured on Ray 2.60). Usage stats would phone home.
LOCAL_RAY_ENV = {
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_DEDUP_LOGS": "0",
}


# Objects up to this size travel inside the task's RPC (its arguments, its return value) instead of
# through the shared-memory object store. Ray's default is 100 KiB; a sampled batch of 8 envs x 500
# steps is ~190 KB, and returning it through the store cost ~0.7 ms more per call here
# (1 x 8 envs, fragment 500: 1.85 -> 1.13 ms from sample end to the driver holding it).
LOCAL_RAY_SYSTEM_CONFIG = {"max_direct_call_object_size": 1024 * 1024}


for _k, _v in LOCAL_RAY_ENV.items():  # Ray reads these when it is imported: set them before it is
    os.environ.setdefault(_k, _v)


def connect(address: str | None, *, num_cpus: int | None = None, **kwargs: Any) -> dict[str, str]:
    """Join the cluster at ``address`` or start a local one on 127.0.0.1 sized to this machine.

    Returns facts to tag the trial with (GCS address, node id), so a reader can tell which cluster
    ran it.
    """
    import ray

    if not ray.is_initialized():
        if address:
            # The env guard's watch folder (crossrl.core.envguard) for the workers of this job: a cluster started
            # elsewhere does not pass this process's environment on to them.
            from crossrl.core.envguard import WATCH_DIR_ENV

            watch = os.environ.get(WATCH_DIR_ENV)
            if watch and "runtime_env" not in kwargs:
                kwargs["runtime_env"] = {"env_vars": {WATCH_DIR_ENV: watch}}
            ray.init(address=address, log_to_driver=False, **kwargs)
        else:
            ray.init(
                # "local": always a new cluster; without it ray.init joins any `ray start` cluster on
                # this machine (found through /tmp/ray/ray_current_cluster).
                address="local",
                num_cpus=num_cpus or os.cpu_count() or 1,
                include_dashboard=False,
                log_to_driver=False,
                _node_ip_address="127.0.0.1",
                _system_config={**LOCAL_RAY_SYSTEM_CONFIG, **kwargs.pop("_system_config", {})},
                **kwargs,
            )
    ctx = ray.get_runtime_context()
    return {"ray_gcs_address": str(ctx.gcs_address), "ray_node_id": str(ctx.get_node_id())}


def disconnect() -> None:
    """``ray.shutdown()`` with no garbage collection in another thread while it runs.

    Ray handles caught in reference cycles (an interrupted loop's traceback holds its frame's object refs)
    are freed by whichever thread's allocation next triggers a collection. If that is another thread
    (the store's sender, a learner) while ``ray.shutdown()`` is between stopping the core worker and
    dropping it, freeing the ref calls into the stopped core worker and Ray ends the process with exit
    code 1 ("The core worker has already been shutdown"): 3 of 10 SIGTERM-stopped sweeps did before this.
    So the cycles are collected here first, while Ray is still connected, and automatic collection is
    off until Ray is down; a ref freed after that finds no core worker and is dropped quietly.
    """
    import gc

    import ray

    gc.collect()
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        ray.shutdown()
    finally:
        if was_enabled:
            gc.enable()


def group_free_cpus() -> float | None:
    """The CPUs still free in the placement group this process runs in (a trial of a sweep fanned out over a
    cluster: its workers must fit there), or None outside one."""
    import ray
    from ray.util import get_current_placement_group

    group = get_current_placement_group()
    if group is None:
        return None
    return float(ray.available_resources().get(f"CPU_group_{group.id.hex()}", 0.0))


def group_actor_pids() -> list[int] | None:
    """Process ids of the live actors on this node in the placement group this process runs in (the engine's
    workers a trial started inside its group), or None outside one.

    Read from the GCS actor table: Ray's state API (``ray.util.state.list_actors``) answers through the dashboard,
    and on a cluster started without one its first call blocks about 40 s before it fails."""
    import ray
    from ray._private.state import state
    from ray.core.generated import gcs_pb2
    from ray.util import get_current_placement_group

    group = get_current_placement_group()
    if group is None:
        return None
    node = ray.NodeID.from_hex(ray.get_runtime_context().get_node_id()).binary()
    rows = (
        gcs_pb2.ActorTableData.FromString(raw)  # type: ignore[attr-defined]
        for raw in state._connect_and_get_accessor().get_actor_table(None, "ALIVE")
    )
    return [
        int(r.pid) for r in rows if r.placement_group_id == group.id.binary() and r.address.node_id == node and r.pid
    ]


def available_cpus() -> int:
    """CPUs the trial's workers may ask for: its placement group's free CPUs in a sweep, else the cluster's."""
    import ray

    in_group = group_free_cpus()
    if in_group is not None:
        return max(1, int(in_group))
    return int(ray.cluster_resources().get("CPU", 1))


def free_cpus() -> float:
    """CPUs free now: in the trial's placement group when it has one, else in the whole cluster."""
    import ray

    in_group = group_free_cpus()
    return in_group if in_group is not None else float(ray.available_resources().get("CPU", 0.0))
