"""Batch inference (``raytpu batch``'s :mod:`workloads.batch`) against one request at a time
through Ray Serve, in the same run, on the same local slice cluster.

The cluster holds a v6e 2x4 batch slice (2 hosts x 4 chips, ct6e-standard-4t) and a v6e 2x2
serving slice (1 host x 4 chips); every host is a Ray node whose JAX sees 4 CPU devices. The
model is the byte LM with its weights perturbed (:func:`write_checkpoint`: a freshly initialised
one answers one byte over and over, which would make "equal outputs" say nothing).

- **Serve, one at a time**: the Serve app (:func:`workloads.serving.app.build_app`) on the
  serving slice; ``--serve-prompts`` prompts POSTed one after another (the next when the last
  answered), greedy.
- **batch**: ``--prompts`` prompts (the Serve prompts among them) through
  :func:`workloads.batch.job.run_batch` on the whole reserved batch slice, one actor per host,
  with ``--kill CHUNK``: that chunk's actor is killed once while writing (recovered, and every
  output still written exactly once).

Reported: prompts/s and new tokens/s of each (batch: from the first chunk's start to the last
chunk's end, actor start-up included, and with the killed actor's restart), their ratio, and
how many Serve completions equal the batch's for the same prompt. The two run one after the
other on the same 2 cores, so neither slows the other. The simulated hosts share those cores, so the
ratio is per machine: what batching buys over one request at a time on the same CPUs, not a
per-host or TPU figure.

    python -m bench.batch [--prompts 3000] [--serve-prompts 100] [--max-new-tokens 16]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import _common

PREFIXES = (
    "The old teacher said that the river ",
    "In the morning the train left the station and ",
    "Where did the small dog go when the rain ",
    "She opened the letter and read the first line: ",
)
"""Shared prompt prefixes (each over 2 prefix-cache blocks of 16 bytes): what the cache reuses."""


def batch_shape() -> Any:
    from raytpu.catalog import shape

    return shape("v6e", "2x4", machine_type="ct6e-standard-4t")


def serve_shape() -> Any:
    from raytpu.catalog import shape

    return shape("v6e", "2x2")


def write_checkpoint(directory: str, context_len: int = 256, noise: float = 0.3) -> str:
    """A step-1 byte-LM checkpoint whose initial weights got Gaussian noise of scale ``noise``:
    its greedy completions vary with the prompt. Returns ``directory``."""
    import jax

    from workloads.model import byte_lm as m
    from workloads.training.config import TrainConfig

    raw = {**TrainConfig(checkpoint_dir=directory).model, "context_len": context_len}
    cfg = m.ModelConfig.from_dict(raw)
    state = m.init_state(cfg, jax.random.PRNGKey(0))
    leaves, tree = jax.tree.flatten(state.params)
    keys = jax.random.split(jax.random.PRNGKey(7), len(leaves))
    noisy = [
        x + noise * jax.random.normal(k, x.shape, x.dtype)
        for x, k in zip(leaves, keys, strict=True)
    ]
    state = state.replace(params=jax.tree.unflatten(tree, noisy))
    _common.save_step_one(directory, state, cfg)
    return directory


def prompt_text(row: int) -> str:
    return f"{PREFIXES[row % len(PREFIXES)]}{row}"


def write_prompts(path: Path, count: int, max_new_tokens: int) -> Path:
    """``count`` greedy prompts, JSON Lines: a shared prefix and the row number."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as out:
        for row in range(count):
            line = {"prompt": prompt_text(row), "max_new_tokens": max_new_tokens, "id": f"p{row}"}
            out.write(json.dumps(line) + "\n")
    return path


def serve_one_at_a_time(
    checkpoint: str,
    prompts: list[str],
    max_new_tokens: int,
    timeout_s: float = 240.0,
    precompile: bool = True,
    sampled: dict[int, tuple[float, int]] | None = None,
) -> dict[str, Any]:
    """Deploy the Serve app on the serving slice, POST each prompt after the last answered;
    its completions and the time the requests took (deploy and warm-up left out).
    ``precompile=False``: the replica compiles only what the requests need (tests).
    ``sampled``: prompt index -> (temperature, seed) of those asked sampled (else greedy)."""
    from raytpu_cli.common import post_json
    from workloads.serving import app as serving
    from workloads.serving.replica import ServeOptions
    from workloads.sim.local_cluster import free_port

    application = serving.build_app(
        checkpoint, serve_shape(), options=ServeOptions(precompile=precompile)
    )
    handle = serving.deploy(application, port=free_port(), timeout_s=timeout_s)
    try:

        def ask(prompt: str, index: int = 0) -> Any:
            body = {"prompt": prompt, "max_new_tokens": max_new_tokens, "temperature": 0}
            if index in (sampled or {}):
                body["temperature"], body["seed"] = (sampled or {})[index]
            reply = post_json(handle.url, body, timeout_s=120)
            if reply.status != 200:
                raise RuntimeError(f"serve answered {reply.status}: {reply.body}")
            return reply.body["completion"]

        ask(prompts[0])  # the first request compiles what the replica did not
        began = time.monotonic()
        completions = [ask(p, i) for i, p in enumerate(prompts)]
        seconds = time.monotonic() - began
    finally:
        serving.shutdown()
    return {"completions": completions, "seconds": seconds, "deploy_s": handle.deploy_s}


def run(args: argparse.Namespace) -> dict[str, Any]:
    from raytpu_cli.common import SliceChoice
    from workloads.batch import files
    from workloads.batch.job import BatchConfig, plan_batch, run_batch
    from workloads.sim.local_cluster import LocalSliceCluster

    work = Path(tempfile.mkdtemp(prefix="raytpu-bench-batch-"))
    checkpoint = write_checkpoint(str(work / "ck"))
    source = write_prompts(work / "prompts.jsonl", args.prompts, args.max_new_tokens)
    slices = [SliceChoice("batch", batch_shape(), 1), SliceChoice("serve", serve_shape(), 1)]
    with LocalSliceCluster(slices):
        _common.progress(f"serve: {args.serve_prompts} prompts one at a time")
        served = serve_one_at_a_time(
            checkpoint, [prompt_text(r) for r in range(args.serve_prompts)], args.max_new_tokens
        )
        _common.progress(f"batch: {args.prompts} prompts, chunk {args.kill} killed (-1: none)")
        config = BatchConfig(
            input=str(source),
            output=str(work / "out"),
            checkpoint_dir=checkpoint,
            chunk_rows=args.chunk_rows,
            batch_size=args.batch_size,
            max_new_tokens=args.max_new_tokens,
            kill_chunk=args.kill if args.kill >= 0 else None,
        )
        result = run_batch(batch_shape(), plan_batch(config))
    records = {r["row"]: r for r in files.read_outputs(config.output)}
    equal = sum(
        records[row]["completion"] == text for row, text in enumerate(served["completions"])
    )
    return {
        "prompts": args.prompts,
        "serve_prompts": args.serve_prompts,
        "max_new_tokens": args.max_new_tokens,
        "serve_s": served["seconds"],
        "serve_prompts_per_s": _common.ratio(args.serve_prompts, served["seconds"]),
        "batch_s": result.run_s,
        "batch_prompts_per_s": result.rows_per_s,
        "batch_tokens": result.tokens,
        "batch_hosts": result.hosts,
        "killed_chunk": args.kill,
        "exactly_once": result.check.exactly_once,
        "output_files": result.check.files,
        "equal_to_serve": equal,
        "cached_tokens": sum(c.cached_tokens for c in result.chunks_written),
    }


def report(figures: dict[str, Any]) -> str:
    serve_rate, batch_rate = figures["serve_prompts_per_s"], figures["batch_prompts_per_s"]
    tokens = figures["max_new_tokens"]
    rows = [
        (
            f"Serve, one request at a time ({figures['serve_prompts']} prompts, 1 host)",
            f"{serve_rate:.1f}",
            f"{serve_rate * tokens:.0f}",
            f"{figures['serve_s']:.1f} s",
        ),
        (
            f"batch, Ray Data ({figures['prompts']} prompts, {figures['batch_hosts']} hosts, "
            + (
                f"chunk {figures['killed_chunk']}'s actor killed)"
                if figures["killed_chunk"] >= 0
                else "no kill)"
            ),
            f"{batch_rate:.1f}",
            f"{figures['batch_tokens'] / figures['batch_s']:.0f}",
            f"{figures['batch_s']:.1f} s",
        ),
    ]
    text = _common.print_table(
        f"Batch vs Serve one at a time ({tokens} new tokens per prompt, greedy)",
        ("path", "prompts/s", "new tokens/s", "time"),
        rows,
    )
    lines = [
        f"batch / Serve: {_common.fmt_ratio(_common.ratio(batch_rate, serve_rate))} on the same "
        "cores (the simulated hosts share this machine's CPUs: a per-host figure would mean "
        "nothing here)",
        f"outputs equal to Serve's: {figures['equal_to_serve']} of {figures['serve_prompts']}",
        f"exactly once: {figures['exactly_once']} ({figures['output_files']} files); "
        f"prefix cache served {figures['cached_tokens']:,} prompt tokens",
        _common.machine_line(),
    ]
    print("\n".join(lines), flush=True)
    return text + "\n" + "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.batch", description=__doc__)
    parser.add_argument("--prompts", type=int, default=3000)
    parser.add_argument("--serve-prompts", type=int, default=100)
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--chunk-rows", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument(
        "--kill", type=int, default=3, help="chunk whose actor is killed once (-1: none)"
    )
    args = parser.parse_args(argv)
    if not 1 <= args.serve_prompts <= args.prompts:
        parser.error(f"--serve-prompts: {args.serve_prompts} must be 1..--prompts")
    figures = run(args)
    report(figures)
    _common.write_results("batch", figures)
    return 0 if figures["exactly_once"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
