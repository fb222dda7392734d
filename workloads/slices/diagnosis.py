"""Why a slice reservation did not place: read from Ray's node and placement group tables.

Glossary (Ray's words): a **bundle** that does not place is waiting for a host with free
resources and matching labels; the reasons are a slice short of hosts (a **partial slice**), a
bundle larger than any host, or every complete slice held by other **placement groups**.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from raytpu import errors
from raytpu.catalog import SliceShape
from raytpu.ray_names import LABEL_POD_TYPE, LABEL_SLICE_NAME


@dataclass(frozen=True)
class Missing:
    """Why a request's bundles did not place, and which scheduling failure that is."""

    reason: str
    error_class: errors.ErrorClass


def describe_missing(shape: SliceShape, tpu_per_bundle: float, own: Sequence[Any] = ()) -> Missing:
    """Why bundles did not place: which slice lacks hosts, which host is too small, or which
    placement groups hold the slices (``own``: this request's, named as such)."""
    import ray

    nodes = [n for n in ray.nodes() if n.get("Alive")]
    by_slice: dict[str, list[dict[str, Any]]] = {}
    for node in nodes:
        labels = node.get("Labels") or {}
        if labels.get(LABEL_POD_TYPE) == shape.pod_type:
            by_slice.setdefault(labels.get(LABEL_SLICE_NAME, "?"), []).append(node)
    if not by_slice:
        return Missing(f"no host with pod type {shape.pod_type} is alive", errors.NO_CAPACITY)
    reasons = []
    error_class = errors.NO_CAPACITY
    for name, members in sorted(by_slice.items()):
        if len(members) < shape.hosts:
            reasons.append(f"slice {name} has {len(members)} of {shape.hosts} hosts")
            error_class = errors.PARTIAL_SLICE
    biggest = max(float((n.get("Resources") or {}).get("TPU", 0)) for n in nodes)
    if tpu_per_bundle > biggest:
        reasons.append(
            f"each bundle asks TPU {tpu_per_bundle:g} but the largest host has TPU {biggest:g}"
        )
        error_class = errors.MISSIZED_REQUEST
    if not reasons:
        complete = sorted(name for name, members in by_slice.items() if len(members) >= shape.hosts)
        holders = _holders(by_slice, {pg.id.hex() for pg in own})
        busy = [name for name in complete if holders.get(name)]
        unheld = [name for name in complete if not holders.get(name)]
        held_by = "; ".join(f"{name} by {', '.join(holders[name])}" for name in busy)
        if unheld:
            reasons.append(
                f"too few free slices: {len(unheld)} of {len(complete)} complete slice(s) held by "
                f"no placement group ({', '.join(unheld)}: free, or used by actors and tasks)"
                + (f" (held: {held_by})" if busy else "")
            )
        else:
            reasons.append(
                f"no free slice: all {len(complete)} complete slice(s) of this shape are in use "
                f"(held: {held_by})"
            )
    return Missing("; ".join(reasons), error_class)


def _holders(by_slice: dict[str, list[dict[str, Any]]], own: set[str]) -> dict[str, list[str]]:
    """Per slice name, the created placement groups with a bundle on one of its hosts: "this
    request" for an id in ``own``, else the group's name or ``unnamed <id prefix>`` (Ray
    Train's and ``slice_placement_group``'s are unnamed)."""
    from workloads import ray_compat

    slice_of = {node["NodeID"]: name for name, members in by_slice.items() for node in members}
    holders: dict[str, list[str]] = {}
    for pg_id, pg in sorted(ray_compat.placement_groups().items()):
        if pg.get("state") != "CREATED":
            continue
        label = "this request" if pg_id in own else (pg.get("name") or f"unnamed {pg_id[:8]}")
        for name in sorted({slice_of.get(n) for n in pg.get("bundles_to_node_id", {}).values()}):
            if name:
                holders.setdefault(name, []).append(label)
    return holders
