"""The child-process side of a trial: read the Trial from stdin, run its adapter, stream JSON lines.

Run as ``python -m crossrl.orchestration.trial_proc FD``; messages go to file descriptor FD (stdout and
stderr are the trial's log, which engines fill with their own chatter).
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from typing import IO, Any

from crossrl.adapters.base import MetricSink
from crossrl.scenarios.spec import Trial


class PipeSink(MetricSink):
    """Sends every message to the runner at once (a killed trial keeps what it reported)."""

    def __init__(self, trial: Trial, stream: IO[str]) -> None:
        self._stream = stream
        super().__init__(trial)

    def _emit(self, message: dict[str, Any]) -> None:
        self._stream.write(json.dumps(message) + "\n")
        self._stream.flush()


def main(argv: list[str]) -> int:
    stream = os.fdopen(int(argv[1]), "w", buffering=1)
    from crossrl.core.envguard import register_stacks

    register_stacks()  # the stall watchdog's SIGUSR1 dumps this process's threads too
    try:
        trial = Trial.model_validate_json(sys.stdin.read())
        from crossrl.adapters.registry import load_adapter

        adapter = load_adapter(trial.engine, multi_agent=trial.env.multi_agent)
        adapter.run(trial, PipeSink(trial, stream))
    except BaseException as e:  # report everything, KeyboardInterrupt/SystemExit included
        tb = traceback.format_exc()
        print(tb, file=sys.stderr, flush=True)
        stream.write(json.dumps({"kind": "error", "error": f"{type(e).__name__}: {e}", "traceback": tb}) + "\n")
        stream.flush()
        return 1
    stream.write(json.dumps({"kind": "done"}) + "\n")
    stream.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
