"""Rule 5, stack level: a public Ingress reaches a Ray dashboard or a Jupyter server only
through IAP.

A public Ingress (class other than ``gce-internal``) whose backend is a Ray dashboard needs IAP
on that backend: the backend's Service names a BackendConfig (annotation
``cloud.google.com/backend-config``, for the backend's port or as ``default``) that the stack
declares with ``spec.iap.enabled: true``. A backend is a Ray dashboard when it is

- the dashboard port itself (8265, or the port named ``dashboard``), on any Service; or
- a Service labelled ``ray-tpu/dashboard-proxy`` (the in-cluster proxy that adds the Ray token,
  :mod:`infra.manifests.dashboard_iap`): behind it the dashboard needs no token from the browser.

A backend is a Jupyter server when its Service selects pods labelled
``app.kubernetes.io/name: jupyterlab`` or it is port 8888 (a notebook runs any code it is sent,
with its pod's credentials: ``ray-tpu:notebooks.iap`` declares its IAP endpoint).

A Service labelled as the dashboard proxy is never ``LoadBalancer`` (a load balancer of its own
would be a way around IAP). The resource rule ``no-public-ray-head`` keeps blocking a public
route straight to a Ray head port, IAP or not: the head wants its token, which only the proxy
adds.

Resources whose names or annotations are unknown at preview are skipped, never guessed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from policies.props import as_int, as_list, get, is_unknown
from policies.resources import SERVICE, is_ingress, object_label
from policies.rules.exposure import INTERNAL_INGRESS_CLASSES, ingress_backends
from policies.rules.notebook import APP_LABEL, JUPYTER_PORT
from raytpu.gke_iap import (
    BACKEND_CONFIG_ANNOTATION,
    BACKEND_CONFIG_ANNOTATIONS,
    DASHBOARD_PROXY_LABEL,
    backend_config_refs,
)
from raytpu.ray_names import DASHBOARD_PORT

_FIX = (
    "route the Ingress to the dashboard proxy (ray-tpu:security.dashboardIap declares it) whose "
    "Service names a BackendConfig with spec.iap.enabled: true"
)
_JUPYTER_FIX = (
    "name a BackendConfig with spec.iap.enabled: true in the notebook Service's "
    "cloud.google.com/backend-config annotation (ray-tpu:notebooks.iap declares both)"
)


def _kind(resource: Any) -> str | None:
    kind = get(resource.props, "kind")
    if isinstance(kind, str):
        return kind
    if resource.type == SERVICE:
        return "Service"
    if is_ingress(resource.type):
        return "Ingress"
    if resource.type.startswith("kubernetes:cloud.google.com/"):
        return resource.type.rsplit(":", 1)[-1]
    return None


def _key(resource: Any) -> tuple[Any, Any]:
    namespace = get(resource.props, "metadata.namespace")
    return (namespace if namespace is not None else "default", get(resource.props, "metadata.name"))


def _ingress_class(props: Mapping[str, Any]) -> Any:
    found = get(props, "spec.ingressClassName")
    annotations = get(props, "metadata.annotations")
    if found is None and isinstance(annotations, Mapping):
        found = annotations.get("kubernetes.io/ingress.class")
    return found


def _service_port(service: Mapping[str, Any], port: Any) -> tuple[set[str], Any]:
    """The keys a backend-config ``ports`` map may use for the Service port a backend names
    (number and name), and its target port."""
    for entry in as_list(get(service, "spec.ports")) or []:
        number, name = as_int(get(entry, "port")), get(entry, "name")
        if (isinstance(port, str) and port == name) or as_int(port) == number:
            keys = {str(number)} | ({name} if isinstance(name, str) else set())
            return keys, get(entry, "targetPort", number)
    return {str(as_int(port)) if as_int(port) is not None else str(port)}, port


def _is_dashboard_port(port: Any) -> bool:
    return as_int(port) == DASHBOARD_PORT or port == "dashboard"


def _is_jupyter(service: Mapping[str, Any] | None, port: Any, target: Any) -> bool:
    selector = get(service, "spec.selector") if service is not None else None
    selected = isinstance(selector, Mapping) and selector.get(APP_LABEL[0]) == APP_LABEL[1]
    return selected or JUPYTER_PORT in (as_int(port), as_int(target))


def _iap_problem(
    service: Mapping[str, Any] | None, keys: set[str], configs: Mapping[Any, Any], namespace: Any
) -> str | None:
    """Why the backend is not behind IAP (None: it is, or it cannot be told at preview)."""
    if service is None:
        return "its Service is not declared here, so no BackendConfig with IAP can be seen"
    annotations = get(service, "metadata.annotations")
    if is_unknown(annotations):
        return None
    raw = None
    if isinstance(annotations, Mapping):
        raw = next((annotations[a] for a in BACKEND_CONFIG_ANNOTATIONS if a in annotations), None)
    if is_unknown(raw):
        return None
    if raw is None:
        return f"its Service has no {BACKEND_CONFIG_ANNOTATION} annotation"
    refs = backend_config_refs(raw)
    if refs is None:
        return (
            f"its Service's {BACKEND_CONFIG_ANNOTATION} annotation {raw!r} is not "
            '{"default": NAME} or {"ports": {PORT: NAME}} JSON'
        )
    name = next((refs["ports"][k] for k in sorted(keys) if k in refs["ports"]), refs["default"])
    if name is None:
        return f"its Service's {BACKEND_CONFIG_ANNOTATION} annotation names no BackendConfig for this port"
    config = configs.get((namespace, name))
    if config is None:
        return f"BackendConfig {name!r} is not declared in namespace {namespace!r}"
    enabled = get(config.props, "spec.iap.enabled")
    if is_unknown(enabled) or enabled is True:
        return None
    shown = "not set" if enabled is None else repr(enabled)
    return f"BackendConfig {name!r} has spec.iap.enabled {shown}"


def check_dashboard_ingress(resources: Sequence[Any]) -> list[str]:
    """Every public Ingress route to a Ray dashboard (its port or the dashboard proxy) is behind
    a BackendConfig with IAP enabled; a dashboard proxy Service is never a LoadBalancer."""
    services: dict[Any, Any] = {}
    configs: dict[Any, Any] = {}
    ingresses = []
    for resource in resources:
        kind = _kind(resource)
        if kind == "Service":
            services[_key(resource)] = resource
        elif kind == "BackendConfig":
            configs[_key(resource)] = resource
        elif kind == "Ingress":
            ingresses.append(resource)
    violations = []
    for resource in services.values():
        labels = get(resource.props, "metadata.labels")
        marked = isinstance(labels, Mapping) and DASHBOARD_PROXY_LABEL in labels
        if marked and get(resource.props, "spec.type") == "LoadBalancer":
            violations.append(
                f"{object_label(resource)}: spec.type 'LoadBalancer' puts the Ray dashboard "
                f"proxy ({DASHBOARD_PROXY_LABEL}: {labels[DASHBOARD_PROXY_LABEL]!r}) on a load "
                f"balancer without IAP: anyone reaching it gets the Ray token added; make it "
                f"ClusterIP and reach it only through the IAP Ingress"
            )
    for ingress in ingresses:
        ingress_class = _ingress_class(ingress.props)
        if is_unknown(ingress_class) or ingress_class in INTERNAL_INGRESS_CLASSES:
            continue
        namespace, _ = _key(ingress)
        for path, name, port in ingress_backends(ingress.props):
            if is_unknown(name) or is_unknown(port):
                continue
            service = services.get((namespace, name))
            props = service.props if service is not None else None
            keys, target = _service_port(props, port) if props is not None else ({str(port)}, port)
            labels = get(props, "metadata.labels") if props is not None else None
            if isinstance(labels, Mapping) and DASHBOARD_PROXY_LABEL in labels:
                what = f"the Ray dashboard proxy of {labels[DASHBOARD_PROXY_LABEL]!r}"
            elif _is_dashboard_port(port) or _is_dashboard_port(target):
                what = f"the Ray dashboard port {DASHBOARD_PORT}"
            elif _is_jupyter(props, port, target):
                what = "a Jupyter server"
            else:
                continue
            problem = _iap_problem(props, keys, configs, namespace)
            if problem is None:
                continue
            fix = _JUPYTER_FIX if what == "a Jupyter server" else _FIX
            violations.append(
                f"{object_label(ingress)}: {path} routes public traffic to service {name!r} "
                f"({what}) without IAP: {problem}; {fix}"
            )
    return violations


__all__ = ["check_dashboard_ingress"]
