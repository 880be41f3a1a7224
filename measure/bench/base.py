"""What every sampling contestant shares: the :class:`Contestant` record, Ray start-up, and a pid probe.

The contestants themselves live in :mod:`.contestants` (raw, crossrl) and :mod:`.others` (RLlib,
TorchRL); both import from here and nothing imports back. Importing :mod:`crossrl.core.cluster`
(done here, before any contestant imports Ray) puts ``LOCAL_RAY_ENV`` in the environment, which Ray
reads when it is imported.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from crossrl.core import cluster


@dataclass
class Contestant:
    """One engine's sampler, set up: ``step() -> env steps sampled``; ``close()`` releases it.

    ``redraw()``, where an engine has it, replaces the processes that step the envs (the evaluator actors, the
    env runners) with fresh ones and keeps this process and its Ray: a new draw for the A/B gate
    (docs/performance.md, "The A/B gate") in about 4 s instead of a new measurement process's 7-10 s.
    """

    step: Callable[[], int]
    close: Callable[[], None]
    info: dict[str, Any] = field(default_factory=dict)
    worker_pids: Callable[[], list[int]] = list  # the processes that step the envs
    redraw: Callable[[], None] | None = None


def ray_up(workers: int) -> None:
    """A local Ray on 127.0.0.1 with a whole (logical) CPU per worker, even past the machine's cores.

    Latency-bound workers sleep most of the time, so 16 of them on 2 cores is the point of the
    scaling benchmark; telling Ray ``max(workers, cores)`` CPUs keeps every actor at ``num_cpus=1``
    (the engines' defaults) instead of per-engine fractional shares.
    """
    cluster.connect(None, num_cpus=max(workers, os.cpu_count() or 1))


def getpid(_: Any) -> int:
    """The calling process's pid; the argument (an evaluator, an env runner) is ignored.

    Sent to actors (``apply``, ``foreach_env_runner``) to find the processes that step the envs.
    """
    return os.getpid()
