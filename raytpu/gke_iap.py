"""GKE's names for an IAP-protected HTTPS endpoint, and a pure check of the two GKE objects it
needs (BackendConfig, ManagedCertificate).

Stdlib only. The program (:mod:`infra.components.dashboard_iap`) declares the endpoint and the policy pack
(:mod:`policies.rules.dashboard_iap`) judges any Ingress that reaches a Ray dashboard; both read
these names from here.

Glossary (GKE's words): a **BackendConfig** (``cloud.google.com/v1``) configures the load
balancer's backend service of a Service port: ``spec.iap.enabled`` turns Identity-Aware Proxy on
(``spec.iap.oauthclientCredentials.secretName``: a Secret with ``client_id`` / ``client_secret``
of a custom OAuth client; without it IAP uses the Google-managed OAuth client). A Service names
its BackendConfig in the annotation :data:`BACKEND_CONFIG_ANNOTATION`, as JSON:
``{"default": NAME}`` or ``{"ports": {"PORT or port name": NAME}}``. A **ManagedCertificate**
(``networking.gke.io/v1``) is a Google-managed TLS certificate for ``spec.domains``.

The BackendConfig and ManagedCertificate CRDs are not vendored in this repository (unlike
KubeRay's, Kueue's and Managed Prometheus'): :func:`validate_backend_config` and
:func:`validate_managed_certificate` check only the fields used here, from GKE's documentation
(field names, types, one domain without a wildcard).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from raytpu.errors import invalid

DASHBOARD_PROXY_LABEL = "ray-tpu/dashboard-proxy"
"""Label (value: the Ray object's name) on the in-cluster proxy's pods and Service that adds the
Ray token to dashboard requests arriving through IAP: what the policy pack treats as "the Ray
dashboard" when an Ingress routes to it."""
BACKEND_CONFIG_ANNOTATION = "cloud.google.com/backend-config"
BACKEND_CONFIG_ANNOTATIONS = (BACKEND_CONFIG_ANNOTATION, "beta.cloud.google.com/backend-config")
"""Service annotations GKE reads a BackendConfig reference from (the beta one is older)."""
NEG_ANNOTATION = "cloud.google.com/neg"
"""``{"ingress": true}``: container-native load balancing (the load balancer reaches pod IPs)."""
BACKEND_CONFIG_API = "cloud.google.com/v1"
MANAGED_CERTIFICATE_API = "networking.gke.io/v1"
INGRESS_CLASS_ANNOTATION = "kubernetes.io/ingress.class"
EXTERNAL_INGRESS_CLASS = "gce"
STATIC_IP_ANNOTATION = "kubernetes.io/ingress.global-static-ip-name"
MANAGED_CERTIFICATES_ANNOTATION = "networking.gke.io/managed-certificates"
ALLOW_HTTP_ANNOTATION = "kubernetes.io/ingress.allow-http"
GFE_SOURCE_RANGES = ("35.191.0.0/16", "130.211.0.0/22")
"""Where Google Front Ends and their health checks reach backends from (external Application
Load Balancer; container-native load balancing connects to pod IPs from these ranges)."""
IAP_ACCESSOR_ROLE = "roles/iap.httpsResourceAccessor"
"""IAP-secured Web App User: may pass IAP to the backends the grant covers."""
HOST_RE = re.compile(r"^(?=.{4,253}$)([a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?\.)+[a-z]{2,63}$")
"""A fully qualified DNS name, lowercase, no wildcard (a ManagedCertificate takes none)."""


def backend_config_refs(annotation: Any) -> dict[str, Any] | None:
    """The parsed value of a backend-config annotation: ``{"default": NAME, "ports": {...}}``,
    or None when it is not JSON of that shape."""
    if isinstance(annotation, Mapping):
        parsed: Any = dict(annotation)
    elif isinstance(annotation, str):
        try:
            parsed = json.loads(annotation)
        except ValueError:
            return None
    else:
        return None
    if not isinstance(parsed, dict) or not set(parsed) <= {"default", "ports"}:
        return None
    ports = parsed.get("ports", {})
    if not isinstance(ports, dict) or not all(isinstance(v, str) for v in ports.values()):
        return None
    if "default" in parsed and not isinstance(parsed["default"], str):
        return None
    return {"default": parsed.get("default"), "ports": {str(k): v for k, v in ports.items()}}


def _is_int(value: Any) -> bool:
    """An integer, also as the Pulumi engine hands it over (``8090.0``)."""
    if isinstance(value, bool):
        return False
    return isinstance(value, int) or (isinstance(value, float) and value.is_integer())


def _object_problems(manifest: Mapping[str, Any], api: str, kind: str) -> list[str]:
    problems = []
    if manifest.get("apiVersion") != api:
        problems.append(invalid("apiVersion", manifest.get("apiVersion"), api))
    if manifest.get("kind") != kind:
        problems.append(invalid("kind", manifest.get("kind"), kind))
    metadata = manifest.get("metadata")
    if not isinstance(metadata, Mapping) or not isinstance(metadata.get("name"), str):
        problems.append("metadata.name: is required; valid: a Kubernetes object name")
    return problems


def validate_backend_config(manifest: Mapping[str, Any]) -> list[str]:
    """Problems of a BackendConfig as used here (``iap``, ``healthCheck``, ``timeoutSec``)."""
    problems = _object_problems(manifest, BACKEND_CONFIG_API, "BackendConfig")
    spec = manifest.get("spec")
    if not isinstance(spec, Mapping):
        return [*problems, "spec: is required; valid: a mapping"]
    known = {"iap", "healthCheck", "timeoutSec", "connectionDraining", "logging"}
    problems += [
        f"spec.{k}: unknown field; valid: {', '.join(sorted(known))}"
        for k in spec
        if k not in known
    ]
    iap = spec.get("iap")
    if iap is not None:
        if not isinstance(iap, Mapping) or not isinstance(iap.get("enabled"), bool):
            problems.append(invalid("spec.iap.enabled", iap, "true or false"))
        elif set(iap) - {"enabled", "oauthclientCredentials"}:
            problems.append(invalid("spec.iap", sorted(iap), ["enabled", "oauthclientCredentials"]))
        credentials = iap.get("oauthclientCredentials") if isinstance(iap, Mapping) else None
        if credentials is not None and (
            not isinstance(credentials, Mapping)
            or set(credentials) != {"secretName"}
            or not isinstance(credentials["secretName"], str)
        ):
            problems.append(
                invalid(
                    "spec.iap.oauthclientCredentials",
                    credentials,
                    "{secretName: NAME} (a Secret with client_id and client_secret)",
                )
            )
    check = spec.get("healthCheck")
    if check is not None:
        fields: dict[str, type] = {
            "type": str,
            "requestPath": str,
            "port": int,
            "checkIntervalSec": int,
        }
        if not isinstance(check, Mapping):
            problems.append(invalid("spec.healthCheck", check, "a mapping"))
        else:
            for key, value in check.items():
                wanted = fields.get(key)
                ok = _is_int(value) if wanted is int else isinstance(value, str)
                if wanted is None or not ok:
                    problems.append(
                        invalid(
                            f"spec.healthCheck.{key}",
                            value,
                            [f"{k} ({t.__name__})" for k, t in fields.items()],
                        )
                    )
            if check.get("type") not in (None, "HTTP", "HTTPS", "HTTP2"):
                problems.append(
                    invalid("spec.healthCheck.type", check.get("type"), ["HTTP", "HTTPS", "HTTP2"])
                )
    timeout = spec.get("timeoutSec")
    if timeout is not None and (not _is_int(timeout) or timeout < 1):
        problems.append(invalid("spec.timeoutSec", timeout, "an integer >= 1"))
    return problems


def validate_managed_certificate(manifest: Mapping[str, Any]) -> list[str]:
    """Problems of a ManagedCertificate: ``spec.domains``, one lowercase DNS name (no wildcard)."""
    problems = _object_problems(manifest, MANAGED_CERTIFICATE_API, "ManagedCertificate")
    spec = manifest.get("spec")
    domains = spec.get("domains") if isinstance(spec, Mapping) else None
    if not isinstance(domains, list) or not domains:
        return [*problems, invalid("spec.domains", domains, "a list of DNS names")]
    for i, domain in enumerate(domains):
        if not isinstance(domain, str) or not HOST_RE.match(domain):
            problems.append(
                invalid(
                    f"spec.domains[{i}]",
                    domain,
                    "a lowercase fully qualified DNS name without a wildcard",
                )
            )
    return problems


__all__ = [
    "BACKEND_CONFIG_ANNOTATION",
    "BACKEND_CONFIG_ANNOTATIONS",
    "BACKEND_CONFIG_API",
    "DASHBOARD_PROXY_LABEL",
    "GFE_SOURCE_RANGES",
    "HOST_RE",
    "IAP_ACCESSOR_ROLE",
    "MANAGED_CERTIFICATE_API",
    "backend_config_refs",
    "validate_backend_config",
    "validate_managed_certificate",
]
