"""The local cluster crossrl starts: loopback only, and the RPC-inline object size it asks Ray for."""

from __future__ import annotations

import pytest
import ray

from crossrl.core import cluster

pytestmark = pytest.mark.usefixtures("ray_cluster")


def test_local_cluster_is_on_loopback_and_inlines_sampled_batches() -> None:
    facts = cluster.connect(None)  # already connected: returns the facts only
    assert facts["ray_gcs_address"].startswith("127.0.0.1:")
    config = ray._private.worker._global_node._config  # the system config the head was started with
    assert config["max_direct_call_object_size"] == cluster.LOCAL_RAY_SYSTEM_CONFIG["max_direct_call_object_size"]
    assert config["max_direct_call_object_size"] > 200_000  # a 1 x 8 envs x 500 steps batch (~190 KB) rides inline
