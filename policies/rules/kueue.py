"""Kueue rules, stack level: teams share TPU slices through queues, quotas and priorities.

- **kueue-queue-label**: a KubeRay object in a namespace that has LocalQueues (a team's) carries
  ``kueue.x-k8s.io/queue-name`` naming one of them; without it Kueue ignores the object and it
  takes slices outside every quota.
- **kueue-whole-slice-quota**: a ClusterQueue's ``google.com/tpu`` nominal quota, borrowing and
  lending limits on a TPU flavor are whole slices of that flavor's shape (chips = product of the
  topology): Kueue admits a slice whole, so a remainder strands chips.
- **kueue-quota-capacity**: per flavor, the nominal quotas of all ClusterQueues add up to no more
  than the stack's node pools of that flavor can ever hold (a nominal quota is a promise).
- **kueue-flavor-node-pools**: a TPU ResourceFlavor's ``nodeLabels`` match some TPU node pool
  (Kueue puts them in the pods' node selector: matching no pool, admitted pods never schedule).
- **kueue-priority-class**: a ``kueue.x-k8s.io/priority-class`` label names a declared
  WorkloadPriorityClass (Kueue refuses a workload whose class does not exist).

Flavors and node pools compare by the labels GKE puts on TPU hosts
(:meth:`raytpu.catalog.SliceShape.node_labels`). The capacity and node-pool rules apply to stacks
that declare node pools; the others also to bare manifests (``raytpu check``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from policies.props import as_int, as_list, as_map, as_str, get, is_unknown
from policies.resources import (
    ResourceLike,
    kind_of,
    node_pool,
    object_label,
    tpu_resources,
    worker_groups,
)
from policies.rules.stack import pool_slices
from raytpu import catalog, generations
from raytpu.kueue import PRIORITY_LABEL, QUEUE_LABEL

KUEUE_GROUP = "kubernetes:kueue.x-k8s.io/"


def _kueue(resources: Sequence[ResourceLike], kind: str) -> list[ResourceLike]:
    return [r for r in resources if r.type.startswith(KUEUE_GROUP) and r.type.endswith(f":{kind}")]


def _name(resource: ResourceLike) -> str:
    name = as_str(get(resource.props, "metadata.name"))
    return name if isinstance(name, str) else resource.name


def _labels(resource: ResourceLike) -> Any:
    return as_map(get(resource.props, "metadata.labels"))


@dataclass(frozen=True)
class _Flavor:
    name: str
    labels: dict[str, Any]
    shape: str
    """``v6e 4x4`` (for messages)."""
    chips: int
    """Chips of one slice of this flavor."""


def _tpu_flavors(resources: Sequence[ResourceLike]) -> dict[str, _Flavor]:
    """Declared ResourceFlavors that select TPU hosts (accelerator and topology labels)."""
    found = {}
    for resource in _kueue(resources, "ResourceFlavor"):
        labels = as_map(get(resource.props, "spec.nodeLabels"))
        if is_unknown(labels):
            continue
        accelerator = labels.get(catalog.GKE_ACCELERATOR_LABEL)
        topology = labels.get(catalog.GKE_TOPOLOGY_LABEL)
        if not isinstance(accelerator, str) or not isinstance(topology, str):
            continue
        try:
            chips = math.prod(catalog.parse_topology(topology))
        except generations.CatalogError:
            continue
        shape = f"{accelerator} {topology}"
        gens = [g for g in generations.GENERATIONS.values() if g.gke_accelerator == accelerator]
        if gens:
            shape = f"{gens[0].name} {topology}"
        found[_name(resource)] = _Flavor(_name(resource), labels, shape, chips)
    return found


def _tpu_quotas(queue: ResourceLike) -> list[tuple[str, str, str, Any]]:
    """(field path, flavor, field, value) of every google.com/tpu quota of a ClusterQueue."""
    found = []
    groups = as_list(get(queue.props, "spec.resourceGroups"))
    for g, group in enumerate([] if is_unknown(groups) else groups):
        flavors = as_list(get(group, "flavors"))
        for f, flavor in enumerate([] if is_unknown(flavors) else flavors):
            resources = as_list(get(flavor, "resources"))
            for r, resource in enumerate([] if is_unknown(resources) else resources):
                if get(resource, "name") != catalog.TPU_RESOURCE:
                    continue
                path = f"spec.resourceGroups[{g}].flavors[{f}].resources[{r}]"
                for key in ("nominalQuota", "borrowingLimit", "lendingLimit"):
                    value = get(resource, key)
                    if value is not None:
                        found.append((path, str(get(flavor, "name")), key, value))
    return found


def check_whole_slice_quotas(resources: Sequence[ResourceLike]) -> list[str]:
    """TPU quotas of ClusterQueues are whole slices of their flavor's shape."""
    flavors = _tpu_flavors(resources)
    violations = []
    for queue in _kueue(resources, "ClusterQueue"):
        for path, flavor_name, key, raw in _tpu_quotas(queue):
            flavor = flavors.get(flavor_name)
            chips = as_int(raw)
            if flavor is None or not isinstance(chips, int) or chips % flavor.chips == 0:
                continue
            low, high = chips // flavor.chips, chips // flavor.chips + 1
            violations.append(
                f"ClusterQueue/{_name(queue)} (team {_name(queue)}), flavor {flavor.name} "
                f"({flavor.shape}, {flavor.chips} chips a slice): {path}.{key} {chips} chips is "
                f"{chips / flavor.chips:g} slices; Kueue admits whole slices, so "
                f"{chips % flavor.chips} chips would never be used; set {low * flavor.chips} "
                f"({_slices(low)}) or {high * flavor.chips} ({_slices(high)})"
            )
    return violations


def _slices(count: int) -> str:
    return f"{count} slice" if count == 1 else f"{count} slices"


def _pools(resources: Sequence[ResourceLike]) -> list[tuple[str, dict[str, str], int]]:
    """(pool name, labels GKE puts on its hosts, slices it holds) of every TPU node pool."""
    roles = tpu_resources(resources)
    found = []
    for resource in roles["pools"]:
        shape_slices = pool_slices(resource, roles["policies"])
        if shape_slices is None:
            continue
        (gen, topology, chips), slices = shape_slices
        shape = catalog.shape(gen, topology, chips_per_host=chips)
        spot = get(resource.props, "nodeConfig.spot") is True
        pool = node_pool(resource.props)
        name = pool.name if isinstance(pool.name, str) else resource.name
        found.append((name, shape.node_labels(spot=spot), slices))
    return found


def _matches(flavor: _Flavor, labels: Mapping[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in flavor.labels.items())


def _teams_using(resources: Sequence[ResourceLike], flavor: str) -> list[str]:
    return sorted(
        _name(q)
        for q in _kueue(resources, "ClusterQueue")
        if any(f == flavor for _, f, _, _ in _tpu_quotas(q))
    )


def check_quota_capacity(resources: Sequence[ResourceLike]) -> list[str]:
    """Per TPU flavor, the nominal quotas fit the node pools that flavor's labels select."""
    pools = _pools(resources)
    if not pools:
        return []
    violations = []
    for flavor in _tpu_flavors(resources).values():
        shares = []
        for queue in _kueue(resources, "ClusterQueue"):
            for _, name, key, raw in _tpu_quotas(queue):
                chips = as_int(raw)
                if name == flavor.name and key == "nominalQuota" and isinstance(chips, int):
                    shares.append((_name(queue), chips))
        wanted = sum(chips for _, chips in shares)
        matching = [(n, s) for n, labels, s in pools if _matches(flavor, labels)]
        capacity = sum(s for _, s in matching) * flavor.chips
        if not shares or not matching or wanted <= capacity:
            continue  # a flavor that matches no pool: kueue-flavor-node-pools says so
        teams = ", ".join(f"{team} {chips / flavor.chips:g}" for team, chips in sorted(shares))
        names = ", ".join(sorted(n for n, _ in matching)) or "none"
        violations.append(
            f"flavor {flavor.name} ({flavor.shape}): the teams' nominal quotas add up to "
            f"{wanted / flavor.chips:g} slices ({teams}) but the node pools of that flavor hold "
            f"{capacity // flavor.chips} (pools: {names}); a nominal quota is a promise Kueue "
            f"cannot keep beyond the pools: lower the quotas (ray-tpu:teams[].quotas) or add "
            f"slices (ray-tpu:slices[].count)"
        )
    return violations


def check_flavor_node_pools(resources: Sequence[ResourceLike]) -> list[str]:
    """Every TPU ResourceFlavor's node labels match at least one TPU node pool."""
    pools = _pools(resources)
    if not tpu_resources(resources)["pools"]:
        return []
    violations = []
    for flavor in _tpu_flavors(resources).values():
        if any(_matches(flavor, labels) for _, labels, _ in pools):
            continue
        teams = ", ".join(_teams_using(resources, flavor.name)) or "no team yet"
        wanted = ", ".join(f"{k}={v}" for k, v in sorted(flavor.labels.items()))
        declared = "; ".join(
            f"{n}: {labels[catalog.GKE_ACCELERATOR_LABEL]} {labels[catalog.GKE_TOPOLOGY_LABEL]}"
            + (" spot" if catalog.GKE_SPOT_LABEL in labels else "")
            for n, labels, _ in sorted(pools, key=lambda p: p[0])
        )
        violations.append(
            f"ResourceFlavor/{flavor.name} ({flavor.shape}, used by {teams}): spec.nodeLabels "
            f"{wanted} match no TPU node pool (pools: {declared or 'none'}); pods admitted on it "
            f"would never schedule: add a slice of that shape and provisioning, or fix the labels"
        )
    return violations


def _queues_by_namespace(resources: Sequence[ResourceLike]) -> dict[str, dict[str, str]]:
    """namespace -> {LocalQueue name: its ClusterQueue (the team)}."""
    found: dict[str, dict[str, str]] = {}
    for queue in _kueue(resources, "LocalQueue"):
        namespace = as_str(get(queue.props, "metadata.namespace")) or "default"
        cluster_queue = as_str(get(queue.props, "spec.clusterQueue"))
        if isinstance(namespace, str):
            found.setdefault(namespace, {})[_name(queue)] = str(cluster_queue)
    return found


def _shape_of(resource: ResourceLike) -> str:
    for group in worker_groups(resource.props, kind_of(resource.props, resource.type)):
        accelerator, topology = group.accelerator, group.topology
        if isinstance(accelerator, str) and isinstance(topology, str):
            gens = [
                g.name for g in generations.GENERATIONS.values() if g.gke_accelerator == accelerator
            ]
            return f"{gens[0] if gens else accelerator} {topology}"
    return "no TPU group"


def check_queue_labels(resources: Sequence[ResourceLike]) -> list[str]:
    """KubeRay objects in a team's namespace name one of its LocalQueues."""
    queues = _queues_by_namespace(resources)
    violations = []
    for resource in tpu_resources(resources)["ray"]:
        namespace = as_str(get(resource.props, "metadata.namespace")) or "default"
        local = queues.get(namespace) if isinstance(namespace, str) else None
        labels = _labels(resource)
        if not local or is_unknown(labels) or is_unknown(labels.get(QUEUE_LABEL)):
            continue
        teams = ", ".join(sorted(set(local.values())))
        who = (
            f"{object_label(resource)} (namespace {namespace}, team {teams}, {_shape_of(resource)})"
        )
        wanted = labels.get(QUEUE_LABEL)
        options = ", ".join(sorted(local))
        if wanted is None:
            violations.append(
                f"{who}: metadata.labels has no {QUEUE_LABEL}; Kueue would not admit it and it "
                f"would take slices outside every team's quota; add the label {QUEUE_LABEL}: "
                f"{sorted(local)[0]} (LocalQueues here: {options}), or give it a team in the stack"
            )
        elif wanted not in local:
            violations.append(
                f"{who}: metadata.labels.{QUEUE_LABEL} {wanted!r} names no LocalQueue in "
                f"namespace {namespace}; it would wait forever; use one of: {options}"
            )
    return violations


def check_priority_classes(resources: Sequence[ResourceLike]) -> list[str]:
    """A priority-class label names a declared WorkloadPriorityClass."""
    declared = sorted(_name(p) for p in _kueue(resources, "WorkloadPriorityClass"))
    if not declared and not _kueue(resources, "LocalQueue"):
        return []  # no Kueue objects in these resources: the classes live elsewhere
    queues = _queues_by_namespace(resources)
    violations = []
    for resource in tpu_resources(resources)["ray"]:
        labels = _labels(resource)
        wanted = None if is_unknown(labels) else labels.get(PRIORITY_LABEL)
        if wanted is None or is_unknown(wanted) or wanted in declared:
            continue
        namespace = as_str(get(resource.props, "metadata.namespace")) or "default"
        queue = None if is_unknown(labels) else labels.get(QUEUE_LABEL)
        team = queues.get(str(namespace), {}).get(str(queue), "none")
        violations.append(
            f"{object_label(resource)} (team {team}, {_shape_of(resource)}): "
            f"metadata.labels.{PRIORITY_LABEL} {wanted!r} names no WorkloadPriorityClass "
            f"(declared: {', '.join(declared) or 'none'}); Kueue refuses the workload; use one "
            f"of those or declare {wanted!r} in ray-tpu:priorityClasses"
        )
    return violations


__all__ = [
    "check_flavor_node_pools",
    "check_priority_classes",
    "check_queue_labels",
    "check_quota_capacity",
    "check_whole_slice_quotas",
]
