"""Fidelity: each engine's own minimal training loop, outside crossrl's adapters, to check that an adapter learns
as the engine does when driven by its own loop (`crossrl fidelity`).

The loops (``rllib_loop``, ``torchrl_loop``) take the settings crossrl's adapter stored for the same trial (its
native config) and run them the way the engine's own examples do: RLlib's ``build_algo()`` / ``train()`` loop on
the gymnasium env, TorchRL's PPO reference loop. They run as extra engines (``rllib-native``, ``torchrl-native``)
through crossrl's runner, which only hosts and measures them: the same trial process, budget, watchdog and
:class:`~crossrl.adapters.base.MetricSink`, so both sides are measured by one rule. ``compare`` runs both sides on
the same seeds and compares them.
"""

from __future__ import annotations

import os
from pathlib import Path

CONFIGS_ENV = "CROSSRL_NATIVE_CONFIGS"
"""The folder where `crossrl fidelity` puts the adapter's stored native config of each seed, as ``<seed>.json``."""

LOOPS: dict[str, str] = {
    "rllib": "crossrl.measure.fidelity.rllib_loop:RllibNativeLoop",
    "torchrl": "crossrl.measure.fidelity.torchrl_loop:TorchrlNativeLoop",
}
"""Engine -> its own loop's class (registered as the extra engine ``<engine>-native``)."""


def native_id(engine: str) -> str:
    return f"{engine}-native"


def stored_config(seed: int) -> dict:
    """The native config crossrl's adapter stored for the trial of ``seed`` (written by `crossrl fidelity`)."""
    import json

    folder = os.environ.get(CONFIGS_ENV)
    path = Path(folder) / f"{seed}.json" if folder else None
    if path is None or not path.is_file():
        raise ValueError(
            f"no stored native config for seed {seed} ({path or CONFIGS_ENV + ' is not set'}): the native loops run "
            "under `crossrl fidelity`, which writes the adapter's config there first"
        )
    return dict(json.loads(path.read_text()))


def beat() -> None:
    """Tell the trial's stall watchdog (``crossrl.orchestration.watch``) that envs stepped: call it after every point.

    The watchdog counts env steps by the beats crossrl's env guard writes from every env it wraps; the native loops'
    envs are the engine's own (made from the gymnasium id), unguarded, so without this a native trial that trains
    longer than ``budget.stall_seconds`` would be ended FAILED as stalled while it makes progress."""
    from crossrl.core.envguard import channel

    channel().beat()
