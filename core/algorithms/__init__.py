"""Algorithms: each module is a loss (a Policy subclass); its optimizers and defaults are in the catalog.

Every module ``crossrl.core.algorithms.<name>`` exposes ``ALGORITHM = AlgorithmDef(...)``;
:func:`load` imports one lazily (torch and Ray stay unimported until a trial runs).
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from crossrl.scenarios.catalog import ALGORITHMS, CROSSRL_SETTINGS, DEFAULT_OPTIMIZER, VALID_OPTIMIZERS

if TYPE_CHECKING:
    from crossrl.core.policy import Policy


@dataclass(frozen=True)
class AlgorithmDef:
    """One algorithm: its policy class (which carries the loss); its defaults are the catalog's."""

    name: str
    policy_cls: type[Policy]

    @property
    def default_optimizer(self) -> str:
        return DEFAULT_OPTIMIZER[self.name]

    @property
    def valid_optimizers(self) -> tuple[str, ...]:
        return tuple(VALID_OPTIMIZERS[self.name])

    def hyperparams(self, given: Mapping[str, Any], native: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """crossrl's own settings for the algorithm (``CROSSRL_SETTINGS``) overlaid with ``given`` (the trial's
        resolved hyperparameters, so a spec's value always wins), then with ``native`` (the spec's
        ``native.crossrl.settings``: engine-native settings, outside the equal-settings rule)."""
        return {**CROSSRL_SETTINGS[self.name], **given, **(native or {})}


def load(name: str) -> AlgorithmDef:
    """``crossrl.core.algorithms.<name>.ALGORITHM``."""
    if name not in ALGORITHMS:
        raise KeyError(f"unknown algorithm {name!r}; known: {', '.join(ALGORITHMS)}")
    module = importlib.import_module(f"crossrl.core.algorithms.{name}")
    alg: AlgorithmDef = module.ALGORITHM
    return alg
