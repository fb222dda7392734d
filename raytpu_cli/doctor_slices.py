"""The slice check of ``raytpu doctor``: each TPU slice's pods, as the TPU webhook made them.

A **slice** is one replica of a TPU worker group: the pods sharing ``ray.io/cluster``,
``ray.io/group`` and the webhook's ``replicaIndex`` label (``<group>-<replica>``, also their
``TPU_NAME``). The webhook gives each pod of a slice of ``n`` hosts a ``TPU_WORKER_ID`` in
0..n-1 and, for ``n > 1``, the hostname ``<group>-<replica>-<id>`` in the subdomain
``<cluster>-headless-worker-svc``, ``TPU_WORKER_HOSTNAMES`` listing the slice's hosts in worker
order, and a pod affinity that keeps the slice on one node pool (``cloud.google.com/gke-nodepool``).
JAX needs all of it: a duplicate worker ID or a wrong host list hangs its start-up.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from policies.props import get
from raytpu_cli.doctor_checks import (
    CHECK_SLICES,
    ClusterState,
    DeclaredRay,
    Group,
    Row,
    env_of,
    labels,
    live_cluster_names,
    live_object,
    pod_name,
    pods_of,
)

NODE_POOL_LABEL = "cloud.google.com/gke-nodepool"
REPLICA_LABEL = "replicaIndex"


def slice_name(pod: Mapping[str, Any]) -> str:
    """The webhook's ``replicaIndex`` label, else the pod's ``TPU_NAME``."""
    return str(labels(pod).get(REPLICA_LABEL) or env_of(pod, "TPU_NAME") or "?")


def _worker_ids(pods: Sequence[Mapping[str, Any]]) -> dict[str, int | None]:
    found: dict[str, int | None] = {}
    for pod in pods:
        value = env_of(pod, "TPU_WORKER_ID")
        found[pod_name(pod)] = int(value) if value is not None and value.isdigit() else None
    return found


def _id_problems(where: str, ids: Mapping[str, int | None], hosts: int) -> list[str]:
    missing = sorted(name for name, worker in ids.items() if worker is None)
    if missing:
        return [
            f"{where}: pod(s) {', '.join(missing)} have no TPU_WORKER_ID (created without the TPU "
            "webhook)"
        ]
    got = sorted(worker for worker in ids.values() if worker is not None)
    if got != list(range(hosts)):
        return [
            f"{where}: TPU_WORKER_ID are {got}, want each of 0..{hosts - 1} once (the webhook's "
            "duplicate worker ID fault: JAX hangs at start-up)"
        ]
    return []


def _address(pod: Mapping[str, Any]) -> str:
    return f"{get(pod, 'spec.hostname') or '?'}.{get(pod, 'spec.subdomain') or '?'}"


def _hostname_problems(
    where: str, pods: Sequence[Mapping[str, Any]], ids: Mapping[str, int | None]
) -> list[str]:
    """Every pod's ``TPU_WORKER_HOSTNAMES`` is its slice's pods' addresses in worker order
    (as a set when the worker IDs are already wrong)."""
    ordered = all(v is not None for v in ids.values()) and len(set(ids.values())) == len(ids)
    by_id = sorted(pods, key=lambda p: ids.get(pod_name(p)) or 0)
    want = [_address(p) for p in by_id]
    wrong = []
    for pod in pods:
        listed = [h for h in (env_of(pod, "TPU_WORKER_HOSTNAMES") or "").split(",") if h]
        if (listed != want) if ordered else (set(listed) != set(want)):
            wrong.append(pod_name(pod))
    if not wrong:
        return []
    return [
        f"{where}: TPU_WORKER_HOSTNAMES of {', '.join(sorted(wrong))} do not match the slice's "
        f"pods' hostnames ({','.join(want)})"
    ]


def _pool_problems(
    where: str, pods: Sequence[Mapping[str, Any]], pools: Mapping[str, str]
) -> list[str]:
    unscheduled = sorted(pod_name(p) for p in pods if not get(p, "spec.nodeName"))
    if unscheduled:
        return [f"{where}: pod(s) {', '.join(unscheduled)} not on a node yet (Pending)"]
    found = sorted({pools.get(str(get(p, "spec.nodeName")), "?") for p in pods})
    if len(found) > 1:
        return [
            f"{where}: pods spread over node pools {', '.join(found)}: one slice is one node "
            "pool (the chips of a slice are joined only within it)"
        ]
    return []


def slice_problems(
    where: str, pods: Sequence[Mapping[str, Any]], hosts: int, pools: Mapping[str, str]
) -> list[str]:
    """What is wrong with one slice of ``hosts`` hosts whose live pods are ``pods``."""
    if len(pods) != hosts:  # the IDs and host lists of a partial slice say nothing more
        partial = f"{where}: {len(pods)} of {hosts} hosts (a partial slice: JAX waits for the rest)"
        return [partial, *_pool_problems(where, pods, pools)]
    ids = _worker_ids(pods)
    problems = _id_problems(where, ids, hosts)
    if hosts > 1 and None not in ids.values():
        problems += _hostname_problems(where, pods, ids)
    return problems + _pool_problems(where, pods, pools)


def node_pools(nodes: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    """node name -> its GKE node pool."""
    return {
        str((n.get("metadata") or {}).get("name")): str(labels(n).get(NODE_POOL_LABEL, "?"))
        for n in nodes
    }


def _slices(
    obj: DeclaredRay, group: Group, cluster: str, state: ClusterState
) -> dict[str, list[Mapping[str, Any]]]:
    found: dict[str, list[Mapping[str, Any]]] = {}
    for pod in pods_of(state, obj.namespace, cluster):
        if labels(pod).get("ray.io/group") == group.name:
            found.setdefault(slice_name(pod), []).append(pod)
    return found


def _fix(obj: DeclaredRay, cluster: str, group: str, name: str) -> str:
    which = f"{REPLICA_LABEL}={name}" if name != "?" else f"ray.io/group={group}"
    return (
        f"recreate the slice: kubectl delete pod -n {obj.namespace} -l "
        f"ray.io/cluster={cluster},{which}"
    )


def check_slices(declared: Sequence[DeclaredRay], state: ClusterState) -> Row:
    """Every running slice of every declared TPU worker group is whole and consistent."""
    pools = node_pools(state.nodes)
    problems: list[str] = []
    seen: list[str] = []
    for obj in declared:
        for cluster in live_cluster_names(obj, live_object(state, obj)):
            for group in (g for g in obj.groups if g.tpu):
                for name, pods in sorted(_slices(obj, group, cluster, state).items()):
                    where = f"slice {obj.namespace}/{cluster}/{name}"
                    found = slice_problems(where, pods, group.hosts, pools)
                    if found:
                        problems.append(
                            f"{'; '.join(found)}: {_fix(obj, cluster, group.name, name)}"
                        )
                    pool = sorted({pools.get(str(get(p, "spec.nodeName")), "?") for p in pods})
                    seen.append(f"{cluster}/{name} ({len(pods)} host(s) on {', '.join(pool)})")
    if problems:
        return Row(CHECK_SLICES, False, "; ".join(problems))
    if not seen:
        return Row(CHECK_SLICES, True, "no TPU slice is running (worker groups at zero)")
    return Row(CHECK_SLICES, True, f"{len(seen)} slice(s) whole: {', '.join(seen)}")
