"""What every benchmark shares: statistics over repeats, tables, JSON results, machine info.

Glossary:

- **repeat**: one timed measurement of the thing under test; a benchmark takes several and
  reports the median and the spread (min..max), because this machine is shared and noisy.
- **ratio**: two numbers measured in the same run, side by side: the headline of every benchmark,
  since absolute times move with the load of other processes.
- **results**: ``bench/results/<name>.json`` (git-ignored); ``docs/performance.md`` holds the
  latest figures that were reported.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
import platform
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from raytpu.table import format_table

RESULTS_DIR = Path(__file__).resolve().parent / "results"
REPO_ROOT = Path(__file__).resolve().parent.parent
NO_ACCELERATOR = "no accelerator lent to this task; MFU on TPU/GPU not measured"

_START = time.perf_counter()


@dataclass(frozen=True)
class Stats:
    """Summary of repeated measurements (same unit as the samples)."""

    n: int
    median: float
    min: float
    max: float
    p50: float
    p99: float
    mean: float

    @property
    def spread(self) -> float:
        """(max - min) / median: 0.1 means the repeats span 10% of the median."""
        return (self.max - self.min) / self.median if self.median else math.nan

    def to_dict(self) -> dict[str, float]:
        return {**asdict(self), "spread": self.spread}


def percentile(samples: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile, ``q`` in [0, 100]."""
    if not samples:
        raise ValueError("percentile: samples is empty; valid: at least one sample")
    if not 0 <= q <= 100:
        raise ValueError(f"percentile: q={q!r} is not valid; valid: 0..100")
    ordered = sorted(samples)
    position = (len(ordered) - 1) * q / 100
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def summarize(samples: Sequence[float]) -> Stats:
    """Median, min, max, p50, p99 and mean of ``samples`` (at least one)."""
    if not samples:
        raise ValueError("summarize: samples is empty; valid: at least one sample")
    values = [float(s) for s in samples]
    return Stats(
        n=len(values),
        median=statistics.median(values),
        min=min(values),
        max=max(values),
        p50=percentile(values, 50),
        p99=percentile(values, 99),
        mean=statistics.fmean(values),
    )


def ratio(numerator: float, denominator: float) -> float:
    return numerator / denominator if denominator else math.nan


def fmt_seconds(seconds: float) -> str:
    """``0.00123`` -> ``1.23 ms``; three significant digits."""
    if seconds is None or math.isnan(seconds):
        return "n/a"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if abs(seconds) >= scale:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds / 1e-9:.3g} ns"


def fmt_stats(stats: Stats) -> str:
    """``12.3 ms [11.9..13.0]``: median and range of the repeats."""
    return f"{fmt_seconds(stats.median)} [{fmt_seconds(stats.min)}..{fmt_seconds(stats.max)}]"


def fmt_ratio(value: float) -> str:
    return "n/a" if value is None or math.isnan(value) else f"{value:.2f}x"


def fmt_bytes(count: float) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if count >= scale:
            return f"{count / scale:.3g} {unit}"
    return f"{int(count)} B"


def progress(message: str) -> None:
    """One progress line on stderr, with the seconds since the benchmark started."""
    print(f"[{time.perf_counter() - _START:7.1f}s] {message}", file=sys.stderr, flush=True)


def print_table(title: str, headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Print ``title`` and the table; returns the table text (for docs)."""
    text = f"{title}\n\n{format_table(headers, rows)}"
    print(f"\n{text}\n", flush=True)
    return text


def free_port() -> int:
    """A TCP port on loopback that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _ram_bytes() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def machine_info() -> dict[str, Any]:
    """The machine a result was measured on: CPU, cores, RAM, load, library versions."""
    ram = _ram_bytes()
    return {
        "date": _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "cpu": _cpu_model(),
        "cores": len(os.sched_getaffinity(0))
        if hasattr(os, "sched_getaffinity")
        else os.cpu_count(),
        "ramGiB": round(ram / 2**30, 1) if ram else None,
        "loadAverage": [round(x, 2) for x in os.getloadavg()],
        "platform": platform.platform(),
        "python": platform.python_version(),
        "versions": {
            name: _version(name)
            for name in ("jax", "jaxlib", "flax", "optax", "ray", "pulumi", "pulumi-gcp")
        },
        "accelerator": NO_ACCELERATOR,
    }


def machine_line(info: dict[str, Any] | None = None) -> str:
    """One line for table footers: ``AMD EPYC, 2 cores, 23.4 GiB, load 1.2; python 3.11 ...``."""
    info = info or machine_info()
    versions = ", ".join(f"{k} {v}" for k, v in info["versions"].items() if v)
    load = "/".join(str(x) for x in info["loadAverage"])
    return (
        f"{info['date']}: {info['cpu']}, {info['cores']} cores, {info['ramGiB']} GiB RAM, "
        f"load {load}; python {info['python']}, {versions}; {info['accelerator']}"
    )


def write_results(name: str, payload: dict[str, Any], directory: Path | None = None) -> Path:
    """Write ``payload`` plus machine info to ``<directory>/<name>.json``; returns the path."""
    directory = directory or RESULTS_DIR
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.json"
    document = {"benchmark": name, "machine": machine_info(), **payload}
    text = json.dumps(jsonable(document), indent=2, allow_nan=False, default=_json_default)
    path.write_text(text + "\n")
    print(f"results: {path}", flush=True)
    return path


def jsonable(value: Any) -> Any:
    """NaN and infinities become null (JSON has no NaN); Stats become dicts."""
    if isinstance(value, Stats):
        value = value.to_dict()
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _json_default(value: Any) -> Any:
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def run_child(
    command: Sequence[str], what: str, timeout_s: float, env: dict[str, str] | None = None
) -> str:
    """A benchmark's child interpreter run from the repository root: its stdout, or
    ``RuntimeError`` naming ``what`` with the tail of its stderr."""
    done = subprocess.run(
        list(command),
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"{what} exited {done.returncode}:\n{done.stderr[-4000:]}")
    return done.stdout


def save_step_one(directory: str, state: Any, cfg: Any) -> None:
    """``state`` of the byte LM ``cfg`` as the step-1 checkpoint in ``directory``, saved the way
    training saves it (and waited for)."""
    from workloads.model.checkpoint import open_checkpoints, save_state
    from workloads.model.family import ByteLM

    manager = open_checkpoints(directory)
    try:
        save_state(manager, 1, state, ByteLM(cfg))
        manager.wait_until_finished()
    finally:
        manager.close()
