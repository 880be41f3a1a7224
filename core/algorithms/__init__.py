"""Algorithms: each module is a loss (a Policy subclass), a default optimizer and extra defaults.

Every module ``crossrl.core.algorithms.<name>`` exposes ``ALGORITHM = AlgorithmDef(...)``;
:func:`load` imports one lazily (torch and Ray stay unimported until a trial runs).
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from crossrl.scenarios.catalog import ALGORITHMS, DEFAULT_OPTIMIZER, VALID_OPTIMIZERS

if TYPE_CHECKING:
    from crossrl.core.policy import Policy


@dataclass(frozen=True)
class AlgorithmDef:
    """One algorithm: its policy class (which carries the loss) and defaults.

    ``extra_defaults`` are settings outside the shared hyperparameter names (the catalog's); they sit
    *under* the trial's hyperparameters (``{**extra_defaults, **trial.hyperparams}``), so a spec always wins.
    """

    name: str
    policy_cls: type[Policy]
    extra_defaults: Mapping[str, Any] = field(default_factory=dict)

    @property
    def default_optimizer(self) -> str:
        return DEFAULT_OPTIMIZER[self.name]

    @property
    def valid_optimizers(self) -> tuple[str, ...]:
        return tuple(VALID_OPTIMIZERS[self.name])

    def hyperparams(self, given: Mapping[str, Any]) -> dict[str, Any]:
        """The algorithm's extra defaults overlaid with ``given`` (the trial's resolved hyperparameters)."""
        return {**self.extra_defaults, **given}


def load(name: str) -> AlgorithmDef:
    """``crossrl.core.algorithms.<name>.ALGORITHM``."""
    if name not in ALGORITHMS:
        raise KeyError(f"unknown algorithm {name!r}; known: {', '.join(ALGORITHMS)}")
    module = importlib.import_module(f"crossrl.core.algorithms.{name}")
    alg: AlgorithmDef = module.ALGORITHM
    return alg
