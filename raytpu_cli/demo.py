"""The main job: train and serve on a simulated TPU slice cluster built from a stack's config.

Starts the local slice cluster for the stack's training and serving slices, reserves the
training slice, trains the byte-level LM through JaxTrainer (checkpointing with Orbax), deploys
the Ray Serve app on the serving slice, sends a few requests, and prints a summary.

Example:
  raytpu demo                 # the dev stack, about 3-4 minutes on 2 cores
  raytpu demo --steps 40 --workdir /tmp/demo
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from raytpu.table import format_table
from raytpu_cli.common import SliceChoice, UsageError, describe_hosts, post_json

PROMPTS = (
    "The old teacher",
    "Where did the captain go",
    "To bake bread, mix flour",
    "In the morning, my sister",
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("--stack", default="dev", help="Pulumi stack (default dev)")
    parser.add_argument("--train-slice", help="default: the slice of the stack's first RayCluster")
    parser.add_argument("--serve-slice", help="default: the slice of the stack's first RayService")
    parser.add_argument("--steps", type=int, default=80, help="training steps (default 80)")
    parser.add_argument("--checkpoint-every", type=int, default=40)
    parser.add_argument("--workdir", help="checkpoints and Ray Train results (default: a temp dir)")
    parser.add_argument("--max-new-tokens", type=int, default=48)


def _pick_slices(args: argparse.Namespace) -> tuple[SliceChoice, SliceChoice]:
    from raytpu_cli.common import load_stack_config

    stack = load_stack_config(args)
    train_name = args.train_slice or (stack.ray_clusters[0].slice if stack.ray_clusters else None)
    serve_name = args.serve_slice or (stack.ray_services[0].slice if stack.ray_services else None)
    if train_name is None or serve_name is None:
        raise UsageError(
            f"stack {args.stack}: needs a RayCluster and a RayService, or --train-slice and "
            f"--serve-slice; valid slices: {', '.join(s.name for s in stack.slices)}"
        )
    train, serve = stack.slice(train_name), stack.slice(serve_name)
    if serve.shape.multi_host:
        raise UsageError(
            f"--serve-slice: {serve.name} ({serve.shape.name}) is not valid; valid: a single-host slice"
        )
    # One copy of each is enough for the demo, however many the stack declares.
    return SliceChoice(train.name, train.shape, 1), SliceChoice(serve.name, serve.shape, 1)


def run(args: argparse.Namespace) -> int:
    from workloads import serve as serving
    from workloads.local_cluster import LocalSliceCluster, free_port
    from workloads.train import TrainConfig, TrainingError, run_training

    began = time.monotonic()
    try:
        train, serve_slice = _pick_slices(args)
        config = TrainConfig(
            checkpoint_dir="",  # set below once the workdir exists
            steps=args.steps,
            checkpoint_every=args.checkpoint_every,
        )
        config.validate(train.shape, 1)
    except (UsageError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    workdir = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="raytpu-demo-"))
    checkpoint_dir = workdir / "checkpoints"
    if checkpoint_dir.exists():
        shutil.rmtree(checkpoint_dir)  # the demo always trains from scratch
    config = TrainConfig(
        checkpoint_dir=str(checkpoint_dir), steps=args.steps, checkpoint_every=args.checkpoint_every
    )
    print(f"[demo] stack {args.stack}: {describe_hosts([train, serve_slice])}", flush=True)
    try:
        with LocalSliceCluster([train, serve_slice]) as cluster:
            print(f"[demo] slice cluster up in {cluster.start_seconds:.1f} s", flush=True)
            result = run_training(train.shape, config, storage_path=str(workdir / "ray_results"))
            print(
                f"[demo] trained: loss {result.first_loss:.3f} -> {result.last_loss:.3f}",
                flush=True,
            )
            handle = serving.deploy(
                serving.build_app(str(checkpoint_dir), serve_slice.shape), port=free_port()
            )
            print(f"[demo] serving at {handle.url}", flush=True)
            try:
                replies = _ask(handle.url, args.max_new_tokens)
                bad = post_json(handle.url, None, raw=b"{not json")
            finally:
                serving.shutdown()
    except (TrainingError, TimeoutError, RuntimeError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted: everything this command started was stopped", file=sys.stderr)
        return 130
    latencies = sorted(r.seconds * 1000 for _, r in replies)
    rows = [
        ("stack", args.stack),
        ("training slice", f"{train.name}: {train.shape.name}, {train.shape.machine_type}"),
        ("hosts / chips", f"{train.shape.hosts} hosts x {train.shape.chips_per_host} chips"),
        (
            "placement",
            f"reserved {', '.join(result.slice_names)} in {result.placement_wait_s:.1f} s",
        ),
        (
            "jax processes / devices",
            f"{result.process_count} / {result.device_count} (mesh over all devices)",
        ),
        ("steps", f"{result.resumed_from} -> {result.final_step} in {result.seconds:.0f} s"),
        ("loss first -> last", f"{result.first_loss:.3f} -> {result.last_loss:.3f}"),
        ("checkpoint", f"{result.checkpoint_dir} (latest step {result.latest_checkpoint})"),
        ("serving slice", f"{serve_slice.name}: {serve_slice.shape.name}"),
        ("serve deploy", f"{handle.deploy_s:.1f} s at {handle.url}"),
    ]
    for prompt, reply in replies:
        text = reply.body.get("completion", reply.body)
        rows.append((f"sample {prompt!r}", f"{reply.status}: {text!r}"))
    rows.append(
        (
            "request latency",
            f"min {latencies[0]:.0f} ms, max {latencies[-1]:.0f} ms over {len(latencies)} "
            f"concurrent requests (batch sizes "
            f"{sorted({r.body.get('batch_size') for _, r in replies}, key=str)})",
        )
    )
    rows.append(("bad JSON request", f"{bad.status}: {bad.body.get('error', bad.body)}"))
    rows.append(("total", f"{time.monotonic() - began:.0f} s"))
    print()
    print(format_table(("demo", "result"), rows))
    fell = result.last_loss < 0.75 * result.first_loss
    ok = fell and all(r.status == 200 for _, r in replies) and bad.status == 400
    if not fell:
        print("error: the loss did not fall by at least 25%", file=sys.stderr)
    return 0 if ok else 1


def _ask(url: str, max_new_tokens: int) -> list[tuple[str, object]]:
    """Send all prompts at once so that Serve can batch them."""

    def one(prompt: str) -> tuple[str, object]:
        payload = {"prompt": prompt, "max_new_tokens": max_new_tokens, "temperature": 0.5}
        return prompt, post_json(url, payload, timeout_s=120)

    with ThreadPoolExecutor(max_workers=len(PROMPTS)) as pool:
        return list(pool.map(one, PROMPTS))
