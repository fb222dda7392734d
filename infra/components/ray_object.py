"""One KubeRay object (RayCluster, RayService or RayJob) on a TPU slice, as a custom resource.

Its :class:`~infra.manifests.ray_kinds.RayKind` builds the manifest from the same catalog record as the
slice's node pool (worker group ``replicas`` = slices, ``numOfHosts`` = hosts per slice,
``google.com/tpu`` = chips per host, both TPU node selectors) and names its stack outputs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pulumi
import pulumi_kubernetes as k8s
import pulumi_random as random

from infra.components import custom_resource
from infra.config.schema import StackConfig
from infra.manifests import ray_access, ray_auth
from infra.manifests.ray_kinds import RayKind, RayObjectConfig


@dataclass(frozen=True)
class RayObjectArgs:
    kind: RayKind
    stack: StackConfig
    config: RayObjectConfig
    provider: k8s.Provider
    stack_name: str = ""
    depends_on: Sequence[pulumi.Resource] = field(default_factory=tuple)
    """What every child waits for (the namespace, the pods' ServiceAccount and its grant)."""
    nodes: Sequence[pulumi.Resource] = field(default_factory=tuple)
    """What only the KubeRay object waits for: the node pools its pods run on (the CPU pool and
    its own slice's), so that a pool that cannot be created holds back nothing else."""


class RayObject(pulumi.ComponentResource):
    """Type token ``ray-tpu:infra:<Kind>``. Outputs: ``name``, ``namespace`` and the kind's
    stack outputs (``outputs``: head and serve Services, or the job's entrypoint)."""

    def __init__(
        self, name: str, args: RayObjectArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__(f"ray-tpu:infra:{args.kind.kind}", name, None, opts)
        manifest = args.kind.build(args.stack, args.config, args.stack_name)
        obj, security = args.config, args.stack.security
        child = pulumi.ResourceOptions(
            parent=self, provider=args.provider, depends_on=list(args.depends_on)
        )
        self.credential = ray_auth.credential(security.ray_auth, args.kind.kind)
        needs: list[pulumi.Resource] = [*args.depends_on, *args.nodes]
        if self.credential == "secret":
            # The provider generates the token once and keeps it (secret) in the stack's state;
            # rotate it with `pulumi up --replace <this RandomPassword's URN>` (docs/security.md).
            self.auth_token = random.RandomPassword(
                f"{name}-auth-token",
                length=48,
                special=False,
                opts=pulumi.ResourceOptions(parent=self),
            )
            self.auth_secret = k8s.core.v1.Secret(
                f"{name}-auth",
                metadata=ray_access.token_secret_metadata(obj.name, obj.namespace),
                string_data={ray_auth.TOKEN_KEY: self.auth_token.result},
                opts=child,
            )
            needs.append(self.auth_secret)
        if self.credential == "kubernetes":
            role = ray_access.ray_write_role(obj.name, obj.namespace)
            self.ray_write_role = k8s.rbac.v1.Role(
                f"{name}-ray-write", metadata=role["metadata"], rules=role["rules"], opts=child
            )
            account = args.stack.storage.service_account if args.stack.storage else "default"
            binding = ray_access.ray_write_binding(obj.name, obj.namespace, account)
            self.ray_write_binding = k8s.rbac.v1.RoleBinding(
                f"{name}-ray-write",
                metadata=binding["metadata"],
                role_ref=binding["roleRef"],
                subjects=binding["subjects"],
                opts=pulumi.ResourceOptions.merge(
                    child, pulumi.ResourceOptions(depends_on=[self.ray_write_role])
                ),
            )
        policy = ray_access.network_policy(obj.name, obj.namespace, security)
        self.network_policy = k8s.networking.v1.NetworkPolicy(
            f"{name}-ray-ports", metadata=policy["metadata"], spec=policy["spec"], opts=child
        )
        self.resource = custom_resource.declare(
            name,
            manifest,
            pulumi.ResourceOptions(
                parent=self,
                provider=args.provider,
                depends_on=needs,
                ignore_changes=list(args.kind.ignore_changes) or None,
                retain_on_delete=args.kind.retain_on_delete,
            ),
        )
        self.name = args.config.name
        self.namespace = args.config.namespace
        self.outputs: dict[str, Any] = dict(args.kind.outputs(args.config, manifest))
        self.register_outputs({"name": self.name, **self.outputs})
