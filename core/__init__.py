"""crossrl's own distributed engine on Ray, after the RLlib paper: the policy graph (``policy.py`` and the
learners), policy evaluators as Ray actors (``evaluator.py``), pluggable policy optimizers (``optimizers/``), one
loss per algorithm (``algorithms/``), envs, replay and the env guard. Usable without the rest of the suite.

May import: ``crossrl.scenarios`` and itself; never ``crossrl.reports`` (``tests/unit/test_layers.py`` holds the
rule).
"""
