"""Serve the latest checkpoint over HTTP with Ray Serve on the stack's serving slice.

Examples:
  raytpu serve --stack dev --slice serve --local --prompt "The old teacher"
  raytpu serve --stack dev --slice serve --local --duration 300     # then curl the printed URL
  raytpu serve --stack dev --slice serve --address ray://ray-head:10001 --checkpoint-dir gs://b/ck

--local serves for --duration seconds (default 600; 0 with --prompt: answer and exit), then shuts
everything down. With --address the application stays deployed on that cluster after the command
exits. The URL printed is the app's route; the OpenAI-compatible API is under it, and the
``base_url`` for an OpenAI client is printed as such (``http://127.0.0.1:PORT/generate/v1``).

Checked before anything starts (exit 2, one line): the slice, --port (free), and with --local
the checkpoint directory (a local folder, or gs:// on the local GCS emulator) holding a checkpoint,
of --preset when given; a directory with none names the runs that exist beside it.
The console shows phases and a summary; Ray's logs go to the log file it names first.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from dataclasses import dataclass
from typing import Any

from raytpu.errors import invalid
from raytpu.table import format_table
from raytpu_cli.common import (
    DEFAULT_CHECKPOINT_DIR,
    SliceChoice,
    UsageError,
    add_slice_arguments,
    check_port_free,
    check_seconds,
    local_storage,
    post_json,
    ray_cluster,
    resolve_slice,
)
from raytpu_cli.console import RunConsole, add_console_arguments, open_run_console

DEFAULT_DURATION_S = 600.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    add_slice_arguments(parser, default_slice="serve")
    parser.add_argument(
        "--checkpoint-dir", default=DEFAULT_CHECKPOINT_DIR, help="Orbax checkpoints"
    )
    parser.add_argument(
        "--preset",
        help="serve only if the checkpoint is of this model (byte-lm, or a raytpu.presets name)",
    )
    parser.add_argument("--port", type=int, default=0, help="HTTP port (default: a free one)")
    parser.add_argument(
        "--prompt", action="append", default=[], help="send this prompt; repeatable"
    )
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--temperature", type=float, default=0.5)
    parser.add_argument(
        "--duration",
        type=float,
        help=f"--local: serve this many seconds (default {DEFAULT_DURATION_S:.0f}; 0 with --prompt)",
    )
    parser.add_argument("--deploy-timeout", type=float, default=180.0, help="seconds")
    add_console_arguments(parser)


@dataclass(frozen=True)
class _Plan:
    """What one ``raytpu serve`` run does, checked."""

    chosen: SliceChoice
    application: Any
    port: int
    duration_s: float


def run(args: argparse.Namespace) -> int:
    try:
        plan = _plan(args)
    except (UsageError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    console: RunConsole | None = None
    try:
        with contextlib.ExitStack() as stack:
            storage = stack.enter_context(local_storage(args, (args.checkpoint_dir,)))
            found = _check_checkpoint(args)
            console = stack.enter_context(open_run_console(args, "serve"))
            if found:
                console.phase(f"{found} ({storage})" if storage else found)
            _serve(args, plan, console, stack)
    except (UsageError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except (TimeoutError, RuntimeError, FileNotFoundError) as error:
        logs = f"; logs: {console.log_path}" if console is not None else ""
        print(f"error: {error}{logs}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted: everything this command started was stopped", file=sys.stderr)
        return 130
    return 0


def _plan(args: argparse.Namespace) -> _Plan:
    from workloads.serving import app as serving
    from workloads.sim.local_cluster import free_port

    chosen = resolve_slice(args)
    check_seconds("--deploy-timeout", args.deploy_timeout)
    check_port_free("--port", args.port)
    duration = args.duration
    if duration is None:
        duration = 0.0 if args.prompt else DEFAULT_DURATION_S
    if not duration >= 0:
        raise UsageError(invalid("--duration", duration, "seconds >= 0"))
    application = serving.build_app(args.checkpoint_dir, chosen.shape)
    return _Plan(chosen, application, args.port or free_port(), duration)


def _check_checkpoint(args: argparse.Namespace) -> str:
    """With --local the replicas load here, so the directory must hold a checkpoint now;
    a line saying which one (``""`` when not checked: on a cluster its replicas read it)."""
    if not args.local:
        return ""
    from raytpu_cli.checkpoint_check import check_servable, filesystem

    directory = args.checkpoint_dir
    found = check_servable("--checkpoint-dir", directory, args.preset, filesystem(directory))
    return f"checkpoint {directory}: {found.model} at step {found.latest}"


def _serve(
    args: argparse.Namespace, plan: _Plan, console: RunConsole, stack: contextlib.ExitStack
) -> None:
    from workloads.serving import app as serving

    stack.enter_context(ray_cluster(args, [plan.chosen], console))
    if args.local:
        stack.callback(serving.shutdown)
    with console.step(f"deploying the Serve app on slice {plan.chosen.name}") as done:
        handle = serving.deploy(plan.application, port=plan.port, timeout_s=args.deploy_timeout)
        done(f"ready in {handle.deploy_s:.1f} s")
    console.phase(f"serving at {handle.url}; OpenAI API: base_url={handle.url}/v1")
    if args.prompt:
        console.table(_ask(args, handle.url, console))
    if args.local and plan.duration_s > 0:
        console.phase(f"serving for {plan.duration_s:.0f} s; Ctrl-C stops")
        time.sleep(plan.duration_s)


def _ask(args: argparse.Namespace, url: str, console: RunConsole) -> str:
    """Each ``--prompt`` in turn, under a progress bar; the replies as a table."""
    rows = []
    with console.progress() as bar:
        task = bar.add_task("requests", total=len(args.prompt), detail="")
        for prompt in args.prompt:
            payload = {
                "prompt": prompt,
                "max_new_tokens": args.max_new_tokens,
                "temperature": args.temperature,
            }
            reply = post_json(url, payload)
            text = reply.body.get("completion", reply.body)
            rows.append((prompt, reply.status, f"{reply.seconds * 1000:.0f} ms", repr(text)))
            bar.advance(task)
    return format_table(("prompt", "status", "latency", "completion"), rows)
