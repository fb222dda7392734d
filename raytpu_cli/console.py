"""What a long command shows a person: its phases, live progress bars and a summary table,
while Ray's and JAX's own logs go to a log file.

``with RunConsole(log_path, verbose=False) as console:`` points this process's file descriptors 1
and 2 at the log file (so the driver's logs, the logs Ray forwards from its workers and anything a
child process prints land there) and keeps the terminal for :meth:`RunConsole.phase`,
:meth:`RunConsole.progress` and :meth:`RunConsole.table`. ``verbose=True`` leaves the
descriptors alone: everything is shown, as without this class. The display uses ``rich``: on a
terminal the bars redraw in place; in a pipe each bar is printed once, when it finishes.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)

from raytpu.errors import invalid

LOG_DIR_ENV = "RAYTPU_LOG_DIR"
PIPE_WIDTH = 200


def log_dir() -> Path:
    """Where a run's logs (and an internal error's traceback) go: $RAYTPU_LOG_DIR, else
    ~/.cache/raytpu/logs."""
    configured = os.environ.get(LOG_DIR_ENV)
    return Path(configured) if configured else Path.home() / ".cache" / "raytpu" / "logs"


def add_console_arguments(parser: argparse.ArgumentParser) -> None:
    """``--verbose`` and ``--log-file``, the same for every long command."""
    parser.add_argument(
        "--verbose",
        action="store_true",
        help="show Ray's and JAX's logs here too (default: only in the log file)",
    )
    parser.add_argument(
        "--log-file",
        metavar="PATH",
        help="where Ray's and JAX's logs go (default: a new file in $RAYTPU_LOG_DIR or "
        "~/.cache/raytpu/logs; its path is printed first)",
    )


def run_log_path(args: argparse.Namespace, command: str) -> Path:
    """``--log-file``, or a new file in :func:`log_dir` named after the command and the time;
    checked writable (``ValueError`` naming ``--log-file`` otherwise)."""
    if args.log_file:
        path = Path(args.log_file).expanduser().absolute()
    else:
        path = log_dir() / f"{command}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("ab"):
            pass
    except OSError as error:
        raise ValueError(
            invalid(
                "--log-file",
                str(path),
                "a file this user can create and append to",
                reason=str(error.strerror or error),
            )
        ) from None
    return path


def open_run_console(args: argparse.Namespace, command: str) -> RunConsole:
    """The console of one ``raytpu COMMAND`` run; prints where the logs go, first."""
    path = run_log_path(args, command)
    shown = " (--verbose: shown here too)" if args.verbose else ""
    print(f"[{command}] Ray and JAX logs: {path}{shown}", flush=True)
    return RunConsole(path, verbose=args.verbose)


RAY_LOG_LINE = re.compile(
    r"^(\x1b\[[0-9;]*m)?\([\w:.\-]+ pid=\d+|^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d[,.]\d+\s+(INFO|WARNING|"
    r"DEBUG|ERROR)\b|^\[repeated \d+x|^(INFO|WARNING|DEBUG) \d{4}-\d\d-\d\d|^\s*warnings\.warn\(|"
    r"^\S+\.py:\d+: \w*Warning: "
)
"""A line Ray (or JAX, or a library through Python's warnings) logged, not the command's own:
a worker's ``(ServeReplica:app:X pid=12)`` prefix, a driver's ``2026-12-06 12:00:00,123 INFO``
record, the de-duplicator's ``[repeated 3x ...]``, a warning with its source line."""


class LogSplitter:
    """Text that arrives in chunks (a job's logs), split by line: every line to ``log_path``,
    and to ``show`` those that are not :data:`RAY_LOG_LINE` (all of them when ``verbose``)."""

    def __init__(self, log_path: Path, show: Callable[[str], None], *, verbose: bool) -> None:
        self.log_path = log_path
        self._show = show
        self._verbose = verbose
        self._partial = ""

    def __call__(self, text: str) -> None:
        lines = (self._partial + text).split("\n")
        self._partial = lines.pop()
        self._write(lines)

    def flush(self) -> None:
        if self._partial:
            self._write([self._partial])
            self._partial = ""

    def _write(self, lines: list[str]) -> None:
        with self.log_path.open("a", encoding="utf-8") as log:
            for line in lines:
                log.write(line + "\n")
        for line in lines:
            if self._verbose or not RAY_LOG_LINE.search(line):
                self._show(line)


class RunConsole:
    """The terminal of one command run, with everything else sent to ``log_path``."""

    def __init__(self, log_path: Path, *, verbose: bool = False) -> None:
        self.log_path = log_path
        self.verbose = verbose
        self._saved: dict[int, int] = {}
        self._log: IO[bytes] | None = None
        self._out: IO[str] | None = None
        self._err: IO[str] | None = None
        self.out = Console(highlight=False)
        self.err = Console(stderr=True, highlight=False)

    def __enter__(self) -> RunConsole:
        if self.verbose:
            return self
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        sys.stdout.flush()
        sys.stderr.flush()
        self._log = self.log_path.open("ab")
        for fd in (1, 2):
            self._saved[fd] = os.dup(fd)
        self._out = os.fdopen(os.dup(self._saved[1]), "w", buffering=1, encoding="utf-8")
        self._err = os.fdopen(os.dup(self._saved[2]), "w", buffering=1, encoding="utf-8")
        terminal = os.isatty(self._saved[1])
        # In a pipe rich assumes 80 columns and would cut the bars' text: lines are long there.
        width = None if terminal else PIPE_WIDTH
        self.out = Console(
            file=self._out, highlight=False, force_terminal=terminal or None, width=width
        )
        self.err = Console(file=self._err, highlight=False)
        for fd in (1, 2):
            os.dup2(self._log.fileno(), fd)
        return self

    def __exit__(self, *exc: object) -> None:
        self.restore()

    def restore(self) -> None:
        """Give fds 1 and 2 back to the terminal (idempotent)."""
        if not self._saved:
            return
        with contextlib.suppress(ValueError, OSError):
            sys.stdout.flush()
            sys.stderr.flush()
        for fd, saved in self._saved.items():
            os.dup2(saved, fd)
            os.close(saved)
        self._saved.clear()
        for handle in (self._out, self._err, self._log):
            if handle is not None:
                with contextlib.suppress(OSError):
                    handle.close()
        self.out = Console(highlight=False)
        self.err = Console(stderr=True, highlight=False)

    # -- what the person sees --------------------------------------------------------------
    def phase(self, text: str) -> None:
        """One line naming what happens now."""
        self.out.print(text, markup=False, soft_wrap=True)

    def error(self, text: str) -> None:
        self.err.print(text, markup=False, soft_wrap=True)

    def table(self, text: str) -> None:
        """Pre-formatted text (a table), written as is: never wrapped."""
        self.out.file.write(text + "\n")
        self.out.file.flush()

    @contextlib.contextmanager
    def step(self, description: str) -> Iterator[Callable[[str], None]]:
        """A spinner while the block runs, one finished line after it; the block calls what it
        is given with the line's closing detail (``done("12 hosts up")``)."""
        with self.progress(counted=False) as bar:
            task = bar.add_task(description, total=None, detail="")

            def done(detail: str) -> None:
                bar.update(task, total=1, completed=1, detail=detail)

            yield done

    @contextlib.contextmanager
    def progress(self, *, counted: bool = True) -> Iterator[Progress]:
        """A live display of one or more tasks; ``counted=False`` for work without a count
        (a spinner and the elapsed time)."""
        columns: list[Any] = [SpinnerColumn(), TextColumn("{task.description}")]
        if counted:
            columns += [BarColumn(bar_width=30), MofNCompleteColumn()]
        columns += [TextColumn("{task.fields[detail]}"), TimeElapsedColumn()]
        with Progress(*columns, console=self.out, transient=False) as bar:
            yield bar
