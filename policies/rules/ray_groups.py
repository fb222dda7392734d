"""Rule 2: every KubeRay worker group that requests ``google.com/tpu`` asks for a real slice.

For RayCluster (``spec``), RayService (``spec.rayClusterConfig``) and RayJob
(``spec.rayClusterSpec``): ``numOfHosts`` (1 when absent, as KubeRay) equals the hosts of the
slice its node selector and chips per host describe, ``google.com/tpu`` requests equal limits,
and both GKE TPU node selector labels are present and name a real slice together.

Stricter than GKE's TPU webhook, never looser. The webhook only checks
``numOfHosts == max(chips(topology) // tpu_per_host, 1)`` (integer division) and that the topology
selector is present; here the shape must exist in the catalog (so chips divide exactly and the
accelerator label matches the topology), which implies the webhook's equation.

``google.com/tpu`` only in limits is valid Kubernetes (requests default to limits, and the webhook
reads limits): an :class:`~policies.rules.Advisory` finding. Only in requests is not (an extended
resource needs its limit): a violation.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from policies.props import is_unknown
from policies.resources import WorkerGroup, worker_groups
from policies.rules import Advisory
from raytpu import catalog, generations

WEBHOOK_ERROR = "Number of workers in worker group not equal to specified topology"


def webhook_hosts(topology: str, tpu_per_host: int) -> int | None:
    """Hosts the GKE TPU webhook expects: ``max(chips // tpu_per_host, 1)`` (None if unparsable)."""
    try:
        chips = math.prod(int(d) for d in str(topology).lower().split("x"))
    except ValueError:
        return None
    if tpu_per_host <= 0:
        return None
    return max(chips // tpu_per_host, 1)


def check_worker_groups(props: Mapping[str, Any], kind: str | None = None) -> list[str]:
    """Violations of every TPU worker group of one KubeRay object."""
    violations: list[str] = []
    for group in worker_groups(props, kind):
        violations += check_group(group)
    return violations


def check_group(group: WorkerGroup) -> list[str]:
    where = f"{group.path} (group {group.label!r})"
    if not group.requests_tpu:
        if group.selects_tpu:
            return [
                f"{where}.template.spec.containers: no container requests {catalog.TPU_RESOURCE}, "
                f"but the nodeSelector picks TPU nodes; GKE taints them "
                f"{catalog.TPU_TAINT_KEY}=present:NoSchedule: request {catalog.TPU_RESOURCE} "
                f"(chips per host) in requests and limits"
            ]
        return []
    if any(is_unknown(v) for v in (group.tpu_requests, group.tpu_limits)):
        return []
    violations: list[str] = []
    requests, limits = group.tpu_requests, group.tpu_limits
    for key, value in (("requests", requests), ("limits", limits)):
        if isinstance(value, str):
            violations.append(
                f"{where}.template.spec.containers[].resources.{key}.{catalog.TPU_RESOURCE}: "
                f"{value} is not a whole number of chips"
            )
    if violations:
        return violations
    field = f"{where}.template.spec.containers[].resources"
    if requests is None:
        violations.append(
            Advisory(
                f"{field}.requests.{catalog.TPU_RESOURCE}: not set while limits asks for {limits};"
                f" valid as written (Kubernetes defaults requests to limits, and the GKE TPU "
                f"webhook reads limits), but state requests: {limits} too so the pod spec says "
                f"what it gets"
            )
        )
    elif limits is None:
        violations.append(
            f"{field}.limits.{catalog.TPU_RESOURCE}: not set while requests asks for {requests}; "
            f"Kubernetes requires a limit for an extended resource (and GKE's TPU webhook reads "
            f"limits): set both requests and limits to {requests}"
        )
    elif requests != limits:
        violations.append(
            f"{where}.template.spec.containers[].resources: {catalog.TPU_RESOURCE} requests "
            f"{requests} != limits {limits}; TPU chips are not overcommitted: set both to the "
            f"chips per host"
        )
        return violations
    chips_per_host = group.chips_per_host
    selector = group.node_selector
    if is_unknown(selector):
        return violations
    accelerator, topology = group.accelerator, group.topology
    if is_unknown(accelerator) or is_unknown(topology):
        return violations
    missing = [
        label
        for label, value in (
            (catalog.GKE_ACCELERATOR_LABEL, accelerator),
            (catalog.GKE_TOPOLOGY_LABEL, topology),
        )
        if not isinstance(value, str) or not value
    ]
    if missing:
        valid_accelerators = ", ".join(g.gke_accelerator for g in generations.GENERATIONS.values())
        details = []
        for label in missing:
            if label == catalog.GKE_ACCELERATOR_LABEL:
                details.append(f"{label} (valid: {valid_accelerators})")
            else:
                details.append(f"{label} (the slice topology, e.g. 4x4 or 2x2x4)")
        violations.append(
            f"{where}.template.spec.nodeSelector: missing {'; '.join(details)}; a TPU worker "
            f"group must select both its accelerator and its topology"
        )
        return violations
    try:
        shape = group.shape()
    except generations.CatalogError as error:
        expected = webhook_hosts(topology, chips_per_host)
        webhook = ""
        if expected is not None and group.hosts != expected:
            webhook = f"; the GKE TPU webhook also rejects it ({WEBHOOK_ERROR!r})"
        violations.append(
            f"{where}.template.spec: nodeSelector {accelerator} {topology} with "
            f"{catalog.TPU_RESOURCE} {chips_per_host} per host is not a TPU slice: {error}"
            f"{webhook}"
        )
        return violations
    hosts = group.hosts
    if is_unknown(hosts):
        return violations
    if not isinstance(hosts, int) or hosts != shape.hosts:
        expected = webhook_hosts(topology, chips_per_host)
        webhook = ""
        if expected is not None and hosts != expected:
            webhook = f"; the GKE TPU webhook rejects this group ({WEBHOOK_ERROR!r})"
        stated = "absent (KubeRay uses 1)" if group.num_of_hosts is None else repr(hosts)
        violations.append(
            f"{where}.numOfHosts: {stated}, but {shape.generation.name} {shape.topology} with "
            f"{shape.chips_per_host} chips per host ({shape.machine_type}) is {shape.hosts} "
            f"host(s) x {shape.chips_per_host} chips = {shape.chips} chips; set numOfHosts: "
            f"{shape.hosts}{webhook}"
        )
    return violations


__all__ = ["WEBHOOK_ERROR", "check_group", "check_worker_groups", "webhook_hosts"]
