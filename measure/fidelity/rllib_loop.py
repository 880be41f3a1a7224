"""RLlib's own loop: an ``AlgorithmConfig`` rebuilt from the native config crossrl's RLlib adapter stored for the same
trial, ``build_algo()`` and ``train()`` in a plain loop on the gymnasium env; nothing of crossrl's adapter.

What is taken from the stored config: every setting in which it differs from the algorithm's own defaults (RLlib's
``to_dict()`` of a fresh ``PPOConfig()`` / ``IMPALAConfig()`` / ``SACConfig()`` / ``DreamerV3Config()``): that is what crossrl chose, and nothing else is
changed. What is replaced: ``env`` (crossrl's registered creator: here the gymnasium id, made by RLlib itself),
``env_config`` (crossrl's env spec: empty) and the episode callbacks (crossrl's: here one that lists each finished
episode's return and length, so both sides are measured alike, and one that tells the stall watchdog an env
stepped; they change nothing RLlib trains on). A stored
setting that is an object RLlib cannot rebuild from JSON (a custom RLModule: pixel specs) is refused with its name.

SAC is RLlib's own SAC with the stored settings: crossrl's adapter replaces two things of it (``adapters/rllib/sac.py``),
which this loop leaves as RLlib ships them (``SAC_REPLACED``): the critics (RLlib's default multi-stream Q network
instead of an MLP on ``[observation, action]``) and the warm-up (RLlib's SAC acts with its untrained policy until
learning starts; the adapter acts uniformly at random, as crossrl's core, TorchRL and CleanRL do). So a SAC check
measures what those two choices change against RLlib as shipped, not a mapping error alone.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from typing import Any, ClassVar

from crossrl.adapters.base import MetricSink
from crossrl.measure.fidelity import beat, stored_config
from crossrl.scenarios.spec import Trial

RETURNS_KEY = "fidelity_episodes"
# crossrl's own objects in the stored config, replaced by the native loop's (module docstring)
REPLACED = frozenset({"env", "env_config", "callbacks_on_episode_end", "callbacks_on_episode_step"})
# SAC: the adapter's RLModule spec (its ConcatQCatalog critics) is left out too: RLlib's default module and catalog
SAC_REPLACED = REPLACED | {"_rl_module_spec"}


def _on_episode_end(*, episode: Any, prev_episode_chunks: Any = None, metrics_logger: Any = None, **_: Any) -> None:
    """A finished episode's return and length (its earlier chunks included), as RLlib's own return metric sums
    them, unreduced, so a point holds the episodes finished since the previous one."""
    chunks = [*(prev_episode_chunks or []), episode]
    ret = float(sum(c.get_return() for c in chunks))
    metrics_logger.log_value(RETURNS_KEY, (ret, int(sum(len(c) for c in chunks))), reduce="item_series")


def _on_episode_step(**_: Any) -> None:
    """Tell the trial's stall watchdog that an env stepped, from the env runner that stepped it (a file touch at
    most once a second). Beating once per ``train()`` is not enough: one iteration of RLlib's SAC (1,000
    env steps, an update after each, RLlib's default critics of ~10x the adapter's parameters) ran past the 120 s
    ``budget.stall_seconds`` on a loaded 2-core machine, and the trial was ended as stalled while it learned."""
    beat()


# an object's repr, alone or inside another's ("RLModuleSpec(catalog_class=<class '...'>, ...)")
_OBJECT = re.compile(r"<(class|function|bound method|built-in function) [^<>]*>|<[^<>]* object>")


def _plain(value: Any) -> Any:
    """JSON types, objects as their repr without the address (a function's repr differs between processes)."""
    return json.loads(re.sub(r" at 0x[0-9a-f]+", "", json.dumps(value, default=repr)))


def settings_from(
    stored: Mapping[str, Any], defaults: Mapping[str, Any], *, replaced: frozenset[str] = REPLACED
) -> dict[str, Any]:
    """The stored settings that differ from RLlib's defaults, minus crossrl's own objects (``replaced``)."""
    plain, stored = _plain(dict(defaults)), _plain(dict(stored))
    out: dict[str, Any] = {}
    for key, value in stored.items():
        if key in replaced or key not in plain or value == plain[key]:
            continue
        if isinstance(value, str) and _OBJECT.search(value):
            raise ValueError(
                f"rllib-native: the stored setting {key} is an object ({value[:80]}); it cannot be rebuilt"
            )
        out[key] = value
    return out


def native_config(
    algorithm: str, stored: Mapping[str, Any], env_id: str, env_kwargs: Mapping[str, Any]
) -> tuple[Any, dict[str, Any]]:
    """RLlib's config for its own loop: a fresh ``PPOConfig`` / ``IMPALAConfig`` / ``SACConfig`` / ``DreamerV3Config``
    with the stored
    settings (:func:`settings_from`), the gymnasium env by its id and this loop's two episode callbacks; and the
    settings taken."""
    from ray.rllib.algorithms.dreamerv3 import DreamerV3Config
    from ray.rllib.algorithms.impala import IMPALAConfig
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.rllib.algorithms.sac import SACConfig

    cls = {"ppo": PPOConfig, "impala": IMPALAConfig, "sac": SACConfig, "dreamer": DreamerV3Config}[algorithm]
    settings = settings_from(stored, cls().to_dict(), replaced=SAC_REPLACED if algorithm == "sac" else REPLACED)
    config = cls().update_from_dict(settings)
    config.environment(env=env_id, env_config=dict(env_kwargs)).callbacks(
        on_episode_end=_on_episode_end, on_episode_step=_on_episode_step
    )
    return config, settings


class RllibNativeLoop:
    """RLlib's own loop: build_algo() and train() on the stored config's settings."""

    engine: ClassVar[str] = "rllib-native"
    algorithms: ClassVar[dict[str, str]] = {
        "ppo": "PPOConfig from the stored native config; build_algo(); train() in a loop",
        "impala": "IMPALAConfig from the stored native config; build_algo(); train() in a loop",
        "sac": "SACConfig from the stored native config with RLlib's own critics and warm-up; build_algo(); train()",
        "dreamer": "DreamerV3Config from the stored native config; build_algo(); train() in a loop",
    }

    def run(self, trial: Trial, sink: MetricSink) -> None:
        if trial.env.multi_agent or trial.model.conv or trial.algorithm not in self.algorithms:
            raise ValueError(
                f"rllib-native runs {', '.join(self.algorithms)} on single-agent gymnasium envs with an MLP, "
                f"not {trial.algorithm} on {trial.env.id}"
            )
        import ray

        config, settings = native_config(trial.algorithm, stored_config(trial.seed), trial.env.id, trial.env.kwargs)
        ray.init(address="local", num_cpus=os.cpu_count() or 1, include_dashboard=False, log_to_driver=False)
        algo = None
        try:
            algo = config.build_algo()
            sink.start_clock()
            sink.tags(engine_version=ray.__version__, native_loop="rllib: build_algo() + train()")
            sink.native_config({"settings_from_stored_config": settings, "env": trial.env.id})
            while not sink.exhausted:
                result = algo.train()
                runners = result.get("env_runners", {})
                episodes = [(float(r), int(n)) for r, n in runners.get(RETURNS_KEY, [])]
                sink.point(
                    env_steps_sampled=int(runners.get("num_env_steps_sampled_lifetime", 0)),
                    env_steps_trained=None,
                    episode_returns=[r for r, _ in episodes],
                    episode_lengths=[n for _, n in episodes],
                )
                beat()
        finally:
            if algo is not None:
                algo.stop()
            ray.shutdown()
