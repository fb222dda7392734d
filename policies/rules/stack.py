"""Rule 3, stack level: Ray TPU worker groups have node pools to run on, and KubeRay runs at all.

- Every TPU worker group finds node pools of its exact shape (generation, topology, chips per
  host) with enough slices for the ``replicas`` of all groups of that shape (``maxReplicas`` for
  groups of a cluster with ``enableInTreeAutoscaling``): a multi-host pool is
  one slice, a single-host pool holds one slice per node (its autoscaling max, else its node count).
- A RayService upgraded blue-green (``upgradeStrategy.type`` ``NewCluster``, KubeRay's default
  when unset) finds its slices a second time in those pools, beside every group's: KubeRay brings
  up the whole second RayCluster before it switches traffic.
- A GKE cluster in a stack that declares KubeRay objects has the Ray Operator add-on
  (``addonsConfig.rayOperatorConfigs[0].enabled``), which brings KubeRay and its TPU webhook.
- A tpu7x pool's workload policy (``placementPolicy.policyName``) names a declared
  ``gcp:compute/resourcePolicy:ResourcePolicy`` whose ``acceleratorTopology`` fits the pool.

These apply to stacks that declare a GKE cluster or node pools; a set of bare Kubernetes manifests
(``raytpu check k8s.yaml``) has no pools to compare with, and only the per-object rules apply.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from policies.props import as_int, as_map, get, is_unknown
from policies.resources import (
    NodePool,
    ResourceLike,
    kind_of,
    node_pool,
    object_label,
    tpu_resources,
    worker_groups,
)
from policies.rules import Advisory
from policies.rules.node_pool import check_pool_shape
from raytpu import catalog, generations

ShapeKey = tuple[str, str, int]


def _key(shape: catalog.SliceShape) -> ShapeKey:
    return (shape.generation.name, shape.topology, shape.chips_per_host)


def _label(key: ShapeKey) -> str:
    gen, topology, chips = key
    shape = catalog.shape(gen, topology, chips_per_host=chips)
    return f"{shape.name} on {shape.machine_type}"


def _pool_name(resource: ResourceLike, pool: NodePool) -> str:
    return pool.name if isinstance(pool.name, str) else resource.name


def _workload_topology(pool: NodePool, policies: Sequence[ResourceLike]) -> Any:
    """acceleratorTopology of the ResourcePolicy the pool names (None: not found, or UNKNOWN)."""
    wanted = pool.policy_name
    if not isinstance(wanted, str):
        return None
    for policy in policies:
        name = get(policy.props, "name")
        names = {policy.name, name} if isinstance(name, str) else {policy.name}
        if wanted in names or any(wanted.endswith(f"/{n}") for n in names):
            return get(policy.props, "workloadPolicy.acceleratorTopology")
    return None


def pool_slices(resource: ResourceLike, policies: Sequence[ResourceLike] = ()) -> Any:
    """(shape key, slices) a TPU node pool offers, or None when its shape is unknown or invalid."""
    pool = node_pool(resource.props)
    topology = pool.topology
    try:
        gen = catalog.shape_from_machine_type(pool.machine_type, None).generation
    except generations.CatalogError:
        return None
    if topology is None and gen.workload_policy:
        topology = _workload_topology(pool, policies)
    if is_unknown(topology):
        return None
    try:
        shape = pool.shape(topology)
    except generations.CatalogError:
        return None
    if shape.multi_host:
        return _key(shape), 1
    autoscaling = as_map(pool.autoscaling)
    high = None if is_unknown(autoscaling) else as_int(autoscaling.get("maxNodeCount"))
    nodes = high if isinstance(high, int) else pool.count
    if not isinstance(nodes, int):
        nodes = 1 if nodes is None else 0
    return _key(shape), nodes


@dataclass(frozen=True)
class _Capacity:
    """The slices the stack's TPU node pools offer, per shape."""

    offered: dict[ShapeKey, int]
    pool_names: dict[ShapeKey, list[str]]


@dataclass(frozen=True)
class _Demand:
    """One TPU worker group's slices: ``who`` it is, of which object, its shape and replicas."""

    resource: ResourceLike
    who: str
    key: ShapeKey
    slices: int


def _capacity(roles: Mapping[str, list[ResourceLike]]) -> _Capacity | None:
    """What the pools offer; ``None`` when a pool's shape is unknown (it could be the one)."""
    offered: dict[ShapeKey, int] = defaultdict(int)
    pool_names: dict[ShapeKey, list[str]] = defaultdict(list)
    for resource in roles["pools"]:
        found = pool_slices(resource, roles["policies"])
        if found is None:
            pool = node_pool(resource.props)
            if is_unknown(pool.topology) or is_unknown(pool.machine_type):
                return None
            continue
        key, slices = found
        offered[key] += slices
        pool_names[key].append(_pool_name(resource, node_pool(resource.props)))
    return _Capacity(offered, pool_names)


def _demands(roles: Mapping[str, list[ResourceLike]]) -> list[_Demand]:
    """Every TPU worker group of a known shape and replica count (rule 2 reports the others)."""
    found = []
    for resource in roles["ray"]:
        for group in worker_groups(resource.props, kind_of(resource.props, resource.type)):
            if not group.requests_tpu or not isinstance(group.chips_per_host, int):
                continue
            try:
                shape = group.shape()
            except (generations.CatalogError, TypeError, ValueError):
                continue
            replicas = group.slices_wanted
            if is_unknown(replicas) or not isinstance(replicas, int):
                continue
            who = f"{object_label(resource)} group {group.label!r} ({group.path})"
            found.append(_Demand(resource, who, _key(shape), replicas))
    return found


def check_slices_for_groups(resources: Sequence[ResourceLike]) -> list[str]:
    """Every TPU worker group has node pools of its shape with enough slices for its replicas."""
    roles = tpu_resources(resources)
    if not roles["clusters"] and not roles["pools"]:
        return []
    capacity = _capacity(roles)
    if capacity is None:
        return []
    needed: dict[ShapeKey, list[_Demand]] = defaultdict(list)
    for demand in _demands(roles):
        needed[demand.key].append(demand)
    violations = []
    for key, users in needed.items():
        total = sum(d.slices for d in users)
        have = capacity.offered.get(key, 0)
        if total <= have:
            continue
        names = ", ".join(f"{d.who} x{d.slices}" for d in users)
        pools = ", ".join(capacity.pool_names.get(key, [])) or "none"
        others = ", ".join(_label(k) for k in sorted(set(capacity.offered) - {key})) or "none"
        violations.append(
            f"{names}: {total} slice(s) of {_label(key)} needed, but the stack's node pools of "
            f"that shape offer {have} (pools: {pools}; other TPU pool shapes: {others}); add node "
            f"pools of this shape (slice count) or lower replicas"
        )
    return violations


BLUE_GREEN = (None, "NewCluster", "NewClusterWithIncrementalUpgrade")
"""RayService ``spec.upgradeStrategy.type`` values that bring up a second RayCluster on upgrade
(``None``: unset, which KubeRay takes as ``NewCluster``)."""


def check_upgrade_capacity(resources: Sequence[ResourceLike]) -> list[str]:
    """A RayService upgraded blue-green needs its slices twice: once for the running RayCluster,
    once for the new one; the pools must hold that beside every other group of the shape."""
    roles = tpu_resources(resources)
    capacity = _capacity(roles) if roles["pools"] else None
    if capacity is None:
        return []
    demands = _demands(roles)
    held: dict[ShapeKey, int] = defaultdict(int)
    for demand in demands:
        held[demand.key] += demand.slices
    violations = []
    for resource in roles["ray"]:
        if kind_of(resource.props, resource.type) != "RayService":
            continue
        strategy = get(resource.props, "spec.upgradeStrategy.type")
        if is_unknown(strategy) or strategy not in BLUE_GREEN:
            continue
        second: dict[ShapeKey, int] = defaultdict(int)
        for demand in demands:
            if demand.resource is resource:
                second[demand.key] += demand.slices
        for key, more in second.items():
            have = capacity.offered.get(key, 0)
            if more and held[key] + more > have:
                shown = "not set (KubeRay's default: NewCluster)" if strategy is None else strategy
                violations.append(
                    f"{object_label(resource)}: spec.upgradeStrategy.type is {shown}: an upgrade "
                    f"brings up a second RayCluster, {more} more slice(s) of {_label(key)} beside "
                    f"the {held[key]} the stack's groups hold, but its node pools offer {have}; "
                    f"set upgradeStrategy.type None (in place; ray-tpu:rayServices[]."
                    f"upgradeStrategy: None, the default without spare slices) or add "
                    f"{held[key] + more - have} slice(s) of that shape"
                )
    return violations


def check_ray_operator_addon(resources: Sequence[ResourceLike]) -> list[str]:
    """A stack with KubeRay objects runs them on a cluster with the Ray Operator add-on."""
    roles = tpu_resources(resources)
    if not roles["ray"]:
        return []
    kinds = sorted({object_label(r) for r in roles["ray"]})
    violations = []
    for cluster in roles["clusters"]:
        enabled_path = "addonsConfig.rayOperatorConfigs[0].enabled"
        enabled = get(cluster.props, enabled_path)
        if is_unknown(enabled) or enabled is True:
            continue
        shown = "not set" if enabled is None else f"{enabled!r}"
        violations.append(
            f"{object_label(cluster)}: {enabled_path} is {shown}, but the stack declares "
            f"{', '.join(kinds)}; enable the Ray Operator add-on (addonsConfig.rayOperatorConfigs "
            f"= [{{enabled: true}}], GKE >= 1.30.0-gke.1747000), which runs KubeRay and its TPU "
            f"webhook"
        )
    return violations


def check_workload_policies(resources: Sequence[ResourceLike]) -> list[str]:
    """tpu7x pools with a workload policy: the policy exists and its topology fits the pool.

    A pool that states ``tpuTopology`` beside ``policyName`` (the form GKE stores) has its shape
    checked by the node pool rule; here its policy's ``acceleratorTopology`` must agree with it.
    """
    roles = tpu_resources(resources)
    violations = []
    for resource in roles["pools"]:
        pool = node_pool(resource.props)
        try:
            gen = catalog.shape_from_machine_type(pool.machine_type, None).generation
        except generations.CatalogError:
            continue
        if not gen.workload_policy or not isinstance(pool.policy_name, str):
            continue
        if is_unknown(pool.topology):
            continue
        topology = _workload_topology(pool, roles["policies"])
        name = _pool_name(resource, pool)
        if topology is None:
            if pool.topology is not None:
                continue  # a policy outside the stack; the pool's own topology was checked
            known = ", ".join(str(get(p.props, "name") or p.name) for p in roles["policies"])
            violations.append(
                f"NodePool/{name}: placementPolicy.policyName {pool.policy_name!r} names no "
                f"declared ResourcePolicy with workloadPolicy.acceleratorTopology (declared: "
                f"{known or 'none'}); declare it in the stack so its topology can be checked"
            )
            continue
        if is_unknown(topology):
            continue
        if pool.topology is not None:
            if pool.topology != topology:
                violations.append(
                    f"NodePool/{name}: placementPolicy.tpuTopology {pool.topology!r} differs from "
                    f"workloadPolicy.acceleratorTopology {topology!r} of {pool.policy_name!r}; "
                    f"make them the same slice topology"
                )
            continue  # the node pool rule checked the pool against its own tpuTopology
        for message in check_pool_shape(
            pool, topology=topology, source="workloadPolicy.acceleratorTopology"
        ):
            kind = Advisory if isinstance(message, Advisory) else str
            violations.append(kind(f"NodePool/{name}: {message}"))
    return violations


__all__ = [
    "check_ray_operator_addon",
    "check_slices_for_groups",
    "check_workload_policies",
    "pool_slices",
]
