"""Small crossrl trials on CartPole for the core's end-to-end tests (tests/core)."""

from __future__ import annotations

from typing import Any

from crossrl.scenarios.spec import ScenarioSpec, Trial


def make_trial(
    algorithm: str,
    *,
    env_steps: int,
    optimizer: str | None = None,
    envs_per_worker: int = 4,
    transport: str = "stream",
    **hp: Any,
) -> Trial:
    """2 workers x ``envs_per_worker`` CartPole envs, a 32x32 MLP; ``hp`` overrides the catalog's."""
    spec = ScenarioSpec.model_validate(
        {
            "name": f"test-{algorithm}",
            "env": {"id": "CartPole-v1"},
            "algorithm": {"name": algorithm, "hyperparams": hp, "model": {"hidden": [32, 32]}},
            "engines": ["crossrl"],
            "execution": {
                "workers": 2,
                "envs_per_worker": envs_per_worker,
                "optimizer": optimizer,
                "transport": transport,
            },  # fmt: skip
            "budget": {"env_steps": env_steps},
        }
    )
    return spec.trials()[0]
