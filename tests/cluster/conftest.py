"""The cluster tests share one two-node Ray cluster on loopback (tests/support/ray_nodes.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from ray_nodes import Cluster, two_nodes


@pytest.fixture(scope="session")
def ray_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with two_nodes(tmp_path_factory.mktemp("ray-nodes")) as cluster:
        yield cluster
