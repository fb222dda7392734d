"""What the rules look at: resources, KubeRay worker groups and TPU node pools, read from props.

Glossary (Ray's and GKE's words, as in :mod:`raytpu.catalog`):

- **resource**: one declared object as the Pulumi engine sees it: a type token
  (``gcp:container/nodePool:NodePool``, ``kubernetes:ray.io/v1:RayCluster``), a name, a URN and its
  input properties (camelCase keys, numbers as floats, maybe unknown during preview).
- **Ray cluster spec**: the ``RayCluster`` ``spec``; a ``RayService`` holds one under
  ``spec.rayClusterConfig``, a ``RayJob`` under ``spec.rayClusterSpec``.
- **worker group**: one entry of ``workerGroupSpecs``; ``replicas`` = slices, ``numOfHosts`` =
  hosts (Kubernetes pods, Ray worker nodes) per slice; a TPU worker group requests
  ``google.com/tpu`` = chips per host and selects its slice with two GKE node labels.
- **node pool**: one GKE node pool; a multi-host TPU node pool is exactly one slice.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from policies.props import UNKNOWN, as_int, as_list, as_str, get, is_unknown
from raytpu import catalog, generations

NODE_POOL = "gcp:container/nodePool:NodePool"
CLUSTER = "gcp:container/cluster:Cluster"
RESOURCE_POLICY = "gcp:compute/resourcePolicy:ResourcePolicy"
SERVICE = "kubernetes:core/v1:Service"
RAY_KINDS = ("RayCluster", "RayService", "RayJob")
RAY_TYPES = tuple(f"kubernetes:ray.io/v1:{kind}" for kind in RAY_KINDS)
CLUSTER_SPEC_PATH = {
    "RayCluster": "spec",
    "RayService": "spec.rayClusterConfig",
    "RayJob": "spec.rayClusterSpec",
}
"""Where each KubeRay kind keeps its Ray cluster spec."""

TPU_MACHINE_FAMILIES = frozenset(
    machine.split("-")[0]
    for g in generations.GENERATIONS.values()
    for machine, _ in g.machine_types
)
"""``ct6e``, ``ct5lp``, ... : machine type prefixes that mean "a TPU host"."""


class ResourceLike(Protocol):
    type: str
    name: str
    urn: str
    props: Mapping[str, Any]


@dataclass(frozen=True)
class Resource:
    """One declared resource, from the engine, a stack file or a Kubernetes manifest."""

    type: str
    name: str
    urn: str
    props: Mapping[str, Any]
    source: str = ""
    """Where it came from (``file.yaml#2``), for messages; empty for the engine."""


def ray_kind(resource_type: str) -> str | None:
    """``RayCluster`` / ``RayService`` / ``RayJob`` for a KubeRay type token, else None."""
    if resource_type.startswith("kubernetes:ray.io/"):
        kind = resource_type.rsplit(":", 1)[-1]
        return kind if kind in RAY_KINDS else None
    return None


def is_ingress(resource_type: str) -> bool:
    return (
        resource_type.startswith("kubernetes:networking.k8s.io/")
        and resource_type.endswith(":Ingress")
    ) or (resource_type.startswith("kubernetes:extensions/") and resource_type.endswith(":Ingress"))


def object_label(resource: ResourceLike) -> str:
    """``RayCluster/train`` for Kubernetes objects, ``NodePool/train-0`` for the rest."""
    kind = resource.type.rsplit(":", 1)[-1]
    name = get(resource.props, "metadata.name")
    if not isinstance(name, str) or not name:
        name = resource.name
    return f"{kind}/{name}"


# ----------------------------------------------------------------------------- worker groups


@dataclass(frozen=True)
class WorkerGroup:
    """One KubeRay worker group, read from a Ray cluster spec. Unknown values stay UNKNOWN."""

    path: str
    """Field path of the group in its object: ``spec.workerGroupSpecs[0]``."""
    name: Any
    replicas: Any
    max_replicas: Any
    """``maxReplicas``: what the in-tree autoscaler may scale the group to."""
    autoscaled: bool
    """The cluster spec sets ``enableInTreeAutoscaling: true``."""
    num_of_hosts: Any
    """``numOfHosts`` as written (None when absent; KubeRay then uses 1)."""
    tpu_requests: Any
    """Sum of ``google.com/tpu`` requests over the containers (None: none requests TPU)."""
    tpu_limits: Any
    node_selector: Any
    containers: Any

    @property
    def hosts(self) -> Any:
        """``numOfHosts`` as KubeRay reads it: 1 when absent."""
        return 1 if self.num_of_hosts is None else self.num_of_hosts

    @property
    def slices_wanted(self) -> Any:
        """Slices the group may hold: ``maxReplicas`` when autoscaled, else ``replicas`` (1)."""
        if self.autoscaled and self.max_replicas is not None:
            return self.max_replicas
        return 1 if self.replicas is None else self.replicas

    @property
    def chips_per_host(self) -> Any:
        """Chips each pod asks for: the limit (what the device plugin enforces), else the request."""
        return self.tpu_limits if self.tpu_limits is not None else self.tpu_requests

    @property
    def requests_tpu(self) -> bool:
        return self.tpu_requests is not None or self.tpu_limits is not None

    @property
    def accelerator(self) -> Any:
        return self._label_value(catalog.GKE_ACCELERATOR_LABEL)

    @property
    def topology(self) -> Any:
        return self._label_value(catalog.GKE_TOPOLOGY_LABEL)

    def _label_value(self, label: str) -> Any:
        """A node selector value (labels hold dots, so not through :func:`get`)."""
        if is_unknown(self.node_selector):
            return UNKNOWN
        if not isinstance(self.node_selector, Mapping):
            return None
        value = self.node_selector.get(label)
        return UNKNOWN if is_unknown(value) else value

    @property
    def selects_tpu(self) -> bool:
        selector = self.node_selector if isinstance(self.node_selector, Mapping) else {}
        return any(
            k in selector for k in (catalog.GKE_ACCELERATOR_LABEL, catalog.GKE_TOPOLOGY_LABEL)
        )

    @property
    def label(self) -> str:
        return self.name if isinstance(self.name, str) else self.path

    def shape(self) -> catalog.SliceShape:
        """The slice this group asks for; raises CatalogError when that is no real slice."""
        return catalog.shape_from_gke_labels(
            self.accelerator, self.topology, int(self.chips_per_host)
        )


def _sum_tpu(containers: list[Any], key: str) -> Any:
    total = None
    for container in containers:
        value = get(container, f"resources.{key}")
        if is_unknown(value):
            return UNKNOWN
        if not isinstance(value, Mapping) or catalog.TPU_RESOURCE not in value:
            continue
        count = as_int(value[catalog.TPU_RESOURCE])
        if is_unknown(count):
            return UNKNOWN
        if count is None:
            return f"{value[catalog.TPU_RESOURCE]!r}"
        total = (total or 0) + count
    return total


def kind_of(props: Mapping[str, Any], resource_type: str = "") -> str | None:
    """The KubeRay kind of an object: its type token, else its ``kind``, else its spec's shape."""
    kind = ray_kind(resource_type) if resource_type else None
    if kind is None:
        found = get(props, "kind")
        kind = found if found in RAY_KINDS else None
    if kind is None and get(props, "apiVersion") in (None, "ray.io/v1"):
        spec = get(props, "spec")  # no kind stated: recognise the spec's shape
        if isinstance(spec, Mapping):
            if "rayClusterConfig" in spec:
                kind = "RayService"
            elif "rayClusterSpec" in spec:
                kind = "RayJob"
            elif "workerGroupSpecs" in spec or "headGroupSpec" in spec:
                kind = "RayCluster"
    return kind


def cluster_spec(props: Mapping[str, Any], kind: str | None = None) -> tuple[str, Any] | None:
    """(path, Ray cluster spec) of a KubeRay object, or None for other objects."""
    kind = kind or kind_of(props)
    if kind is None:
        return None
    path = CLUSTER_SPEC_PATH[kind]
    return path, get(props, path)


def worker_groups(props: Mapping[str, Any], kind: str | None = None) -> list[WorkerGroup]:
    """The worker groups of a RayCluster, RayService or RayJob (empty when unknown)."""
    found = cluster_spec(props, kind)
    if found is None:
        return []
    path, spec = found
    groups = as_list(get(spec, "workerGroupSpecs"))
    if is_unknown(groups):
        return []
    result = []
    for i, group in enumerate(groups):
        if not isinstance(group, Mapping):
            continue
        containers = as_list(get(group, "template.spec.containers"))
        if is_unknown(containers):
            requests = limits = UNKNOWN
        else:
            requests, limits = _sum_tpu(containers, "requests"), _sum_tpu(containers, "limits")
        result.append(
            WorkerGroup(
                path=f"{path}.workerGroupSpecs[{i}]",
                name=get(group, "groupName"),
                replicas=_int_or_raw(get(group, "replicas")),
                max_replicas=_int_or_raw(get(group, "maxReplicas")),
                autoscaled=get(spec, "enableInTreeAutoscaling") is True,
                num_of_hosts=_int_or_raw(get(group, "numOfHosts")),
                tpu_requests=requests,
                tpu_limits=limits,
                node_selector=get(group, "template.spec.nodeSelector"),
                containers=containers,
            )
        )
    return result


def _int_or_raw(value: Any) -> Any:
    """An int when ``value`` is a whole number, UNKNOWN, None when absent, else ``value`` as is."""
    number = as_int(value)
    return value if number is None and value is not None else number


def pod_templates(props: Mapping[str, Any], kind: str | None = None) -> list[tuple[str, Any]]:
    """(path, pod spec) of the head and of every worker group of a KubeRay object."""
    found = cluster_spec(props, kind)
    if found is None:
        return []
    path, spec = found
    templates = [(f"{path}.headGroupSpec.template.spec", get(spec, "headGroupSpec.template.spec"))]
    groups = as_list(get(spec, "workerGroupSpecs"))
    if not is_unknown(groups):
        for i in range(len(groups)):
            group_path = f"workerGroupSpecs[{i}].template.spec"
            templates.append((f"{path}.{group_path}", get(spec, group_path)))
    return templates


# ----------------------------------------------------------------------------- node pools


@dataclass(frozen=True)
class NodePool:
    """The TPU facts of a ``gcp:container/nodePool:NodePool`` (unknown values stay UNKNOWN)."""

    machine_type: Any
    topology: Any
    """``placementPolicy.tpuTopology`` (None when absent)."""
    placement_type: Any
    policy_name: Any
    node_count: Any
    initial_node_count: Any
    autoscaling: Any
    node_locations: Any
    name: Any = None

    @property
    def is_tpu(self) -> bool:
        machine = self.machine_type
        return isinstance(machine, str) and machine.split("-")[0] in TPU_MACHINE_FAMILIES

    @property
    def count(self) -> Any:
        """Nodes asked for: ``nodeCount``, else ``initialNodeCount`` (None when neither)."""
        return self.node_count if self.node_count is not None else self.initial_node_count

    def shape(self, topology: Any = None) -> catalog.SliceShape:
        """The slice of this pool; raises CatalogError when it is none (unknown: caller's job)."""
        return catalog.shape_from_machine_type(self.machine_type, topology or self.topology)


def node_pool(props: Mapping[str, Any]) -> NodePool:
    return NodePool(
        machine_type=as_str(get(props, "nodeConfig.machineType")),
        topology=as_str(get(props, "placementPolicy.tpuTopology")),
        placement_type=as_str(get(props, "placementPolicy.type")),
        policy_name=as_str(get(props, "placementPolicy.policyName")),
        node_count=_int_or_raw(get(props, "nodeCount")),
        initial_node_count=_int_or_raw(get(props, "initialNodeCount")),
        autoscaling=get(props, "autoscaling"),
        node_locations=get(props, "nodeLocations"),
        name=as_str(get(props, "name")),
    )


def tpu_resources(resources: Sequence[ResourceLike]) -> dict[str, list[ResourceLike]]:
    """Resources by role: ``pools`` (TPU node pools, and pools of unknown machine type),
    ``clusters``, ``ray`` (KubeRay objects), ``policies`` (resource policies)."""
    roles: dict[str, list[ResourceLike]] = {"pools": [], "clusters": [], "ray": [], "policies": []}
    for resource in resources:
        if resource.type == NODE_POOL:
            pool = node_pool(resource.props)
            if pool.is_tpu or is_unknown(pool.machine_type):  # unknown: may be a TPU pool
                roles["pools"].append(resource)
        elif resource.type == CLUSTER:
            roles["clusters"].append(resource)
        elif resource.type == RESOURCE_POLICY:
            roles["policies"].append(resource)
        elif ray_kind(resource.type):
            roles["ray"].append(resource)
    return roles


__all__ = [
    "CLUSTER",
    "NODE_POOL",
    "RAY_KINDS",
    "RAY_TYPES",
    "RESOURCE_POLICY",
    "SERVICE",
    "NodePool",
    "Resource",
    "ResourceLike",
    "WorkerGroup",
    "cluster_spec",
    "is_ingress",
    "kind_of",
    "node_pool",
    "object_label",
    "pod_templates",
    "ray_kind",
    "tpu_resources",
    "worker_groups",
]
