"""The ground floor, the suite's vocabulary: the spec schema and its loader, the algorithm catalog and shared
defaults, metric names, trial statuses, the checks `crossrl validate` makes, and the built-in scenario files.

May import: nothing else of crossrl (``tests/unit/test_layers.py`` holds the rule).
"""
