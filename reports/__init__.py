"""Reading and presenting results: the MLflow store and its journal, statistics, figures, the rendered reports,
verdicts, regression checks and past runs. Reading results needs neither an engine nor Ray.

May import: ``crossrl.scenarios`` and itself; never ``crossrl.core`` (``tests/unit/test_layers.py`` holds the
rule).
"""
