"""Open the Ray Dashboard of a stack's Ray head through an authenticated tunnel.

Examples:
  raytpu dashboard --stack dev                       # the first RayCluster of the stack
  raytpu dashboard --stack prod --cluster serve --port 8266

Runs ``kubectl port-forward`` under your own kubectl credentials (never a public endpoint),
prints the local URL, and keeps the tunnel open until Ctrl-C or ``--duration`` seconds; the
tunnel is always closed on exit. Exit codes: 0 closed normally, 2 bad input, 6 the tunnel did
not come up in time, 1 kubectl failed.
"""

from __future__ import annotations

import argparse
import contextlib
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from raytpu import errors, stack_outputs
from raytpu.stack_outputs import RayHead, StackOutputs, StackOutputsError
from raytpu_cli import failure

START_TIMEOUT_S = 20.0


class TunnelError(RuntimeError):
    """kubectl port-forward failed; the message carries kubectl's own words."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("--stack", required=True, help="Pulumi stack name, e.g. dev or prod")
    parser.add_argument("--outputs", type=Path, help="saved `pulumi stack output --json`")
    parser.add_argument("--cluster", help="RayCluster or RayService name (default: the first)")
    parser.add_argument("--port", type=int, default=0, help="local port (default: a free one)")
    parser.add_argument(
        "--duration", type=float, default=3600.0, help="close the tunnel after this many seconds"
    )
    parser.add_argument("--kubectl", default="kubectl", help=argparse.SUPPRESS)


def choose_head(outputs: StackOutputs, name: str | None) -> RayHead:
    heads = {**outputs.ray_services, **outputs.ray_clusters}
    if not heads:
        raise StackOutputsError(f"stack {outputs.stack!r} declares no RayCluster or RayService")
    if name is None:
        return next(iter(outputs.ray_clusters.values() or heads.values()))
    if name not in heads:
        raise StackOutputsError(
            f"--cluster: {name!r} is not valid; valid: {', '.join(sorted(heads))}"
        )
    return heads[name]


def command(kubectl: str, head: RayHead, local_port: int) -> list[str]:
    return [
        kubectl,
        "port-forward",
        f"svc/{head.head_service}",
        f"{local_port}:{head.dashboard_port}",
        "-n",
        head.namespace,
        "--address",
        "127.0.0.1",
    ]


@contextlib.contextmanager
def tunnel(
    argv: Sequence[str], *, timeout_s: float = START_TIMEOUT_S
) -> Iterator[subprocess.Popen]:
    """Start ``kubectl port-forward``; yield once it forwards; always stop it."""
    process = subprocess.Popen(
        list(argv), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    ready = threading.Event()
    lines: list[str] = []

    def read() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            lines.append(line.rstrip())
            if line.startswith("Forwarding from"):
                ready.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + timeout_s
        while not ready.wait(0.1):
            if process.poll() is not None:
                reader.join(timeout=1)
                raise TunnelError(f"kubectl port-forward exited: {' | '.join(lines)[-500:]}")
            if time.monotonic() > deadline:
                raise errors.NetworkTimeoutError(
                    f"kubectl port-forward did not forward within {timeout_s:.0f} s"
                )
        yield process
    finally:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=5)


def run(args: argparse.Namespace) -> int:
    from workloads.local_cluster import free_port

    try:
        if args.outputs is not None:
            outputs = stack_outputs.read_outputs_file(args.outputs, args.stack)
        else:
            outputs = stack_outputs.fetch_outputs(args.stack)
        head = choose_head(outputs, args.cluster)
    except StackOutputsError as error:
        return failure.report(error)
    port = args.port or free_port()
    try:
        with tunnel(command(args.kubectl, head, port), timeout_s=START_TIMEOUT_S) as process:
            print(f"Ray Dashboard of {head.kind} {head.name!r}: http://127.0.0.1:{port}")
            print(f"tunnel open for {args.duration:.0f} s; Ctrl-C closes it", file=sys.stderr)
            deadline = time.monotonic() + args.duration
            while process.poll() is None and time.monotonic() < deadline:
                time.sleep(0.2)
            if process.poll() not in (None, 0):
                raise TunnelError(f"kubectl port-forward stopped with {process.returncode}")
    except (TunnelError, errors.NetworkTimeoutError, OSError) as error:
        return failure.report(error)
    except KeyboardInterrupt:
        print("tunnel closed", file=sys.stderr)
        return 130
    return 0
