"""Arguments and helpers shared by ``raytpu demo``, ``raytpu train`` and ``raytpu serve``.

Imports of ray, jax and infra stay inside functions so that ``raytpu --help`` stays fast.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from raytpu import project
from raytpu.catalog import SliceShape, shape
from raytpu.errors import invalid
from raytpu.generations import CatalogError

DEFAULT_CHECKPOINT_DIR = os.environ.get("RAYTPU_CHECKPOINT_DIR", "/tmp/raytpu/checkpoints")
LOCAL_BUCKET = "raytpu-local"
LOCAL_GCS_DIR = Path(os.environ.get("RAYTPU_LOCAL_GCS_DIR", "/tmp/raytpu/gcs"))
"""``--local``: the GCS emulator keeps ``gs://`` objects here between commands (a ``gs://`` path
of a train run is where the serve command finds it); ``$RAYTPU_LOCAL_GCS_DIR`` moves it."""


class UsageError(ValueError):
    """Bad command-line input: exit code 2."""


@dataclass(frozen=True)
class SliceChoice:
    """A slice picked from a stack config (or from catalog flags), duck-typing SliceConfig."""

    name: str
    shape: SliceShape
    count: int


def add_slice_arguments(parser: argparse.ArgumentParser, default_slice: str) -> None:
    parser.add_argument("--stack", default="dev", help="Pulumi stack whose config names the slice")
    parser.add_argument(
        "--slice",
        default=default_slice,
        help=f"slice name in the stack's ray-tpu:slices (default {default_slice})",
    )
    parser.add_argument(
        "--generation", help="instead of --stack/--slice: TPU generation (e.g. v6e)"
    )
    parser.add_argument("--topology", help="with --generation: topology (e.g. 2x4)")
    parser.add_argument("--machine-type", help="with --generation: GKE machine type")
    parser.add_argument(
        "--num-slices", type=int, default=1, help="slices to use together (default 1)"
    )
    where = parser.add_mutually_exclusive_group()
    where.add_argument(
        "--local",
        action="store_true",
        help="start the simulated slice cluster on this machine for the run",
    )
    where.add_argument(
        "--address",
        help="an existing Ray cluster: ray://host:10001 (Ray Client) or a GCS address; "
        "default: the cluster this process runs in (RAY_ADDRESS), as inside a Ray job",
    )


def resolve_slice(args: argparse.Namespace) -> SliceChoice:
    """The slice from ``--generation/--topology/--machine-type`` or from the stack config."""
    if args.num_slices < 1:
        raise UsageError(invalid("--num-slices", args.num_slices, ">= 1"))
    if args.generation or args.topology:
        if not (args.generation and args.topology):
            raise UsageError("--generation and --topology: give both, or neither (use --stack)")
        try:
            chosen = shape(args.generation, args.topology, machine_type=args.machine_type)
        except CatalogError as error:
            raise UsageError(str(error)) from error
        return SliceChoice(name=args.slice, shape=chosen, count=args.num_slices)
    config = load_stack_config(args).slice(args.slice)
    if args.num_slices > config.count:
        raise UsageError(
            invalid(
                "--num-slices",
                args.num_slices,
                f"1..{config.count} (stack {args.stack} declares {config.count} x slice "
                f"{config.name})",
            )
        )
    return SliceChoice(name=config.name, shape=config.shape, count=config.count)


def check_seconds(flag: str, value: float) -> None:
    """A timeout flag: a finite number of seconds > 0 (0 would give up before trying)."""
    if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
        raise UsageError(invalid(flag, value, "a number of seconds > 0"))


def check_writable_dir(flag: str, directory: str) -> None:
    """A local folder the run will write (created if missing); URLs (gs://...) are not checked.

    Creates it and writes a probe file, so that a folder nobody can write fails here, before
    anything starts, and not in a worker.
    """
    if "://" in directory:
        return
    path = Path(directory).absolute()
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as error:
        raise UsageError(
            invalid(
                flag,
                directory,
                "a folder this user can create and write, or gs://BUCKET/PATH",
                reason=str(error.strerror or error),
            )
        ) from None


def check_port_free(flag: str, port: int) -> None:
    """A TCP port this machine can listen on (0: a free one is picked later)."""
    import socket

    if not 0 <= port <= 65535:
        raise UsageError(invalid(flag, port, "0 (a free port) or 1..65535"))
    if port == 0:
        return
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError as error:
            raise UsageError(
                invalid(
                    flag, port, "a free port, or 0 to pick one", reason=str(error.strerror or error)
                )
            ) from None


def project_dir(args: argparse.Namespace) -> Path:
    """The Pulumi project of ``--cwd`` (default: the current directory), Pulumi's rule."""
    try:
        return project.find_project(getattr(args, "cwd", None))
    except project.ProjectError as error:
        raise UsageError(str(error)) from None


def load_stack_config(
    args: argparse.Namespace,
    *,
    folder: Path | None = None,
    log: Any = None,
    image_tag: str | None = None,
) -> Any:
    """The validated ``StackConfig`` of ``args.stack`` in the project of ``--cwd`` (or in
    ``folder``, taken as is), with ``ray-tpu:imageTag`` = ``image_tag`` when given; says on
    stderr which file it read. Raises UsageError/ConfigError."""
    from infra.config.stack import load_stack_file

    where = folder if folder is not None else project_dir(args)
    try:
        path = project.resolve_stack_file(args.stack, where)
    except project.ProjectError as error:
        raise UsageError(str(error)) from None
    (log or _stderr)(f"stack {args.stack}: {path}")
    return load_stack_file(path, image_tag=image_tag)


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


@contextlib.contextmanager
def local_storage(args: argparse.Namespace, storage: tuple[str, ...]) -> Iterator[str]:
    """``--local``: a GCS emulator for each ``gs://BUCKET/...`` among the run's folders
    ``storage``, keeping its objects in :data:`LOCAL_GCS_DIR` between commands (what ``raytpu
    train --local`` wrote to ``gs://`` is where ``raytpu serve --local`` finds it). Within
    ``with`` this process's environment points gs:// clients at it. Yields a line saying so
    (``""`` when nothing was started)."""
    buckets = tuple(sorted({d[5:].split("/")[0] for d in storage if d.startswith("gs://")}))
    if not (args.local and buckets):
        yield ""
        return
    from workloads.sim.gcs_emulator import GcsEmulator

    with GcsEmulator(buckets, data_dir=LOCAL_GCS_DIR):
        yield f"gs:// is a local GCS emulator keeping {LOCAL_GCS_DIR}"


@contextlib.contextmanager
def ray_cluster(args: argparse.Namespace, slices: list[SliceChoice], console: Any) -> Iterator[Any]:
    """``--local``: the simulated cluster of ``slices``, started under ``console``'s spinner;
    otherwise connect to ``--address`` (or to the cluster this process runs in). Inside
    :func:`local_storage`, every simulated host is pointed at its emulator too."""
    import ray

    if args.local:
        from workloads.sim.gcs_emulator import EMULATOR_ENV_VARS
        from workloads.sim.local_cluster import LocalSliceCluster

        env = {name: os.environ[name] for name in EMULATOR_ENV_VARS if name in os.environ}
        cluster = LocalSliceCluster(slices, env=env)
        with contextlib.ExitStack() as stack:
            with console.step(f"simulated slice cluster: {describe_hosts(slices)}") as done:
                stack.enter_context(cluster)
                done(f"{_hosts(len(cluster.hosts))} up in {cluster.start_seconds:.1f} s")
            yield cluster
        return
    address = args.address or os.environ.get("RAY_ADDRESS") or "auto"
    ray.init(address=address, logging_level="WARNING")
    try:
        yield None
    finally:
        ray.shutdown()


def describe_hosts(slices: list[SliceChoice]) -> str:
    return ", ".join(
        f"{s.count} x {s.name} ({s.shape.generation.name} {s.shape.topology}: "
        f"{_hosts(s.shape.hosts)} x {s.shape.chips_per_host} chips)"
        for s in slices
    )


def _hosts(count: int) -> str:
    return f"{count} host" + ("" if count == 1 else "s")


@dataclass(frozen=True)
class HttpReply:
    status: int
    body: dict[str, Any]
    seconds: float


def post_json(
    url: str, payload: Any, *, timeout_s: float = 60.0, raw: bytes | None = None
) -> HttpReply:
    """POST ``payload`` as JSON (or ``raw`` bytes as-is); 4xx/5xx come back, not raise."""
    data = raw if raw is not None else json.dumps(payload).encode("utf-8")
    request = urllib.request.Request(
        url, data=data, method="POST", headers={"Content-Type": "application/json"}
    )
    began = time.monotonic()
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            status, text = response.status, response.read()
    except urllib.error.HTTPError as error:
        status, text = error.code, error.read()
    seconds = time.monotonic() - began
    try:
        body = json.loads(text.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        body = {"raw": text.decode("utf-8", errors="replace")}
    return HttpReply(status=status, body=body, seconds=seconds)
