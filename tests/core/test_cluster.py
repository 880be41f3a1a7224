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


@pytest.mark.parametrize(("hidden", "inline"), [((16, 16), True), ((256, 256), False)])
def test_small_weights_ride_in_the_sample_call_big_ones_go_through_one_put(
    hidden: tuple[int, int], inline: bool
) -> None:
    from crossrl.core import evaluator as E
    from crossrl.core.algorithms import load
    from crossrl.core.policy import PolicySpec
    from crossrl.scenarios.catalog import HYPERPARAM_DEFAULTS
    from crossrl.scenarios.spec import EnvSpec, ModelSpec

    alg = load("ppo")
    evs = E.EvaluatorSet(
        env_spec=EnvSpec(id="CartPole-v1"),
        num_envs=2,
        policy_factory=PolicySpec(
            policy_cls=alg.policy_cls,
            hyperparams=alg.hyperparams(HYPERPARAM_DEFAULTS["ppo"]),
            model=ModelSpec(hidden=hidden),
        ),
        num_remote=2,
        seed=0,
        transport="calls",  # on the stream, weights always travel as packed bytes in the grant
    )
    try:
        sent = evs.broadcast_weights(with_next_sample=True)
        nbytes = sum(v.nbytes for v in evs.local.get_weights().values())
        assert (nbytes <= E.INLINE_WEIGHTS_BYTES) == inline
        assert isinstance(sent, bytes) == inline and isinstance(sent, ray.ObjectRef) == (not inline)
        batches = evs.sample(num_steps=4)
        assert len(batches) == 2
        versions = ray.get([r.apply.remote(lambda ev: ev.weights_version) for r in evs.remotes])
        assert versions == [evs.weights_version] * 2
    finally:
        evs.stop()


def test_disconnect_frees_cycles_first_and_lets_no_thread_collect_while_ray_shuts_down(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A Ray ref held in a reference cycle (as an interrupted loop's traceback holds its frame's refs) is freed
    before Ray shuts down, and no other thread's allocation can start a collection during the shutdown: freeing
    a ref then calls into a stopped core worker, and Ray ends the process (exit 1)."""
    import gc
    import threading
    import weakref

    class Holder:
        pass

    held = Holder()
    held.self, held.ref = held, ray.put(1)  # type: ignore[attr-defined]
    alive = weakref.ref(held)
    del held
    seen: dict[str, object] = {}
    churned = threading.Event()

    def churn() -> None:  # allocates far past the collector's thresholds
        for _ in range(200):
            cycle = [Holder() for _ in range(100)]
            for h in cycle:
                h.self = h  # type: ignore[attr-defined]
        churned.set()

    def shutdown() -> None:
        seen["cycle freed"] = alive() is None
        seen["collecting"] = gc.isenabled()
        started: list[str] = []

        def note(phase: str, _info: dict[str, int]) -> None:
            if phase == "start":
                started.append(threading.current_thread().name)

        gc.callbacks.append(note)
        try:
            thread = threading.Thread(target=churn, name="churn")
            thread.start()
            thread.join()
        finally:
            gc.callbacks.remove(note)
        seen["collected meanwhile"] = "churn" in started

    monkeypatch.setattr(ray, "shutdown", shutdown)
    assert gc.isenabled()
    cluster.disconnect()
    assert churned.is_set()
    assert seen == {"cycle freed": True, "collecting": False, "collected meanwhile": False}
    assert gc.isenabled()  # back on afterwards


def test_a_trial_finds_the_actors_of_its_placement_group_without_a_dashboard() -> None:
    """The trial host's CPU and memory account reads its group's actors from the GCS actor table: the local cluster
    has no dashboard, and Ray's state API blocked about 40 s on each trial's first sample before it failed."""
    import os
    import time

    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    @ray.remote(num_cpus=0)
    class Probe:
        def pid(self) -> int:
            return os.getpid()

        def group_pids(self) -> tuple[list[int] | None, float]:
            started = time.perf_counter()
            pids = cluster.group_actor_pids()
            return pids, time.perf_counter() - started

    group = placement_group([{"CPU": 1}])
    ray.get(group.ready())
    try:
        strategy = PlacementGroupSchedulingStrategy(group, placement_group_capture_child_tasks=True)
        inside = [Probe.options(scheduling_strategy=strategy).remote() for _ in range(2)]  # type: ignore[attr-defined]
        outside = Probe.remote()  # type: ignore[attr-defined]
        pids = ray.get([a.pid.remote() for a in inside])
        found, took = ray.get(inside[0].group_pids.remote())
        assert sorted(found) == sorted(pids), (found, pids)
        assert ray.get(outside.pid.remote()) not in found
        assert took < 5.0
        assert ray.get(outside.group_pids.remote())[0] is None  # outside any group
        assert cluster.group_actor_pids() is None  # the driver
    finally:
        remove_placement_group(group)
