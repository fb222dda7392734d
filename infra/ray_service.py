"""A KubeRay ``RayService`` (a Ray Serve application) on a TPU slice, as a custom resource.

The spec comes from :func:`infra.kuberay.ray_service_spec`: ``serveConfigV2`` (YAML text with the
application's import path) and the RayCluster that serves it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import pulumi
import pulumi_kubernetes as k8s

from infra import custom_resource, kuberay
from infra.config import RayServiceConfig, StackConfig


@dataclass(frozen=True)
class RayServiceArgs:
    stack: StackConfig
    service: RayServiceConfig
    provider: k8s.Provider
    depends_on: Sequence[pulumi.Resource] = field(default_factory=tuple)


class RayService(pulumi.ComponentResource):
    """Outputs: ``name``, ``namespace``, ``head_service`` and ``serve_service``."""

    def __init__(
        self, name: str, args: RayServiceArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("ray-tpu:infra:RayService", name, None, opts)
        manifest = kuberay.ray_service_object(args.stack, args.service)
        self.resource = custom_resource.declare(
            name,
            manifest,
            pulumi.ResourceOptions(
                parent=self, provider=args.provider, depends_on=list(args.depends_on)
            ),
        )
        self.name = args.service.name
        self.namespace = args.service.namespace
        self.head_service = kuberay.head_service_name(args.service.name)
        self.serve_service = kuberay.serve_service_name(args.service.name)
        self.register_outputs(
            {
                "name": self.name,
                "namespace": self.namespace,
                "headService": self.head_service,
                "serveService": self.serve_service,
            }
        )
