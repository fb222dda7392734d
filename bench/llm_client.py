"""A standard LLM benchmark client (NVIDIA AIPerf) against our OpenAI-compatible endpoint.

The applications are the ones :mod:`bench.serving_llm` puts up side by side on one simulated v6e
2x2 serving host (its start-up and floor are reused): the built-in app with the prefix cache, the
same app without it, and the trivial Serve deployment that streams the right number of tokens
without a model (the floor). ``raytpu serve --local`` deploys the same built-in app
(:func:`workloads.serving.app.build_app` + ``deploy``) but has no option to turn the prefix cache
off, hence the apps are built here.

For each endpoint (``/v1/completions``, ``/v1/chat/completions``), rate and app, one
``aiperf profile`` run: streaming, a synthetic prefix-sharing profile (``--num-prefix-prompts``
prefixes of ``--prefix-prompt-length`` tokens, one of them prepended to every user prompt of
``--isl`` tokens), ``--osl`` new tokens, Poisson arrivals at the rate, a fixed request count. The
tokenizer is a local byte-level one (the served model reads bytes: one token per byte), written
from :func:`workloads.data.text_data.tokenizer_json`; nothing is fetched from the Hub. Printed:
AIPerf's own report table per run, then a side-by-side table of the key numbers (TTFT p50/p99,
ITL p50, output tokens/s, requests/s, and the replica's prefix-cache hit rate).

The floor answers both routes in their own reply shapes (``bench.serving_llm.floor_deployment``
parses a body by its request's path), so each endpoint has its floor row.

AIPerf is not installed with the project's dev dependencies (it pins rich, pandas and psutil
below this venv's): install the ``bench`` extra into its own venv and point ``RAYTPU_AIPERF`` at
its ``aiperf`` (or put it on PATH)::

    python3.11 -m venv /tmp/aiperf-venv && /tmp/aiperf-venv/bin/pip install aiperf==0.13.0
    RAYTPU_AIPERF=/tmp/aiperf-venv/bin/aiperf python -m bench.llm_client [--rates 2 4]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import _common

CLIENT = "aiperf"
CLIENT_VERSION = "0.13.0"
MODEL = "raytpu-byte-lm"
ENDPOINTS = ("completions", "chat")
APPS = ("cache on", "cache off", "floor")
BOX = set("┏┃┡│└━┗╇")
RUN_TIMEOUT_S = 240.0


@dataclass(frozen=True)
class Profile:
    """The synthetic prefix-sharing workload, in tokens (bytes for the byte LM)."""

    prefixes: int = 2
    prefix_tokens: int = 384
    isl: int = 48
    osl: int = 16
    requests: int = 16
    warmup: int = 2
    seed: int = 0


def client_command(
    client: str, url: str, endpoint: str, rate: float, profile: Profile, tokenizer: str, out: str
) -> list[str]:
    """The ``aiperf profile`` command line for one (endpoint, rate, app) run."""
    if endpoint not in ENDPOINTS:
        raise ValueError(f"endpoint: {endpoint!r} is not valid; valid: {', '.join(ENDPOINTS)}")
    return [
        client,
        "profile",
        "--model",
        MODEL,
        "--url",
        url,
        "--endpoint-type",
        endpoint,
        "--streaming",
        "--tokenizer",
        tokenizer,
        "--request-rate",
        f"{rate:g}",
        "--arrival-pattern",
        "poisson",
        "--request-count",
        str(profile.requests),
        "--warmup-request-count",
        str(profile.warmup),
        "--num-prefix-prompts",
        str(profile.prefixes),
        "--prefix-prompt-length",
        str(profile.prefix_tokens),
        "--isl",
        str(profile.isl),
        "--isl-stddev",
        "0",
        "--osl",
        str(profile.osl),
        "--random-seed",
        str(profile.seed),
        "--workers-max",
        "2",
        # Token counts from our usage event: the byte LM emits raw bytes, and the text a client
        # sees has U+FFFD (3 bytes) for each invalid sequence, so re-tokenizing it overcounts.
        "--use-server-token-count",
        "--ui-type",
        "none",
        "--artifact-dir",
        out,
    ]


KEY_METRICS = {
    "ttftP50": ("time_to_first_token", "p50"),
    "ttftP99": ("time_to_first_token", "p99"),
    "itlP50": ("inter_token_latency", "p50"),
    "itlP99": ("inter_token_latency", "p99"),
    "outputTokensPerS": ("output_token_throughput", "avg"),
    "requestsPerS": ("request_throughput", "avg"),
    "completed": ("request_count", "avg"),
    "errors": ("error_request_count", "avg"),
}
"""Side-by-side key -> (AIPerf metric tag, statistic); ``error_request_count`` is absent when
no request failed."""
TO_SECONDS = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0, "sec": 1.0}


def key_numbers(export: dict[str, Any]) -> dict[str, float | None]:
    """The key numbers of AIPerf's ``profile_export_aiperf.json``: latencies in seconds (from
    the metric's ``unit``), throughputs as reported; ``None`` where the metric is absent."""
    out: dict[str, float | None] = {}
    for key, (tag, stat) in KEY_METRICS.items():
        metric = export.get(tag)
        value = metric.get(stat) if isinstance(metric, dict) else None
        if value is not None and key.startswith(("ttft", "itl")):
            unit = metric.get("unit", "ms")
            if unit not in TO_SECONDS:
                raise ValueError(f"{tag}.unit: {unit!r} is not valid; valid: {list(TO_SECONDS)}")
            value = float(value) * TO_SECONDS[unit]
        out[key] = None if value is None else float(value)
    return out


def client_table(stdout: str, metric: str = "Time to First Token") -> str:
    """AIPerf's own report table out of its console output: the box-drawn table (``┏`` .. ``┘``)
    that has a ``metric`` row (its LLM metrics: TTFT, ITL, throughput), else its first table;
    the log lines, the other tables and the warning panels are dropped."""
    tables: list[list[str]] = []
    for line in stdout.splitlines():
        text = line.rstrip()
        if text.lstrip().startswith("┏"):
            tables.append([text])
        elif tables and tables[-1][-1].lstrip()[:1] != "└" and text.lstrip()[:1] in BOX:
            tables[-1].append(text)
    chosen = [t for t in tables if any(metric in row for row in t)] or tables[:1]
    return "\n".join(chosen[0]) if chosen else ""


def write_tokenizer(directory: Path) -> Path:
    """A byte-level Hugging Face tokenizer folder (one token per byte, as the byte LM reads):
    BPE trained to 257 tokens (the 256 bytes and ``<|endoftext|>``: no merges)."""
    from workloads.data.text_data import SPECIAL, tokenizer_json

    directory.mkdir(parents=True, exist_ok=True)
    (directory / "tokenizer.json").write_text(tokenizer_json("bytes\n", 256 + len(SPECIAL)))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": 1024,
        "eos_token": SPECIAL[0],
    }
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    return directory


def find_client() -> str:
    """``$RAYTPU_AIPERF``, else ``aiperf`` beside this Python, else on PATH."""
    chosen = os.environ.get("RAYTPU_AIPERF")
    if chosen:
        return chosen
    beside = Path(sys.executable).with_name(CLIENT)
    if beside.exists():
        return str(beside)
    found = shutil.which(CLIENT)
    if found:
        return found
    raise FileNotFoundError(
        f"{CLIENT}: not found (RAYTPU_AIPERF, beside {sys.executable}, PATH); valid: "
        f"python3.11 -m venv /tmp/aiperf-venv && /tmp/aiperf-venv/bin/pip install "
        f"{CLIENT}=={CLIENT_VERSION}, then RAYTPU_AIPERF=/tmp/aiperf-venv/bin/{CLIENT}"
    )


def run_client(command: list[str], out: Path) -> dict[str, Any]:
    """One AIPerf run: its key numbers, its own table, and the tail of its output on failure."""
    # The tokenizer is a local folder, so nothing is fetched; HF_HUB_OFFLINE=1 must stay unset:
    # with it AIPerf 0.13.0 looks a local path up in the Hub cache (snapshot_download) and fails.
    env = {**os.environ, "COLUMNS": "150"}
    env.pop("HF_HUB_OFFLINE", None)
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, env=env, check=False
        )
    except subprocess.TimeoutExpired:
        return {"error": f"no result after {RUN_TIMEOUT_S:.0f} s", "table": ""}
    exports = sorted(out.rglob("profile_export_aiperf.json"))
    if done.returncode != 0 or not exports:
        tail = (done.stdout + done.stderr)[-1500:]
        return {"error": f"exited {done.returncode}: {tail}", "table": client_table(done.stdout)}
    return {
        **key_numbers(json.loads(exports[-1].read_text())),
        "table": client_table(done.stdout),
    }


@contextlib.contextmanager
def serving_apps(checkpoint_dir: str) -> Iterator[dict[str, str]]:
    """The three apps of :mod:`bench.serving_llm` up side by side: label -> base URL."""
    from bench.serving import _serve_slice, serve_shape
    from bench.serving_llm import cache_apps
    from workloads.serving.app import deploy, shutdown
    from workloads.sim.local_cluster import LocalSliceCluster

    apps = cache_apps(checkpoint_dir, ("cache on", "cache off", "floor"))
    with LocalSliceCluster([_serve_slice(serve_shape())]) as cluster:
        _common.progress(f"cluster up in {cluster.start_seconds:.1f} s")
        port = _common.free_port()
        try:
            urls = {}
            for i, (label, app) in enumerate(apps.items()):
                _common.progress(f"deploying {label}")
                handle = deploy(
                    app, port=port, name=f"app{i}", route_prefix=f"/app{i}", timeout_s=300
                )
                urls[label] = handle.url
            yield urls
        finally:
            shutdown()


def prefix_counts(label: str) -> dict[str, Any] | None:
    from bench.serving_llm import _prefix_counts

    return _prefix_counts(f"app{APPS.index(label)}") if label != "floor" else None


def measure(
    urls: dict[str, str], endpoints: Sequence[str], rates: Sequence[float], profile: Profile
) -> list[dict[str, Any]]:
    from bench.serving_llm import _hit_rate

    client = find_client()
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-aiperf-") as scratch:
        tokenizer = str(write_tokenizer(Path(scratch) / "byte-tokenizer"))
        for endpoint in endpoints:
            for rate in rates:
                for label in APPS:
                    out = Path(scratch) / f"{endpoint}-{rate:g}-{label.replace(' ', '-')}"
                    command = client_command(
                        client, urls[label], endpoint, rate, profile, tokenizer, str(out)
                    )
                    _common.progress(f"{CLIENT} {endpoint} rate {rate:g}/s: {label}")
                    before = prefix_counts(label)
                    result = run_client(command, out)
                    after = prefix_counts(label)
                    if "error" in result:
                        _common.progress(f"  failed: {result['error'][-300:]}")
                    rows.append(
                        {
                            "endpoint": endpoint,
                            "rate": rate,
                            "app": label,
                            "prefixHitRate": _hit_rate(before, after),
                            **result,
                        }
                    )
    return rows


def _s(value: float | None) -> str:
    return "n/a" if value is None else _common.fmt_seconds(value)


def _n(value: float | None, digits: int = 1) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def side_by_side(rows: Sequence[dict[str, Any]]) -> list[list[str]]:
    return [
        [
            f"/v1/{'chat/completions' if r['endpoint'] == 'chat' else 'completions'}",
            f"{r['rate']:g}",
            r["app"],
            "error"
            if "error" in r
            else f"{_n(r.get('completed'), 0)}/{_n(r.get('errors') or 0, 0)}",
            _s(r.get("ttftP50")),
            _s(r.get("ttftP99")),
            _s(r.get("itlP50")),
            _n(r.get("outputTokensPerS")),
            _n(r.get("requestsPerS"), 2),
            "n/a" if r.get("prefixHitRate") is None else f"{r['prefixHitRate']:.0%}",
        ]
        for r in rows
    ]


HEADERS = (
    "endpoint",
    "rate/s",
    "app",
    "ok/err",
    "TTFT p50",
    "TTFT p99",
    "ITL p50",
    "out tok/s",
    "req/s",
    "prefix hits",
)


def report(result: dict[str, Any]) -> None:
    for row in result["runs"]:
        title = f"{CLIENT} {CLIENT_VERSION}: /v1/{row['endpoint']}, {row['rate']:g}/s, {row['app']}"
        print(f"\n{title}\n{row.get('table') or row.get('error', '')}\n", flush=True)
    p = result["profile"]
    _common.print_table(
        f"{CLIENT} {CLIENT_VERSION}, streaming, Poisson arrivals, {p['requests']} requests per "
        f"run; {p['prefixes']} shared prefixes of {p['prefix_tokens']} tokens + {p['isl']}-token "
        f"user prompts, {p['osl']} new tokens; byte tokens ({_common.machine_line()})",
        HEADERS,
        side_by_side(result["runs"]),
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.llm_client", description=__doc__)
    parser.add_argument("--rates", type=float, nargs="+", default=[2.0, 4.0])
    parser.add_argument("--endpoints", nargs="+", default=list(ENDPOINTS), choices=ENDPOINTS)
    parser.add_argument("--requests", type=int, default=Profile.requests)
    parser.add_argument("--prefix-tokens", type=int, default=Profile.prefix_tokens)
    parser.add_argument("--isl", type=int, default=Profile.isl)
    parser.add_argument("--osl", type=int, default=Profile.osl)
    parser.add_argument("--seed", type=int, default=Profile.seed)
    args = parser.parse_args(argv)
    for rate in args.rates:
        if not 0 < rate <= 50:
            parser.error(f"--rates: {rate!r} is not valid; valid: 0 < rate <= 50")
    if not 1 <= args.requests <= 500:
        parser.error(f"--requests: {args.requests!r} is not valid; valid: 1..500")
    if not 0 < args.prefix_tokens + args.isl + 16 <= 1000:
        parser.error("--prefix-tokens + --isl: too long; valid: <= 984 (prompts <= 1000 bytes)")
    if not 1 <= args.osl <= 256:
        parser.error(f"--osl: {args.osl!r} is not valid; valid: 1..256")
    find_client()  # before a cluster starts
    profile = Profile(
        prefix_tokens=args.prefix_tokens,
        isl=args.isl,
        osl=args.osl,
        requests=args.requests,
        seed=args.seed,
    )
    from bench.serving import write_checkpoint_process

    with tempfile.TemporaryDirectory(prefix="bench-llm-client-") as checkpoint_dir:
        _common.progress("saving a checkpoint of the workload's model (separate process)")
        write_checkpoint_process(checkpoint_dir)
        with serving_apps(checkpoint_dir) as urls:
            runs = measure(urls, args.endpoints, args.rates, profile)
    result = {
        "client": f"{CLIENT}=={CLIENT_VERSION}",
        "profile": profile.__dict__,
        "rates": args.rates,
        "runs": runs,
    }
    report(result)
    path = _common.write_results("llm_client", result)
    _common.progress(f"results: {path}")
    return 1 if any("error" in r for r in runs) else 0


if __name__ == "__main__":
    raise SystemExit(main())
