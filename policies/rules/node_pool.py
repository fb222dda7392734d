"""Rule 1: a TPU node pool (``gcp:container/nodePool:NodePool``) is exactly one real slice shape.

GKE's rules (see the TPU facts): a single-host pool carries no ``placementPolicy.tpuTopology``; a
multi-host pool is one slice: ``placementPolicy`` COMPACT with its ``tpuTopology`` (tpu7x: a
workload policy named in ``placementPolicy.policyName``, no ``type``), autoscaling whole slice
(``minNodeCount`` 0 or hosts, ``maxNodeCount`` hosts) and one zone in ``nodeLocations``.

Node count, as the program declares it (docs/infra.md): without autoscaling, ``nodeCount`` (or
``initialNodeCount``) == hosts; with autoscaling, ``initialNodeCount`` 0 or hosts. ``nodeCount``
beside autoscaling is advisory (pulumi-gcp: "should not be used alongside autoscaling"; it
resizes the pool back on every update after the autoscaler moved it) unless it is a partial slice.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from policies.props import as_int, as_list, as_map, is_unknown
from policies.resources import NodePool, node_pool
from policies.rules import Advisory
from raytpu import catalog, generations
from raytpu.errors import invalid


@functools.cache
def _known_machines() -> dict[str, generations.Generation]:
    return {m: g for g in generations.GENERATIONS.values() for m, _ in g.machine_types}


def check_node_pool(props: Mapping[str, Any]) -> list[str]:
    """Violations of one node pool's props (empty for non-TPU pools and unknown shapes)."""
    pool = node_pool(props)
    machine = pool.machine_type
    if machine is None or is_unknown(machine):
        return []
    if not pool.is_tpu:
        if isinstance(pool.topology, str):
            return [
                f"placementPolicy.tpuTopology: {pool.topology!r} is set on machine type "
                f"{machine!r}, which is not a TPU host; remove tpuTopology or use a TPU machine "
                f"type ({', '.join(sorted(_known_machines()))})"
            ]
        return []
    machines = _known_machines()
    if machine not in machines:
        return [
            f"nodeConfig.machineType: {machine!r} is not a known TPU machine type; valid: "
            f"{', '.join(machines)}"
        ]
    if is_unknown(pool.topology):
        return []
    gen = machines[machine]
    if gen.workload_policy and pool.topology is None and pool.policy_name is not None:
        # The topology lives in the workload policy: the stack rule resolves it.
        return _location_violations(pool, hosts=None, label=f"{gen.name} workload-policy pool")
    return check_pool_shape(pool)


def check_pool_shape(pool: NodePool, topology: Any = None, source: str = "") -> list[str]:
    """Shape, placement, node count, autoscaling and zone of a TPU pool with a known topology.

    ``topology`` overrides ``placementPolicy.tpuTopology`` (a tpu7x workload policy's
    ``acceleratorTopology``); ``source`` names where that topology came from.
    """
    topo = topology or pool.topology
    where = source or "placementPolicy.tpuTopology"
    try:
        shape = pool.shape(topo)
    except generations.CatalogError as error:
        stated = f"{where} {topo!r}" if topo else "no tpuTopology (one host)"
        return [
            f"nodeConfig.machineType/{where}: {pool.machine_type!r} with {stated} is not a TPU "
            f"slice: {error}"
        ]
    if not shape.multi_host:
        if pool.topology is not None:
            return [_single_host_topology(pool, shape)]
        return []
    violations: list[str] = []
    uses_workload_policy = shape.uses_workload_policy
    if uses_workload_policy:
        if pool.policy_name is None:
            violations.append(
                f"placementPolicy.policyName: not set; a multi-host {shape.name} pool needs a "
                f"workload policy (gcp.compute.ResourcePolicy with workloadPolicy type "
                f"{catalog.WORKLOAD_POLICY_TYPE}, acceleratorTopology {shape.topology!r}) named here"
            )
        elif isinstance(pool.placement_type, str) and pool.placement_type:
            violations.append(
                Advisory(
                    f"placementPolicy.type: {pool.placement_type!r} is set beside policyName; GKE "
                    f"stores a workload-policy pool as policyName and tpuTopology with no type, so "
                    f"this likely diffs (and replaces the pool) on every update: set type to '' "
                    f"and tpuTopology to {shape.topology!r}"
                )
            )
    else:
        if pool.placement_type is not None and not is_unknown(pool.placement_type):
            if pool.placement_type != "COMPACT":
                violations.append(
                    invalid(
                        "placementPolicy.type",
                        pool.placement_type,
                        "COMPACT",
                        reason=f"{shape.name} is a multi-host slice",
                    )
                )
        elif pool.placement_type is None:
            violations.append(
                f"placementPolicy.type: not set; a multi-host {shape.name} slice needs "
                f"placementPolicy type COMPACT with tpuTopology {shape.topology!r}"
            )
    violations += _count_violations(pool, shape)
    violations += _location_violations(pool, shape.hosts, shape.name)
    return violations


def _single_host_topology(pool: NodePool, shape: catalog.SliceShape) -> str:
    hint = ""
    try:
        multi = catalog.shape(
            shape.generation.name, shape.topology, chips_per_host=catalog.MULTI_HOST_CHIPS_PER_HOST
        )
        if multi.multi_host and multi.machine_type != pool.machine_type:
            hint = (
                f"; for a {multi.hosts}-host {shape.topology} slice use machine type "
                f"{multi.machine_type} ({multi.chips_per_host} chips per host)"
            )
    except generations.CatalogError:
        pass
    return (
        f"placementPolicy.tpuTopology: {shape.topology!r} is set on a single-host pool "
        f"({pool.machine_type} holds all {shape.chips} chips on 1 host); GKE rejects tpuTopology "
        f"on single-host TPU pools: remove placementPolicy{hint}"
    )


def _count_violations(pool: NodePool, shape: catalog.SliceShape) -> list[str]:
    hosts = shape.hosts
    facts = f"{shape.name}, {shape.chips} chips on {pool.machine_type}"
    violations: list[str] = []
    autoscaling = as_map(pool.autoscaling)
    if is_unknown(autoscaling):
        return []
    scaled = any(
        autoscaling.get(k) is not None
        for k in ("minNodeCount", "maxNodeCount", "totalMinNodeCount", "totalMaxNodeCount")
    )
    counts = (("nodeCount", pool.node_count), ("initialNodeCount", pool.initial_node_count))
    if any(is_unknown(value) for _, value in counts):
        return []
    allowed = (0, hosts) if scaled else (hosts,)
    valid = f"0 or {hosts}" if scaled else str(hosts)
    for key, value in counts:
        if value is not None and (not isinstance(value, int) or value not in allowed):
            violations.append(
                f"{key}: {value!r} nodes does not make whole slices of {facts}; set {key} = "
                f"{valid} (a partial slice never starts)"
            )
    if scaled and pool.node_count in allowed:
        violations.append(
            Advisory(
                f"nodeCount: {pool.node_count!r} is set beside autoscaling; pulumi-gcp says "
                f"nodeCount should not be used alongside autoscaling (each update resizes the "
                f"pool back after the autoscaler moved it): set initialNodeCount = "
                f"{pool.node_count!r} instead and ignore its later changes"
            )
        )
    if not scaled and pool.count is None:
        violations.append(
            f"nodeCount: not set; a multi-host pool of {facts} without autoscaling needs "
            f"nodeCount = {hosts}"
        )
    for key in ("totalMinNodeCount", "totalMaxNodeCount"):
        value = autoscaling.get(key)
        if value is not None and not is_unknown(value):
            per_zone = "minNodeCount" if "Min" in key else "maxNodeCount"
            violations.append(
                f"autoscaling.{key}: {value!r} is set; a multi-host TPU pool scales whole slices "
                f"per zone: use autoscaling.{per_zone} (0 or {hosts} for min, {hosts} for max)"
            )
    if scaled:
        low = as_int(autoscaling.get("minNodeCount"))
        high = as_int(autoscaling.get("maxNodeCount"))
        raw_low, raw_high = autoscaling.get("minNodeCount"), autoscaling.get("maxNodeCount")
        if not is_unknown(low) and raw_low is not None and low not in (0, hosts):
            violations.append(
                invalid(
                    "autoscaling.minNodeCount",
                    raw_low,
                    f"0, {hosts} (a slice scales as a whole)",
                    reason=f"for {facts}",
                )
            )
        if not is_unknown(high) and (raw_high is None or high != hosts):
            valid = f"{hosts} (one whole slice per pool)"
            violations.append(
                f"autoscaling.maxNodeCount: not set for {facts}; valid: {valid}"
                if raw_high is None
                else invalid("autoscaling.maxNodeCount", raw_high, valid, reason=f"for {facts}")
            )
    return violations


def _location_violations(pool: NodePool, hosts: int | None, label: str) -> list[str]:
    if hosts is not None and hosts <= 1:
        return []
    locations = pool.node_locations
    if is_unknown(locations):
        return []
    zones = as_list(locations)
    if is_unknown(zones) or any(is_unknown(z) for z in zones):
        return []
    if len(zones) != 1:
        shown = "not set" if locations is None else f"{zones!r} has {len(zones)} zones"
        return [
            f"nodeLocations: {shown}; a multi-host {label} must sit in exactly one zone "
            f"(the slice's hosts share one interconnect): set nodeLocations to one zone"
        ]
    return []


__all__ = ["check_node_pool", "check_pool_shape"]
