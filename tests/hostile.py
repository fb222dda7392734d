"""Shared by the hostile-input tests: run the CLI in-process and see what a user would see."""

from __future__ import annotations

import contextlib
import io
import time
import tracemalloc
from dataclasses import dataclass
from pathlib import Path

from raytpu_cli.main import main

ALIAS_BOMB = 'a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]\n' + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join([f'*{chr(97 + i)}'] * 9)}]\n" for i in range(8)
)
"""A "billion laughs": 9 strings, each level 9 aliases of the one before: 9**9 values expanded."""


@dataclass(frozen=True)
class Run:
    code: int
    out: str
    err: str
    seconds: float
    peak_mib: float


def run_cli(*argv: str, measure_memory: bool = False) -> Run:
    """``raytpu ARGV`` in this process: exit code, stdout, stderr, seconds, peak MiB allocated."""
    out, err = io.StringIO(), io.StringIO()
    if measure_memory:
        tracemalloc.start()
    began = time.monotonic()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(list(argv))
            except SystemExit as exit_:  # argparse usage errors
                code = int(exit_.code or 0)
        seconds = time.monotonic() - began
        peak = tracemalloc.get_traced_memory()[1] / 2**20 if measure_memory else 0.0
    finally:
        if measure_memory:
            tracemalloc.stop()
    return Run(code, out.getvalue(), err.getvalue(), seconds, peak)


def write_project(folder: Path, stack_text: str | bytes, stack: str = "dev") -> Path:
    """A Pulumi project in ``folder``: Pulumi.yaml and Pulumi.<stack>.yaml with ``stack_text``."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "Pulumi.yaml").write_text("name: ray-tpu\nruntime: python\n")
    path = folder / f"Pulumi.{stack}.yaml"
    if isinstance(stack_text, bytes):
        path.write_bytes(stack_text)
    else:
        path.write_text(stack_text)
    return path
