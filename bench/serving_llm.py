"""Serving like an LLM server: open-loop traffic from a generated trace, and the decode path.

Two parts, measured in the same run:

1. **Traffic** (local slice cluster, one v6e 2x2 serving host): three Serve applications up side
   by side, each one replica: the built-in app with the prefix cache (2 chips), the same app
   without it (2 chips), and a trivial Ray Serve deployment that streams the right number of
   tokens without computing anything (the floor: proxy, routing, SSE). A seeded trace
   (:func:`trace`) of prompts that share a few system prompts (most requests) or none, with
   varied user-turn lengths and output lengths, is replayed open-loop: arrivals are a Poisson
   process at each rate, sent on time whether or not earlier requests are done. Every request is
   a streaming ``/v1/completions`` call: TTFT is the time to the first SSE event, TPOT the time
   between first and last over the tokens after the first. Reported per app and rate: TTFT and
   TPOT p50/p99, completed requests/s, output tokens/s, and the prefix-cache hit rate (blocks
   found / blocks looked up, from the replica's counters over that run).
2. **Decode cost** (in this process, the default model, ``context_len`` 1024): time per new token
   of the engine's decode loop (:func:`workloads.serving.engine.decode.decode`) at several prompt lengths, next
   to a bare jitted KV-cached decode of the same parameters (``lax.fori_loop`` of greedy steps,
   nothing else; the two are called in turn, each repeat) and to the uncached reference (every
   token re-runs the sequence).
3. **Mixed lengths** (in this process): one batch of long and short prompts sent as one batch whose
   prefill is grouped by width (:mod:`workloads.serving.engine.prefill_plan`), as one batch prefilled jointly,
   and as one batch per length bucket in turn (how the batcher kept lengths apart before).

    python -m bench.serving_llm [--rates 2 4 8] [--duration 20] [--seed 0]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from bench import _common
from bench.serving import REPLICA_TPU, _serve_slice, serve_shape, write_checkpoint_process

SYSTEM_LENGTHS = (256, 400, 600)
SYSTEM_WEIGHTS = (0.45, 0.3, 0.15)
"""Share of requests per system prompt; the remaining 10% have none."""
USER_LENGTHS = (16, 160)
OUTPUT_LENGTHS = (8, 16, 32)
REQUEST_TIMEOUT_S = 120.0
DECODE_CONTEXTS = (64, 256, 960)
DECODE_STEPS = 64
UNCACHED_STEPS = 4


@dataclass(frozen=True)
class Request:
    at_s: float
    prompt: str
    max_tokens: int
    system: int
    """Index of its system prompt, -1 for none."""


def trace(seed: int, rate: float, duration_s: float) -> list[Request]:
    """Poisson arrivals at ``rate`` per second for ``duration_s``; prompts cut from the corpus:
    a system prompt (by SYSTEM_WEIGHTS) then a user turn of USER_LENGTHS bytes."""
    from workloads.data import corpus

    text = corpus.load_corpus()
    rng = np.random.default_rng(seed)
    systems = []
    for length in SYSTEM_LENGTHS:
        start = int(rng.integers(0, len(text) - length))
        systems.append(text[start : start + length])
    requests, at = [], 0.0
    weights = np.array([*SYSTEM_WEIGHTS, 1 - sum(SYSTEM_WEIGHTS)])
    while True:
        at += float(rng.exponential(1.0 / rate))
        if at >= duration_s:
            return requests
        system = int(rng.choice(len(weights), p=weights))
        length = int(rng.integers(*USER_LENGTHS))
        start = int(rng.integers(0, len(text) - length))
        head = systems[system] if system < len(systems) else ""
        requests.append(
            Request(
                at,
                head + "User: " + text[start : start + length],
                int(rng.choice(OUTPUT_LENGTHS)),
                system if system < len(systems) else -1,
            )
        )


async def _one(session: Any, url: str, request: Request, began: float) -> dict[str, Any]:
    await asyncio.sleep(max(0.0, began + request.at_s - time.perf_counter()))
    body = {
        "model": "raytpu-byte-lm",
        "prompt": request.prompt,
        "max_tokens": request.max_tokens,
        "temperature": 0.0,
        "stream": True,
    }
    sent = time.perf_counter()
    first = last = None
    async with session.post(url, json=body) as response:
        if response.status != 200:
            return {"error": f"HTTP {response.status}: {(await response.read())[:200]!r}"}
        async for line in response.content:
            if line.startswith(b"data: ") and not line.startswith(b"data: [DONE]"):
                last = time.perf_counter()
                first = first or last
    if first is None or last is None:
        return {"error": "no event"}
    tpot = (last - first) / (request.max_tokens - 1) if request.max_tokens > 1 else None
    return {"ttft": first - sent, "tpot": tpot, "tokens": request.max_tokens, "done": last}


async def _replay(url: str, requests: list[Request]) -> dict[str, Any]:
    import aiohttp

    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        began = time.perf_counter()
        results = await asyncio.gather(
            *(_one(session, url, r, began) for r in requests), return_exceptions=True
        )
    ok = [r for r in results if isinstance(r, dict) and "ttft" in r]
    failed = [
        str(r.get("error") if isinstance(r, dict) else r)[:200] for r in results if r not in ok
    ]
    span = max((r["done"] for r in ok), default=began) - began
    return {"ok": ok, "errors": failed, "seconds": span}


def floor_deployment() -> Any:
    """A trivial Serve deployment: the same streaming reply shapes (``/v1/completions`` and
    ``/v1/chat/completions``, by the request's path), no model."""
    from ray import serve

    @serve.deployment(max_ongoing_requests=512, ray_actor_options={"num_cpus": 0})
    class Floor:
        async def __call__(self, request: Any) -> Any:
            from starlette.responses import StreamingResponse

            from workloads.serving import openai_api

            route = openai_api.route_of(request.url.path)
            if route != openai_api.CHAT:
                route = openai_api.COMPLETIONS  # the trivial floor answers any path as one
            parsed = openai_api.parse(route, await request.body(), "raytpu-byte-lm")
            completion = openai_api.Completion(parsed)
            wanted = parsed.generate.max_new_tokens

            async def events():
                yield completion.event([32], last=wanted == 1)
                if wanted > 1:
                    yield completion.event([32] * (wanted - 1), last=True)

            return StreamingResponse(events(), media_type="text/event-stream")

    return Floor.bind()


def _prefix_counts(app: str) -> dict[str, Any] | None:
    from ray import serve

    handle = serve.get_deployment_handle("TextGenerator", app)
    return handle.describe.remote().result(timeout_s=60)["prefix"]


def _hit_rate(before: dict[str, Any] | None, after: dict[str, Any] | None) -> float | None:
    if before is None or after is None:
        return None
    hits = sum(after["hits"].values()) - sum(before["hits"].values())
    misses = after["misses"] - before["misses"]
    return hits / (hits + misses) if hits + misses else None


def cache_apps(checkpoint_dir: str, labels: Sequence[str]) -> dict[str, Any]:
    """``labels`` (cache on, cache off, floor) -> the three applications measured side by
    side: the built-in app with the prefix cache on and off, and the trivial floor."""
    from workloads.serving.app import build_app
    from workloads.serving.replica import ServeOptions

    on, off, floor = labels
    return {
        on: build_app(
            checkpoint_dir, tpu_per_replica=REPLICA_TPU, options=ServeOptions(shared_prefix=False)
        ),
        off: build_app(
            checkpoint_dir, tpu_per_replica=REPLICA_TPU, options=ServeOptions(prefix_cache=False)
        ),
        floor: floor_deployment(),
    }


def traffic(checkpoint_dir: str, rates: Sequence[float], duration_s: float, seed: int) -> list:
    from workloads.serving.app import deploy, shutdown
    from workloads.sim.local_cluster import LocalSliceCluster

    shape = serve_shape()
    apps = cache_apps(
        checkpoint_dir,
        (
            "built-in, prefix cache on",
            "built-in, prefix cache off",
            "trivial Serve deployment (floor)",
        ),
    )
    names = {label: f"app{i}" for i, label in enumerate(apps)}
    rows = []
    with LocalSliceCluster([_serve_slice(shape)]) as cluster:
        _common.progress(f"cluster up in {cluster.start_seconds:.1f} s")
        port = _common.free_port()
        urls = {}
        try:
            for label, app in apps.items():
                _common.progress(f"deploying {label}")
                handle = deploy(
                    app,
                    port=port,
                    name=names[label],
                    route_prefix=f"/{names[label]}",
                    timeout_s=300,
                )
                urls[label] = handle.url + "/v1/completions"
            warm = trace(seed + 1, 2.0, 4.0)
            for label in apps:
                _common.progress(f"warming up {label} ({len(warm)} requests)")
                asyncio.run(_replay(urls[label], warm))
            for rate in rates:
                requests = trace(seed, rate, duration_s)
                for label in apps:
                    cached = label.startswith("built-in")
                    before = _prefix_counts(names[label]) if cached else None
                    _common.progress(f"rate {rate:g}/s: {label}, {len(requests)} requests")
                    done = asyncio.run(_replay(urls[label], requests))
                    after = _prefix_counts(names[label]) if cached else None
                    rows.append(_row(label, rate, requests, done, _hit_rate(before, after)))
        finally:
            shutdown()
    return rows


def _row(label: str, rate: float, requests: list, done: dict, hit_rate: float | None) -> dict:
    ok = done["ok"]
    ttft = _common.summarize([r["ttft"] for r in ok]) if ok else None
    tpots = [r["tpot"] for r in ok if r["tpot"] is not None]
    tpot = _common.summarize(tpots) if tpots else None
    seconds = done["seconds"] or float("nan")
    return {
        "app": label,
        "rate": rate,
        "sent": len(requests),
        "completed": len(ok),
        "errors": len(done["errors"]),
        "firstErrors": done["errors"][:3],
        "ttft": ttft.to_dict() if ttft else None,
        "tpot": tpot.to_dict() if tpot else None,
        "rps": len(ok) / seconds,
        "tokensPerS": sum(r["tokens"] for r in ok) / seconds,
        "prefixHitRate": hit_rate,
    }


# -- decode cost ----------------------------------------------------------------------------------


def decode_cost(repeats: int) -> list[dict[str, Any]]:
    """Per-token decode time at DECODE_CONTEXTS prompt lengths: engine loop, bare loop, uncached."""
    import jax
    import jax.numpy as jnp

    from workloads.model import byte_lm as m
    from workloads.serving.engine import decode as d

    cfg = m.ModelConfig()
    params = m.init_state(cfg, jax.random.PRNGKey(0)).params
    lm = m.DecoderLM(cfg)

    @jax.jit
    def bare(params, kv, token, position):
        def step(_, carry):
            kv, token, position = carry
            logits, kv = lm.apply({"params": params}, token[:, None], position[:, None], kv)
            return kv, jnp.argmax(logits[:, 0], -1).astype(jnp.int32), position + 1

        return jax.lax.fori_loop(0, DECODE_STEPS, step, (kv, token, position))[1]

    def timed(fn) -> float:
        fn()  # compile
        samples = []
        for _ in range(repeats):
            began = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - began)
        return _common.summarize(samples).median

    rows = []
    for context in DECODE_CONTEXTS:
        prompt = "x" * context
        ids = [d.prompt_ids(cfg, prompt, DECODE_STEPS)]

        def engine(ids=ids):
            kv = d.new_cache(cfg, 1, None)
            state = d.prefill(params, cfg, kv, d.PrefillInputs.fresh(ids, [0.0]))
            jax.block_until_ready(state.logits)
            began = time.perf_counter()
            d.decode(params, cfg, state, DECODE_STEPS, cap=256)
            return time.perf_counter() - began

        def bare_loop(ids=ids):
            kv = d.new_cache(cfg, 1, None)
            state = d.prefill(params, cfg, kv, d.PrefillInputs.fresh(ids, [0.0]))
            token = jnp.argmax(state.logits, -1).astype(jnp.int32)
            jax.block_until_ready(token)
            began = time.perf_counter()
            bare(params, state.kv, token, state.positions).block_until_ready()
            return time.perf_counter() - began

        engine_s, bare_s = (
            t / DECODE_STEPS for t in _interleaved(engine, bare_loop, repeats=repeats)
        )
        uncached_s = (
            timed(
                lambda p=prompt: d.generate_tokens_uncached(
                    params, cfg, [p], [UNCACHED_STEPS], [0.0]
                )
            )
            / UNCACHED_STEPS
        )
        rows.append(
            {
                "context": context,
                "engineTokenS": engine_s,
                "bareTokenS": bare_s,
                "uncachedTokenS": uncached_s,
                "engineOverBare": _common.ratio(engine_s, bare_s),
                "uncachedOverEngine": _common.ratio(uncached_s, engine_s),
            }
        )
        _common.progress(f"decode cost at context {context}: {engine_s * 1e3:.2f} ms/token")
    return rows


def _interleaved(*fns, repeats: int) -> tuple[float, ...]:
    """Medians of each ``fn()`` (each returns its own seconds), called in turn so that the load
    of other processes hits them alike."""
    for fn in fns:
        fn()  # compile
    samples: list[list[float]] = [[] for _ in fns]
    for _ in range(repeats):
        for fn, own in zip(fns, samples, strict=True):
            own.append(fn())
    return tuple(_common.summarize(own).median for own in samples)


MIXED_PROMPTS = (760, 760, 300, 300, 20, 20, 20, 20)
"""One batch as the trace makes them: two long system-prompt turns, two mid, four short."""


def mixed_batch(repeats: int) -> list[dict[str, Any]]:
    """One batch of MIXED_PROMPTS (16 new tokens each, default model): sent as one batch with
    the prefill grouped by width, as one batch prefilled jointly (every row padded to the
    longest), and as the length-bucket batcher did before (one batch per bucket, in turn)."""
    import jax

    from workloads.model import byte_lm as m
    from workloads.serving.engine import decode as d
    from workloads.serving.engine.engine import Engine, Row

    cfg = m.ModelConfig()
    params = m.init_state(cfg, jax.random.PRNGKey(0)).params
    rows = [Row(chr(97 + i) * n, 16, 0.0) for i, n in enumerate(MIXED_PROMPTS)]
    buckets = (1, 2, 4, 8)
    grouped = Engine(params, cfg, None, buckets, cap=16)
    joint = Engine(params, cfg, None, buckets, cap=16, split_prefill=False)
    widths = {d.length_bucket(n, cfg.context_len) for n in MIXED_PROMPTS}
    by_bucket = [
        [
            r
            for r, n in zip(rows, MIXED_PROMPTS, strict=True)
            if d.length_bucket(n, cfg.context_len) == w
        ]
        for w in sorted(widths, reverse=True)
    ]
    seen: dict[str, list[Any]] = {}

    def timed(label: str, engine: Engine, batches: list[list[Row]]):
        def run() -> float:
            began = time.perf_counter()
            seen[label] = [engine.generate(batch, seed=0)[1] for batch in batches]
            return time.perf_counter() - began

        return run

    modes = {
        "one batch, prefill by width": timed("grouped", grouped, [rows]),
        "one batch, joint prefill": timed("joint", joint, [rows]),
        "a batch per length bucket": timed("bucketed", joint, by_bucket),
    }
    medians = _interleaved(*modes.values(), repeats=repeats)
    out = []
    for (label, _), key, wall in zip(modes.items(), seen, medians, strict=True):
        timings = seen[key]
        out.append(
            {
                "mode": label,
                "wallS": wall,
                "prefillS": sum(t.prefill_s for t in timings),
                "positions": sum(t.prefill_positions for t in timings),
                "programs": sum(t.prefill_groups for t in timings),
            }
        )
    _common.progress("mixed batch: " + ", ".join(f"{r['mode']} {r['wallS']:.2f} s" for r in out))
    return out


# -- report -------------------------------------------------------------------------------------


def _pct(stats: dict | None, key: str) -> str:
    return _common.fmt_seconds(stats[key]) if stats else "n/a"


def report(result: dict[str, Any]) -> None:
    rows = [
        [
            r["app"],
            f"{r['rate']:g}",
            f"{r['completed']}/{r['sent']}",
            _pct(r["ttft"], "p50"),
            _pct(r["ttft"], "p99"),
            _pct(r["tpot"], "p50"),
            _pct(r["tpot"], "p99"),
            f"{r['rps']:.2f}",
            f"{r['tokensPerS']:.0f}",
            "n/a" if r["prefixHitRate"] is None else f"{r['prefixHitRate']:.0%}",
        ]
        for r in result["traffic"]
    ]
    _common.print_table(
        f"Open-loop Poisson traffic, streaming /v1/completions, {result['durationS']:g} s per "
        f"rate, seed {result['seed']} ({_common.machine_line()})",
        [
            "app",
            "rate/s",
            "done",
            "TTFT p50",
            "TTFT p99",
            "TPOT p50",
            "TPOT p99",
            "req/s",
            "tok/s",
            "prefix hits",
        ],
        rows,
    )
    _common.print_table(
        f"Decode cost per new token ({DECODE_STEPS} steps, context_len 1024, batch 1)",
        [
            "prompt tokens",
            "engine loop",
            "bare jitted loop",
            "engine / bare",
            "uncached",
            "uncached / engine",
        ],
        [
            [
                r["context"],
                _common.fmt_seconds(r["engineTokenS"]),
                _common.fmt_seconds(r["bareTokenS"]),
                _common.fmt_ratio(r["engineOverBare"]),
                _common.fmt_seconds(r["uncachedTokenS"]),
                _common.fmt_ratio(r["uncachedOverEngine"]),
            ]
            for r in result["decode"]
        ],
    )
    _common.print_table(
        f"One batch of prompts of {', '.join(map(str, MIXED_PROMPTS))} bytes, 16 new tokens each "
        "(default model, one device)",
        ["sent as", "wall (median)", "prefill", "prefill positions", "prefill programs"],
        [
            [
                r["mode"],
                _common.fmt_seconds(r["wallS"]),
                _common.fmt_seconds(r["prefillS"]),
                r["positions"],
                r["programs"],
            ]
            for r in result["mixed"]
        ],
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.serving_llm", description=__doc__)
    parser.add_argument("--rates", type=float, nargs="+", default=[2.0, 4.0, 8.0])
    parser.add_argument("--duration", type=float, default=20.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--skip-traffic", action="store_true")
    args = parser.parse_args(argv)
    for rate in args.rates:
        if not 0 < rate <= 100:
            parser.error(f"--rates: {rate!r} is not valid; valid: 0 < rate <= 100")
    if not 1 <= args.duration <= 600:
        parser.error(f"--duration: {args.duration!r} is not valid; valid: 1..600 seconds")
    result: dict[str, Any] = {"seed": args.seed, "durationS": args.duration, "rates": args.rates}
    if not args.skip_traffic:
        with tempfile.TemporaryDirectory(prefix="bench-llm-") as checkpoint_dir:
            _common.progress("saving a checkpoint of the workload's model (separate process)")
            write_checkpoint_process(checkpoint_dir)
            result["traffic"] = traffic(checkpoint_dir, args.rates, args.duration, args.seed)
    else:
        result["traffic"] = []
    _common.progress("decode cost, in this process")
    result["decode"] = decode_cost(args.repeats)
    _common.progress("a batch of mixed prompt lengths, in this process")
    result["mixed"] = mixed_batch(args.repeats)
    result["machine"] = _common.machine_info()
    report(result)
    path = _common.write_results("serving_llm", result)
    _common.progress(f"results: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
