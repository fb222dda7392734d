"""Builders for the policy tests: resource props as the Pulumi engine or kubectl would hold them.

Plain data built from the catalog (numbers as floats, like the engine), plus :func:`edit` to break
one field of a copy. Imported by tests/test_policies_*.py (pytest puts tests/ on sys.path).
"""

from __future__ import annotations

import copy
import re
from typing import Any

from policies.resources import Resource
from raytpu import catalog

DELETE = object()
"""Pass as the value to :func:`edit` to remove the field."""

ZONE = "us-east5-b"
WORKER_IMAGE = "us-east5-docker.pkg.dev/proj/ray-tpu/ray:2.60.0-py311-0123456789ab"
"""The worker image built from Dockerfile (the stock rayproject/ray lacks workloads.serve:app)."""


def node_pool_props(
    gen: str,
    topology: str,
    machine_type: str | None = None,
    *,
    name: str = "pool",
    workload_policy: str = "slice-policy",
) -> dict[str, Any]:
    """A correct TPU node pool for one slice of ``gen`` ``topology``."""
    shape = catalog.shape(gen, topology, machine_type=machine_type)
    props: dict[str, Any] = {
        "name": name,
        "cluster": "ray-tpu",
        "location": "us-east5",
        "nodeConfig": {"machineType": shape.machine_type, "spot": True},
        "nodeCount": float(shape.hosts),
        "nodeLocations": [ZONE],
    }
    if shape.multi_host:
        if shape.uses_workload_policy:
            props["placementPolicy"] = {"policyName": workload_policy}
        else:
            props["placementPolicy"] = {"type": "COMPACT", "tpuTopology": shape.topology}
    return props


def tpu_group(
    shape: catalog.SliceShape,
    *,
    name: str = "tpu",
    replicas: int = 1,
    image: str = WORKER_IMAGE,
) -> dict[str, Any]:
    """A correct KubeRay worker group for ``replicas`` slices of ``shape``."""
    chips = str(shape.chips_per_host)
    return {
        "groupName": name,
        "replicas": replicas,
        "minReplicas": replicas,
        "maxReplicas": replicas,
        "numOfHosts": shape.hosts,
        "rayStartParams": {},
        "template": {
            "spec": {
                "containers": [
                    {
                        "name": "ray-worker",
                        "image": image,
                        "resources": {
                            "requests": {"cpu": "8", "google.com/tpu": chips},
                            "limits": {"cpu": "8", "google.com/tpu": chips},
                        },
                    }
                ],
                "nodeSelector": dict(shape.node_selector),
            }
        },
    }


def cluster_spec(
    groups: list[dict[str, Any]],
    *,
    ray_version: str = "2.60.0",
    image: str = WORKER_IMAGE,
) -> dict[str, Any]:
    return {
        "rayVersion": ray_version,
        "authOptions": {"mode": "token"},
        "headGroupSpec": {
            "rayStartParams": {},
            "template": {
                "spec": {
                    "containers": [
                        {
                            "name": "ray-head",
                            "image": image,
                            "ports": [
                                {"containerPort": 6379, "name": "gcs-server"},
                                {"containerPort": 8265, "name": "dashboard"},
                                {"containerPort": 10001, "name": "client"},
                            ],
                            "resources": {
                                "requests": {"cpu": "2", "memory": "8Gi"},
                                "limits": {"cpu": "2", "memory": "8Gi"},
                            },
                        }
                    ]
                }
            },
        },
        "workerGroupSpecs": groups,
    }


def ray_object(kind: str, name: str, spec: dict[str, Any]) -> dict[str, Any]:
    """A RayCluster / RayService / RayJob wrapping a Ray cluster spec where that kind keeps it."""
    if kind == "RayCluster":
        body = spec
    elif kind == "RayService":
        body = {
            "upgradeStrategy": {
                "type": "None"
            },  # in place: no second set of slices (the program's)
            "serveConfigV2": "applications:\n- name: app\n  import_path: workloads.serve:app\n",
            "rayClusterConfig": spec,
        }
    elif kind == "RayJob":
        body = {"entrypoint": "python -m raytpu_cli train", "rayClusterSpec": spec}
    else:
        raise ValueError(f"kind: {kind!r} is not valid; valid: RayCluster, RayService, RayJob")
    return {
        "apiVersion": "ray.io/v1",
        "kind": kind,
        "metadata": {"name": name, "namespace": "ray"},
        "spec": body,
    }


def gke_cluster_props(*, ray_operator: bool = True, workload_pool: Any = "proj.svc.id.goog"):
    props: dict[str, Any] = {
        "name": "ray-tpu",
        "project": "proj",
        "location": "us-east5",
        "addonsConfig": {"rayOperatorConfigs": [{"enabled": ray_operator}]},
    }
    if workload_pool is not None:
        props["workloadIdentityConfig"] = {"workloadPool": workload_pool}
    return props


def resource(type_: str, name: str, props: dict[str, Any]) -> Resource:
    return Resource(
        type=type_, name=name, urn=f"urn:pulumi:test::ray-tpu::{type_}::{name}", props=props
    )


_STEP = re.compile(r"([^.\[\]]+)|\[(\d+)\]")


def edit(obj: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    """A deep copy of ``obj`` with ``path`` (``a.b[0].c``; ``a.'x.y'`` not needed) set or deleted.

    A key holding dots (a node label) is written after a slash: ``template.spec.nodeSelector/<label>``.
    """
    result = copy.deepcopy(obj)
    head, _, label = path.partition("/")
    steps = [(n, int(i) if i else None) for n, i in _STEP.findall(head)]
    if label:
        steps.append((label, None))
    current: Any = result
    for name, index in steps[:-1]:
        current = current[name] if name else current[index]
    name, index = steps[-1]
    key: Any = name if name else index
    if value is DELETE:
        del current[key]
    else:
        current[key] = value
    return result
