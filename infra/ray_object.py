"""One KubeRay object (RayCluster, RayService or RayJob) on a TPU slice, as a custom resource.

Its :class:`~infra.ray_kinds.RayKind` builds the manifest from the same catalog record as the
slice's node pool (worker group ``replicas`` = slices, ``numOfHosts`` = hosts per slice,
``google.com/tpu`` = chips per host, both TPU node selectors) and names its stack outputs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from infra.config import StackConfig
from infra.ray_kinds import RayKind, RayObjectConfig


@dataclass(frozen=True)
class RayObjectArgs:
    kind: RayKind
    stack: StackConfig
    config: RayObjectConfig
    provider: k8s.Provider
    stack_name: str = ""
    depends_on: Sequence[pulumi.Resource] = field(default_factory=tuple)


class RayObject(pulumi.ComponentResource):
    """Type token ``ray-tpu:infra:<Kind>``. Outputs: ``name``, ``namespace`` and the kind's
    stack outputs (``outputs``: head and serve Services, or the job's entrypoint)."""

    def __init__(
        self, name: str, args: RayObjectArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__(f"ray-tpu:infra:{args.kind.kind}", name, None, opts)
        manifest = args.kind.build(args.stack, args.config, args.stack_name)
        self.resource = k8s.apiextensions.CustomResource(
            name,
            api_version=manifest["apiVersion"],
            kind=manifest["kind"],
            metadata=manifest["metadata"],
            spec=manifest["spec"],
            opts=pulumi.ResourceOptions(
                parent=self,
                provider=args.provider,
                depends_on=list(args.depends_on),
                delete_before_replace=args.kind.delete_before_replace,
            ),
        )
        self.name = args.config.name
        self.namespace = args.config.namespace
        self.outputs: dict[str, Any] = dict(args.kind.outputs(args.config, manifest))
        self.register_outputs({"name": self.name, **self.outputs})
