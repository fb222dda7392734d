"""Kueue's names, and its CRDs for offline validation (stdlib, PyYAML and jsonschema only).

Kueue admits a workload when its ClusterQueue has quota for it. Glossary (Kueue's words):

- **ResourceFlavor**: one kind of node, by its labels. Here: one TPU slice shape (accelerator,
  topology, machine type) on Spot VMs or not; its ``nodeLabels`` come from
  :meth:`raytpu.catalog.SliceShape.node_labels`.
- **ClusterQueue**: a team's quota per flavor (``nominalQuota``, in ``google.com/tpu`` chips),
  how much it may borrow from its **cohort** (``borrowingLimit``) and lend to it
  (``lendingLimit``), and its preemption rules.
- **LocalQueue**: the namespaced queue users name with the ``kueue.x-k8s.io/queue-name`` label;
  it points at one ClusterQueue.
- **WorkloadPriorityClass**: a named priority (``value``) for the ``kueue.x-k8s.io/priority-class``
  label; it orders the queue and decides preemption, without touching pod priority.

The CRDs (Kueue v0.19.2, ``v1beta2``, the storage version) are read from ``$RAYTPU_KUEUE_CRDS``
or ``.crds/kueue`` (``raytpu crds fetch``, at the pin of :mod:`raytpu.crd_pins`), as
:mod:`raytpu.crds` does for KubeRay's.
"""

from __future__ import annotations

from raytpu.catalog import SliceShape
from raytpu.crd_pins import pin
from raytpu.crds import CrdSet

KUEUE_VERSION = "0.19.2"
"""The Kueue release the program installs (never ``latest``)."""
KUEUE_CHART = "oci://registry.k8s.io/kueue/charts/kueue"
KUEUE_NAMESPACE = "kueue-system"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
RAY_FRAMEWORKS = ("ray.io/rayjob", "ray.io/raycluster", "ray.io/rayservice")
"""The Kueue integrations that admit KubeRay objects (in the chart's default frameworks)."""

KUEUE = CrdSet(
    api_version="kueue.x-k8s.io/v1beta2",
    kinds={
        "ResourceFlavor": "resourceflavors",
        "ClusterQueue": "clusterqueues",
        "LocalQueue": "localqueues",
        "Cohort": "cohorts",
        "WorkloadPriorityClass": "workloadpriorityclasses",
        "ProvisioningRequestConfig": "provisioningrequestconfigs",
        "AdmissionCheck": "admissionchecks",
    },
    pin=pin("kueue"),
    body_kinds=frozenset({"WorkloadPriorityClass"}),
)

API_VERSION = KUEUE.api_version
validate_object = KUEUE.validate_object


def flavor_name(shape: SliceShape, *, spot: bool, queued: bool = False) -> str:
    """The ResourceFlavor of ``shape``: ``v6e-4x4-4t``, ``v6e-2x4-8t-spot``,
    ``v6e-4x4-4t-queued`` (queued provisioning: its own pools, its own admission check)."""
    name = f"{shape.generation.name}-{shape.topology}-{shape.chips_per_host}t"
    return f"{name}-spot" if spot else f"{name}-queued" if queued else name


__all__ = [
    "API_VERSION",
    "KUEUE",
    "KUEUE_CHART",
    "KUEUE_NAMESPACE",
    "KUEUE_VERSION",
    "PRIORITY_LABEL",
    "QUEUE_LABEL",
    "RAY_FRAMEWORKS",
    "flavor_name",
    "validate_object",
]
