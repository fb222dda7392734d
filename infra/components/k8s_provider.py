"""A Kubernetes provider for the GKE cluster, authenticated by ``gke-gcloud-auth-plugin``.

The kubeconfig is built as a data structure and serialized with PyYAML (never by string
formatting) and exported as a secret. The provider waits for the cluster only (through its
endpoint): what needs nodes waits for its own node pools (:mod:`infra.program`), so that one TPU
pool that cannot be created does not hold back every Kubernetes object.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_kubernetes as k8s
import yaml

AUTH_PLUGIN = "gke-gcloud-auth-plugin"
INSTALL_HINT = (
    "Install gke-gcloud-auth-plugin for kubectl and Pulumi: "
    "gcloud components install gke-gcloud-auth-plugin"
)


def kubeconfig(project: str, location: str, name: str, endpoint: str, ca_certificate: str) -> str:
    """A kubeconfig for one GKE cluster (YAML text) that authenticates through gcloud."""
    context = f"gke_{project}_{location}_{name}"
    document: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": context,
                "cluster": {
                    "server": f"https://{endpoint}",
                    "certificate-authority-data": ca_certificate,
                },
            }
        ],
        "contexts": [{"name": context, "context": {"cluster": context, "user": context}}],
        "current-context": context,
        "users": [
            {
                "name": context,
                "user": {
                    "exec": {
                        "apiVersion": "client.authentication.k8s.io/v1beta1",
                        "command": AUTH_PLUGIN,
                        "installHint": INSTALL_HINT,
                        "provideClusterInfo": True,
                        "interactiveMode": "IfAvailable",
                    }
                },
            }
        ],
    }
    return yaml.safe_dump(document, sort_keys=False)


@dataclass(frozen=True)
class KubernetesAccessArgs:
    project: str
    location: str
    cluster_name: pulumi.Input[str]
    endpoint: pulumi.Input[str]
    ca_certificate: pulumi.Input[str]
    namespaces: Sequence[str] = ()
    """Namespaces to create for the Ray objects (``default`` exists already)."""


class KubernetesAccess(pulumi.ComponentResource):
    """Outputs: ``kubeconfig`` (secret YAML text), ``provider`` (a ``kubernetes.Provider``) and
    ``namespaces`` (name -> ``Namespace``, for the Ray objects)."""

    def __init__(
        self, name: str, args: KubernetesAccessArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("ray-tpu:infra:KubernetesAccess", name, None, opts)
        text = pulumi.Output.all(args.cluster_name, args.endpoint, args.ca_certificate).apply(
            lambda values: kubeconfig(args.project, args.location, *values)
        )
        self.kubeconfig = pulumi.Output.secret(text)
        self.provider = k8s.Provider(
            name,
            kubeconfig=self.kubeconfig,
            opts=pulumi.ResourceOptions(parent=self),
        )
        self.namespaces = {
            namespace: k8s.core.v1.Namespace(
                f"ns-{namespace}",
                metadata={"name": namespace, "labels": {"app.kubernetes.io/part-of": "ray-tpu"}},
                opts=pulumi.ResourceOptions(parent=self, provider=self.provider),
            )
            for namespace in dict.fromkeys(args.namespaces)
            if namespace != "default"
        }
        self.register_outputs({"kubeconfig": self.kubeconfig})
