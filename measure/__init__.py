"""Tools that measure the engines: ``bench/`` (sampling, scaling, end-to-end and overhead benchmarks, layout sweeps
and the paired A/B gate, `crossrl bench` and `crossrl ab`) and ``fidelity/`` (each engine's own minimal training
loop beside crossrl's adapter, `crossrl fidelity`).

May import: ``crossrl.scenarios``, ``crossrl.core``, ``crossrl.reports``, ``crossrl.adapters``,
``crossrl.orchestration`` and itself; never the CLI (``tests/unit/test_layers.py`` holds the rule).
"""
