"""raytpu.processes.stop: SIGTERM, a bound, then SIGKILL; whole process groups on request."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from raytpu import processes

POLITE = "import time; time.sleep(60)"
STUBBORN = (
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    "print(1, flush=True); time.sleep(60)"
)
PARENT = (
    "import subprocess, sys, time; "
    "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
    "print(c.pid, flush=True); time.sleep(60)"
)


def _start(code: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, start_new_session=True
    )


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.parametrize(
    ("code", "returncode", "max_s"),
    [(POLITE, -15, 3.0), (STUBBORN, -9, 3.0)],
    ids=["exits-on-sigterm", "sigkill-after-the-bound"],
)
def test_stop_ends_a_process_within_its_bound(code: str, returncode: int, max_s: float) -> None:
    process = _start(code)
    if code == STUBBORN:
        assert process.stdout is not None and process.stdout.readline()  # handler installed
    started = time.monotonic()
    processes.stop([process], timeout_s=0.5)
    assert process.returncode == returncode
    assert time.monotonic() - started < max_s


def test_group_stop_takes_the_children_too() -> None:
    parent = _start(PARENT)
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    processes.stop([parent], timeout_s=2, group=True)
    deadline = time.monotonic() + 5
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)  # the child is reparented to init, which reaps it
    assert not _alive(child)


def test_stop_skips_what_has_exited() -> None:
    done = subprocess.Popen([sys.executable, "-c", "pass"])
    done.wait(timeout=30)
    processes.stop([done])
    assert done.returncode == 0
