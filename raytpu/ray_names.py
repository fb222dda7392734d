"""Ray's names that every layer spells: node labels of TPU hosts and the Ray head's ports.

Stdlib only. Ray 2.60 turns a TPU host's environment (``TPU_NAME``, ``TPU_WORKER_ID``,
``TPU_ACCELERATOR_TYPE``, ``TPU_TOPOLOGY``) into these node labels; KubeRay's head Service carries
these ports. Infra (the head group's ports), policies (which ports must stay private) and
workloads (label selectors, the local cluster) import them from here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from raytpu.catalog import SliceShape

LABEL_SLICE_NAME = "ray.io/tpu-slice-name"
"""Node label: the slice (``TPU_NAME``) a host belongs to."""
LABEL_WORKER_ID = "ray.io/tpu-worker-id"
"""Node label: the host's index inside its slice (``TPU_WORKER_ID``)."""
LABEL_POD_TYPE = "ray.io/tpu-pod-type"
"""Node label: the pod type (``TPU_ACCELERATOR_TYPE``, e.g. ``v6e-16``)."""
LABEL_TOPOLOGY = "ray.io/tpu-topology"
"""Node label: the slice topology (``TPU_TOPOLOGY``, e.g. ``4x4``)."""
LABEL_ACCELERATOR_TYPE = "ray.io/accelerator-type"
"""Node label: Ray's accelerator type (``TPU-V6E``)."""

GCS_PORT = 6379
DASHBOARD_PORT = 8265
"""Dashboard and Ray Job Submission API."""
CLIENT_PORT = 10001
"""Ray Client (``ray://``)."""
SERVE_PORT = 8000
"""Ray Serve's HTTP proxy."""
METRICS_PORT = 8080
"""Ray's Prometheus metrics export port on every node."""

HEAD_PORTS: tuple[tuple[str, int], ...] = (
    ("gcs", GCS_PORT),
    ("dashboard", DASHBOARD_PORT),
    ("client", CLIENT_PORT),
    ("serve", SERVE_PORT),
)
"""The named container ports of a KubeRay head (KubeRay's own port names)."""

PRIVATE_HEAD_PORTS: dict[int, str] = {
    DASHBOARD_PORT: "dashboard / job API",
    CLIENT_PORT: "Ray client",
    GCS_PORT: "GCS",
}
"""Head ports that run arbitrary code for whoever reaches them."""

PRIVATE_HEAD_PORT_NAMES: dict[str, int] = {
    "dashboard": DASHBOARD_PORT,
    "client": CLIENT_PORT,
    "gcs": GCS_PORT,
    "gcs-server": GCS_PORT,
}
"""KubeRay port names of :data:`PRIVATE_HEAD_PORTS` (a Service may name a port instead of a number)."""

K8S_LABEL_IS_RAY_NODE = "ray.io/is-ray-node"
"""Pod label KubeRay puts on every Ray head and worker pod (value ``yes``): what scrapes select."""


def shape_labels(shape: SliceShape) -> dict[str, str]:
    """The labels every host of a ``shape`` slice carries whatever its slice and index: what a
    worker group declares in ``rayStartParams`` so that Ray's autoscaler can scale it from zero
    for a label-selected placement group (ray-project/ray#56532)."""
    return {
        LABEL_POD_TYPE: shape.pod_type,
        LABEL_TOPOLOGY: shape.topology,
        LABEL_ACCELERATOR_TYPE: shape.ray_accelerator_type,
    }


def ray_start_labels(labels: Mapping[str, str]) -> str:
    """``labels`` as ``ray start --labels`` takes them in KubeRay's ``rayStartParams``."""
    return ", ".join(f"{key}={value}" for key, value in labels.items())


def host_key(labels: Mapping[str, str]) -> tuple[str, int] | None:
    """A Ray node's TPU host as ``(slice name, worker id)`` from its labels; None for a node
    that is not a TPU host (the head, a CPU node)."""
    slice_name, worker_id = labels.get(LABEL_SLICE_NAME), labels.get(LABEL_WORKER_ID, "")
    if not slice_name or not worker_id.isdigit():
        return None
    return slice_name, int(worker_id)
