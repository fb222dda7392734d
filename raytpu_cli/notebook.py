"""Start JupyterLab with its kernels attached to a Ray cluster, token auth on.

Examples:
  raytpu notebook --local                          # the simulated v6e 2x2 slice cluster
  raytpu notebook --local --generation v6e --topology 2x4
  raytpu notebook --stack dev                      # a stack's RayCluster, through a tunnel

``--local`` starts the simulated slice cluster (Ray token auth on, as on GKE) and a JupyterLab
whose kernels find it (``RAY_ADDRESS``, ``RAY_AUTH_MODE=token``, ``RAY_AUTH_TOKEN`` in their
environment): ``ray.init()`` in a cell connects; a kernel without the token is refused.
``--stack`` opens ``kubectl port-forward`` to the head's Ray Client port under your own kubectl
credentials, fetches the Ray credential as ``raytpu dashboard`` does (your Google identity, or
the token Secret read with your RBAC; never printed), and starts a local JupyterLab attached
to ``ray://127.0.0.1:PORT``. For an IDE (VS Code, PyCharm), connect to the printed URL as an
existing Jupyter server: its kernels are the same.

JupyterLab listens on 127.0.0.1 only, with its own random Jupyter token (in the printed URL).
Everything started is stopped on exit, Ctrl-C or after ``--duration`` seconds. Exit codes: 0
closed normally, 2 bad input, 5 something did not come up in time, 1 a tool failed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from raytpu import errors, processes
from raytpu.catalog import CatalogError, shape
from raytpu.errors import invalid
from raytpu.ray_names import CLIENT_PORT
from raytpu_cli import failure
from raytpu_cli.common import (
    SliceChoice,
    UsageError,
    check_port_free,
    check_seconds,
    check_writable_dir,
)

LAB_START_TIMEOUT_S = 60.0
"""Bound on JupyterLab answering ``/api/status`` after it starts."""
ANNOUNCEMENTS = "@jupyterlab/apputils-extension:announcements"
"""JupyterLab's news and update checks: off (nothing calls home; no pop-up over the cells)."""
AUTH_ENV = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")


class LabError(RuntimeError):
    """JupyterLab exited or failed; the message carries the tail of its log."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--local", action="store_true", help="the simulated slice cluster")
    where.add_argument("--stack", help="a deployed Pulumi stack (dev, prod...)")
    parser.add_argument("--generation", default="v6e", help="--local: TPU generation (v6e)")
    parser.add_argument("--topology", default="2x2", help="--local: slice topology (2x2)")
    parser.add_argument("--outputs", type=Path, help="--stack: saved `pulumi stack output --json`")
    parser.add_argument("--cluster", help="--stack: RayCluster or RayService (default: the first)")
    parser.add_argument("--port", type=int, default=0, help="JupyterLab's port (default: free)")
    parser.add_argument("--root-dir", default=".", help="the folder JupyterLab shows (default .)")
    parser.add_argument(
        "--duration", type=float, default=8 * 3600.0, help="stop everything after this many s"
    )
    parser.add_argument("--kubectl", default="kubectl", help=argparse.SUPPRESS)


@dataclass(frozen=True)
class LabServer:
    url: str
    """``http://127.0.0.1:PORT/lab?token=...``: what a browser or an IDE opens."""
    base: str
    token: str
    process: subprocess.Popen


def lab_command(port: int, root_dir: Path) -> list[str]:
    """JupyterLab on 127.0.0.1 only, no browser, no calls home; its token from ``JUPYTER_TOKEN``."""
    root = ["--allow-root"] if os.geteuid() == 0 else []  # containers and CI run as root
    return [
        sys.executable,
        "-m",
        "jupyterlab",
        *root,
        "--no-browser",
        "--ServerApp.ip=127.0.0.1",
        f"--ServerApp.port={port}",
        "--ServerApp.port_retries=0",
        f"--ServerApp.root_dir={root_dir}",
        "--LabApp.news_url=None",
        "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
    ]


def lab_env(ray: Mapping[str, str], home: Path, token: str) -> dict[str, str]:
    """The server's (and so every kernel's) environment: this one without any Ray credential
    or address, then ``ray``'s, a Jupyter token, and Jupyter's config and runtime folders of
    its own (no user config can turn its authentication off)."""
    env = {k: v for k, v in os.environ.items() if k not in (*AUTH_ENV, "RAY_ADDRESS")}
    env.update(ray)
    env.update(
        JUPYTER_TOKEN=token,
        JUPYTER_CONFIG_DIR=str(home / "config"),
        JUPYTER_RUNTIME_DIR=str(home / "runtime"),
        IPYTHONDIR=str(home / "ipython"),
        JAX_PLATFORMS=env.get("JAX_PLATFORMS", "cpu") if "RAY_ADDRESS" in ray else "",
    )
    if not env["JAX_PLATFORMS"]:
        env.pop("JAX_PLATFORMS")
    return env


def _wait_ready(
    base: str, token: str, process: subprocess.Popen, log: Path, timeout_s: float
) -> None:
    deadline = time.monotonic() + timeout_s
    request = urllib.request.Request(
        f"{base}/api/status", headers={"Authorization": f"token {token}"}
    )
    while True:
        if process.poll() is not None:
            tail = log.read_text(errors="replace")[-1500:]
            raise LabError(f"JupyterLab exited with {process.returncode}: {tail}")
        with (
            contextlib.suppress(urllib.error.URLError, OSError),
            urllib.request.urlopen(request, timeout=2) as reply,
        ):
            if reply.status == 200:
                return
        if time.monotonic() > deadline:
            raise errors.NetworkTimeoutError(
                f"JupyterLab did not answer {base}/api/status within {timeout_s:.0f} s (log: {log})"
            )
        time.sleep(0.25)


@contextlib.contextmanager
def jupyter_lab(
    ray: Mapping[str, str], root_dir: Path, port: int, *, timeout_s: float = LAB_START_TIMEOUT_S
) -> Iterator[LabServer]:
    """Start JupyterLab (its own process group: kernels go with it); yield once it answers;
    always stop it and remove its temporary folder."""
    from workloads.sim.local_cluster import free_port

    port = port or free_port()
    token = secrets.token_hex(24)
    with tempfile.TemporaryDirectory(prefix="raytpu-lab-") as folder:
        home = Path(folder)
        log = home / "jupyterlab.log"
        (home / "config" / "labconfig").mkdir(parents=True)
        (home / "config" / "labconfig" / "page_config.json").write_text(
            json.dumps({"disabledExtensions": {ANNOUNCEMENTS: True}})
        )
        with log.open("wb") as out:
            process = subprocess.Popen(
                lab_command(port, root_dir),
                env=lab_env(ray, home, token),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        try:
            base = f"http://127.0.0.1:{port}"
            _wait_ready(base, token, process, log, timeout_s)
            yield LabServer(f"{base}/lab?token={token}", base, token, process)
        finally:
            processes.stop([process], group=True)


def _local_slice(args: argparse.Namespace) -> SliceChoice:
    try:
        chosen = shape(args.generation, args.topology)
    except CatalogError as error:
        raise UsageError(str(error)) from error
    return SliceChoice(name="notebook", shape=chosen, count=1)


def _check(args: argparse.Namespace) -> Path:
    check_port_free("--port", args.port)
    check_seconds("--duration", args.duration)
    root = Path(args.root_dir)
    if not root.is_dir():
        raise UsageError(invalid("--root-dir", args.root_dir, "an existing folder"))
    check_writable_dir("--root-dir", args.root_dir)
    if args.local and (args.cluster or args.outputs):
        flag = "--cluster" if args.cluster else "--outputs"
        raise UsageError(
            invalid(flag, getattr(args, flag[2:]), "unset with --local (--stack only)")
        )
    return root.absolute()


def _serve(lab: LabServer, what: str, duration: float) -> int:
    print(f"JupyterLab attached to {what}: {lab.url}", flush=True)
    print(
        f"(an IDE: connect to the existing Jupyter server {lab.base}/?token=...; open for "
        f"{duration:.0f} s; Ctrl-C stops everything)",
        file=sys.stderr,
        flush=True,
    )
    deadline = time.monotonic() + duration
    while lab.process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    if lab.process.poll() not in (None, 0):
        raise LabError(f"JupyterLab stopped with {lab.process.returncode}")
    return 0


def _run_local(args: argparse.Namespace, root: Path) -> int:
    from workloads.sim.local_cluster import LocalSliceCluster

    choice = _local_slice(args)
    with LocalSliceCluster([choice], connect=False) as cluster:
        assert cluster.address is not None
        ray = {"RAY_ADDRESS": cluster.address}
        ray.update({k: os.environ[k] for k in AUTH_ENV if k in os.environ})
        what = (
            f"the simulated {choice.shape.generation.name} {choice.shape.topology} slice "
            f"cluster at {cluster.address} (Ray auth: {ray.get('RAY_AUTH_MODE', 'off')})"
        )
        with jupyter_lab(ray, root, args.port) as lab:
            return _serve(lab, what, args.duration)


def stack_ray_env(token: str | None, local_port: int) -> dict[str, str]:
    """A kernel's Ray settings for a head reached through the tunnel (``token``: None when the
    head runs without auth)."""
    env = {"RAY_ADDRESS": f"ray://127.0.0.1:{local_port}"}
    if token is not None:
        env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=token)
    return env


def tunnel_command(kubectl: str, head_service: str, namespace: str, local_port: int) -> list[str]:
    return [
        kubectl,
        "port-forward",
        f"svc/{head_service}",
        f"{local_port}:{CLIENT_PORT}",
        "-n",
        namespace,
        "--address",
        "127.0.0.1",
    ]


def _run_stack(args: argparse.Namespace, root: Path) -> int:
    from raytpu import stack_outputs
    from raytpu_cli.dashboard import START_TIMEOUT_S, tunnel
    from raytpu_cli.ray_credentials import auth_headers
    from workloads.sim.local_cluster import free_port

    outputs = stack_outputs.load_outputs(args.stack, args.outputs, args.cwd)
    head = outputs.head(args.cluster)
    headers = auth_headers(head)
    token = headers["Authorization"].removeprefix("Bearer ") if headers else None
    local_port = free_port()
    argv = tunnel_command(args.kubectl, head.head_service, head.namespace, local_port)
    with (
        tunnel(argv, timeout_s=START_TIMEOUT_S),
        jupyter_lab(stack_ray_env(token, local_port), root, args.port) as lab,
    ):
        return _serve(lab, f"{head.kind} {head.name!r} (auth: {head.auth})", args.duration)


def run(args: argparse.Namespace) -> int:
    from raytpu.stack_outputs import StackOutputsError
    from raytpu_cli.dashboard import TunnelError
    from raytpu_cli.ray_credentials import CredentialError

    try:
        root = _check(args)
        if args.local:
            _local_slice(args)  # bad flags refused before anything starts
            return _run_local(args, root)
        return _run_stack(args, root)
    except (
        UsageError,
        LabError,
        StackOutputsError,
        TunnelError,
        CredentialError,
        errors.NetworkTimeoutError,
        OSError,
    ) as error:
        return failure.report(error)
    except KeyboardInterrupt:
        print("notebook stopped", file=sys.stderr)
        return 130
