"""``python -m bench [NAME ...]``: run the benchmarks one after another, each in its own process.

Default: iac_scale, reservation, training, serving (each with its default configuration). Each
prints its tables and writes ``bench/results/<name>.json``. Exit status: the first failure's.
"""

from __future__ import annotations

import argparse
import subprocess
import sys

from bench import _common

BENCHMARKS = (
    "iac_scale",
    "reservation",
    "training",
    "serving",
    "matmul",
    "presets",
    "serving_llm",
    "goodput",
    "compile_cache",
    "llm_client",
    "batch",
    "imports",
)
DEFAULT = ("iac_scale", "reservation", "training", "serving")
TIMEOUT_S = 1200.0
"""Bound on one benchmark (the defaults take a few minutes each on 2 cores)."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("names", nargs="*", default=list(DEFAULT), metavar="NAME")
    args = parser.parse_args(argv)
    for name in args.names:
        if name not in BENCHMARKS:
            parser.error(f"NAME: {name!r} is not valid; valid: {', '.join(BENCHMARKS)}")
    status = 0
    for name in args.names:
        _common.progress(f"bench.{name}")
        try:
            done = subprocess.run(
                [sys.executable, "-m", f"bench.{name}"],
                cwd=_common.REPO_ROOT,
                timeout=TIMEOUT_S,
                check=False,
            )
        except subprocess.TimeoutExpired:
            print(f"bench.{name}: no result after {TIMEOUT_S:.0f} s", file=sys.stderr)
            status = status or 1
            continue
        if done.returncode != 0:
            print(f"bench.{name}: exited {done.returncode}", file=sys.stderr)
            status = status or done.returncode
    return status


if __name__ == "__main__":
    raise SystemExit(main())
