"""The benchmarks (``crossrl bench sampling|scaling|e2e|overhead`` and the A/B gate) as library functions.

:mod:`.samplers` measures one engine's pure sampling speed in a fresh process; :mod:`.commands` runs
the interleaved comparisons and the end-to-end and overhead measurements, returning plain data,
printing rich tables and writing JSON. Nothing heavy is imported here, so the CLI stays fast.
"""
