"""Crash points for fault-injection tests: the process kills itself where a test asks.

``PGCDC_FAULT_INJECT=<point>`` makes :func:`crash_point` SIGKILL the process the first time
that point is reached, exactly like an OOM kill or a lost node would. Unset (always, in
production) it does nothing.
"""

from __future__ import annotations

import os
import signal

ENV = "PGCDC_FAULT_INJECT"


def crash_point(name: str) -> None:
    """Die here (SIGKILL, no cleanup) when the environment names this point."""
    if os.environ.get(ENV) == name:
        os.kill(os.getpid(), signal.SIGKILL)
