"""A local Ray cluster on 127.0.0.1 for the modules that use it (``pytestmark = usefixtures("ray_cluster")``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import ray

from crossrl.core import cluster


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[None]:
    cluster.connect(None, num_cpus=2)
    yield
    ray.shutdown()
