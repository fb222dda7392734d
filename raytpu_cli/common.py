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
from raytpu.generations import CatalogError

DEFAULT_CHECKPOINT_DIR = os.environ.get("RAYTPU_CHECKPOINT_DIR", "/tmp/raytpu/checkpoints")
LOCAL_BUCKET = "raytpu-local"
LOCAL_GCS_DIR = Path("/tmp/raytpu/gcs")
"""``--local``: the GCS emulator keeps ``gs://`` objects here between commands (a ``gs://`` path
of a train run is where the serve command finds it)."""


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
        raise UsageError(f"--num-slices: {args.num_slices!r} is not valid; valid: >= 1")
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
            f"--num-slices: {args.num_slices} is not valid; valid: 1..{config.count} "
            f"(stack {args.stack} declares {config.count} x slice {config.name})"
        )
    return SliceChoice(name=config.name, shape=config.shape, count=config.count)


def check_seconds(flag: str, value: float) -> None:
    """A timeout flag: a finite number of seconds > 0 (0 would give up before trying)."""
    if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
        raise UsageError(f"{flag}: {value!r} is not valid; valid: a number of seconds > 0")


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
            f"{flag}: {directory!r} is not valid ({error.strerror or error}); valid: a folder "
            "this user can create and write, or gs://BUCKET/PATH"
        ) from None


def check_checkpoint_dir(flag: str, directory: str) -> None:
    """A local folder that holds at least one checkpoint step (what ``raytpu train`` writes)."""
    if "://" in directory:
        return
    path = Path(directory)
    hint = "run `raytpu train` first, or pass --checkpoint-dir FOLDER it wrote"
    if not path.is_dir():
        problem = "is not a directory" if path.exists() else "does not exist"
        raise UsageError(
            f"{flag}: {directory!r} {problem}; valid: a folder of checkpoints ({hint})"
        )
    try:
        steps = [p for p in path.iterdir() if p.is_dir() and p.name.isascii() and p.name.isdigit()]
    except OSError as error:
        raise UsageError(f"{flag}: {directory!r} cannot be read ({error.strerror})") from None
    if not steps:
        raise UsageError(
            f"{flag}: {directory!r} holds no checkpoint; valid: a folder of checkpoints ({hint})"
        )


def project_dir(args: argparse.Namespace) -> Path:
    """The Pulumi project of ``--cwd`` (default: the current directory), Pulumi's rule."""
    try:
        return project.find_project(getattr(args, "cwd", None))
    except project.ProjectError as error:
        raise UsageError(str(error)) from None


def load_stack_config(
    args: argparse.Namespace, *, folder: Path | None = None, log: Any = None
) -> Any:
    """The validated ``StackConfig`` of ``args.stack`` in the project of ``--cwd`` (or in
    ``folder``, taken as is); says on stderr which file it read. Raises UsageError/ConfigError."""
    from infra.config.stack import load_stack_file

    where = folder if folder is not None else project_dir(args)
    try:
        path = project.resolve_stack_file(args.stack, where)
    except project.ProjectError as error:
        raise UsageError(str(error)) from None
    (log or _stderr)(f"stack {args.stack}: {path}")
    return load_stack_file(path)


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


@contextlib.contextmanager
def ray_cluster(
    args: argparse.Namespace,
    slices: list[SliceChoice],
    *,
    log: Any = print,
    storage: tuple[str, ...] = (),
) -> Iterator[Any]:
    """``--local``: the simulated cluster of ``slices``; otherwise connect to ``--address``.

    ``storage``: the run's folders; for ``--local`` each ``gs://BUCKET/...`` among them is served
    by a GCS emulator that keeps its objects in :data:`LOCAL_GCS_DIR` between commands."""
    import ray

    if args.local:
        from workloads.sim.gcs_emulator import GcsEmulator
        from workloads.sim.local_cluster import LocalSliceCluster

        buckets = tuple(sorted({d[5:].split("/")[0] for d in storage if d.startswith("gs://")}))
        with contextlib.ExitStack() as stack:
            env: dict[str, str] = {}
            if buckets:
                gcs = stack.enter_context(GcsEmulator(buckets, data_dir=LOCAL_GCS_DIR))
                env = dict(gcs.env)
                log(f"gs://{', gs://'.join(buckets)}: a GCS emulator keeping {LOCAL_GCS_DIR}")
            log(f"starting the simulated slice cluster: {describe_hosts(slices)}")
            cluster = stack.enter_context(LocalSliceCluster(slices, env=env))
            log(f"cluster up in {cluster.start_seconds:.1f} s at {cluster.address}")
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
        f"{s.shape.hosts} hosts x {s.shape.chips_per_host} chips)"
        for s in slices
    )


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
