"""Kueue on the cluster, and the queues, quotas and priorities of the stack's teams.

- **Kueue** itself: the Helm chart ``oci://registry.k8s.io/kueue/charts/kueue`` at the pinned
  release :data:`raytpu.kueue.KUEUE_VERSION` (never ``latest``), in ``kueue-system``. The chart's
  default manager configuration integrates ``ray.io/rayjob``, ``ray.io/raycluster`` and
  ``ray.io/rayservice``; it is left as the release ships it. Pulumi waits for the release to be
  ready (its webhooks answer) before the objects below are created.
- The **Kueue objects** of :mod:`infra.manifests.kueue` (flavors, ClusterQueues, LocalQueues,
  WorkloadPriorityClasses), each checked against the Kueue CRDs before it is declared.

The team's Ray objects carry the queue and priority labels (:mod:`infra.manifests.kuberay`) and wait for
this component, so Kueue admits them from their first moment.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import pulumi
import pulumi_kubernetes as k8s

from infra.components import custom_resource
from infra.config.schema import StackConfig
from infra.manifests import kueue as kueue_spec
from raytpu import kueue


@dataclass(frozen=True)
class KueueArgs:
    stack: StackConfig
    provider: k8s.Provider
    nodes: Sequence[pulumi.Resource] = field(default_factory=tuple)
    """What Kueue's controller pods run on (the CPU pool): its Helm release waits for them."""
    depends_on: Sequence[pulumi.Resource] = field(default_factory=tuple)
    """The namespaces of the teams' LocalQueues."""


class Kueue(pulumi.ComponentResource):
    """Type token ``ray-tpu:infra:Kueue``. Outputs: ``version``, ``flavors``,
    ``clusterQueues``, ``localQueues`` (namespace/name) and ``priorityClasses``."""

    def __init__(
        self, name: str, args: KueueArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("ray-tpu:infra:Kueue", name, None, opts)
        self.release = k8s.helm.v3.Release(
            f"{name}-release",
            name="kueue",
            chart=kueue.KUEUE_CHART,
            version=kueue.KUEUE_VERSION,
            namespace=kueue.KUEUE_NAMESPACE,
            create_namespace=True,
            opts=pulumi.ResourceOptions(
                parent=self, provider=args.provider, depends_on=list(args.nodes)
            ),
        )
        after_release = pulumi.ResourceOptions(
            parent=self, provider=args.provider, depends_on=[self.release]
        )
        manifests = kueue_spec.manifests(args.stack)
        by_kind: dict[str, list[pulumi.Resource]] = {}
        names: dict[str, list[str]] = {}
        kinds = (
            "ResourceFlavor",
            "WorkloadPriorityClass",
            "ProvisioningRequestConfig",
            "AdmissionCheck",
            "ClusterQueue",
            "LocalQueue",
        )
        for kind in kinds:
            # ClusterQueues name flavors and admission checks (which name their configs);
            # LocalQueues name ClusterQueues and live in namespaces.
            extra = {
                "AdmissionCheck": by_kind.get("ProvisioningRequestConfig", []),
                "ClusterQueue": [
                    *by_kind.get("ResourceFlavor", []),
                    *by_kind.get("AdmissionCheck", []),
                ],
                "LocalQueue": [*by_kind.get("ClusterQueue", []), *args.depends_on],
            }.get(kind, [])
            options = pulumi.ResourceOptions.merge(
                after_release, pulumi.ResourceOptions(depends_on=list(extra))
            )
            for manifest in (m for m in manifests if m["kind"] == kind):
                metadata = manifest["metadata"]
                label = "/".join(filter(None, (metadata.get("namespace"), metadata["name"])))
                by_kind.setdefault(kind, []).append(
                    custom_resource.declare(
                        f"{name}-{kind.lower()}-{label.replace('/', '-')}", manifest, options
                    )
                )
                names.setdefault(kind, []).append(label)
        self.names = names
        self.register_outputs(
            {
                "version": kueue.KUEUE_VERSION,
                "flavors": names.get("ResourceFlavor", []),
                "clusterQueues": names.get("ClusterQueue", []),
                "localQueues": names.get("LocalQueue", []),
                "priorityClasses": names.get("WorkloadPriorityClass", []),
            }
        )
