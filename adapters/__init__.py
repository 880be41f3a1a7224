"""The engines, and nothing else: each behind the one :class:`~crossrl.adapters.base.Adapter` protocol.

``base.py`` is the contract (the Adapter protocol and the :class:`~crossrl.adapters.base.MetricSink` every engine
reports through), ``checkpoints.py`` the checkpoint folders every engine writes, ``registry.py`` the engine ids,
what each runs and how to load it (lazily). One engine per module or, once it has more than one module, per
package: ``crossrl.py`` (crossrl's own core), ``rllib/`` (Ray RLlib), ``torchrl/`` (TorchRL).

May import: ``crossrl.scenarios``, ``crossrl.core``, ``crossrl.reports`` and itself; never the orchestration
(``crossrl.orchestration``), the measurement tools (``crossrl.measure``) or the CLI
(``tests/unit/test_layers.py`` holds the rule).
"""
