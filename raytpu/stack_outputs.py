"""Read what ``pulumi up`` made: the stack outputs that ``raytpu submit`` needs.

Stdlib plus the catalog only (no pulumi import): the outputs come from
``pulumi stack output --json --stack STACK`` (run as a subprocess with a timeout) or from a saved
copy of that JSON.

Glossary (Ray's and KubeRay's words):

- **stack outputs**: the values the Pulumi program exports. The contract this module reads:
  ``clusterName``, ``clusterEndpoint``, ``slices`` = {slice name: {generation, topology,
  machineType, chipsPerHost, hosts, chips, count, nodePools}}, ``rayClusters`` = {name:
  {namespace, slice, headService, dashboardPort}}, ``rayServices`` = {name: {namespace, slice,
  headService, serveService, dashboardPort}}, ``checkpointBucket`` (optional: stacks deployed
  before it have none).
- **head service**: the Kubernetes Service KubeRay makes for the Ray head of a RayCluster ``N``
  (``N-head-svc``); its dashboard port (8265) serves Ray's Job Submission API.
- **serve service**: for a RayService ``N``, the Service in front of the Serve HTTP proxies
  (``N-serve-svc``, port 8000).

Nothing here exposes the head: it is reached with ``kubectl port-forward`` (see
:meth:`RayHead.port_forward_command`), never through a public LoadBalancer.
"""

from __future__ import annotations

import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from raytpu import catalog, entrypoints, generations, inputs, project
from raytpu.errors import invalid
from raytpu.ray_names import DASHBOARD_PORT, SERVE_PORT

__all__ = [
    "DEFAULT_DASHBOARD_PORT",
    "RayHead",
    "SliceOutput",
    "StackNotDeployedError",
    "StackOutputs",
    "StackOutputsError",
    "fetch_outputs",
    "load_outputs",
    "parse_outputs",
    "read_outputs_file",
]

DEFAULT_DASHBOARD_PORT = DASHBOARD_PORT
"""Ray dashboard / Job Submission API port on the head."""
PULUMI_TIMEOUT_S = 120.0


class StackOutputsError(ValueError):
    """Stack outputs that cannot be used. The message names the key path and what is valid."""


class StackNotDeployedError(StackOutputsError):
    """The stack has no outputs: it does not exist or ``pulumi up`` never ran for it."""

    def __init__(self, stack: str, detail: str = "") -> None:
        self.stack = stack
        message = (
            f"stack {stack!r} has no outputs: it is not deployed. "
            f"Run `pulumi up --stack {stack}` first"
        )
        if detail:
            message += f" ({detail})"
        super().__init__(message)


@dataclass(frozen=True)
class SliceOutput:
    """One slice of the stack as ``pulumi up`` made it: a catalog shape times ``count``."""

    name: str
    shape: catalog.SliceShape
    count: int
    """Slices of this shape (KubeRay worker group ``replicas``)."""
    node_pools: tuple[str, ...]

    @property
    def hosts(self) -> int:
        return self.shape.hosts

    @property
    def chips_per_host(self) -> int:
        return self.shape.chips_per_host


@dataclass(frozen=True)
class RayHead:
    """A Ray head in the stack: of a RayCluster, or of the RayCluster a RayService runs."""

    kind: str
    """``RayCluster`` or ``RayService``."""
    name: str
    namespace: str
    slice: str
    head_service: str
    dashboard_port: int = DEFAULT_DASHBOARD_PORT
    serve_service: str | None = None
    replicas: int | None = None
    """Slices its TPU worker group holds (optional output; else the slice's ``count``)."""
    auth: str = "none"
    """How a client authenticates to its Ray head: ``kubernetes`` (the user's own Kubernetes
    credentials), ``secret`` (the token in :attr:`auth_secret`, read through the Kubernetes API)
    or ``none``. Older stacks without the output: ``none``."""
    auth_secret: str | None = None

    def port_forward_command(self, local_port: int = DEFAULT_DASHBOARD_PORT) -> str:
        """The command that makes the head's Job Submission API reachable on localhost."""
        return (
            f"kubectl port-forward svc/{self.head_service} "
            f"{local_port}:{self.dashboard_port} -n {self.namespace}"
        )

    def serve_port_forward_command(self, local_port: int = SERVE_PORT) -> str | None:
        if self.serve_service is None:
            return None
        return (
            f"kubectl port-forward svc/{self.serve_service} "
            f"{local_port}:{SERVE_PORT} -n {self.namespace}"
        )


@dataclass(frozen=True)
class StackOutputs:
    """The parsed outputs of one stack."""

    stack: str
    cluster_name: str
    cluster_endpoint: str | None
    slices: Mapping[str, SliceOutput]
    ray_clusters: Mapping[str, RayHead]
    ray_services: Mapping[str, RayHead] = field(default_factory=dict)
    checkpoint_bucket: str | None = None
    """The stack's checkpoint bucket (``checkpointBucket``); None for stacks deployed before it."""
    dashboard_iap_url: str | None = None
    """``dashboardIap.url``: the IAP-protected Ray Dashboard, when the stack declares one."""

    def checkpoint_dir(self, run: str) -> str | None:
        """``gs://BUCKET/RUN`` where training run ``run`` keeps its checkpoints (None: no bucket)."""
        if self.checkpoint_bucket is None:
            return None
        return entrypoints.checkpoint_uri(self.checkpoint_bucket, run)

    def slice(self, name: str) -> SliceOutput:
        if name not in self.slices:
            raise StackOutputsError(
                f"slice: {name!r} is not in stack {self.stack!r}; valid: {_names(self.slices)}"
            )
        return self.slices[name]

    def ray_cluster(self, name: str) -> RayHead:
        if name not in self.ray_clusters:
            raise StackOutputsError(
                f"cluster: {name!r} is not a RayCluster of stack {self.stack!r}; "
                f"valid: {_names(self.ray_clusters)}"
            )
        return self.ray_clusters[name]

    def ray_service(self, name: str) -> RayHead:
        if name not in self.ray_services:
            raise StackOutputsError(
                f"service: {name!r} is not a RayService of stack {self.stack!r}; "
                f"valid: {_names(self.ray_services)}"
            )
        return self.ray_services[name]

    def head(self, name: str | None = None) -> RayHead:
        """The Ray head called ``name``, a RayCluster or a RayService; with no name, the first
        RayCluster, else the first RayService (what ``dashboard`` and ``status`` open)."""
        heads = {**self.ray_services, **self.ray_clusters}
        if not heads:
            raise StackOutputsError(f"stack {self.stack!r} declares no RayCluster or RayService")
        if name is None:
            return next(iter(self.ray_clusters.values() or heads.values()))
        if name not in heads:
            raise StackOutputsError(invalid("--cluster", name, sorted(heads)))
        return heads[name]

    def clusters_on_slice(self, slice_name: str) -> list[RayHead]:
        self.slice(slice_name)
        return [c for c in self.ray_clusters.values() if c.slice == slice_name]


def _names(mapping: Mapping[str, Any]) -> str:
    return ", ".join(sorted(mapping)) or "(none)"


def _require(raw: Mapping[str, Any], key: str, path: str, kind: type | tuple[type, ...]) -> Any:
    if not isinstance(raw, Mapping):
        raise StackOutputsError(invalid(path, raw, "a JSON object"))
    if key not in raw:
        raise StackOutputsError(f"{path}.{key}: is required; valid: {_kind_text(kind)}")
    value = raw[key]
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise StackOutputsError(invalid(f"{path}.{key}", value, _kind_text(kind)))
    return value


def _kind_text(kind: type | tuple[type, ...]) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    words = {str: "a string", int: "an integer", float: "a number", dict: "a JSON object"}
    words[Mapping] = "a JSON object"
    words[list] = "a JSON list"
    return " or ".join(words.get(k, k.__name__) for k in kinds)


def _int(raw: Mapping[str, Any], key: str, path: str, default: int | None = None) -> int:
    """An integer output. Pulumi mocks and some engines hand numbers back as floats."""
    if default is not None and key not in raw:
        return default
    value = _require(raw, key, path, (int, float))
    if (isinstance(value, float) and not value.is_integer()) or value < 0:
        raise StackOutputsError(invalid(f"{path}.{key}", value, "an integer >= 0"))
    return int(value)


def _parse_slice(name: str, raw: Any, path: str) -> SliceOutput:
    generation = _require(raw, "generation", path, str)
    topology = _require(raw, "topology", path, str)
    machine_type = _require(raw, "machineType", path, str)
    try:
        shape = catalog.shape(generation, topology, machine_type=machine_type)
    except generations.CatalogError as error:
        raise StackOutputsError(f"{path}.{error}") from error
    for key, expected in (
        ("chipsPerHost", shape.chips_per_host),
        ("hosts", shape.hosts),
        ("chips", shape.chips),
    ):
        if key in raw and _int(raw, key, path) != expected:
            raise StackOutputsError(
                invalid(f"{path}.{key}", raw[key], f"{expected} (catalog: {shape.name})")
            )
    count = _int(raw, "count", path, default=1)
    pools = raw.get("nodePools", [])
    if not isinstance(pools, list) or not all(isinstance(p, str) for p in pools):
        raise StackOutputsError(invalid(f"{path}.nodePools", pools, "a list of names"))
    return SliceOutput(name=name, shape=shape, count=count, node_pools=tuple(pools))


def _parse_head(kind: str, name: str, raw: Any, path: str, slices: Mapping[str, Any]) -> RayHead:
    namespace = _require(raw, "namespace", path, str)
    slice_name = _require(raw, "slice", path, str)
    if slice_name not in slices:
        raise StackOutputsError(invalid(f"{path}.slice", slice_name, _names(slices)))
    head_service = _require(raw, "headService", path, str)
    serve_service = _require(raw, "serveService", path, str) if kind == "RayService" else None
    return RayHead(
        kind=kind,
        name=name,
        namespace=namespace,
        slice=slice_name,
        head_service=head_service,
        dashboard_port=_int(raw, "dashboardPort", path, default=DEFAULT_DASHBOARD_PORT),
        serve_service=serve_service,
        replicas=_int(raw, "replicas", path) if "replicas" in raw else None,
        **_auth(raw, path),
    )


AUTH_KINDS = ("kubernetes", "secret", "none")


def _auth(raw: Mapping[str, Any], path: str) -> dict[str, Any]:
    auth = raw.get("auth", "none")
    if auth not in AUTH_KINDS:
        raise StackOutputsError(invalid(f"{path}.auth", auth, AUTH_KINDS))
    secret = raw.get("authSecret")
    if auth == "secret" and (not isinstance(secret, str) or not secret):
        raise StackOutputsError(
            invalid(f"{path}.authSecret", secret, "the token Secret's name (auth is secret)")
        )
    return {"auth": auth, "auth_secret": secret if auth == "secret" else None}


def parse_outputs(raw: Any, stack: str) -> StackOutputs:
    """Parse the JSON object ``pulumi stack output --json`` prints.

    Raises :class:`StackNotDeployedError` for an empty object and :class:`StackOutputsError`
    naming the key path for anything malformed.
    """
    if not isinstance(raw, Mapping):
        raise StackOutputsError(invalid("outputs", type(raw).__name__, "a JSON object"))
    if not raw:
        raise StackNotDeployedError(stack)
    cluster_name = _require(raw, "clusterName", "outputs", str)
    endpoint = raw.get("clusterEndpoint")
    if endpoint is not None and not isinstance(endpoint, str):
        raise StackOutputsError(invalid("outputs.clusterEndpoint", endpoint, "a string"))
    raw_slices = _require(raw, "slices", "outputs", Mapping)
    slices = {
        name: _parse_slice(name, value, f"outputs.slices.{name}")
        for name, value in raw_slices.items()
    }
    clusters = {
        name: _parse_head("RayCluster", name, value, f"outputs.rayClusters.{name}", slices)
        for name, value in _require(raw, "rayClusters", "outputs", Mapping).items()
    }
    services_raw = raw.get("rayServices", {})
    if not isinstance(services_raw, Mapping):
        raise StackOutputsError(invalid("outputs.rayServices", services_raw, "a JSON object"))
    services = {
        name: _parse_head("RayService", name, value, f"outputs.rayServices.{name}", slices)
        for name, value in services_raw.items()
    }
    bucket = raw.get("checkpointBucket")
    if bucket is not None and (not isinstance(bucket, str) or not bucket.strip()):
        raise StackOutputsError(invalid("outputs.checkpointBucket", bucket, "a GCS bucket name"))
    iap = raw.get("dashboardIap")
    iap_url = iap.get("url") if isinstance(iap, Mapping) else None
    if iap is not None and not (isinstance(iap_url, str) and iap_url.startswith("https://")):
        raise StackOutputsError(invalid("outputs.dashboardIap.url", iap_url, "an https:// URL"))
    return StackOutputs(
        stack=stack,
        checkpoint_bucket=bucket,
        dashboard_iap_url=iap_url,
        cluster_name=cluster_name,
        cluster_endpoint=endpoint,
        slices=slices,
        ray_clusters=clusters,
        ray_services=services,
    )


def read_outputs_file(path: Path, stack: str) -> StackOutputs:
    """Parse a saved ``pulumi stack output --json --stack STACK > FILE``."""
    path = Path(path)
    if not path.exists():
        raise StackOutputsError(
            f"--outputs: {str(path)!r} does not exist; save it with "
            f"`pulumi stack output --json --stack {stack} > {path}`"
        )
    try:
        raw = inputs.load_json(path)
    except inputs.InputError as error:
        raise StackOutputsError(
            f"--outputs: {error}; valid: the output of `pulumi stack output --json --stack {stack}`"
        ) from None
    return parse_outputs(raw, stack)


def load_outputs(
    stack: str, outputs_file: Path | None = None, cwd: Path | None = None
) -> StackOutputs:
    """The outputs of ``stack``: from ``outputs_file`` (``--outputs``) when given, else from
    ``pulumi stack output`` run in the Pulumi project found from ``cwd`` (default: here)."""
    if outputs_file is not None:
        return read_outputs_file(outputs_file, stack)
    try:
        folder = project.find_project(cwd)
    except project.ProjectError as error:
        raise StackOutputsError(str(error)) from None
    return fetch_outputs(stack, cwd=folder)


def fetch_outputs(
    stack: str,
    *,
    pulumi: str = "pulumi",
    cwd: Path | None = None,
    timeout_s: float = PULUMI_TIMEOUT_S,
) -> StackOutputs:
    """Run ``pulumi stack output --json --stack STACK`` and parse what it prints.

    Secrets are not asked for (no ``--show-secrets``): nothing here needs the kubeconfig.
    """
    command = [pulumi, "stack", "output", "--json", "--stack", stack]
    try:
        done = subprocess.run(
            command, cwd=cwd, capture_output=True, text=True, timeout=timeout_s, check=False
        )
    except FileNotFoundError as error:
        raise StackOutputsError(
            f"pulumi: {pulumi!r} is not on PATH; install the Pulumi CLI, or pass "
            f"--outputs FILE saved with `pulumi stack output --json --stack {stack} > FILE`"
        ) from error
    except subprocess.TimeoutExpired as error:
        raise StackOutputsError(
            f"pulumi: `{' '.join(command)}` did not answer within {timeout_s:.0f} s; "
            "check `pulumi whoami` and the backend, or pass --outputs FILE"
        ) from error
    if done.returncode != 0:
        stderr = done.stderr.strip()
        if "no stack named" in stderr or "not found" in stderr:
            raise StackNotDeployedError(stack, stderr.splitlines()[-1] if stderr else "")
        raise StackOutputsError(
            f"pulumi: `{' '.join(command)}` failed (exit {done.returncode}): {stderr}"
        )
    try:
        raw = inputs.parse_json(done.stdout or "{}", "pulumi stack output")
    except inputs.InputError as error:
        raise StackOutputsError(
            f"pulumi: `{' '.join(command)}` printed something that is not JSON: {error}"
        ) from None
    return parse_outputs(raw, stack)
