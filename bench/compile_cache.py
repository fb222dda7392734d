"""A training worker's restart with and without JAX's persistent compilation cache, in one run.

Each case is a fresh process (as a restarted worker or a new replica is), with
``XLA_FLAGS=--xla_force_host_platform_device_count=8``: the ``tiny`` Llama preset's family
(:class:`workloads.model.family.Llama`, FSDP over the 8 CPU devices) jitted the way
:meth:`workloads.training.worker_loop.WorkerLoop.compile` does, then the first call of the init
and of the train step (on a batch of zeros; no tokenizer), timed to the results' arrival:

- **no cache**: what a worker does today (no ``jax_compilation_cache_dir``);
- **cold**: :func:`workloads.model.compile_cache.enable` on an empty directory: the first process
  compiles and writes the entries;
- **warm**: a new process on the same directory: the restart, which loads them.

Cold and warm run on a local folder and on ``gs://`` through the GCS emulator (fake-gcs-server,
:mod:`workloads.sim.gcs_emulator`; the rows say so when it cannot start). Cases alternate within
each repeat, so the load of other processes falls on all of them alike. Hits and writes are
JAX's own monitoring events (``/jax/compilation_cache/cache_hits``, and ``.../cache_misses``,
which JAX records as it writes an entry); entries are the files or objects in the directory.

    python -m bench.compile_cache [--repeats 3] [--no-gcs]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bench import _common
from raytpu.entrypoints import COMPILATION_CACHE_ENV
from workloads.model import compile_cache

DEVICES = 8
PRESET = "tiny"
BUCKET = "raytpu-bench-cache"
CHILD_TIMEOUT_S = 300.0
CACHE_ENV_PREFIXES = (
    "JAX_COMPILATION_CACHE",
    "JAX_PERSISTENT_CACHE",
    "JAX_ENABLE_COMPILATION_CACHE",
)
HITS = "/jax/compilation_cache/cache_hits"
WRITES = "/jax/compilation_cache/cache_misses"
"""JAX records this event as it writes an entry (after a miss whose program is kept)."""
CASES = ("none", "local-cold", "local-warm", "gs-cold", "gs-warm")
CASE_NAMES = {
    "none": "no cache",
    "local-cold": "local, cold (1st process)",
    "local-warm": "local, warm (restart)",
    "gs-cold": "gs:// emulator, cold (1st process)",
    "gs-warm": "gs:// emulator, warm (restart)",
}


def child(cache_dir: str, min_compile_time_s: float) -> dict[str, Any]:
    """In a fresh process: enable the cache at ``cache_dir`` ("": none), then jit and first-call
    the family's init and train step on the mesh; the seconds and JAX's cache events."""
    began = time.perf_counter()
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from raytpu.presets import preset
    from workloads.model.family import Llama

    events: dict[str, int] = {}
    jax.monitoring.register_event_listener(
        lambda event, **_: events.__setitem__(event, events.get(event, 0) + 1)
    )
    compile_cache.enable(cache_dir, min_compile_time_s=min_compile_time_s)
    family = Llama(preset(PRESET))
    mesh = family.mesh(jax.devices())
    imported = time.perf_counter()
    state_sharding = family.state_shardings(mesh)
    batch_sharding = family.batch_sharding(mesh)
    init_fn = jax.jit(family.init, out_shardings=state_sharding)
    step_fn = jax.jit(
        family.train_step,
        in_shardings=(state_sharding, batch_sharding),
        out_shardings=(state_sharding, NamedSharding(mesh, P())),
    )
    state = jax.block_until_ready(init_fn(jax.random.PRNGKey(0)))
    initialized = time.perf_counter()
    rows = DEVICES
    batch = jax.device_put(jnp.zeros((rows, family.preset.seq_len + 1), jnp.int32), batch_sharding)
    _, loss = step_fn(state, batch)
    float(loss)
    stepped = time.perf_counter()
    return {
        "devices": jax.device_count(),
        "importS": imported - began,
        "initS": initialized - imported,
        "stepS": stepped - initialized,
        "compileS": stepped - imported,
        "hits": events.get(HITS, 0),
        "writes": events.get(WRITES, 0),
    }


def run_child(cache_dir: str, min_compile_time_s: float, env: dict[str, str]) -> dict[str, Any]:
    """One fresh process of :func:`child`; adds ``processS``, spawn to first step."""
    command = [sys.executable, "-m", "bench.compile_cache", "--child", cache_dir]
    command += ["--min-compile-time", str(min_compile_time_s)]
    began = time.perf_counter()
    stdout = _common.run_child(
        command, f"bench.compile_cache child ({cache_dir or 'no cache'})", CHILD_TIMEOUT_S, env
    )
    result = json.loads(stdout.strip().splitlines()[-1])
    return {**result, "processS": time.perf_counter() - began}


def child_env() -> dict[str, str]:
    """This environment without any cache setting of its own (a test session's or a shell's
    ``JAX_COMPILATION_CACHE_DIR`` would cache the no-cache case), on 8 CPU devices."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(CACHE_ENV_PREFIXES) and k != COMPILATION_CACHE_ENV
    }
    env["JAX_PLATFORMS"] = "cpu"
    env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={DEVICES}"
    return env


def run(repeats: int, min_compile_time_s: float, use_gcs: bool) -> dict[str, Any]:
    """``repeats`` rounds of every case; a fresh cache directory (local and gs://) each round."""
    from workloads.sim.gcs_emulator import GcsEmulator, GcsEmulatorError

    env = child_env()
    samples: dict[str, list[dict[str, Any]]] = {case: [] for case in CASES}
    entries: dict[str, list[int]] = {"local": [], "gs": []}
    gcs, gcs_skipped = None, ""
    if use_gcs:
        try:
            gcs = GcsEmulator((BUCKET,)).start()
        except GcsEmulatorError as error:
            gcs_skipped = str(error)
    else:
        gcs_skipped = "--no-gcs"
    try:
        with tempfile.TemporaryDirectory(prefix="raytpu-compile-cache-") as root:
            for rep in range(repeats):
                local = str(Path(root, f"rep-{rep}"))
                dirs: dict[str, str] = {"none": "", "local": local}
                counters: dict[str, Callable[[], int]] = {
                    "local": lambda d=local: len(list(Path(d).glob("*-cache")))
                }
                if gcs is not None:
                    prefix = f"rep-{rep}/jax-compilation-cache"
                    dirs["gs"] = f"gs://{BUCKET}/{prefix}"
                    counters["gs"] = lambda p=prefix: len(gcs.objects(BUCKET, p + "/"))
                    env.update(gcs.env)
                for case in CASES:
                    where = case.split("-")[0]
                    if where not in dirs:
                        continue
                    _common.progress(f"repeat {rep + 1}/{repeats}: {CASE_NAMES[case]}")
                    samples[case].append(run_child(dirs[where], min_compile_time_s, env))
                    if case.endswith("-cold"):
                        entries[where].append(counters[where]())
    finally:
        if gcs is not None:
            gcs.stop()
    return summarize(samples, entries, repeats, min_compile_time_s, gcs_skipped)


def summarize(
    samples: dict[str, list[dict[str, Any]]],
    entries: dict[str, list[int]],
    repeats: int,
    min_compile_time_s: float,
    gcs_skipped: str,
) -> dict[str, Any]:
    cases: dict[str, Any] = {}
    for case, runs in samples.items():
        if not runs:
            continue
        cases[case] = {
            "compile": _common.summarize([r["compileS"] for r in runs]),
            "init": _common.summarize([r["initS"] for r in runs]),
            "step": _common.summarize([r["stepS"] for r in runs]),
            "process": _common.summarize([r["processS"] for r in runs]),
            "hits": [r["hits"] for r in runs],
            "writes": [r["writes"] for r in runs],
            "entries": entries.get(case.split("-")[0], []) if case.endswith("-cold") else [],
        }
        if case.endswith("-warm") and not all(cases[case]["hits"]):
            raise RuntimeError(f"{case}: no cache hit in a warm process: {cases[case]['hits']}")
    base = cases["none"]["compile"].median
    for case in cases.values():
        case["speedup"] = _common.ratio(base, case["compile"].median)
    return {
        "preset": PRESET,
        "devices": DEVICES,
        "repeats": repeats,
        "minCompileTimeS": min_compile_time_s,
        "gcsSkipped": gcs_skipped,
        "cases": cases,
    }


def _counts(values: list[int]) -> str:
    return "-" if not values else "/".join(str(v) for v in sorted(set(values)))


def print_report(result: dict[str, Any]) -> str:
    rows = [
        (
            CASE_NAMES[name],
            _common.fmt_stats(c["compile"]),
            _common.fmt_seconds(c["init"].median),
            _common.fmt_seconds(c["step"].median),
            _common.fmt_stats(c["process"]),
            _counts(c["hits"]),
            _counts(c["writes"]),
            _counts(c["entries"]),
            _common.fmt_ratio(c["speedup"]),
        )
        for name, c in result["cases"].items()
    ]
    table = _common.print_table(
        f"Restart compile: {result['preset']} Llama preset, init + first train step on an "
        f"{result['devices']}-device CPU mesh, each case a fresh process, "
        f"{result['repeats']} repeats; cache threshold {result['minCompileTimeS']:g} s",
        (
            "case",
            "init + 1st step median [min..max]",
            "init",
            "1st step",
            "process (spawn to 1st step)",
            "cache hits",
            "entries written",
            "entries in dir",
            "vs no cache",
        ),
        rows,
    )
    if result["gcsSkipped"]:
        print(f"gs:// rows skipped: {result['gcsSkipped']}")
    return table


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.compile_cache", description=__doc__)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-gcs", action="store_true", help="local directory only")
    parser.add_argument(
        "--min-compile-time",
        type=float,
        default=None,
        help="jax_persistent_cache_min_compile_time_secs (default: JAX's, 1 s, as on the workers)",
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    threshold = args.min_compile_time
    if threshold is None:
        threshold = compile_cache.MIN_COMPILE_TIME_S
    if args.child is not None:
        print(json.dumps(child(args.child, threshold)))
        return 0
    if args.repeats < 1:
        parser.error(f"--repeats: {args.repeats!r} is not valid; valid: 1 or more")
    result = run(args.repeats, threshold, use_gcs=not args.no_gcs)
    print_report(result)
    print(_common.machine_line())
    _common.write_results("compile_cache", result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
