"""What a stack's Ray cluster is doing: its slices, jobs and Serve applications, as tables.

Examples:
  raytpu status --stack dev                           # the first RayCluster, through kubectl
  raytpu status --stack prod --cluster serve --json
  raytpu status --stack dev --address http://127.0.0.1:8265   # a head you reach yourself

Reaches the head as ``raytpu dashboard`` does (``kubectl port-forward`` under your own
credentials, unless ``--address`` is given) and authenticates as ``raytpu submit`` does (your
Kubernetes credentials, or the token Secret read with your RBAC). Reads Ray's state API
(nodes, placement groups), the Jobs API and Serve's API; every request is bounded.

- **slice**: hosts grouped by ``ray.io/tpu-slice-name``; ``free``, ``reserved`` (a placement group
  holds its hosts, with the job that made it), or ``partial`` (fewer hosts alive than its shape).
- **jobs**: each submission, its status and, for a failed one, its error class
  (:mod:`raytpu.errors`).
- **serve**: each application, its status, and running / target replicas per deployment.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from raytpu import catalog, errors, generations, stack_outputs
from raytpu.ray_names import LABEL_POD_TYPE, LABEL_SLICE_NAME, LABEL_TOPOLOGY
from raytpu.stack_outputs import RayHead, StackOutputsError
from raytpu.table import format_table
from raytpu_cli import dashboard, failure
from raytpu_cli.ray_credentials import CredentialError, auth_headers

REQUEST_TIMEOUT_S = 15.0
LIST_LIMIT = 1000


@dataclass(frozen=True)
class SliceState:
    name: str
    pod_type: str
    topology: str
    hosts_alive: int
    hosts: int | None
    """Hosts of the slice's shape (None when the shape is not in the catalog)."""
    state: str
    """``free``, ``reserved`` or ``partial``."""
    held_by: str = ""


@dataclass(frozen=True)
class JobState:
    submission_id: str
    status: str
    entrypoint: str
    error_class: str = ""


@dataclass(frozen=True)
class AppState:
    name: str
    status: str
    deployments: str
    error_class: str = ""


class HeadApi:
    """GET requests to one Ray head's HTTP APIs, bounded, with the credential attached."""

    def __init__(self, address: str, headers: Mapping[str, str]) -> None:
        self.address = address.rstrip("/")
        self.headers = dict(headers)

    def get(self, path: str) -> Any:
        import requests

        response = requests.get(
            f"{self.address}{path}", headers=self.headers, timeout=REQUEST_TIMEOUT_S
        )
        if response.status_code in (401, 403):
            raise CredentialError(
                f"the Ray head refused the credential (HTTP {response.status_code})"
            )
        response.raise_for_status()
        return response.json()

    def state(self, resource: str) -> list[dict[str, Any]]:
        reply = self.get(f"/api/v0/{resource}?detail=true&limit={LIST_LIMIT}")
        return list(reply["data"]["result"]["result"])


def _shape_hosts(pod_type: str, topology: str, chips_per_host: float) -> int | None:
    generation = pod_type.rsplit("-", 1)[0]
    try:
        shape = catalog.shape(generation, topology, chips_per_host=int(chips_per_host))
    except (generations.CatalogError, ValueError):
        return None
    return shape.hosts


def slice_states(
    nodes: list[dict[str, Any]], groups: list[dict[str, Any]], job_names: Mapping[str, str]
) -> list[SliceState]:
    """Slices from the alive nodes' labels; reserved when a live placement group holds a host."""
    members: dict[str, list[dict[str, Any]]] = {}
    for node in nodes:
        labels = node.get("labels") or {}
        if node.get("state") == "ALIVE" and LABEL_SLICE_NAME in labels:
            members.setdefault(labels[LABEL_SLICE_NAME], []).append(node)
    holder: dict[str, str] = {}
    for group in groups:
        if group.get("state") not in ("CREATED", "RESCHEDULING"):
            continue
        job = str(group.get("creator_job_id") or "")
        for bundle in group.get("bundles") or []:
            node_id = bundle.get("node_id")
            if node_id:
                holder[node_id] = job_names.get(job, job or "?")
    states = []
    for name, hosts in sorted(members.items()):
        labels = hosts[0].get("labels") or {}
        tpu = float((hosts[0].get("resources_total") or {}).get("TPU", 0))
        expected = _shape_hosts(labels.get(LABEL_POD_TYPE, ""), labels.get(LABEL_TOPOLOGY, ""), tpu)
        held = sorted({holder[h["node_id"]] for h in hosts if h.get("node_id") in holder})
        if expected is not None and len(hosts) < expected:
            state = "partial"
        else:
            state = "reserved" if held else "free"
        states.append(
            SliceState(
                name,
                labels.get(LABEL_POD_TYPE, ""),
                labels.get(LABEL_TOPOLOGY, ""),
                len(hosts),
                expected,
                state,
                ", ".join(held),
            )
        )
    return states


def _error_class(message: str) -> str:
    return errors.classify(RuntimeError(message)).label if message else ""


def job_states(jobs: list[dict[str, Any]]) -> list[JobState]:
    return [
        JobState(
            _submission_or_job_id(job),
            str(job.get("status", "?")),
            str(job.get("entrypoint", ""))[:80],
            _error_class(str(job.get("message") or "")) if job.get("status") == "FAILED" else "",
        )
        for job in jobs
    ]


def app_states(serve: Mapping[str, Any]) -> list[AppState]:
    apps = []
    for name, app in sorted((serve.get("applications") or {}).items()):
        parts = []
        for dep_name, dep in sorted((app.get("deployments") or {}).items()):
            replicas = dep.get("replicas") or []
            running = sum(1 for r in replicas if r.get("state") == "RUNNING")
            target = (dep.get("target_num_replicas") or len(replicas)) if replicas else 0
            parts.append(f"{dep_name} {running}/{target}")
        status = str(app.get("status", "?"))
        failed = status in ("DEPLOY_FAILED", "UNHEALTHY")
        apps.append(
            AppState(
                name,
                status,
                ", ".join(parts),
                _error_class(str(app.get("message") or "")) if failed else "",
            )
        )
    return apps


def _submission_or_job_id(job: Mapping[str, Any]) -> str:
    return str(job.get("submission_id") or job.get("job_id") or "?")


def holder_names(
    api: HeadApi, jobs: list[dict[str, Any]], groups: list[dict[str, Any]]
) -> dict[str, str]:
    """Each placement group creator's name as a person submitted it: the submission id of the
    job whose driver created it, else the driver's job id. A creator missing from ``jobs`` is
    asked for by its id (``GET /api/jobs/<job_id>`` resolves a driver to its submission)."""
    names = {str(j["job_id"]): _submission_or_job_id(j) for j in jobs if j.get("job_id")}
    for creator in {str(g.get("creator_job_id") or "") for g in groups} - set(names) - {""}:
        with contextlib.suppress(OSError):  # not found or not answered: its job id is shown
            names[creator] = _submission_or_job_id(api.get(f"/api/jobs/{creator}"))
    return names


def collect(api: HeadApi) -> dict[str, list[Any]]:
    """Everything :func:`run` shows, from one head."""
    # Groups before jobs: a group's creator is then in the job list (or asked for by its id).
    groups = api.state("placement_groups")
    nodes = api.state("nodes")
    jobs = api.get("/api/jobs/")
    try:
        serve = api.get("/api/serve/applications/")
    except OSError:
        serve = {}
    return {
        "slices": slice_states(nodes, groups, holder_names(api, jobs, groups)),
        "jobs": job_states(jobs),
        "serve": app_states(serve or {}),
    }


def print_tables(found: Mapping[str, list[Any]], head: RayHead) -> None:
    print(f"{head.kind} {head.name!r} (namespace {head.namespace}, slice {head.slice})")
    sections = [
        (
            "slice",
            found["slices"],
            lambda s: (
                s.name,
                s.pod_type,
                s.topology,
                f"{s.hosts_alive}/{s.hosts if s.hosts is not None else '?'}",
                s.state,
                s.held_by,
            ),
            ("slice", "pod type", "topology", "hosts", "state", "held by"),
        ),
        (
            "job",
            found["jobs"],
            lambda j: (j.submission_id, j.status, j.error_class, j.entrypoint),
            ("job", "status", "error class", "entrypoint"),
        ),
        (
            "serve",
            found["serve"],
            lambda a: (a.name, a.status, a.deployments, a.error_class),
            ("application", "status", "replicas (running/target)", "error class"),
        ),
    ]
    for what, rows, row, header in sections:
        print()
        if rows:
            print(format_table(header, [tuple(str(c) for c in row(r)) for r in rows]))
        else:
            print(f"no {what}s")


@contextlib.contextmanager
def _reach(args: argparse.Namespace, head: RayHead) -> Iterator[str]:
    if args.address:
        yield args.address
        return
    from workloads.sim.local_cluster import free_port

    port = free_port()
    with dashboard.tunnel(dashboard.command(args.kubectl, head, port)):
        yield f"http://127.0.0.1:{port}"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("--stack", required=True, help="Pulumi stack name, e.g. dev or prod")
    parser.add_argument("--outputs", type=Path, help="saved `pulumi stack output --json`")
    parser.add_argument("--cluster", help="RayCluster or RayService name (default: the first)")
    parser.add_argument("--address", help="the head's dashboard URL (default: kubectl tunnel)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")
    parser.add_argument("--kubectl", default="kubectl", help=argparse.SUPPRESS)


def run(args: argparse.Namespace) -> int:
    import requests

    try:
        head = stack_outputs.load_outputs(args.stack, args.outputs, args.cwd).head(args.cluster)
    except StackOutputsError as error:
        return failure.report(error)
    try:
        headers = auth_headers(head)
        with _reach(args, head) as address:
            found = collect(HeadApi(address, headers))
    except (CredentialError, dashboard.TunnelError, errors.NetworkTimeoutError) as error:
        return failure.report(error)
    except requests.exceptions.RequestException as error:
        print(f"error: the Ray head did not answer: {error}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps({k: [asdict(v) for v in vs] for k, vs in found.items()}, indent=2))
    else:
        print_tables(found, head)
    return 0
