"""Rule 5: no Ray head port on the internet, and Workload Identity on the cluster.

Ray has no authentication: whoever reaches the dashboard / job API (8265), the Ray client
(10001) or GCS (6379) runs arbitrary code on every TPU host. They must not sit behind a
``LoadBalancer`` Service, a public Ingress, or a KubeRay head with ``serviceType: LoadBalancer``.
Reach them with ``kubectl port-forward`` or an authenticating proxy (IAP). Pods reach Google APIs
through Workload Identity (``workloadIdentityConfig.workloadPool``), not node keys.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from policies.props import as_int, as_list, get, is_unknown
from policies.resources import cluster_spec
from raytpu.errors import invalid
from raytpu.ray_names import PRIVATE_HEAD_PORT_NAMES, PRIVATE_HEAD_PORTS

RAY_HEAD_PORTS = PRIVATE_HEAD_PORTS
RAY_HEAD_PORT_NAMES = PRIVATE_HEAD_PORT_NAMES
INTERNAL_INGRESS_CLASSES = frozenset({"gce-internal"})
_FIX = "use kubectl port-forward or an authenticating proxy (IAP) instead"


def _ray_port(port: Any) -> str | None:
    """Describes ``port`` (number or name) when it is a Ray head port, else None."""
    if is_unknown(port):
        return None
    number = as_int(port)
    if isinstance(number, int) and number in RAY_HEAD_PORTS:
        return f"{number} ({RAY_HEAD_PORTS[number]})"
    if isinstance(port, str) and port in RAY_HEAD_PORT_NAMES:
        number = RAY_HEAD_PORT_NAMES[port]
        return f"{port!r} ({RAY_HEAD_PORTS[number]}, {number})"
    return None


def check_service(props: Mapping[str, Any]) -> list[str]:
    """A ``LoadBalancer`` Service exposes no Ray head port."""
    if get(props, "spec.type") != "LoadBalancer":
        return []
    ports = as_list(get(props, "spec.ports"))
    if is_unknown(ports):
        return []
    violations = []
    for i, port in enumerate(ports):
        for key in ("port", "targetPort"):
            found = _ray_port(get(port, key))
            if found:
                violations.append(
                    f"spec.ports[{i}].{key}: {found} is behind a LoadBalancer Service; Ray has "
                    f"no authentication and this port runs arbitrary code: make the Service "
                    f"ClusterIP and {_FIX}"
                )
                break
    return violations


def _ingress_backends(props: Mapping[str, Any]) -> list[tuple[str, Any, Any]]:
    """(path, service name, port) of every backend of an Ingress (v1 and v1beta1 shapes)."""
    backends = []
    candidates = [("spec.defaultBackend", get(props, "spec.defaultBackend"))]
    candidates.append(("spec.backend", get(props, "spec.backend")))
    rules = as_list(get(props, "spec.rules"))
    if not is_unknown(rules):
        for i, rule in enumerate(rules):
            paths = as_list(get(rule, "http.paths"))
            if is_unknown(paths):
                continue
            for j, _ in enumerate(paths):
                candidates.append(
                    (
                        f"spec.rules[{i}].http.paths[{j}].backend",
                        get(rule, f"http.paths[{j}].backend"),
                    )
                )
    for path, backend in candidates:
        if not isinstance(backend, Mapping):
            continue
        service = get(backend, "service.name", get(backend, "serviceName"))
        port = get(backend, "service.port.number")
        if port is None:
            port = get(backend, "service.port.name", get(backend, "servicePort"))
        backends.append((path, service, port))
    return backends


ingress_backends = _ingress_backends
"""Public name of the backend reader (the stack rule :mod:`policies.rules.dashboard_iap` uses it)."""


def check_ingress(props: Mapping[str, Any]) -> list[str]:
    """A public Ingress routes to no Ray head port."""
    ingress_class = get(props, "spec.ingressClassName")
    annotations = get(props, "metadata.annotations")
    if isinstance(annotations, Mapping) and ingress_class is None:
        ingress_class = annotations.get("kubernetes.io/ingress.class")
    if is_unknown(ingress_class) or ingress_class in INTERNAL_INGRESS_CLASSES:
        return []
    violations = []
    for path, service, port in _ingress_backends(props):
        found = _ray_port(port)
        if found:
            violations.append(
                f"{path}: routes public traffic to service {service!r} port {found}; Ray has no "
                f"authentication and this port runs arbitrary code: remove the route and {_FIX}"
            )
    return violations


def check_ray_head_service(props: Mapping[str, Any], kind: str | None = None) -> list[str]:
    """A KubeRay head does not ask for a LoadBalancer Service (it would carry 8265/10001/6379)."""
    found = cluster_spec(props, kind)
    if found is None:
        return []
    path, spec = found
    violations = []
    for field in ("headGroupSpec.serviceType", "headGroupSpec.headService.spec.type"):
        if get(spec, field) == "LoadBalancer":
            violations.append(
                f"{path}.{field}: 'LoadBalancer' puts the Ray head's dashboard (8265), client "
                f"(10001) and GCS (6379) ports on a load balancer; Ray has no authentication: "
                f"use ClusterIP and {_FIX}"
            )
    return violations


def check_workload_identity(props: Mapping[str, Any]) -> list[str]:
    """A GKE cluster has Workload Identity (``workloadIdentityConfig.workloadPool``)."""
    if get(props, "enableAutopilot") is True:
        return []  # Autopilot always runs Workload Identity
    pool = get(props, "workloadIdentityConfig.workloadPool")
    if is_unknown(pool) or (isinstance(pool, str) and pool.strip()):
        return []
    project = get(props, "project")
    example = f"{project}.svc.id.goog" if isinstance(project, str) else "PROJECT_ID.svc.id.goog"
    field = "workloadIdentityConfig.workloadPool"
    why = (
        "Ray pods reach Google APIs (GCS checkpoints, Artifact Registry) through it as a "
        "Kubernetes service account, not with node credentials"
    )
    if pool is None:
        return [f"{field}: not set; set it to {example!r}; {why}"]
    return [invalid(field, pool, f"a workload pool such as {example!r}", hint=why)]


__all__ = [
    "RAY_HEAD_PORTS",
    "check_ingress",
    "check_ray_head_service",
    "check_service",
    "check_workload_identity",
]
