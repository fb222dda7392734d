"""Pure builders of the Kueue objects a stack's teams need (plain dicts, no pulumi import).

From ``ray-tpu:teams`` and ``ray-tpu:priorityClasses`` (:mod:`infra.config.teams`):

- one **ResourceFlavor** per TPU flavor of the stack's slices (shape + Spot or not; its node
  labels from the catalog), plus ``ray-tpu-default`` (no labels) for CPU and memory;
- one **ClusterQueue** per team: ``google.com/tpu`` quotas in chips = slices x chips per slice,
  borrowing and lending limits in chips, its cohort, preemption within the queue by priority and
  reclaim within the cohort. Kueue refuses a workload that asks for a resource its ClusterQueue
  does not list, and Ray pods ask for CPU and memory too: those are listed on the default
  flavor with quotas no cluster reaches, so only TPU chips are governed;
- one **LocalQueue** (named after the team) in each namespace the team's Ray objects use;
- one **WorkloadPriorityClass** per priority class;
- the ``kueue.x-k8s.io/queue-name`` and ``kueue.x-k8s.io/priority-class`` labels of every Ray
  object of a team (:func:`workload_labels`).

Every object is checked against Kueue's CRDs (:mod:`raytpu.kueue`) by the offline checks, never while
declaring.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from infra.config.schema import RayClusterConfig, StackConfig
from infra.config.team_schema import TeamConfig, TeamQuota
from infra.config.teams import team_of
from raytpu import admission, kueue
from raytpu.catalog import TPU_RESOURCE

DEFAULT_FLAVOR = "ray-tpu-default"
"""The flavor of CPU and memory: no node labels, so it never steers a pod."""
UNGOVERNED = (("cpu", "100k"), ("memory", "1Pi"))
"""CPU and memory quotas far above any cluster: Kueue must list them, we do not govern them."""
NAMESPACE_LABEL = "kubernetes.io/metadata.name"
QUEUED_CHECK = "raytpu-queued-provisioning"
QUEUED_PROVISIONING_CLASS = "queued-provisioning.gke.io"
"""GKE's ProvisioningRequest class of queued provisioning (Dynamic Workload Scheduler)."""
PROVISIONING_CONTROLLER = "kueue.x-k8s.io/provisioning-request"
"""Kueue's admission check controller that creates ProvisioningRequests."""
Manifest = dict[str, Any]


def _object(kind: str, name: str, namespace: str | None = None, **body: Any) -> Manifest:
    metadata: dict[str, Any] = {
        "name": name,
        "labels": {
            "app.kubernetes.io/managed-by": "pulumi",
            "app.kubernetes.io/part-of": "ray-tpu",
        },
    }
    if namespace is not None:
        metadata["namespace"] = namespace
    return {"apiVersion": kueue.API_VERSION, "kind": kind, "metadata": metadata, **body}


@dataclass(frozen=True)
class Flavor:
    """A TPU flavor of the stack and the slices its node pools hold."""

    name: str
    quota: TeamQuota
    """A quota of this flavor with 0 slices: its shape and provisioning."""
    capacity: int
    """Slices the stack's node pools of this flavor hold at most."""
    slice_names: tuple[str, ...]


def flavors(stack: StackConfig) -> dict[str, Flavor]:
    """Every TPU flavor of the stack's slices, by name, with the slices its pools hold."""
    found: dict[str, Flavor] = {}
    for s in stack.slices:
        quota = TeamQuota(s.name, s.shape, s.provisioning == "spot", 0, queued=s.queued)
        known = found.get(quota.flavor)
        if known is None:
            found[quota.flavor] = Flavor(quota.flavor, quota, s.count, (s.name,))
        else:
            found[quota.flavor] = Flavor(
                known.name, known.quota, known.capacity + s.count, (*known.slice_names, s.name)
            )
    return found


def resource_flavors(stack: StackConfig) -> list[Manifest]:
    tpu = [
        _object(
            "ResourceFlavor",
            f.name,
            spec={"nodeLabels": f.quota.shape.node_labels(spot=f.quota.spot)},
        )
        for f in flavors(stack).values()
    ]
    return [*tpu, _object("ResourceFlavor", DEFAULT_FLAVOR, spec={})]


def _tpu_quota(quota: TeamQuota) -> dict[str, Any]:
    chips = quota.chips_per_slice
    resource: dict[str, Any] = {"name": TPU_RESOURCE, "nominalQuota": quota.slices * chips}
    if quota.borrowing_limit is not None:
        resource["borrowingLimit"] = quota.borrowing_limit * chips
    if quota.lending_limit is not None:
        resource["lendingLimit"] = quota.lending_limit * chips
    return {"name": quota.flavor, "resources": [resource]}


def team_namespaces(stack: StackConfig, team: TeamConfig) -> tuple[str, ...]:
    """The team's namespace, then every other namespace holding one of its Ray objects."""
    objects = (*stack.ray_clusters, *stack.ray_services, *stack.ray_jobs)
    used = [o.namespace for o in objects if team_of(stack.teams, o) is team]
    return tuple(dict.fromkeys([team.namespace, *used]))


def cluster_queue(stack: StackConfig, team: TeamConfig) -> Manifest:
    spec: dict[str, Any] = {
        "namespaceSelector": {
            "matchExpressions": [
                {
                    "key": NAMESPACE_LABEL,
                    "operator": "In",
                    "values": list(team_namespaces(stack, team)),
                }
            ]
        },
        "queueingStrategy": "BestEffortFIFO",
        "preemption": {
            "withinClusterQueue": team.within_cluster_queue,
            "reclaimWithinCohort": team.reclaim_within_cohort,
            "borrowWithinCohort": {"policy": "Never"},
        },
        "resourceGroups": [
            {
                "coveredResources": [TPU_RESOURCE],
                "flavors": [_tpu_quota(q) for q in team.quotas],
            },
            {
                "coveredResources": [name for name, _ in UNGOVERNED],
                "flavors": [
                    {
                        "name": DEFAULT_FLAVOR,
                        "resources": [{"name": n, "nominalQuota": q} for n, q in UNGOVERNED],
                    }
                ],
            },
        ],
    }
    if team.cohort is not None:
        spec["cohortName"] = team.cohort
    if queued_flavors(team):
        spec["admissionChecksStrategy"] = {
            "admissionChecks": [{"name": QUEUED_CHECK, "onFlavors": queued_flavors(team)}]
        }
    return _object("ClusterQueue", team.name, spec=spec)


def queued_flavors(team: TeamConfig) -> list[str]:
    """The team's flavors on ``queued`` slices: admitted only once GKE provisions the slice."""
    return list(dict.fromkeys(q.flavor for q in team.quotas if q.queued))


def queued_provisioning(stack: StackConfig) -> list[Manifest]:
    """The ProvisioningRequestConfig and AdmissionCheck of queued provisioning, when a team
    has a quota on a ``queued`` slice: Kueue asks GKE (Dynamic Workload Scheduler) for the
    workload's whole slices in one ProvisioningRequest and admits it once they are there."""
    if not any(queued_flavors(team) for team in stack.teams):
        return []
    config = _object(
        "ProvisioningRequestConfig",
        QUEUED_CHECK,
        spec={
            "provisioningClassName": QUEUED_PROVISIONING_CLASS,
            "managedResources": [TPU_RESOURCE],
        },
    )
    check = _object(
        "AdmissionCheck",
        QUEUED_CHECK,
        spec={
            "controllerName": PROVISIONING_CONTROLLER,
            "parameters": {
                "apiGroup": kueue.API_VERSION.split("/")[0],
                "kind": "ProvisioningRequestConfig",
                "name": QUEUED_CHECK,
            },
        },
    )
    return [config, check]


def local_queues(stack: StackConfig, team: TeamConfig) -> list[Manifest]:
    return [
        _object("LocalQueue", team.name, namespace, spec={"clusterQueue": team.name})
        for namespace in team_namespaces(stack, team)
    ]


def priority_classes(stack: StackConfig) -> list[Manifest]:
    return [
        _object("WorkloadPriorityClass", p.name, value=p.value, description=p.description)
        for p in stack.priority_classes
    ]


def workload_labels(stack: StackConfig, obj: RayClusterConfig) -> dict[str, str]:
    """Kueue's queue and priority labels of a team's Ray object (empty for other objects)."""
    team = team_of(stack.teams, obj)
    if team is None:
        return {}
    return {kueue.QUEUE_LABEL: team.name, kueue.PRIORITY_LABEL: obj.priority or team.priority}


def manifests(stack: StackConfig) -> list[Manifest]:
    """Every Kueue object the stack declares (none without teams); the offline checks validate
    them against the Kueue CRDs (``raytpu preview``, ``raytpu check``)."""
    if not stack.teams:
        return []
    found = [*resource_flavors(stack), *priority_classes(stack), *queued_provisioning(stack)]
    for team in stack.teams:
        found += [cluster_queue(stack, team), *local_queues(stack, team)]
    return found


@dataclass(frozen=True)
class QuotaRow:
    """One line of ``raytpu quota``: a team's quota of one flavor, and what the pools hold."""

    team: str
    flavor: str
    shape: str
    slices: int
    chips: int
    borrowing_limit: int | None
    lending_limit: int | None
    cohort: str | None
    capacity: int
    """Slices the node pools of this flavor hold."""
    unassigned: int
    """Slices of this flavor no team's nominal quota covers (negative: oversubscribed)."""


def quota_rows(stack: StackConfig) -> list[QuotaRow]:
    known = flavors(stack)
    assigned: dict[str, int] = {}
    for team in stack.teams:
        for q in team.quotas:
            assigned[q.flavor] = assigned.get(q.flavor, 0) + q.slices
    rows = []
    for team in stack.teams:
        for q in team.quotas:
            capacity = known[q.flavor].capacity if q.flavor in known else 0
            rows.append(
                QuotaRow(
                    team=team.name,
                    flavor=q.flavor,
                    shape=q.shape.name,
                    slices=q.slices,
                    chips=q.slices * q.chips_per_slice,
                    borrowing_limit=q.borrowing_limit,
                    lending_limit=q.lending_limit,
                    cohort=team.cohort,
                    capacity=capacity,
                    unassigned=capacity - assigned[q.flavor],
                )
            )
    return rows


def admission_queues(stack: StackConfig) -> list[admission.ClusterQueue]:
    """The teams' ClusterQueues for the planning model (:mod:`raytpu.admission`), in slices."""
    return [
        admission.ClusterQueue(
            name=team.name,
            quotas={
                q.flavor: admission.Quota(q.slices, q.borrowing_limit, q.lending_limit)
                for q in team.quotas
            },
            cohort=team.cohort,
            within=team.within_cluster_queue,
            reclaim=team.reclaim_within_cohort,
        )
        for team in stack.teams
    ]
