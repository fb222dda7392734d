"""After `pulumi up`: check that what the cluster runs is what the stack declares.

Examples:
  raytpu doctor --stack dev                       # kubectl's current context
  raytpu doctor --stack prod --get-credentials    # the stack's own cluster, through gcloud
  raytpu doctor --stack dev --recorded tests/data/doctor/healthy --image-tag 0123456789ab

Declares the stack offline (as `raytpu preview` does: the Pulumi program under mocks, with
ray-tpu:imageTag from --image-tag, else the checkout's commit), reads the cluster with
`kubectl get ... -o json` (bounded; or JSON answers saved in a --recorded folder, one file per
kind: crds, mutatingwebhookconfigurations, rayclusters, rayservices, rayjobs, pods, nodes) and
prints one row per check:

- KubeRay version: the live CRDs know every field the stack's Ray objects set (an old KubeRay
  drops authOptions without a word, leaving Ray open).
- TPU webhook: a mutating webhook on KubeRay's pods (TPU_WORKER_ID, TPU_WORKER_HOSTNAMES).
- Ray objects Ready: every declared RayCluster, RayService and RayJob exists and is Ready.
- TPU slices: each running slice has TPU_WORKER_ID 0..n-1 once each, TPU_WORKER_HOSTNAMES that
  match its pods' hostnames, and all its pods on one node pool.
- token auth: the live objects keep authOptions.mode token and their heads run with it.
- RayCluster images: no pod of a RayCluster, or of a RayService's active cluster, runs another
  image than declared.

Exit codes: 0 every check passed, 1 a check failed (or kubectl failed), 2 bad input, 6 the
cluster did not answer in time.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any, Protocol

from raytpu import errors
from raytpu.errors import invalid
from raytpu_cli import failure

KUBECTL_TIMEOUT_S = 60.0
RECORDED_FILES = (
    "crds",
    "mutatingwebhookconfigurations",
    "rayclusters",
    "rayservices",
    "rayjobs",
    "pods",
    "nodes",
)
"""What doctor reads, one `kubectl get -o json` each; a --recorded folder holds <name>.json."""
NAMESPACED = ("rayclusters", "rayservices", "rayjobs", "pods")
KUBERAY_CRDS = ("rayclusters.ray.io", "rayjobs.ray.io", "rayservices.ray.io")


class ClusterReadError(RuntimeError):
    """kubectl could not read the cluster; the message carries kubectl's own words."""


class Reader(Protocol):
    def get(self, what: str, namespace: str | None) -> list[dict[str, Any]]:
        """The items of one kind (of ``namespace``; all namespaces when None)."""
        ...


def _items(text: str, source: str) -> list[dict[str, Any]]:
    """The items of a ``kubectl get -o json`` answer (a List, or one object)."""
    if not text.strip():
        return []  # --ignore-not-found with nothing found prints nothing
    answer = json.loads(text)
    if not isinstance(answer, dict):
        raise ValueError(f"{source}: not a Kubernetes object or List")
    if answer.get("kind", "").endswith("List") or "items" in answer:
        return [item for item in answer.get("items") or [] if isinstance(item, dict)]
    return [answer]


class KubectlReader:
    """`kubectl get <kind> -o json`, bounded, under the user's own kubectl credentials."""

    def __init__(
        self, kubectl: str = "kubectl", *, timeout_s: float = KUBECTL_TIMEOUT_S, env: Any = None
    ) -> None:
        self.kubectl, self.timeout_s, self.env = kubectl, timeout_s, env

    def argv(self, what: str, namespace: str | None) -> list[str]:
        if what == "crds":
            return [self.kubectl, "get", "crd", *KUBERAY_CRDS, "--ignore-not-found", "-o", "json"]
        kind = f"{what}.ray.io" if what.startswith("ray") else what
        argv = [self.kubectl, "get", kind, "-o", "json"]
        if what == "pods":
            argv += ["-l", "ray.io/is-ray-node=yes"]
        if what in NAMESPACED:
            argv += ["-n", namespace] if namespace else ["--all-namespaces"]
        return argv

    def get(self, what: str, namespace: str | None) -> list[dict[str, Any]]:
        argv = self.argv(what, namespace)
        try:
            done = subprocess.run(
                argv, capture_output=True, text=True, timeout=self.timeout_s, env=self.env
            )
        except FileNotFoundError:
            raise ClusterReadError(
                f"{self.kubectl}: not found on PATH; install kubectl (gcloud components install "
                "kubectl) or pass --recorded DIR"
            ) from None
        except subprocess.TimeoutExpired:
            raise errors.NetworkTimeoutError(
                f"`{' '.join(argv[1:4])}` got no answer within {self.timeout_s:.0f} s: can "
                "this machine reach the cluster's control plane (prod: masterAuthorizedNetworks)?"
            ) from None
        if done.returncode != 0:
            words = (done.stderr.strip().splitlines() or ["(no message)"])[-1][:300]
            if "doesn't have a resource type" in words:
                return []  # its CRD is missing: the KubeRay version row says so
            raise ClusterReadError(
                f"`{' '.join(argv[1:])}` failed: {words}; check `kubectl config current-context` "
                "(or pass --get-credentials) and your RBAC (get, list on these kinds)"
            )
        try:
            return _items(done.stdout, " ".join(argv[1:3]))
        except ValueError as error:
            raise ClusterReadError(f"kubectl printed something that is not JSON: {error}") from None


class RecordedReader:
    """Answers saved from `kubectl get <kind> -o json` in one folder, one <kind>.json each."""

    def __init__(self, folder: Path) -> None:
        if not folder.is_dir():
            raise ValueError(
                invalid("--recorded", str(folder), "a folder of kubectl get -o json answers")
            )
        self.folder = folder

    def get(self, what: str, namespace: str | None) -> list[dict[str, Any]]:
        path = self.folder / f"{what}.json"
        if not path.is_file():
            raise ValueError(
                invalid(
                    "--recorded",
                    str(path),
                    f"a folder holding {', '.join(RECORDED_FILES)} (.json)",
                    reason="missing",
                )
            )
        try:
            items = _items(path.read_text(encoding="utf-8"), str(path))
        except (ValueError, UnicodeDecodeError) as error:
            raise ValueError(
                invalid("--recorded", str(path), "kubectl get -o json output", reason=str(error))
            ) from None
        if namespace is None:
            return items
        return [i for i in items if (i.get("metadata") or {}).get("namespace") == namespace]


def collect(reader: Reader, namespaces: Sequence[str]) -> Any:
    """Everything the checks read, as a :class:`~raytpu_cli.doctor_checks.ClusterState`."""
    from raytpu_cli.doctor_checks import ClusterState

    def namespaced(what: str) -> tuple[dict[str, Any], ...]:
        return tuple(item for ns in namespaces for item in reader.get(what, ns))

    return ClusterState(
        crds=tuple(reader.get("crds", None)),
        mutating_webhooks=tuple(reader.get("mutatingwebhookconfigurations", None)),
        ray_objects={
            "RayCluster": namespaced("rayclusters"),
            "RayService": namespaced("rayservices"),
            "RayJob": namespaced("rayjobs"),
        },
        pods=namespaced("pods"),
        nodes=tuple(reader.get("nodes", None)),
    )


def run_checks(declared: Sequence[Any], state: Any) -> list[Any]:
    """Every row, in the order of the docs (docs/delivery.md)."""
    from raytpu_cli import doctor_checks as checks
    from raytpu_cli.doctor_slices import check_slices

    return [
        checks.check_version(declared, state),
        checks.check_webhook(declared, state),
        checks.check_ready(declared, state),
        check_slices(declared, state),
        checks.check_auth(declared, state),
        checks.check_images(declared, state),
    ]


def print_rows(rows: Sequence[Any], stack: str, *, width: int | None = None) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"raytpu doctor --stack {stack}", show_lines=True)
    for column, style in (("check", "bold"), ("result", ""), ("what to do / what was seen", "")):
        table.add_column(column, style=style, overflow="fold")
    for row in rows:
        result = "[green]pass[/green]" if row.ok else "[bold red]FAIL[/bold red]"
        table.add_row(row.check, result, row.message)
    console = Console(width=width or (None if sys.stdout.isatty() else 160))
    console.print(table)
    failed = sum(not row.ok for row in rows)
    console.print(f"stack {stack}: {len(rows)} checks, {failed} failed")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("--stack", required=True, help="Pulumi stack name, e.g. dev or prod")
    parser.add_argument(
        "--image-tag", help="ray-tpu:imageTag the stack was deployed with (default: the stack's)"
    )
    parser.add_argument("--recorded", type=Path, metavar="DIR", help="read saved answers")
    parser.add_argument(
        "--get-credentials",
        action="store_true",
        help="fetch the stack's cluster credentials with gcloud into a private kubeconfig "
        "for this run (default: kubectl's current context)",
    )
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    parser.add_argument("--kubectl", default="kubectl", help=argparse.SUPPRESS)
    parser.add_argument("--timeout", type=float, default=KUBECTL_TIMEOUT_S, help=argparse.SUPPRESS)


def _credentials(config: Any, folder: str) -> dict[str, str]:
    """An environment whose KUBECONFIG holds only the stack's cluster (gcloud get-credentials)."""
    env = {**os.environ, "KUBECONFIG": str(Path(folder) / "kubeconfig")}
    argv = [
        "gcloud",
        "container",
        "clusters",
        "get-credentials",
        config.cluster.name,
        "--location",
        config.cluster.location,
        "--project",
        config.project,
    ]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env)
    except (FileNotFoundError, subprocess.TimeoutExpired) as error:
        raise ClusterReadError(f"gcloud container clusters get-credentials: {error}") from None
    if done.returncode != 0:
        words = (done.stderr.strip().splitlines() or ["(no message)"])[-1][:300]
        raise ClusterReadError(f"gcloud container clusters get-credentials failed: {words}")
    return env


def _declare(args: argparse.Namespace) -> tuple[Any, tuple[Any, ...]]:
    from infra import offline
    from raytpu_cli.common import load_stack_config
    from raytpu_cli.doctor_checks import declared_objects

    config = load_stack_config(args, image_tag=args.image_tag)
    resources, _ = offline.run_program(config, stack=args.stack)
    return config, declared_objects(resources)


def _read(args: argparse.Namespace, config: Any, namespaces: Sequence[str]) -> Any:
    if args.recorded is not None:
        return collect(RecordedReader(args.recorded), namespaces)
    with tempfile.TemporaryDirectory(prefix="raytpu-doctor-") as folder:
        env = _credentials(config, folder) if args.get_credentials else None
        return collect(KubectlReader(args.kubectl, timeout_s=args.timeout, env=env), namespaces)


def run(args: argparse.Namespace) -> int:
    from infra.config.schema import ConfigError
    from raytpu import generations

    if not args.timeout > 0:
        return failure.report(ValueError(invalid("--timeout", args.timeout, "seconds > 0")))
    try:
        config, declared = _declare(args)
        namespaces = sorted({d.namespace for d in declared})
        state = _read(args, config, namespaces)
    except (ConfigError, generations.CatalogError) as error:
        return failure.report(ValueError(str(error)))
    except (ValueError, ClusterReadError, errors.NetworkTimeoutError) as error:
        return failure.report(error)
    rows = run_checks(declared, state)
    if args.json:
        print(json.dumps({"stack": args.stack, "rows": [asdict(r) for r in rows]}, indent=2))
    else:
        print_rows(rows, args.stack)
    return 0 if all(row.ok for row in rows) else 1
