"""Matmul-rate probe: the peak float32 FLOP/s this machine reaches with ``jnp.dot`` in JAX.

It is the denominator of model FLOPs utilisation (MFU) in ``bench.training``, measured in the
same run. Square matrices of several sizes, compiled and warmed up, each size timed over several
repeats; the rate of a size is its median, the peak is the best median over sizes.

    python -m bench.matmul [--sizes 256 512 1024 2048] [--repeats 5]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence

from bench import _common

DEFAULT_SIZES = (256, 512, 1024, 2048)
MAX_SPREAD_FLOPS = 20e9
"""Largest call (all devices together) the all-devices layout times."""


def measure_size(size: int, *, repeats: int, min_seconds: float, spread: bool = False) -> dict:
    """FLOP/s of ``size`` x ``size`` float32 ``jnp.dot``: median over repeats.

    ``spread=False``: one dot on the first device. ``spread=True``: one independent dot per
    device, all in one jitted call (a ``[devices, size, size]`` batch sharded over the devices),
    which is how a data-parallel step uses several host devices at once.
    """
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    if size < 1:
        raise ValueError(f"size: {size!r} is not valid; valid: a positive matrix side")
    if repeats < 1:
        raise ValueError(f"repeats: {repeats!r} is not valid; valid: 1 or more")
    devices = jax.devices() if spread else jax.devices()[:1]
    sharding = NamedSharding(Mesh(np.array(devices), ("d",)), P("d"))
    keys = jax.random.split(jax.random.key(0), 2)
    shape = (len(devices), size, size)
    a = jax.device_put(jax.random.normal(keys[0], shape, jnp.float32), sharding)
    b = jax.device_put(jax.random.normal(keys[1], shape, jnp.float32), sharding)
    dot = jax.jit(lambda x, y: jnp.einsum("bij,bjk->bik", x, y), out_shardings=sharding)
    dot(a, b).block_until_ready()  # compile
    # Calibrate: enough back-to-back calls that one repeat lasts about min_seconds.
    start = time.perf_counter()
    dot(a, b).block_until_ready()
    one = max(time.perf_counter() - start, 1e-6)
    calls = max(1, int(min_seconds / one))
    flops = 2.0 * size**3 * len(devices)
    rates: list[float] = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            out = dot(a, b)
        out.block_until_ready()
        elapsed = time.perf_counter() - start
        rates.append(flops * calls / elapsed)
    stats = _common.summarize(rates)
    return {
        "size": size,
        "devices": len(devices),
        "calls": calls,
        "flopsPerCall": flops,
        "rate": stats,
    }


def measure(
    sizes: Sequence[int] = DEFAULT_SIZES,
    *,
    repeats: int = 5,
    min_seconds: float = 0.2,
    report: bool = True,
) -> dict:
    """Rate per size (one device, and every device when there are several) and the peak (the
    best median). ``report`` prints progress lines."""
    import jax

    layouts = [False, True] if jax.device_count() > 1 else [False]
    per_size = []
    for spread in layouts:
        for size in sizes:
            devices = jax.device_count() if spread else 1
            if spread and devices * 2.0 * size**3 > MAX_SPREAD_FLOPS and size != min(sizes):
                continue  # one call would take many seconds on a few cores
            if report:
                where = f"{jax.device_count()} devices" if spread else "1 device"
                _common.progress(f"matmul {size}x{size} float32 on {where}, {repeats} repeats")
            per_size.append(
                measure_size(size, repeats=repeats, min_seconds=min_seconds, spread=spread)
            )
    best = max(per_size, key=lambda r: r["rate"].median)
    return {
        "device": str(jax.devices()[0]),
        "deviceCount": jax.device_count(),
        "backend": jax.default_backend(),
        "sizes": per_size,
        "peakFlops": best["rate"].median,
        "peakSize": best["size"],
        "peakDevices": best["devices"],
    }


def table_rows(result: dict) -> list[list[str]]:
    return [
        [
            f"{r['size']}x{r['size']}",
            r["devices"],
            r["calls"],
            f"{r['rate'].median / 1e9:.1f}",
            f"{r['rate'].min / 1e9:.1f}..{r['rate'].max / 1e9:.1f}",
            r["rate"].n,
        ]
        for r in result["sizes"]
    ]


HEADERS = ("matrix", "devices", "calls/repeat", "GFLOP/s median", "GFLOP/s range", "repeats")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.matmul", description=__doc__)
    parser.add_argument("--sizes", type=int, nargs="+", default=list(DEFAULT_SIZES))
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--min-seconds", type=float, default=0.2, help="length of one repeat")
    args = parser.parse_args(argv)
    result = measure(args.sizes, repeats=args.repeats, min_seconds=args.min_seconds)
    _common.print_table(
        f"JAX float32 matmul rate on {result['device']} (peak {result['peakFlops'] / 1e9:.1f} "
        f"GFLOP/s at {result['peakSize']} on {result['peakDevices']} device(s))",
        HEADERS,
        table_rows(result),
    )
    print(_common.machine_line())
    _common.write_results("matmul", result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
