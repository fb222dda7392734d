"""Open the Ray Dashboard of a stack's Ray head through an authenticated tunnel.

Examples:
  raytpu dashboard --stack dev                       # the first RayCluster of the stack
  raytpu dashboard --stack prod --cluster serve --port 8266

Runs ``kubectl port-forward`` under your own kubectl credentials (never a public endpoint),
prints the local URL, and keeps the tunnel open until Ctrl-C or ``--duration`` seconds; the
tunnel is always closed on exit. A head with token authentication gets a small proxy on that
local URL that adds the credential to every request (your Kubernetes credentials, or the token
Secret read with your RBAC, as ``raytpu submit`` does): the browser never asks for a token and
you never copy one. The proxy listens on 127.0.0.1 only. Exit codes: 0 closed normally, 2 bad
input, 6 the tunnel did not come up in time, 1 kubectl failed.
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

from raytpu import errors, processes, stack_outputs
from raytpu.stack_outputs import RayHead, StackOutputsError
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
        processes.stop([process])


HOP_HEADERS = frozenset(
    {"host", "connection", "keep-alive", "transfer-encoding", "upgrade", "content-length"}
)


@contextlib.contextmanager
def auth_proxy(target: str, headers: dict[str, str], port: int) -> Iterator[str]:
    """An HTTP proxy on ``127.0.0.1:port`` to ``target`` that adds ``headers`` to every request;
    yields its URL. Runs in a thread with its own event loop; stopped on exit (bounded)."""
    import asyncio

    from aiohttp import ClientSession, ClientTimeout, web

    async def forward(request: web.Request) -> web.Response:
        sent = {k: v for k, v in request.headers.items() if k.lower() not in HOP_HEADERS}
        sent.update(headers)
        async with (
            ClientSession(timeout=ClientTimeout(total=60)) as session,
            session.request(
                request.method,
                f"{target}{request.rel_url}",
                headers=sent,
                data=await request.read(),
            ) as reply,
        ):
            body = await reply.read()
            kept = {k: v for k, v in reply.headers.items() if k.lower() not in HOP_HEADERS}
            kept.pop("Content-Encoding", None)  # aiohttp hands the body over decoded
            return web.Response(status=reply.status, body=body, headers=kept)

    loop = asyncio.new_event_loop()
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", forward)
    runner = web.AppRunner(app)
    loop.run_until_complete(runner.setup())
    loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", port).start())
    thread = threading.Thread(target=loop.run_forever, name="dashboard-proxy", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(timeout=10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        loop.close()


def run(args: argparse.Namespace) -> int:
    from raytpu_cli.ray_credentials import CredentialError, auth_headers
    from workloads.sim.local_cluster import free_port

    try:
        outputs = stack_outputs.load_outputs(args.stack, args.outputs, args.cwd)
        head = outputs.head(args.cluster)
    except StackOutputsError as error:
        return failure.report(error)
    port = args.port or free_port()
    try:
        headers = auth_headers(head)
        tunnel_port = free_port() if headers else port
        with contextlib.ExitStack() as stack:
            process = stack.enter_context(
                tunnel(command(args.kubectl, head, tunnel_port), timeout_s=START_TIMEOUT_S)
            )
            url = f"http://127.0.0.1:{port}"
            if headers:  # the browser's requests get the credential on the way
                url = stack.enter_context(
                    auth_proxy(f"http://127.0.0.1:{tunnel_port}", headers, port)
                )
            print(f"Ray Dashboard of {head.kind} {head.name!r}: {url}")
            if outputs.dashboard_iap_url:
                print(
                    f"(the stack also serves a dashboard through IAP, read-only, to its members: "
                    f"{outputs.dashboard_iap_url})"
                )
            print(f"tunnel open for {args.duration:.0f} s; Ctrl-C closes it", file=sys.stderr)
            deadline = time.monotonic() + args.duration
            while process.poll() is None and time.monotonic() < deadline:
                time.sleep(0.2)
            if process.poll() not in (None, 0):
                raise TunnelError(f"kubectl port-forward stopped with {process.returncode}")
    except (TunnelError, errors.NetworkTimeoutError, OSError, CredentialError) as error:
        return failure.report(error)
    except KeyboardInterrupt:
        print("tunnel closed", file=sys.stderr)
        return 130
    return 0
