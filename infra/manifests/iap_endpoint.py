"""One HTTPS host behind Identity-Aware Proxy in front of one Service, as plain manifests (no
pulumi import): what the Ray Dashboard's proxy (:mod:`infra.manifests.dashboard_iap`) and a
notebook (:mod:`infra.manifests.notebook`) share.

The path of a request: browser -> Google Front End (HTTPS, a ManagedCertificate, a global static
IP) -> IAP (the user's Google identity must hold ``roles/iap.httpsResourceAccessor``, granted for
this host only by :func:`iam_condition`) -> the Service's pods, container-native (GFE connects to
pod IPs from :data:`~raytpu.gke_iap.GFE_SOURCE_RANGES`, which :func:`gfe_network_policy` admits).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from raytpu import gke_iap


@dataclass(frozen=True)
class IapEndpoint:
    """Glossary: ``name`` prefixes the BackendConfig (``<name>-iap``), the ManagedCertificate
    (``<name>-cert``) and the Ingress (``<name>``); ``service`` and ``service_port`` are the
    backend; the load balancer's health check asks ``health_path`` on the pods' ``health_port``."""

    name: str
    namespace: str
    labels: dict[str, str]
    host: str
    service: str
    service_port: int
    health_path: str
    health_port: int
    oauth_secret: str | None = None
    timeout_s: int = 300
    """The backend service's timeout: a request's, and a WebSocket connection's whole life."""
    description: str = ""
    """What the endpoint is, for the IAM condition (``Ray Dashboard of RayCluster/train``)."""


def backend_config_name(ep: IapEndpoint) -> str:
    return f"{ep.name}-iap"


def certificate_name(ep: IapEndpoint) -> str:
    return f"{ep.name}-cert"


def address_name(cluster: str, ep: IapEndpoint) -> str:
    """The global static IP's name: ``<cluster>-<name>``, at most 63 characters."""
    return f"{cluster}-{ep.name}"[:63].rstrip("-")


def _meta(name: str, ep: IapEndpoint, **extra: Any) -> dict[str, Any]:
    return {"name": name, "namespace": ep.namespace, "labels": dict(ep.labels), **extra}


def service_annotations(ep: IapEndpoint) -> dict[str, str]:
    """Container-native load balancing (NEG) and the IAP BackendConfig for every port."""
    return {
        gke_iap.NEG_ANNOTATION: json.dumps({"ingress": True}),
        gke_iap.BACKEND_CONFIG_ANNOTATION: json.dumps({"default": backend_config_name(ep)}),
    }


def backend_config(ep: IapEndpoint) -> dict[str, Any]:
    iap_spec: dict[str, Any] = {"enabled": True}
    if ep.oauth_secret:
        iap_spec["oauthclientCredentials"] = {"secretName": ep.oauth_secret}
    return {
        "apiVersion": gke_iap.BACKEND_CONFIG_API,
        "kind": "BackendConfig",
        "metadata": _meta(backend_config_name(ep), ep),
        "spec": {
            "iap": iap_spec,
            "healthCheck": {"type": "HTTP", "requestPath": ep.health_path, "port": ep.health_port},
            "timeoutSec": ep.timeout_s,
        },
    }


def managed_certificate(ep: IapEndpoint) -> dict[str, Any]:
    return {
        "apiVersion": gke_iap.MANAGED_CERTIFICATE_API,
        "kind": "ManagedCertificate",
        "metadata": _meta(certificate_name(ep), ep),
        "spec": {"domains": [ep.host]},
    }


def ingress(ep: IapEndpoint, address: str) -> dict[str, Any]:
    """An external GCE Ingress: HTTPS only, on the static IP, for ``host`` only."""
    annotations = {
        gke_iap.INGRESS_CLASS_ANNOTATION: gke_iap.EXTERNAL_INGRESS_CLASS,
        gke_iap.STATIC_IP_ANNOTATION: address,
        gke_iap.MANAGED_CERTIFICATES_ANNOTATION: certificate_name(ep),
        gke_iap.ALLOW_HTTP_ANNOTATION: "false",
    }
    backend = {"service": {"name": ep.service, "port": {"number": ep.service_port}}}
    return {
        "metadata": _meta(ep.name, ep, annotations=annotations),
        "spec": {
            "rules": [
                {
                    "host": ep.host,
                    "http": {"paths": [{"path": "/", "pathType": "Prefix", "backend": backend}]},
                }
            ]
        },
    }


def gfe_network_policy(ep: IapEndpoint, name: str, pods: dict[str, str], port: int) -> dict:
    """The ``pods`` accept Google Front Ends (traffic and health checks) on ``port``, no one else
    (NetworkPolicies add up: this admits GFE beside any other policy of those pods)."""
    return {
        "metadata": _meta(name, ep),
        "spec": {
            "podSelector": {"matchLabels": pods},
            "policyTypes": ["Ingress"],
            "ingress": [
                {
                    "from": [{"ipBlock": {"cidr": cidr}} for cidr in gke_iap.GFE_SOURCE_RANGES],
                    "ports": [{"protocol": "TCP", "port": port}],
                }
            ],
        },
    }


def iam_condition(ep: IapEndpoint, title: str) -> dict[str, str]:
    """The grant holds for requests to this host only (IAP's ``request.host`` attribute)."""
    return {
        "title": title,
        "description": f"{ep.description} on {ep.host} only",
        "expression": f'request.host == "{ep.host}"',
    }
