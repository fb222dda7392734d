"""Ray token authentication for the KubeRay objects: ``authOptions`` and where the token lives.

Pure (no pulumi import). Since Ray 2.52 the GCS, dashboard / Jobs API and Ray Client ports can
require a bearer token (``RAY_AUTH_MODE=token``); KubeRay (v1.5.1+) sets it up from
``spec.authOptions``:

- ``kubernetes`` (Ray >= 2.55, KubeRay >= 1.6.0): ``{mode: token, enableK8sTokenAuth: true}``.
  Ray checks bearer tokens against the Kubernetes API (TokenReview plus RBAC), so users reach a
  cluster with their own Kubernetes credentials. KubeRay supports it for standalone RayClusters
  only, so RayServices and RayJobs get the Secret form below.
- ``token``: ``{mode: token, secretName: <name>-ray-auth}``: a random token in a Kubernetes Secret
  the stack declares (generated once at create, never in the repository or the stack outputs).
- ``disabled``: ``{mode: disabled}``; only with ``ray-tpu:security.disabledReason``, and the
  policy pack's ``ray-token-auth`` still blocks it unless policy config relaxes that policy.
"""

from __future__ import annotations

from typing import Any

RBAC_KINDS = frozenset({"RayCluster"})
"""KubeRay kinds whose ``enableK8sTokenAuth`` KubeRay supports (its API reference)."""
TOKEN_KEY = "auth_token"
"""The data key KubeRay reads the token from in ``authOptions.secretName``."""


def credential(mode: str, kind: str) -> str:
    """How a client authenticates to an object: ``kubernetes``, ``secret`` or ``none``."""
    if mode == "disabled":
        return "none"
    if mode == "kubernetes" and kind in RBAC_KINDS:
        return "kubernetes"
    return "secret"


def secret_name(name: str) -> str:
    """The token Secret of Ray object ``name`` (in its namespace)."""
    return f"{name}-ray-auth"


def auth_options(mode: str, kind: str, name: str) -> dict[str, Any]:
    """``authOptions`` of the Ray cluster of object ``name`` of ``kind``."""
    how = credential(mode, kind)
    if how == "none":
        return {"mode": "disabled"}
    if how == "kubernetes":
        return {"mode": "token", "enableK8sTokenAuth": True}
    return {"mode": "token", "secretName": secret_name(name)}
