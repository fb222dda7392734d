"""``raytpu demo`` for real: a quiet console, and Ctrl-C at any phase leaves nothing behind.

Each test runs the real command in its own session (process group), as a terminal would, with
its output in a pipe. The interrupt tests send SIGINT to the whole group (what Ctrl-C does),
then look for any process of that group, and any PID seen in it during the run, still alive.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

REPO = Path(__file__).resolve().parents[1]
DEMO_BOUND_S = 300.0
MAX_CONSOLE_LINES = 60

pytestmark = pytest.mark.ray


def _start_demo(workdir: Path, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "raytpu_cli", "demo", "--workdir", str(workdir), *extra],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def _group_pids(pgid: int) -> set[int]:
    """Live (non-zombie) processes whose process group is ``pgid``."""
    found = set()
    for proc in psutil.process_iter(["pid", "status"]):
        try:
            if proc.info["status"] != psutil.STATUS_ZOMBIE and os.getpgid(proc.pid) == pgid:
                found.add(proc.pid)
        except (ProcessLookupError, psutil.NoSuchProcess):
            continue
    return found


def _alive(pids: set[int]) -> set[int]:
    alive = set()
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                alive.add(pid)
        except psutil.NoSuchProcess:
            continue
    return alive


def test_demo_console_is_short_and_ends_with_the_summary(tmp_path: Path) -> None:
    began = time.monotonic()
    demo = _start_demo(tmp_path)
    try:
        output, _ = demo.communicate(timeout=DEMO_BOUND_S)
    finally:
        if demo.poll() is None:
            os.killpg(demo.pid, signal.SIGKILL)
    seconds = time.monotonic() - began
    lines = output.splitlines()
    assert demo.returncode == 0, output  # the demo's own checks: loss fell, 4 x 200, one 400
    assert len(lines) <= MAX_CONSOLE_LINES, output
    assert seconds < DEMO_BOUND_S
    assert lines[-1].startswith("total"), output
    assert any(line.startswith("demo ") and "result" in line for line in lines), output
    (training,) = [line for line in lines if line.strip().startswith("training ━")]
    assert "80/80" in training and "tokens/s" in training, training
    log = (tmp_path / "demo.log").read_text(errors="replace")
    assert "[train] step 80/80" in log  # the workers' logs went to the file, not the console
    assert "[train] step" not in output


def _log_has(text: str) -> Callable[[Path, str], bool]:
    def ready(workdir: Path, _output: str) -> bool:
        log = workdir / "demo.log"
        return log.is_file() and text in log.read_text(errors="replace")

    return ready


def _after_seconds(seconds: float) -> Callable[[Path, str], bool]:
    began = time.monotonic()
    return lambda _workdir, _output: time.monotonic() - began > seconds


PHASES = [
    ("cluster start", lambda: _after_seconds(4.0), signal.SIGINT),
    # During training Ray Train's own SIGINT handler is in charge; a SIGTERM is handed to it.
    ("training", lambda: _log_has("[train] step 5/"), signal.SIGTERM),
    ("serving", lambda: _log_has("Deploying new version of Deployment"), signal.SIGINT),
]


@pytest.mark.parametrize(
    ("phase", "ready", "signum"),
    PHASES,
    ids=[f"{p}-{s.name}" for p, _, s in PHASES],
)
def test_an_interrupt_stops_every_process_and_exits_130(
    tmp_path: Path,
    phase: str,
    ready: Callable[[], Callable[[Path, str], bool]],
    signum: signal.Signals,
) -> None:
    """Ctrl-C (SIGINT to the whole group) or a SIGTERM (how Kubernetes and CI stop a command)."""
    # A short run: the interrupt comes long before the end; serving comes sooner.
    demo = _start_demo(tmp_path, "--steps", "20", "--checkpoint-every", "10")
    seen: set[int] = set()
    is_ready = ready()
    deadline = time.monotonic() + DEMO_BOUND_S
    try:
        while not is_ready(tmp_path, ""):
            assert demo.poll() is None, f"demo ended before {phase}: {demo.stdout.read()}"
            assert time.monotonic() < deadline, f"{phase} never came"
            seen |= _group_pids(demo.pid)
            time.sleep(0.5)
        seen |= _group_pids(demo.pid)
        if signum == signal.SIGINT:
            os.killpg(demo.pid, signum)  # Ctrl-C: the whole foreground group
        else:
            os.kill(demo.pid, signum)  # a supervisor stops the command itself
        output, _ = demo.communicate(timeout=120)
    finally:
        if demo.poll() is None:
            os.killpg(demo.pid, signal.SIGKILL)
    leftovers = _alive(seen - {demo.pid}) | _group_pids(demo.pid)
    assert demo.returncode == 130, output
    assert f"interrupted by {signum.name}" in output and "stopped" in output, output
    assert len(seen) > 1, "the demo started no process before the interrupt"
    assert not leftovers, [" ".join(psutil.Process(p).cmdline()[:3]) for p in leftovers]
