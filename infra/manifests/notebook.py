"""A JupyterLab next to a RayCluster, as plain manifests (no pulumi import;
:class:`infra.components.notebook.Notebook` declares them).

What the notebook is: one pod (a Deployment of one replica) running JupyterLab in the stack's
Ray image, with a ClusterIP Service reached by ``kubectl port-forward`` (``raytpu notebook
--stack``) and a Jupyter token from a Secret the stack generates. Its kernels attach to the
RayCluster over Ray Client (``RAY_ADDRESS=ray://<head>:10001``) with Ray's token auth:

- ``kubernetes`` (RBAC tokens): the notebook's own ServiceAccount token is the Ray credential
  (``RAY_AUTH_TOKEN_PATH``), bound to the cluster's ``ray:write`` Role and nothing wider;
- ``secret``: ``RAY_AUTH_TOKEN`` from the cluster's token Secret (``secretKeyRef``: the token is
  never in a manifest, and the ServiceAccount has no ``get`` on Secrets).

Its Role (:func:`role`) lets it use its team's RayCluster and queue: read that cluster, create
and delete RayJobs in its namespace (Kueue admits them through the team's LocalQueue), read the
queue and its pods' logs. It grants nothing on node pools (GCP objects: no Google identity is
bound to it), nothing cluster-scoped (a Role cannot), no change to any RayCluster, no Secrets,
no RBAC, and nothing in another namespace.
"""

from __future__ import annotations

from typing import Any

from infra.config.notebook_schema import NOTEBOOK_PORT, NotebookConfig, NotebookIapConfig
from infra.manifests import iap_endpoint, kuberay, ray_access, ray_auth
from raytpu.kueue import API_VERSION as KUEUE_API_VERSION
from raytpu.ray_names import CLIENT_PORT, DASHBOARD_PORT

NOTEBOOK_LABEL = "ray-tpu/notebook"
"""Pod label naming the notebook: what its NetworkPolicies and the Ray head's admit select."""
APP_NAME = "jupyterlab"
LABELS = {"app.kubernetes.io/name": APP_NAME, "app.kubernetes.io/part-of": "ray-tpu"}
JUPYTER_TOKEN_ENV = "JUPYTER_TOKEN"
"""jupyter_server's IdentityProvider reads its token from this variable (2.x)."""
JUPYTER_TOKEN_KEY = "token"
SA_TOKEN_PATH = "/var/run/secrets/kubernetes.io/serviceaccount/token"
WORK_DIR = "/home/ray/work"
RBAC_API = "rbac.authorization.k8s.io"
HEALTH_PATH = "/api"
"""jupyter_server's version endpoint: 200 without a token (the load balancer's health check)."""
IAP_TIMEOUT_S = 3600
"""The backend service's timeout behind IAP: how long a kernel's WebSocket may stay open."""
KUEUE_GROUP = KUEUE_API_VERSION.split("/")[0]


def _labels(nb: NotebookConfig) -> dict[str, str]:
    return {**LABELS, NOTEBOOK_LABEL: nb.name}


def _meta(name: str, nb: NotebookConfig, **extra: Any) -> dict[str, Any]:
    return {"name": name, "namespace": nb.namespace, "labels": _labels(nb), **extra}


def token_secret_name(nb: NotebookConfig) -> str:
    """The Secret holding the Jupyter token (``raytpu notebook --stack`` reads it with RBAC)."""
    return f"{nb.name}-jupyter-token"


def ray_address(nb: NotebookConfig) -> str:
    head = f"{kuberay.head_service_name(nb.ray_cluster)}.{nb.namespace}.svc.cluster.local"
    return f"ray://{head}:{CLIENT_PORT}"


def service_account(nb: NotebookConfig) -> dict[str, Any]:
    """Its token is mounted: it is the notebook's Kubernetes identity (and, with ``kubernetes``
    Ray auth, its Ray credential)."""
    return {"metadata": _meta(nb.name, nb), "automountServiceAccountToken": True}


def role(nb: NotebookConfig) -> dict[str, Any]:
    """What the notebook may do in its namespace; nothing else is granted (see the module)."""
    rules: list[dict[str, Any]] = [
        {
            "apiGroups": ["ray.io"],
            "resources": ["rayclusters"],
            "resourceNames": [nb.ray_cluster],
            "verbs": ["get"],
        },
        {
            "apiGroups": ["ray.io"],
            "resources": ["rayjobs"],
            "verbs": ["create", "get", "list", "watch", "delete"],
        },
        {"apiGroups": [""], "resources": ["pods", "pods/log"], "verbs": ["get", "list", "watch"]},
    ]
    if nb.queue is not None:
        rules.append(
            {
                "apiGroups": [KUEUE_GROUP],
                "resources": ["localqueues"],
                "resourceNames": [nb.queue],
                "verbs": ["get"],
            }
        )
    return {"metadata": _meta(nb.name, nb), "rules": rules}


def _binding(name: str, nb: NotebookConfig, role_name: str) -> dict[str, Any]:
    return {
        "metadata": _meta(name, nb),
        "roleRef": {"apiGroup": RBAC_API, "kind": "Role", "name": role_name},
        "subjects": [{"kind": "ServiceAccount", "name": nb.name, "namespace": nb.namespace}],
    }


def role_binding(nb: NotebookConfig) -> dict[str, Any]:
    return _binding(nb.name, nb, nb.name)


def ray_write_binding(nb: NotebookConfig) -> dict[str, Any]:
    """``kubernetes`` Ray auth: the notebook's ServiceAccount gets the RayCluster's ``ray:write``
    Role (:func:`infra.manifests.ray_access.ray_write_role`), which is what Ray checks."""
    role_name = ray_access.ray_write_role(nb.ray_cluster, nb.namespace)["metadata"]["name"]
    return _binding(f"{nb.name}-ray-write", nb, role_name)


def ray_env(nb: NotebookConfig, credential: str) -> list[dict[str, Any]]:
    """The kernels' Ray settings (a kernel inherits the server's environment)."""
    env: list[dict[str, Any]] = [{"name": "RAY_ADDRESS", "value": ray_address(nb)}]
    if credential == "none":
        return env
    env.append({"name": "RAY_AUTH_MODE", "value": "token"})
    if credential == "kubernetes":
        env.append({"name": "RAY_AUTH_TOKEN_PATH", "value": SA_TOKEN_PATH})
    else:
        secret = {"name": ray_auth.secret_name(nb.ray_cluster), "key": ray_auth.TOKEN_KEY}
        env.append({"name": "RAY_AUTH_TOKEN", "valueFrom": {"secretKeyRef": secret}})
    return env


def command() -> list[str]:
    """JupyterLab on all pod addresses (the Service and port-forward reach it there); the token
    comes from ``JUPYTER_TOKEN``, never from an argument."""
    return [
        "python",
        "-m",
        "jupyterlab",
        "--no-browser",
        "--ip=0.0.0.0",
        f"--port={NOTEBOOK_PORT}",
        f"--ServerApp.root_dir={WORK_DIR}",
    ]


def deployment(
    nb: NotebookConfig, credential: str, image: str, cpu: str, memory: str
) -> dict[str, Any]:
    token = {"name": token_secret_name(nb), "key": JUPYTER_TOKEN_KEY}
    container = {
        "name": APP_NAME,
        "image": image,
        "command": command(),
        "workingDir": WORK_DIR,
        "ports": [{"name": "http", "containerPort": NOTEBOOK_PORT}],
        "env": [
            {"name": JUPYTER_TOKEN_ENV, "valueFrom": {"secretKeyRef": token}},
            *ray_env(nb, credential),
        ],
        "readinessProbe": {"tcpSocket": {"port": NOTEBOOK_PORT}, "periodSeconds": 10},
        "resources": {
            "requests": {"cpu": cpu, "memory": memory},
            "limits": {"cpu": cpu, "memory": memory},
        },
        "securityContext": {
            "runAsNonRoot": True,
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
        },
        "volumeMounts": [{"name": "work", "mountPath": WORK_DIR}],
    }
    return {
        "metadata": _meta(nb.name, nb),
        "spec": {
            "replicas": 1,
            "strategy": {"type": "Recreate"},
            "selector": {"matchLabels": _labels(nb)},
            "template": {
                "metadata": {"labels": _labels(nb)},
                "spec": {
                    "serviceAccountName": nb.name,
                    "securityContext": {
                        "runAsUser": 1000,
                        "fsGroup": 100,
                        "seccompProfile": {"type": "RuntimeDefault"},
                    },
                    "containers": [container],
                    "volumes": [{"name": "work", "emptyDir": {}}],
                },
            },
        },
    }


def endpoint(nb: NotebookConfig, iap: NotebookIapConfig) -> iap_endpoint.IapEndpoint:
    """The notebook's IAP endpoint: ``<name>.<domain>`` in front of its Service."""
    return iap_endpoint.IapEndpoint(
        name=nb.name,
        namespace=nb.namespace,
        labels=_labels(nb),
        host=iap.host(nb),
        service=nb.name,
        service_port=NOTEBOOK_PORT,
        health_path=HEALTH_PATH,
        health_port=NOTEBOOK_PORT,
        oauth_secret=iap.oauth_secret,
        timeout_s=IAP_TIMEOUT_S,
        description=f"JupyterLab {nb.name} in namespace {nb.namespace}",
    )


def service(nb: NotebookConfig, iap: NotebookIapConfig | None = None) -> dict[str, Any]:
    """ClusterIP only: reached with ``kubectl port-forward`` under the user's own RBAC, and with
    ``iap`` also through its IAP Ingress (container-native, the IAP BackendConfig named)."""
    extra = {"annotations": iap_endpoint.service_annotations(endpoint(nb, iap))} if iap else {}
    return {
        "metadata": _meta(nb.name, nb, **extra),
        "spec": {
            "type": "ClusterIP",
            "selector": _labels(nb),
            "ports": [
                {"name": "http", "port": NOTEBOOK_PORT, "targetPort": NOTEBOOK_PORT},
            ],
        },
    }


def network_policy(nb: NotebookConfig) -> dict[str, Any]:
    """No pod may connect to the notebook (port-forward does not pass NetworkPolicies; with IAP,
    :func:`gfe_policy` admits Google Front Ends beside this)."""
    return {
        "metadata": _meta(nb.name, nb),
        "spec": {
            "podSelector": {"matchLabels": {NOTEBOOK_LABEL: nb.name}},
            "policyTypes": ["Ingress"],
            "ingress": [],
        },
    }


def ray_head_policy(nb: NotebookConfig) -> dict[str, Any]:
    """The RayCluster's pods admit the notebook on the Ray Client and dashboard / Jobs ports
    (added to the cluster's own :func:`infra.manifests.ray_access.network_policy`)."""
    return {
        "metadata": _meta(f"{nb.name}-to-ray", nb),
        "spec": {
            "podSelector": {"matchLabels": {ray_access.RAY_OBJECT_LABEL: nb.ray_cluster}},
            "policyTypes": ["Ingress"],
            "ingress": [
                {
                    "from": [{"podSelector": {"matchLabels": {NOTEBOOK_LABEL: nb.name}}}],
                    "ports": [
                        {"protocol": "TCP", "port": CLIENT_PORT},
                        {"protocol": "TCP", "port": DASHBOARD_PORT},
                    ],
                }
            ],
        },
    }


def token_secret_metadata(nb: NotebookConfig) -> dict[str, Any]:
    return _meta(token_secret_name(nb), nb)


def gfe_policy(nb: NotebookConfig, iap: NotebookIapConfig) -> dict[str, Any]:
    """With IAP: the notebook's pod admits Google Front Ends on its port, no one else."""
    ep = endpoint(nb, iap)
    pods = {NOTEBOOK_LABEL: nb.name}
    return iap_endpoint.gfe_network_policy(ep, f"{nb.name}-from-gfe", pods, NOTEBOOK_PORT)
