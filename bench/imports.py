"""Import cost of the modules every Ray process loads: wall time of a fresh interpreter that
imports each one, median over repeats, and the heavy modules it pulled in.

Every Ray worker, agent and driver imports ``ray``, and ``ray`` imports ``jsonschema``: what a
dependency adds to that import is paid once per process, dozens of times per simulated cluster.
(jsonschema 4.24+ with its ``format-nongpl`` extra builds a Lark grammar at import; see the
``notebook`` extra in pyproject.toml.)

    python -m bench.imports [--modules ray jsonschema ...] [--repeats 5]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from collections.abc import Sequence

from bench import _common

DEFAULT_MODULES = (
    "jsonschema",
    "ray",
    "ray._private.workers.default_worker",
    "ray.train",
    "workloads.serving.app",
)
WATCHED = ("rfc3987_syntax", "lark", "pyarrow", "torch", "transformers")
"""Modules whose presence after an import is worth a column: grammar builders, big libraries."""
TIMEOUT_S = 120.0


def measure(module: str, repeats: int) -> dict:
    """Median wall seconds of ``python -c "import <module>"`` and which WATCHED modules it loads."""
    if repeats < 1:
        raise ValueError(f"repeats: {repeats!r} is not valid; valid: 1 or more")
    probe = f"import sys, {module}; print(','.join(m for m in {WATCHED!r} if m in sys.modules))"
    samples, loaded = [], ""
    for _ in range(repeats):
        began = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "-c", probe],
            cwd=_common.REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
            check=False,
        )
        samples.append(time.perf_counter() - began)
        if done.returncode != 0:
            raise RuntimeError(f"import {module} failed: {done.stderr.strip()[-500:]}")
        loaded = done.stdout.strip()
    return {"module": module, "stats": _common.summarize(samples), "loaded": loaded or "-"}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.imports", description=__doc__)
    parser.add_argument("--modules", nargs="+", default=list(DEFAULT_MODULES))
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    rows = []
    for module in args.modules:
        _common.progress(f"import {module}")
        rows.append(measure(module, args.repeats))
    _common.print_table(
        f"Import cost, a fresh interpreter per sample ({_common.machine_line()})",
        ("module", "wall: median [min..max]", "loaded"),
        [(row["module"], _common.fmt_stats(row["stats"]), row["loaded"]) for row in rows],
    )
    _common.write_results("imports", {"repeats": args.repeats, "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
