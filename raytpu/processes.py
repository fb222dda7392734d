"""Stopping the processes a command started: one way for every tunnel, server and node.

A process is asked first (SIGTERM), then made to (SIGKILL) once the bound has passed; with
``group=True`` the signal goes to its process group (a child started with
``start_new_session=True`` and everything it started in turn). Nothing waits without a bound.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Sequence

STOP_TIMEOUT_S = 5.0
"""How long a process has to exit after SIGTERM before it gets SIGKILL."""


def _signal(process: subprocess.Popen, signum: int, group: bool) -> None:
    with contextlib.suppress(ProcessLookupError):
        if group:
            os.killpg(process.pid, signum)
        else:
            process.send_signal(signum)


def stop(
    processes: Sequence[subprocess.Popen], *, timeout_s: float = STOP_TIMEOUT_S, group: bool = False
) -> None:
    """SIGTERM every running process of ``processes`` at once, wait up to ``timeout_s`` in all,
    SIGKILL those still running, and reap them. Processes already gone are skipped."""
    running = [p for p in processes if p.poll() is None]
    for process in running:
        _signal(process, signal.SIGTERM, group)
    deadline = time.monotonic() + timeout_s
    for process in running:
        try:
            process.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _signal(process, signal.SIGKILL, group)
            process.wait(timeout=STOP_TIMEOUT_S)
