"""``DashboardIap``: one Ray object's dashboard on an HTTPS host behind Identity-Aware Proxy.

Declares the in-cluster authenticating proxy (ServiceAccount, ConfigMap, Deployment, Service),
its BackendConfig with IAP on, a ManagedCertificate, a global static IP, the external GCE
Ingress, two NetworkPolicies (the proxy admits only Google Front Ends; the Ray head admits the
proxy on the dashboard port) and the IAM grants of ``roles/iap.httpsResourceAccessor``.

Where the IAM grant sits: on the project's IAP "compute backend services" resource
(``projects/P/iap_web/compute``, ``gcp.iap.WebTypeComputeIamMember``) with the IAM condition
``request.host == HOST``. The tighter resource, the backend service itself, is created by GKE's
Ingress controller under a generated name (``k8s1-...``) that Pulumi cannot know in the same
``pulumi up``; the project level (``gcp.projects.IAMMember``) would open every IAP app of the
project. The host condition keeps the grant to this endpoint. See :mod:`infra.manifests.dashboard_iap`
for the request path and docs/security.md for what stays to do by hand.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import pulumi
import pulumi_kubernetes as k8s

from infra.components import custom_resource
from infra.components.iap_front import declare_front
from infra.config.schema import DashboardIapConfig
from infra.manifests import dashboard_iap as spec


@dataclass(frozen=True)
class DashboardIapArgs:
    project: str
    cluster_name: str
    """The GKE cluster's name (prefix of the static IP's name)."""
    iap: DashboardIapConfig
    credential: str
    """How the Ray object authenticates: ``kubernetes``, ``secret`` or ``none``
    (:func:`infra.manifests.ray_auth.credential`)."""
    provider: k8s.Provider
    depends_on: Sequence[pulumi.Resource] = field(default_factory=tuple)
    """The Ray object (its token Secret or ``ray:write`` Role must exist first)."""


class DashboardIap(pulumi.ComponentResource):
    """Type token ``ray-tpu:infra:DashboardIap``. Outputs: ``url``, ``address`` (the static IP
    the host's DNS A record must point at) and ``addressName``."""

    def __init__(
        self, name: str, args: DashboardIapArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("ray-tpu:infra:DashboardIap", name, None, opts)
        iap, credential = args.iap, args.credential
        child = pulumi.ResourceOptions(
            parent=self, provider=args.provider, depends_on=list(args.depends_on)
        )
        account = spec.service_account(iap)
        self.service_account = k8s.core.v1.ServiceAccount(
            f"{name}-proxy",
            metadata=account["metadata"],
            automount_service_account_token=account["automountServiceAccountToken"],
            opts=child,
        )
        after_account = pulumi.ResourceOptions.merge(
            child, pulumi.ResourceOptions(depends_on=[self.service_account])
        )
        needs: list[pulumi.Resource] = [self.service_account]
        if credential == "kubernetes":
            token = spec.service_account_token(iap)
            self.token = k8s.core.v1.Secret(
                f"{name}-proxy-token",
                metadata=token["metadata"],
                type=token["type"],
                opts=after_account,
            )
            binding = spec.ray_write_binding(iap)
            self.binding = k8s.rbac.v1.RoleBinding(
                f"{name}-proxy",
                metadata=binding["metadata"],
                role_ref=binding["roleRef"],
                subjects=binding["subjects"],
                opts=after_account,
            )
            needs += [self.token, self.binding]
        config = spec.config_map(iap, credential)
        self.config_map = k8s.core.v1.ConfigMap(
            f"{name}-proxy", metadata=config["metadata"], data=config["data"], opts=child
        )
        needs.append(self.config_map)
        deployment = spec.deployment(iap, credential)
        self.deployment = k8s.apps.v1.Deployment(
            f"{name}-proxy",
            metadata=deployment["metadata"],
            spec=deployment["spec"],
            opts=pulumi.ResourceOptions.merge(child, pulumi.ResourceOptions(depends_on=needs)),
        )
        for label, policy in (
            ("proxy", spec.proxy_network_policy(iap)),
            ("from-proxy", spec.head_network_policy(iap)),
        ):
            k8s.networking.v1.NetworkPolicy(
                f"{name}-{label}", metadata=policy["metadata"], spec=policy["spec"], opts=child
            )
        backend = spec.backend_config(iap)
        self.backend_config = custom_resource.declare(f"{name}-iap", backend, child)
        certificate = spec.managed_certificate(iap)
        self.certificate = custom_resource.declare(f"{name}-cert", certificate, child)
        service = spec.service(iap)
        self.service = k8s.core.v1.Service(
            f"{name}-proxy",
            metadata=service["metadata"],
            spec=service["spec"],
            opts=pulumi.ResourceOptions.merge(
                child, pulumi.ResourceOptions(depends_on=[self.backend_config])
            ),
        )
        front = declare_front(
            name,
            spec.endpoint(iap),
            project=args.project,
            cluster_name=args.cluster_name,
            members=iap.members,
            title=f"ray-dashboard-{iap.name}",
            address_description=f"Ray Dashboard of {iap.kind}/{iap.name} behind IAP ({iap.host})",
            after=[self.service, self.certificate, self.backend_config],
            parent=self,
            child=child,
        )
        self.address, self.ingress, self.members = front.address, front.ingress, front.members
        address_name = front.address_name
        self.url = f"https://{iap.host}/"
        self.outputs = {
            "url": self.url,
            "host": iap.host,
            "rayObject": f"{iap.kind}/{iap.name}",
            "namespace": iap.namespace,
            "address": self.address.address,
            "addressName": address_name,
        }
        self.register_outputs(self.outputs)
