"""What an engine leaves of Ray behind it: a Ray it started is shut down; a Ray it joined stays up with every CPU
free again (its actors gone), as a user's cluster must after a trial."""

from __future__ import annotations

import time
from typing import Any


def cpus_free_again(*, timeout_s: float) -> bool:
    """Whether every CPU of the Ray this process is connected to is free within ``timeout_s``."""
    import ray

    deadline = time.monotonic() + timeout_s
    while ray.available_resources().get("CPU", 0.0) < ray.cluster_resources().get("CPU", 0.0):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def run_leaving_ray_as_found(adapter: Any, trial: Any, sink: Any) -> None:
    """``adapter.run(trial, sink)``, then check Ray is as it was before."""
    import ray

    was_up = ray.is_initialized()
    adapter.run(trial, sink)
    if not was_up:
        assert not ray.is_initialized(), "the adapter must shut down the Ray it started"
    else:
        assert ray.is_initialized(), "the adapter must leave up a Ray it joined"
        assert cpus_free_again(timeout_s=20.0), (
            f"the adapter left CPUs taken on the Ray it joined: {ray.available_resources()}"
        )
