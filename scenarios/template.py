"""A commented scenario spec to start from (``crossrl init``): every field a newcomer sets, with what it means.

The template is YAML with comments; :func:`spec_template` fills in the env, the algorithm and the name, and the
algorithm's resolved default hyperparameters (``scenarios/catalog.py``) are written out, so the file shows every
value that will run. It loads as it is (``tests/unit/test_template.py`` validates it for every algorithm).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import yaml

from crossrl.scenarios.catalog import ALGORITHMS, ENGINES
from crossrl.scenarios.spec import AlgorithmSpec

TEMPLATE = """\
# A crossrl scenario: one comparison, run on every engine with the same settings.
# Check it:   crossrl validate {path}
# Run it:     crossrl run {path}        (the report lands in crossrl-results/reports/{name}/report.html)
# Every field: README, "Scenario specs".

# the MLflow experiment's name (letters, digits, _ . -)
name: {name}
description: {algorithm} on {env_id}, every engine

env:
  # a gymnasium id ('module:Id' imports module first); kwargs are passed to gymnasium.make
  id: {env_id}
  kwargs: {{}}

algorithm:
  # one of {algorithms}
  name: {algorithm}
  # The shared hyperparameter names, mapped to each engine's own (README, "Fairness"). These are the
  # defaults for {algorithm}: delete a line to keep its default, change it to tune.
  hyperparams:
{hyperparams}
  model:
    hidden: [64, 64]         # the MLP every engine builds (conv: [[filters, kernel, stride], ...] for images)
    activation: tanh

engines: [{engines}]

execution:
  workers: [1, 2]            # one set of trials per worker count: the report's scaling
  envs_per_worker: 4

budget:
  env_steps: 100000          # env steps sampled per trial (or train_seconds: training time)
  wall_seconds: 1200         # hard limit per trial, set-up included: past it the trial is a TIMEOUT

checkpoint:                  # what `crossrl run --resume` continues a killed trial from, `crossrl evaluate` reloads
  every_seconds: 60          # one per minute of training (every_env_steps: N too: whichever first); keep 2
  keep: 2

target:
  episode_return_mean: null  # the return that defines steps and seconds to target (null: none)

seeds: [0, 1, 2]             # one set of trials per seed; three or more for a verdict with a CI
"""


def spec_template(
    *, name: str, env_id: str, algorithm: str = "ppo", path: str = "spec.yaml", engines: Sequence[str] = ENGINES
) -> str:
    """The commented spec for ``env_id`` and ``algorithm`` on ``engines`` (those that run it); ValueError for an
    unknown algorithm or a bad name."""
    if algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm {algorithm!r} is not one of {', '.join(ALGORITHMS)}")
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", name):
        raise ValueError(f"name {name!r}: letters, digits, '_', '.' and '-', starting with a letter or digit")
    hp = AlgorithmSpec.model_validate({"name": algorithm}).resolved_hyperparams()
    lines = yaml.safe_dump(hp, sort_keys=False, default_flow_style=False).splitlines()
    return TEMPLATE.format(
        name=name,
        env_id=env_id,
        algorithm=algorithm,
        algorithms=", ".join(ALGORITHMS),
        hyperparams="\n".join(f"    {line}" for line in lines),
        engines=", ".join(engines),
        path=path,
    )
