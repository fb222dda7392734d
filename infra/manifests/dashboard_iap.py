"""The Ray Dashboard behind IAP, as plain manifests (no pulumi import; :mod:`infra.components.dashboard_iap`
declares them).

The path of a request: browser -> Google Front End (HTTPS, ManagedCertificate, global static IP)
-> IAP (the user's Google identity must hold ``roles/iap.httpsResourceAccessor`` for the host)
-> the proxy's pods (container-native load balancing: GFE connects to pod IPs from
:data:`~raytpu.gke_iap.GFE_SOURCE_RANGES`) -> nginx adds ``Authorization: Bearer <Ray token>``
-> the Ray head's dashboard port. The browser never sees a Ray token.

Glossary: the **proxy** is an nginx Deployment (unprivileged image, read-only root file system,
no Kubernetes API token mounted) configured from a ConfigMap template; nginx's entrypoint fills
``${RAYTPU_RAY_TOKEN}`` from the environment, which comes from a Secret (``secretKeyRef``), so the
token is never in a manifest. It forwards ``GET`` and ``HEAD`` only: the dashboard through IAP
is for looking; jobs are submitted with ``raytpu submit`` under the user's own credentials.
"""

from __future__ import annotations

from typing import Any

from infra.config.schema import DashboardIapConfig
from infra.manifests import iap_endpoint, kuberay, ray_access, ray_auth
from raytpu import gke_iap
from raytpu.ray_names import DASHBOARD_PORT

PROXY_IMAGE = "nginxinc/nginx-unprivileged:1.28.0-alpine"
"""nginx as a non-root user (uid 101); its entrypoint renders ``/etc/nginx/templates``."""
PROXY_PORT = 8090
SERVICE_PORT = 80
HEALTH_PATH = "/healthz"
TOKEN_ENV = "RAYTPU_RAY_TOKEN"
SA_TOKEN_KEY = "token"
"""The key Kubernetes' token controller writes a ServiceAccount token Secret's token under."""
IAP_HEADER = "x-goog-iap-jwt-assertion"
LABELS = {"app.kubernetes.io/name": "ray-dashboard-proxy", "app.kubernetes.io/part-of": "ray-tpu"}


def base_name(iap: DashboardIapConfig) -> str:
    """``<object>-dashboard``: the prefix of every object of the endpoint."""
    return f"{iap.name}-dashboard"


def proxy_name(iap: DashboardIapConfig) -> str:
    return f"{base_name(iap)}-proxy"


def endpoint(iap: DashboardIapConfig) -> iap_endpoint.IapEndpoint:
    """The IAP endpoint in front of the proxy's Service."""
    return iap_endpoint.IapEndpoint(
        name=base_name(iap),
        namespace=iap.namespace,
        labels=_labels(iap),
        host=iap.host,
        service=proxy_name(iap),
        service_port=SERVICE_PORT,
        health_path=HEALTH_PATH,
        health_port=PROXY_PORT,
        oauth_secret=iap.oauth_secret,
        description=f"Ray Dashboard of {iap.kind}/{iap.name}",
    )


def backend_config_name(iap: DashboardIapConfig) -> str:
    return iap_endpoint.backend_config_name(endpoint(iap))


def token_secret(iap: DashboardIapConfig, credential: str) -> tuple[str, str] | None:
    """(Secret name, key) of the bearer token the proxy sends, or None (Ray without auth).

    ``secret``: the Ray object's own token Secret. ``kubernetes`` (RBAC-token RayClusters): a
    ServiceAccount token Secret of the proxy's own ServiceAccount, which is bound to the
    cluster's ``ray:write`` Role and to nothing else."""
    if credential == "secret":
        return ray_auth.secret_name(iap.name), ray_auth.TOKEN_KEY
    if credential == "kubernetes":
        return f"{proxy_name(iap)}-token", SA_TOKEN_KEY
    return None


def _labels(iap: DashboardIapConfig) -> dict[str, str]:
    return {**LABELS, gke_iap.DASHBOARD_PROXY_LABEL: iap.name}


def _meta(name: str, iap: DashboardIapConfig, **extra: Any) -> dict[str, Any]:
    return {"name": name, "namespace": iap.namespace, "labels": _labels(iap), **extra}


def nginx_template(iap: DashboardIapConfig, credential: str) -> str:
    """``default.conf.template``: health check locally, everything else to the Ray head."""
    head = f"{kuberay.head_service_name(iap.name)}.{iap.namespace}.svc.cluster.local"
    auth = (
        f'        proxy_set_header Authorization "Bearer ${{{TOKEN_ENV}}}";\n'
        if token_secret(iap, credential)
        else '        proxy_set_header Authorization "";\n'
    )
    return (
        "server {\n"
        f"    listen {PROXY_PORT};\n"
        "    server_tokens off;\n"
        f"    location = {HEALTH_PATH} {{\n"
        "        access_log off;\n"
        '        return 200 "ok\\n";\n'
        "    }\n"
        "    location / {\n"
        "        # Only requests that came through IAP carry its signed header (not verified\n"
        "        # here: a tripwire; the NetworkPolicy admits only Google Front Ends).\n"
        f'        if ($http_{IAP_HEADER.replace("-", "_")} = "") {{\n'
        "            return 403;\n"
        "        }\n"
        "        limit_except GET HEAD {\n"
        "            deny all;\n"
        "        }\n"
        f"        proxy_pass http://{head}:{DASHBOARD_PORT};\n"
        "        proxy_http_version 1.1;\n"
        f"{auth}"
        f'        proxy_set_header {IAP_HEADER} "";\n'
        "        proxy_read_timeout 300s;\n"
        "    }\n"
        "}\n"
    )


def config_map(iap: DashboardIapConfig, credential: str) -> dict[str, Any]:
    return {
        "metadata": _meta(proxy_name(iap), iap),
        "data": {"default.conf.template": nginx_template(iap, credential)},
    }


def service_account(iap: DashboardIapConfig) -> dict[str, Any]:
    return {"metadata": _meta(proxy_name(iap), iap), "automountServiceAccountToken": False}


def service_account_token(iap: DashboardIapConfig) -> dict[str, Any]:
    """A ServiceAccount token Secret (filled by Kubernetes' token controller): the credential of
    an RBAC-token RayCluster's proxy. Revoke it by deleting the Secret (docs/security.md)."""
    name, _ = token_secret(iap, "kubernetes") or ("", "")
    annotations = {"kubernetes.io/service-account.name": proxy_name(iap)}
    return {
        "metadata": _meta(name, iap, annotations=annotations),
        "type": "kubernetes.io/service-account-token",
    }


def ray_write_binding(iap: DashboardIapConfig) -> dict[str, Any]:
    """Binds the proxy's ServiceAccount to the cluster's ``ray:write`` Role
    (:func:`infra.manifests.ray_access.ray_write_role`): the only thing its token may do."""
    role = ray_access.ray_write_role(iap.name, iap.namespace)["metadata"]["name"]
    return {
        "metadata": _meta(proxy_name(iap), iap),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role},
        "subjects": [
            {"kind": "ServiceAccount", "name": proxy_name(iap), "namespace": iap.namespace}
        ],
    }


def deployment(iap: DashboardIapConfig, credential: str) -> dict[str, Any]:
    secret = token_secret(iap, credential)
    env = [{"name": "NGINX_ENVSUBST_FILTER", "value": "^RAYTPU_"}]
    if secret:
        env.append(
            {
                "name": TOKEN_ENV,
                "valueFrom": {"secretKeyRef": {"name": secret[0], "key": secret[1]}},
            }
        )
    probe = {"httpGet": {"path": HEALTH_PATH, "port": PROXY_PORT}, "periodSeconds": 10}
    container = {
        "name": "nginx",
        "image": PROXY_IMAGE,
        "ports": [{"name": "http", "containerPort": PROXY_PORT}],
        "env": env,
        "readinessProbe": probe,
        "livenessProbe": probe,
        "resources": {
            "requests": {"cpu": "50m", "memory": "64Mi"},
            "limits": {"cpu": "500m", "memory": "128Mi"},
        },
        "securityContext": {
            "runAsNonRoot": True,
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        },
        "volumeMounts": [
            {"name": "templates", "mountPath": "/etc/nginx/templates", "readOnly": True},
            {"name": "conf", "mountPath": "/etc/nginx/conf.d"},
            {"name": "tmp", "mountPath": "/tmp"},
        ],
    }
    return {
        "metadata": _meta(proxy_name(iap), iap),
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": _labels(iap)},
            "template": {
                "metadata": {"labels": _labels(iap)},
                "spec": {
                    "serviceAccountName": proxy_name(iap),
                    "automountServiceAccountToken": False,
                    "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
                    "containers": [container],
                    "volumes": [
                        {"name": "templates", "configMap": {"name": proxy_name(iap)}},
                        {"name": "conf", "emptyDir": {}},
                        {"name": "tmp", "emptyDir": {}},
                    ],
                },
            },
        },
    }


def service(iap: DashboardIapConfig) -> dict[str, Any]:
    """ClusterIP, container-native (NEG), with the IAP BackendConfig for its port."""
    annotations = iap_endpoint.service_annotations(endpoint(iap))
    return {
        "metadata": _meta(proxy_name(iap), iap, annotations=annotations),
        "spec": {
            "type": "ClusterIP",
            "selector": _labels(iap),
            "ports": [
                {"name": "http", "port": SERVICE_PORT, "targetPort": "http", "protocol": "TCP"}
            ],
        },
    }


def backend_config(iap: DashboardIapConfig) -> dict[str, Any]:
    return iap_endpoint.backend_config(endpoint(iap))


def managed_certificate(iap: DashboardIapConfig) -> dict[str, Any]:
    return iap_endpoint.managed_certificate(endpoint(iap))


def ingress(iap: DashboardIapConfig, address: str) -> dict[str, Any]:
    """An external GCE Ingress: HTTPS only, on the static IP, for ``host`` only."""
    return iap_endpoint.ingress(endpoint(iap), address)


def proxy_network_policy(iap: DashboardIapConfig) -> dict[str, Any]:
    """The proxy's pods accept only Google Front Ends (traffic and health checks) on its port."""
    return iap_endpoint.gfe_network_policy(endpoint(iap), proxy_name(iap), _labels(iap), PROXY_PORT)


def head_network_policy(iap: DashboardIapConfig) -> dict[str, Any]:
    """Adds to the Ray object's own NetworkPolicy (policies are a union): its pods accept the
    proxy's pods on the dashboard port, nothing more."""
    return {
        "metadata": _meta(f"{base_name(iap)}-from-proxy", iap),
        "spec": {
            "podSelector": {"matchLabels": {ray_access.RAY_OBJECT_LABEL: iap.name}},
            "policyTypes": ["Ingress"],
            "ingress": [
                {
                    "from": [{"podSelector": {"matchLabels": _labels(iap)}}],
                    "ports": [{"protocol": "TCP", "port": DASHBOARD_PORT}],
                }
            ],
        },
    }
