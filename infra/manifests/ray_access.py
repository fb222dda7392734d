"""Who may reach a Ray object's pods: its NetworkPolicy, its token Secret and its RBAC, as plain
manifests (no pulumi import; :class:`infra.components.ray_object.RayObject` declares them).

Glossary: a **NetworkPolicy** selects pods and lists the only traffic they accept; GKE enforces it
with Dataplane V2 (``datapath_provider=ADVANCED_DATAPATH``). ``kubectl port-forward`` does not
pass through it: the kubelet opens the forwarded connection inside the pod's own network
namespace, so the authenticated port-forward path keeps working while every other pod is held
off (docs/security.md).
"""

from __future__ import annotations

from typing import Any

from infra.config.schema import SecurityConfig
from infra.manifests import ray_auth
from raytpu.ray_names import DASHBOARD_PORT, METRICS_PORT, SERVE_PORT

RAY_OBJECT_LABEL = "ray-tpu/ray-object"
"""Pod label naming the Ray object (RayCluster, RayService or RayJob) a pod belongs to: what the
object's NetworkPolicy selects, on the pods of every RayCluster the object creates."""
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"
"""The label Kubernetes puts on every namespace with its own name."""


def _from_namespaces(names: tuple[str, ...]) -> list[dict[str, Any]]:
    return [{"namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: name}}} for name in names]


def network_policy(name: str, namespace: str, security: SecurityConfig) -> dict[str, Any]:
    """The NetworkPolicy of Ray object ``name``: its pods accept traffic from each other (all
    ports: GCS, raylets, object transfer, Gloo/ICI coordination), the metrics port from the
    Prometheus scrapers' namespaces, and the dashboard / Jobs API and Serve ports from the
    KubeRay operator's namespaces. Nothing else."""
    own = {"podSelector": {"matchLabels": {RAY_OBJECT_LABEL: name}}}
    ingress: list[dict[str, Any]] = [{"from": [own]}]
    if security.scraper_namespaces:
        ingress.append(
            {
                "from": _from_namespaces(security.scraper_namespaces),
                "ports": [{"protocol": "TCP", "port": METRICS_PORT}],
            }
        )
    if security.operator_namespaces:
        ingress.append(
            {
                "from": _from_namespaces(security.operator_namespaces),
                "ports": [
                    {"protocol": "TCP", "port": DASHBOARD_PORT},
                    {"protocol": "TCP", "port": SERVE_PORT},
                ],
            }
        )
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": f"{name}-ray-ports", "namespace": namespace},
        "spec": {
            "podSelector": {"matchLabels": {RAY_OBJECT_LABEL: name}},
            "policyTypes": ["Ingress"],
            "ingress": ingress,
        },
    }


def ray_write_role(name: str, namespace: str) -> dict[str, Any]:
    """The Role that Kubernetes-RBAC token auth checks: the custom verb ``ray:write`` on this one
    RayCluster. Bound to the Ray pods' service account; bind users to it too."""
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": f"{name}-ray-write", "namespace": namespace},
        "rules": [
            {
                "apiGroups": ["ray.io"],
                "resources": ["rayclusters"],
                "resourceNames": [name],
                "verbs": ["ray:write"],
            }
        ],
    }


def ray_write_binding(name: str, namespace: str, service_account: str) -> dict[str, Any]:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": f"{name}-ray-write", "namespace": namespace},
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "Role",
            "name": f"{name}-ray-write",
        },
        "subjects": [{"kind": "ServiceAccount", "name": service_account, "namespace": namespace}],
    }


def token_secret_metadata(name: str, namespace: str) -> dict[str, Any]:
    """Metadata of the token Secret (its data is generated at create by the component)."""
    return {
        "name": ray_auth.secret_name(name),
        "namespace": namespace,
        "labels": {RAY_OBJECT_LABEL: name, "app.kubernetes.io/part-of": "ray-tpu"},
    }
