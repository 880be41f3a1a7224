"""Entry point of one measurement process: ``python -m crossrl.measure.bench._child REQUEST.json RESULT.json``."""

from __future__ import annotations

import sys

if __name__ == "__main__":
    from crossrl.measure.bench.contestants import main

    sys.exit(main(sys.argv))
