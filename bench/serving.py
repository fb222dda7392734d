"""Serving: the HTTP application vs calling the model in-process, with and without batching.

A checkpoint of the workload's model (:mod:`workloads.model.byte_lm`, freshly initialised: generation
cost does not depend on the weights) is saved with :func:`workloads.model.checkpoint.save_state`. Then, in
the same run:

- **in-process**: :func:`workloads.serving.engine.decode.generate` called directly in this process, one prompt
  per call and ``MAX_BATCH_SIZE`` prompts per call: the floor the HTTP path is compared with;
- **HTTP, dynamic batching**: the real application (:func:`workloads.serving.app.build_app`, its
  ``@serve.batch`` settings) deployed with :func:`workloads.serving.app.deploy` on a local slice
  cluster holding one single-host v6e 2x2 serving slice, called over loopback HTTP;
- **HTTP, no batching**: the same deployment class with ``max_batch_size`` 1.

Both applications are up side by side (one replica each, 2 of the host's 4 chips each) and every
round measures in-process, then each concurrency for both applications in alternating order, so
that the load of other processes on this shared machine hits all of them alike. Each HTTP
configuration is a closed loop of 1, 8 or 32 clients, bounded by a request count and a time
limit. Reported: requests/s (median over rounds), p50 and p99 latency (all rounds pooled), and
ratios (batching over no batching; HTTP over in-process), all measured in this run.

    python -m bench.serving [--concurrency 1 8 32] [--requests 48] [--rounds 2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any

from bench import _common
from raytpu import catalog

PROMPT = "The train left the station at seven in the morning, and"
WARMUP_REQUESTS = 8
REQUEST_TIMEOUT_S = 60.0
WARMUP_LIMIT_S = 120.0
REPLICA_TPU = 2
"""Chips per replica: half the 4-chip serving host, so both applications are up side by side
and every round measures them alternately under the same load."""


def serve_shape() -> catalog.SliceShape:
    """The dev stack's serving slice: v6e 2x2, one host with 4 chips."""
    return catalog.shape("v6e", "2x2")


def write_checkpoint(directory: str, seed: int = 0) -> None:
    """A step-1 checkpoint of the workload's default model, saved the way training saves it."""
    import jax

    from workloads.model import byte_lm as m

    cfg = m.ModelConfig()
    _common.save_step_one(directory, m.init_state(cfg, jax.random.PRNGKey(seed)), cfg)


def write_checkpoint_process(directory: str, timeout_s: float = 300.0) -> None:
    """:func:`write_checkpoint` in a child process: JAX stays out of this process until the
    cluster's node processes are forked (forking a multithreaded JAX process can deadlock)."""
    command = [sys.executable, "-m", "bench.serving", "--write-checkpoint", directory]
    done = subprocess.run(command, cwd=_common.REPO_ROOT, timeout=timeout_s, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"writing the checkpoint exited {done.returncode}")


def build(checkpoint_dir: str, batching: bool, shape: catalog.SliceShape) -> Any:
    """Both applications fit on the one serving host at once: each replica asks half its chips.
    Without batching: the same deployment with batches of one request and no wait."""
    from workloads.serving.app import ServeOptions, build_app

    options = ServeOptions() if batching else ServeOptions(max_batch_size=1, batch_wait_s=0.0)
    return build_app(checkpoint_dir, tpu_per_replica=REPLICA_TPU, options=options)


# -- in-process ---------------------------------------------------------------------------------


class InProcessModel:
    """The checkpoint restored in this process; :meth:`measure` times ``generate`` calls."""

    def __init__(self, checkpoint_dir: str, max_new_tokens: int) -> None:
        from workloads.model.checkpoint import restore_params

        self.params, family, _ = restore_params(checkpoint_dir)
        self.cfg = family.config
        self.max_new_tokens = max_new_tokens
        self._calls = 0

    def measure(self, batch: int, calls: int) -> dict[str, Any]:
        from workloads.serving.engine.decode import generate

        prompts = [PROMPT] * batch
        tokens = [self.max_new_tokens] * batch
        temperatures = [0.0] * batch
        generate(self.params, self.cfg, prompts, tokens, temperatures)  # compile / warm up
        latencies = []
        began = time.perf_counter()
        for _ in range(calls):
            self._calls += 1
            start = time.perf_counter()
            generate(self.params, self.cfg, prompts, tokens, temperatures, seed=self._calls)
            latencies.append(time.perf_counter() - start)
        elapsed = time.perf_counter() - began
        return {"requests": calls * batch, "seconds": elapsed, "latencies": latencies, "errors": []}


# -- HTTP load ----------------------------------------------------------------------------------


async def _load(
    url: str, concurrency: int, requests: int, time_limit_s: float, body: dict
) -> dict[str, Any]:
    import aiohttp

    latencies: list[float] = []
    errors: list[str] = []
    batch_sizes: list[int] = []
    issued = 0
    deadline = time.perf_counter() + time_limit_s
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)

    async def client(session: aiohttp.ClientSession) -> None:
        nonlocal issued
        while issued < requests and time.perf_counter() < deadline:
            issued += 1
            start = time.perf_counter()
            async with session.post(url, json=body) as response:
                payload = await response.read()
            if response.status != 200:
                errors.append(f"HTTP {response.status}: {payload[:200]!r}")
                continue
            latencies.append(time.perf_counter() - start)
            batch_sizes.append(int(json.loads(payload).get("batch_size", 0)))

    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        began = time.perf_counter()
        await asyncio.gather(*(client(session) for _ in range(concurrency)))
        elapsed = time.perf_counter() - began
    if not latencies:
        raise RuntimeError(f"no request to {url} succeeded: {errors[:3]}")
    return {
        "requests": len(latencies),
        "seconds": elapsed,
        "latencies": latencies,
        "errors": errors,
        "batchSizes": batch_sizes,
    }


def http_load(
    url: str, concurrency: int, requests: int, time_limit_s: float, max_new_tokens: int
) -> dict[str, Any]:
    """``concurrency`` closed-loop clients, at most ``requests`` requests and ``time_limit_s``."""
    body = {"prompt": PROMPT, "max_new_tokens": max_new_tokens, "temperature": 0.0}
    return asyncio.run(_load(url, concurrency, requests, time_limit_s, body))


# -- the run ------------------------------------------------------------------------------------


def _combine(mode: str, concurrency: int, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Pool latencies over rounds; requests/s is the median of the rounds' rates."""
    latencies = [x for r in runs for x in r["latencies"]]
    batch_sizes = [x for r in runs for x in r.get("batchSizes", [])]
    errors = [x for r in runs for x in r["errors"]]
    return {
        "mode": mode,
        "concurrency": concurrency,
        "requests": len(latencies),
        "rounds": len(runs),
        "rps": _common.summarize([r["requests"] / r["seconds"] for r in runs]),
        "latency": _common.summarize(latencies),
        "meanBatchSize": sum(batch_sizes) / len(batch_sizes) if batch_sizes else None,
        "errors": len(errors),
        "firstErrors": errors[:3],
    }


def run(
    *,
    concurrency: Sequence[int],
    requests: int,
    rounds: int,
    time_limit_s: float,
    max_new_tokens: int,
) -> dict[str, Any]:
    from workloads.serving.app import BATCH_WAIT_S, MAX_BATCH_SIZE, deploy, shutdown
    from workloads.sim.local_cluster import LocalSliceCluster

    for c in concurrency:
        if c < 1:
            raise ValueError(f"--concurrency: {c!r} is not valid; valid: integers >= 1")
    if rounds < 1:
        raise ValueError(f"--rounds: {rounds!r} is not valid; valid: 1 or more")
    shape = serve_shape()
    modes = {
        "batched": f"HTTP, adaptive batching (max {MAX_BATCH_SIZE}, wait <= {BATCH_WAIT_S * 1000:g} ms)",
        "unbatched": "HTTP, no batching",
    }
    samples: dict[tuple[str, int], list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-serve-") as checkpoint_dir:
        _common.progress("saving a checkpoint of the workload's model (separate process)")
        write_checkpoint_process(checkpoint_dir)
        _common.progress(f"starting local slice cluster: one {shape.name} serving slice")
        with LocalSliceCluster([_serve_slice(shape)]) as cluster:
            _common.progress(f"cluster up in {cluster.start_seconds:.1f} s")
            port = _common.free_port()
            urls: dict[str, str] = {}
            warmup: list[dict[str, Any]] = []
            deploy_s: dict[str, float] = {}
            try:
                for key in modes:
                    _common.progress(f"deploying {modes[key]}")
                    handle = deploy(
                        build(checkpoint_dir, key == "batched", shape),
                        port=port,
                        name=key,
                        route_prefix=f"/{key}",
                        timeout_s=180.0,
                    )
                    urls[key], deploy_s[key] = handle.url, handle.deploy_s
                for key in modes:
                    # Warm-up. generate() compiles once per batch size it sees, so bursts of
                    # 1..MAX_BATCH_SIZE simultaneous requests come first (their latencies show
                    # that compile cost), then every concurrency once.
                    _common.progress(f"warming up {modes[key]}")
                    for burst in range(1, MAX_BATCH_SIZE + 1):
                        done = http_load(urls[key], burst, burst, WARMUP_LIMIT_S, max_new_tokens)
                        warmup.append(
                            {
                                "mode": modes[key],
                                "burst": burst,
                                "maxLatencyS": max(done["latencies"]),
                                "batchSizes": sorted(set(done["batchSizes"])),
                            }
                        )
                    for c in concurrency:
                        warm = min(2 * c, 2 * WARMUP_REQUESTS)
                        http_load(urls[key], c, warm, time_limit_s, max_new_tokens)
                local = InProcessModel(checkpoint_dir, max_new_tokens)
                for round_index in range(rounds):
                    for batch in (1, MAX_BATCH_SIZE):
                        _common.progress(f"round {round_index + 1}/{rounds}: in-process x{batch}")
                        calls = max(4, requests // (batch * 2))
                        samples.setdefault((f"in-process, {batch} per call", batch), []).append(
                            local.measure(batch, calls)
                        )
                    for c in concurrency:
                        order = list(modes) if round_index % 2 == 0 else list(modes)[::-1]
                        for key in order:
                            _common.progress(
                                f"round {round_index + 1}/{rounds}: {modes[key]}, concurrency {c}"
                            )
                            samples.setdefault((modes[key], c), []).append(
                                http_load(
                                    urls[key], c, max(requests, c), time_limit_s, max_new_tokens
                                )
                            )
            finally:
                shutdown()
    rows = [_combine(mode, c, runs) for (mode, c), runs in samples.items()]
    return {
        "shape": shape.to_dict(),
        "tpuPerReplica": REPLICA_TPU,
        "maxNewTokens": max_new_tokens,
        "requestsPerRound": requests,
        "rounds": rounds,
        "timeLimitS": time_limit_s,
        "deployS": deploy_s,
        "warmup": warmup,
        "rows": rows,
        "ratios": _ratios(rows, modes),
    }


def _serve_slice(shape: catalog.SliceShape) -> Any:
    from infra.config.schema import SliceConfig

    return SliceConfig(
        name="serve",
        shape=shape,
        zone="us-east5-b",
        count=1,
        provisioning="on-demand",
        reservation=None,
    )


def _ratios(rows: list[dict[str, Any]], modes: dict[str, str]) -> list[dict[str, Any]]:
    by = {(r["mode"], r["concurrency"]): r for r in rows}
    single = next(r for r in rows if r["mode"].startswith("in-process") and r["concurrency"] == 1)
    out = []
    for c in sorted({c for (mode, c) in by if mode == modes["batched"]}):
        batched = by.get((modes["batched"], c))
        plain = by.get((modes["unbatched"], c))
        if batched is None or plain is None:
            continue
        out.append(
            {
                "concurrency": c,
                "batchedOverUnbatchedRps": _common.ratio(
                    batched["rps"].median, plain["rps"].median
                ),
                "batchedRpsOverInProcess": _common.ratio(
                    batched["rps"].median, single["rps"].median
                ),
                "unbatchedRpsOverInProcess": _common.ratio(
                    plain["rps"].median, single["rps"].median
                ),
                "batchedP50OverInProcess": _common.ratio(
                    batched["latency"].p50, single["latency"].p50
                ),
                "unbatchedP50OverInProcess": _common.ratio(
                    plain["latency"].p50, single["latency"].p50
                ),
            }
        )
    return out


def print_report(result: dict[str, Any]) -> list[str]:
    rows = [
        (
            r["mode"],
            r["concurrency"],
            r["requests"],
            f"{r['rps'].median:.1f} [{r['rps'].min:.1f}..{r['rps'].max:.1f}]",
            _common.fmt_seconds(r["latency"].p50),
            _common.fmt_seconds(r["latency"].p99),
            f"{r['meanBatchSize']:.1f}" if r["meanBatchSize"] is not None else "-",
            r["errors"],
        )
        for r in result["rows"]
    ]
    first = _common.print_table(
        f"Serving {result['shape']['generation']} {result['shape']['topology']} replica, "
        f"{result['maxNewTokens']} new tokens per request, greedy, {result['rounds']} interleaved "
        "rounds (in-process rows: latency per call, concurrency = prompts per call)",
        ("mode", "concurrency", "requests", "req/s [rounds]", "p50", "p99", "mean batch", "errors"),
        rows,
    )
    second = _common.print_table(
        "Ratios (same run)",
        (
            "concurrency",
            "req/s batching / no batching",
            "req/s batching / in-process",
            "req/s no batching / in-process",
            "p50 batching / in-process",
            "p50 no batching / in-process",
        ),
        [
            (
                r["concurrency"],
                _common.fmt_ratio(r["batchedOverUnbatchedRps"]),
                _common.fmt_ratio(r["batchedRpsOverInProcess"]),
                _common.fmt_ratio(r["unbatchedRpsOverInProcess"]),
                _common.fmt_ratio(r["batchedP50OverInProcess"]),
                _common.fmt_ratio(r["unbatchedP50OverInProcess"]),
            )
            for r in result["ratios"]
        ],
    )
    burst = [w for w in result["warmup"] if w["mode"].startswith("HTTP, batching")]
    if burst:
        print(
            "warm-up bursts on the batching application (n simultaneous requests: slowest "
            "latency, batch sizes seen): "
            + "; ".join(
                f"{w['burst']}: {_common.fmt_seconds(w['maxLatencyS'])} {w['batchSizes']}"
                for w in burst
            )
        )
    return [first, second]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.serving", description=__doc__)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--requests", type=int, default=48, help="per configuration and round")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds")
    parser.add_argument("--time-limit", type=float, default=30.0, help="seconds per configuration")
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--write-checkpoint", metavar="DIR", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.write_checkpoint:
        write_checkpoint(args.write_checkpoint)
        return 0
    result = run(
        concurrency=args.concurrency,
        requests=args.requests,
        rounds=args.rounds,
        time_limit_s=args.time_limit,
        max_new_tokens=args.max_new_tokens,
    )
    print_report(result)
    print(_common.machine_line())
    _common.write_results("serving", result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
