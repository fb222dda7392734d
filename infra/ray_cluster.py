"""A KubeRay ``RayCluster`` on a TPU slice, as a Kubernetes custom resource.

The spec comes from :func:`infra.kuberay.ray_cluster_spec`, built from the same catalog record as
the slice's node pool: worker group ``replicas`` = slices, ``numOfHosts`` = hosts per slice,
``google.com/tpu`` = chips per host, both TPU node selectors.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import pulumi
import pulumi_kubernetes as k8s

from infra import custom_resource, kuberay
from infra.config import RayClusterConfig, StackConfig


@dataclass(frozen=True)
class RayClusterArgs:
    stack: StackConfig
    cluster: RayClusterConfig
    provider: k8s.Provider
    depends_on: Sequence[pulumi.Resource] = field(default_factory=tuple)


class RayCluster(pulumi.ComponentResource):
    """Outputs: ``name``, ``namespace``, ``head_service`` (``<name>-head-svc``)."""

    def __init__(
        self, name: str, args: RayClusterArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("ray-tpu:infra:RayCluster", name, None, opts)
        manifest = kuberay.ray_cluster_object(args.stack, args.cluster)
        self.resource = custom_resource.declare(
            name,
            manifest,
            pulumi.ResourceOptions(
                parent=self, provider=args.provider, depends_on=list(args.depends_on)
            ),
        )
        self.name = args.cluster.name
        self.namespace = args.cluster.namespace
        self.head_service = kuberay.head_service_name(args.cluster.name)
        self.register_outputs(
            {"name": self.name, "namespace": self.namespace, "headService": self.head_service}
        )
