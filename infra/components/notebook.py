"""``Notebook``: a JupyterLab next to a RayCluster, attached to it with Ray's token auth.

Declares the notebook's ServiceAccount, its Role and RoleBinding (:func:`infra.manifests.notebook.role`:
the team's RayCluster and queue, nothing on the pools or another team's objects), with
``kubernetes`` Ray auth a RoleBinding to the cluster's ``ray:write`` Role, a generated Jupyter
token in a Secret, the Deployment, a ClusterIP Service (``raytpu notebook --stack`` port-forwards
to it) and two NetworkPolicies (nothing reaches the notebook pod; the Ray head admits it on the
client and dashboard ports). With ``iap`` (``ray-tpu:notebooks.iap``) also its HTTPS host
``<name>.<domain>`` behind Identity-Aware Proxy (:mod:`infra.manifests.iap_endpoint`): a
BackendConfig with IAP on, a ManagedCertificate, a global static IP, the GCE Ingress, a
NetworkPolicy admitting Google Front Ends and the ``roles/iap.httpsResourceAccessor`` grants for
that host only; the Jupyter token is still asked for behind IAP. See docs/notebooks.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pulumi
import pulumi_kubernetes as k8s
import pulumi_random as random

from infra.components import custom_resource
from infra.components.iap_front import declare_front
from infra.config.notebook_schema import NotebookConfig, NotebookIapConfig
from infra.manifests import iap_endpoint
from infra.manifests import notebook as spec


@dataclass(frozen=True)
class NotebookArgs:
    notebook: NotebookConfig
    credential: str
    """How its RayCluster authenticates: ``kubernetes``, ``secret`` or ``none``
    (:func:`infra.manifests.ray_auth.credential`)."""
    image: str
    cpu: str
    memory: str
    provider: k8s.Provider
    depends_on: Sequence[pulumi.Resource] = field(default_factory=tuple)
    """Its namespace and its RayCluster (whose ``ray:write`` Role or token Secret it uses)."""
    iap: NotebookIapConfig | None = None
    project: str = ""
    """The GCP project of the static IP and the IAP grants (with ``iap``)."""
    cluster_name: str = ""
    """The GKE cluster's name: the static IP's name prefix (with ``iap``)."""


class Notebook(pulumi.ComponentResource):
    """Type token ``ray-tpu:infra:Notebook``. Outputs: ``name``, ``namespace``, ``service``,
    ``port``, ``rayCluster``, ``tokenSecret`` and ``team``; with IAP also ``url`` and
    ``iapAddress`` (where the host's DNS A record must point)."""

    def __init__(
        self, name: str, args: NotebookArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("ray-tpu:infra:Notebook", name, None, opts)
        nb = args.notebook
        child = pulumi.ResourceOptions(
            parent=self, provider=args.provider, depends_on=list(args.depends_on)
        )
        account = spec.service_account(nb)
        self.service_account = k8s.core.v1.ServiceAccount(
            name,
            metadata=account["metadata"],
            automount_service_account_token=account["automountServiceAccountToken"],
            opts=child,
        )
        role = spec.role(nb)
        self.role = k8s.rbac.v1.Role(
            name, metadata=role["metadata"], rules=role["rules"], opts=child
        )
        after = pulumi.ResourceOptions.merge(
            child, pulumi.ResourceOptions(depends_on=[self.service_account, self.role])
        )
        bindings = [("", spec.role_binding(nb))]
        if args.credential == "kubernetes":
            bindings.append(("-ray-write", spec.ray_write_binding(nb)))
        self.bindings = [
            k8s.rbac.v1.RoleBinding(
                f"{name}{suffix}",
                metadata=binding["metadata"],
                role_ref=binding["roleRef"],
                subjects=binding["subjects"],
                opts=after,
            )
            for suffix, binding in bindings
        ]
        # Generated once at create, kept (secret) in the stack's state, never an output.
        self.jupyter_token = random.RandomPassword(
            f"{name}-jupyter-token",
            length=48,
            special=False,
            opts=pulumi.ResourceOptions(parent=self),
        )
        self.token_secret = k8s.core.v1.Secret(
            f"{name}-jupyter-token",
            metadata=spec.token_secret_metadata(nb),
            string_data={spec.JUPYTER_TOKEN_KEY: self.jupyter_token.result},
            opts=child,
        )
        deployment = spec.deployment(nb, args.credential, args.image, args.cpu, args.memory)
        self.deployment = k8s.apps.v1.Deployment(
            name,
            metadata=deployment["metadata"],
            spec=deployment["spec"],
            opts=pulumi.ResourceOptions.merge(
                child,
                pulumi.ResourceOptions(depends_on=[*self.bindings, self.token_secret]),
            ),
        )
        self.service = self._service(name, args, child)
        self.network_policies = [
            k8s.networking.v1.NetworkPolicy(
                f"{name}{suffix}", metadata=policy["metadata"], spec=policy["spec"], opts=child
            )
            for suffix, policy in (
                ("", spec.network_policy(nb)),
                ("-to-ray", spec.ray_head_policy(nb)),
            )
        ]
        self.outputs = {
            "name": nb.name,
            "namespace": nb.namespace,
            "service": nb.name,
            "port": spec.NOTEBOOK_PORT,
            "rayCluster": nb.ray_cluster,
            "tokenSecret": spec.token_secret_name(nb),
            "team": nb.team,
        }
        if args.iap is not None:
            self.outputs.update(self._iap(name, args, args.iap, child))
        self.register_outputs(self.outputs)

    def _service(self, name: str, args: NotebookArgs, child: pulumi.ResourceOptions) -> Any:
        service = spec.service(args.notebook, args.iap)
        needs: list[pulumi.Resource] = []
        if args.iap is not None:  # the BackendConfig its annotation names exists first
            ep = spec.endpoint(args.notebook, args.iap)
            backend = iap_endpoint.backend_config(ep)
            self.backend_config = custom_resource.declare(f"{name}-iap", backend, child)
            needs.append(self.backend_config)
        return k8s.core.v1.Service(
            name,
            metadata=service["metadata"],
            spec=service["spec"],
            opts=pulumi.ResourceOptions.merge(child, pulumi.ResourceOptions(depends_on=needs)),
        )

    def _iap(
        self, name: str, args: NotebookArgs, iap: NotebookIapConfig, child: pulumi.ResourceOptions
    ) -> dict[str, Any]:
        """The IAP endpoint's objects beside the Service; its outputs."""
        nb = args.notebook
        ep = spec.endpoint(nb, iap)
        policy = spec.gfe_policy(nb, iap)
        k8s.networking.v1.NetworkPolicy(
            f"{name}-from-gfe", metadata=policy["metadata"], spec=policy["spec"], opts=child
        )
        certificate = custom_resource.declare(
            f"{name}-cert", iap_endpoint.managed_certificate(ep), child
        )
        front = declare_front(
            name,
            ep,
            project=args.project,
            cluster_name=args.cluster_name,
            members=iap.members_of(nb),
            title=f"notebook-{nb.name}",
            address_description=f"JupyterLab {nb.name} behind IAP ({ep.host})",
            after=[self.service, certificate, self.backend_config],
            parent=self,
            child=child,
        )
        return {"url": f"https://{ep.host}/", "iapAddress": front.address.address}
