"""The main job: train and serve on a simulated TPU slice cluster built from a stack's config.

Starts a GCS emulator in place of the stack's checkpoint bucket and the local slice cluster for
the stack's training and serving slices (each simulated host in its own folder), reserves the
training slice, trains the byte-level LM through JaxTrainer (every host writing its Orbax shards
to ``gs://``), deploys the Ray Serve app on the serving slice (loading from ``gs://``), sends a
few requests, and prints a summary.

Example:
  raytpu demo                 # the dev stack, about 3-4 minutes on 2 cores
  raytpu demo --steps 40 --workdir /tmp/demo
  raytpu demo --verbose       # Ray's and JAX's logs on the console too

The console shows the phases, progress bars and the summary table; Ray's and JAX's logs go to
``<workdir>/demo.log`` (its path is printed first). Ctrl-C (or SIGTERM) at any phase stops every
process the demo started and exits 130.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from raytpu.errors import invalid
from raytpu.table import format_table
from raytpu_cli.common import HttpReply, SliceChoice, UsageError, describe_hosts, post_json
from raytpu_cli.console import RunConsole
from workloads.training.config import TrainConfig, TrainResult
from workloads.training.driver import TrainingError

if TYPE_CHECKING:
    from workloads.sim.local_cluster import LocalSliceCluster

DEMO_BUCKET = "raytpu-demo"
DEMO_RUN = "demo"
"""The demo checkpoints to gs://raytpu-demo/demo on the emulator (a stack: gs://BUCKET/<run>)."""
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
    parser.add_argument("--workdir", help="where demo.log goes (default: a temp dir)")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument(
        "--verbose",
        action="store_true",
        help="show Ray's and JAX's logs here too (default: only in the log file)",
    )


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
            invalid(
                "--serve-slice",
                serve.name,
                "a single-host slice",
                reason=f"{serve.shape.name} is multi-host",
            )
        )
    # One copy of each is enough for the demo, however many the stack declares.
    return SliceChoice(train.name, train.shape, 1), SliceChoice(serve.name, serve.shape, 1)


def run(args: argparse.Namespace) -> int:
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
    # The stack's checkpoint bucket, played by a fresh GCS emulator: the demo trains from scratch.
    config = replace(config, checkpoint_dir=f"gs://{DEMO_BUCKET}/{DEMO_RUN}")
    log_path = workdir / "demo.log"
    print(
        f"[demo] Ray and JAX logs: {log_path}"
        + ("" if not args.verbose else " (--verbose: shown here too)"),
        flush=True,
    )
    run_ = DemoRun(args, train, serve_slice, config, RunConsole(log_path, verbose=args.verbose))
    try:
        with run_.console:
            summary = run_.run()
    except KeyboardInterrupt:
        return _interrupted(run_, log_path)
    except (TrainingError, TimeoutError, RuntimeError) as error:
        if run_.cluster is not None and run_.cluster.interrupted:
            return _interrupted(run_, log_path)
        print(f"error: {error}\n(logs: {log_path})", file=sys.stderr)
        return 1
    rows, ok, fell = summary
    rows.append(("total", f"{time.monotonic() - began:.0f} s"))
    print()
    print(format_table(("demo", "result"), rows), flush=True)
    if not fell:
        print("error: the loss did not fall by at least 25%", file=sys.stderr)
    return 0 if ok else 1


def _interrupted(run_: DemoRun, log_path: Path) -> int:
    cluster = run_.cluster
    signal_name = (cluster.interrupted if cluster is not None else None) or "SIGINT"
    stopped = "nothing had started yet"
    if cluster is not None:
        stopped = (
            f"the simulated slice cluster (head + {len(cluster.hosts)} hosts"
            + (
                f"; {cluster.stopped_processes} leftover processes killed"
                if cluster.stopped_processes
                else ""
            )
            + ")"
            + (" and the Serve app" if run_.phase_name in ("serving", "requests") else "")
        )
    print(
        f"interrupted by {signal_name} during {run_.phase_name}: stopped {stopped}; "
        f"logs: {log_path}",
        file=sys.stderr,
    )
    return 130


class DemoRun:
    """One demo run: its phases, what it started, and the summary rows."""

    def __init__(
        self,
        args: argparse.Namespace,
        train: SliceChoice,
        serve_slice: SliceChoice,
        config: TrainConfig,
        console: RunConsole,
    ) -> None:
        self.args = args
        self.train = train
        self.serve_slice = serve_slice
        self.config = config
        self.console = console
        self.cluster: LocalSliceCluster | None = None
        self.phase_name = "start-up"

    def run(self) -> tuple[list[tuple[str, str]], bool, bool]:
        from workloads.serving import app as serving
        from workloads.serving.replica import ServeOptions
        from workloads.sim.gcs_emulator import GcsEmulator
        from workloads.sim.local_cluster import LocalSliceCluster, free_port

        console, train, serve_slice = self.console, self.train, self.serve_slice
        console.phase(f"[demo] stack {self.args.stack}: {describe_hosts([train, serve_slice])}")
        self.phase_name = "cluster start"
        with contextlib.ExitStack() as stack:
            gcs = stack.enter_context(GcsEmulator((DEMO_BUCKET,)))
            self.cluster = LocalSliceCluster([train, serve_slice], env=gcs.env)
            with console.step("starting the simulated slice cluster") as done:
                stack.enter_context(self.cluster)
                done(f"{len(self.cluster.hosts)} hosts up")
            self.phase_name = "training"
            result = self._train()
            console.phase(f"[demo] trained: loss {result.first_loss:.3f} -> {result.last_loss:.3f}")
            self.phase_name = "serving"
            with console.step("serving: deploy and compile batch sizes") as done:
                stack.callback(serving.shutdown)
                # The demo's prompts are short: compile the other prompt lengths on first use.
                options = ServeOptions(precompile=False)
                handle = serving.deploy(
                    serving.build_app(
                        self.config.checkpoint_dir, serve_slice.shape, options=options
                    ),
                    port=free_port(),
                )
                done("ready")
            self.phase_name = "requests"
            with console.progress() as bar:
                task = bar.add_task("requests", total=len(PROMPTS) + 1, detail="")
                replies = _ask(handle.url, self.args.max_new_tokens, lambda: bar.advance(task))
                bad = post_json(handle.url, None, raw=b"{not json")
                bar.advance(task)
        return _summary(self.args, train, serve_slice, result, handle, replies, bad)

    def _train(self) -> TrainResult:
        from raytpu_cli.train import train_under

        return train_under(self.console, self.train.shape, self.config)


def _summary(
    args: argparse.Namespace,
    train: SliceChoice,
    serve_slice: SliceChoice,
    result: TrainResult,
    handle: Any,
    replies: list[tuple[str, HttpReply]],
    bad: HttpReply,
) -> tuple[list[tuple[str, str]], bool, bool]:
    latencies = sorted(r.seconds * 1000 for _, r in replies)
    rows = [
        ("stack", args.stack),
        ("training slice", f"{train.name}: {train.shape.name}, {train.shape.machine_type}"),
        ("hosts / chips", f"{train.shape.hosts} hosts x {train.shape.chips_per_host} chips"),
        (
            "placement",
            f"workers ran on {_hosts_text(result)} (free slice found in "
            f"{result.placement_wait_s:.1f} s)",
        ),
        (
            "jax processes / devices",
            f"{result.process_count} / {result.device_count} (mesh over all devices)",
        ),
        ("steps", f"{result.resumed_from} -> {result.final_step} in {result.seconds:.0f} s"),
        ("loss first -> last", f"{result.first_loss:.3f} -> {result.last_loss:.3f}"),
        (
            "checkpoint",
            f"{result.checkpoint_dir} (latest step {result.latest_checkpoint}; the bucket is a "
            "local GCS emulator, every host wrote its own shards)",
        ),
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
    fell = result.last_loss < 0.75 * result.first_loss
    ok = fell and all(r.status == 200 for _, r in replies) and bad.status == 400
    return rows, ok, fell


def _hosts_text(result: TrainResult) -> str:
    """``train-0 hosts 0, 1`` from the workers' own placements."""
    parts = []
    for name in result.slice_names:
        ids = sorted(p.tpu_worker_id for p in result.placements if p.slice_name == name)
        parts.append(f"{name} hosts {', '.join(map(str, ids))}")
    return "; ".join(parts)


def _ask(
    url: str, max_new_tokens: int, on_reply: Callable[[], object]
) -> list[tuple[str, HttpReply]]:
    """Send all prompts at once so that Serve can batch them."""

    def one(prompt: str) -> tuple[str, HttpReply]:
        payload = {"prompt": prompt, "max_new_tokens": max_new_tokens, "temperature": 0.5}
        reply = post_json(url, payload, timeout_s=120)
        on_reply()
        return prompt, reply

    with ThreadPoolExecutor(max_workers=len(PROMPTS)) as pool:
        return list(pool.map(one, PROMPTS))
