"""The credential a command presents to a Ray head, fetched through the user's own access.

The stack outputs say how each head authenticates (:attr:`raytpu.stack_outputs.RayHead.auth`):

- ``kubernetes``: Ray checks bearer tokens with the Kubernetes API (KubeRay
  ``enableK8sTokenAuth``). The user's own Google credential is that token on GKE (what
  ``gke-gcloud-auth-plugin`` hands kubectl): ``gcloud auth print-access-token``. Ray then asks
  Kubernetes whether that user may ``ray:write`` the RayCluster.
- ``secret``: the token KubeRay's ``authOptions.secretName`` names, read with ``kubectl get
  secret`` under the user's RBAC (``get`` on that Secret).
- ``none``: no header.

The token is never printed, stored, or asked of the user. Every call is bounded.
"""

from __future__ import annotations

import base64
import binascii
import shutil
import subprocess
from collections.abc import Callable, Sequence

from raytpu.stack_outputs import RayHead

CREDENTIAL_TIMEOUT_S = 30.0
Runner = Callable[[Sequence[str]], subprocess.CompletedProcess[str]]


class CredentialError(RuntimeError):
    """No credential for the head; the message says which permission or tool is missing."""


def _run(argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
    if shutil.which(argv[0]) is None:
        raise CredentialError(f"{argv[0]}: not found on PATH; install it (see docs/delivery.md)")
    try:
        return subprocess.run(
            list(argv), capture_output=True, text=True, timeout=CREDENTIAL_TIMEOUT_S, check=False
        )
    except subprocess.TimeoutExpired as error:
        raise CredentialError(
            f"{' '.join(argv[:3])}: no answer within {CREDENTIAL_TIMEOUT_S:.0f} s"
        ) from error


def auth_headers(head: RayHead, run: Runner = _run) -> dict[str, str]:
    """``{"Authorization": "Bearer ..."}`` for ``head`` (empty when it runs without auth)."""
    if head.auth == "none":
        return {}
    token = _kubernetes_token(run) if head.auth == "kubernetes" else _secret_token(head, run)
    return {"Authorization": f"Bearer {token}"}


def _kubernetes_token(run: Runner) -> str:
    result = run(["gcloud", "auth", "print-access-token"])
    token = result.stdout.strip()
    if result.returncode != 0 or not token:
        raise CredentialError(
            "gcloud auth print-access-token failed: run `gcloud auth login` (your own Google "
            f"identity is the Ray credential of this cluster): {result.stderr.strip()[-300:]}"
        )
    return token


def _secret_token(head: RayHead, run: Runner) -> str:
    secret = head.auth_secret
    argv = [
        "kubectl",
        "get",
        "secret",
        str(secret),
        "-n",
        head.namespace,
        "-o",
        "jsonpath={.data.auth_token}",
    ]
    result = run(argv)
    if result.returncode != 0:
        error = result.stderr.strip()
        if "forbidden" in error.lower():
            raise CredentialError(
                f"you may not read the Ray token of {head.kind} {head.name!r}: Kubernetes RBAC "
                f"denies get on secret {secret!r} in namespace {head.namespace!r}. Ask for a "
                f"RoleBinding that grants it (check: kubectl auth can-i get secret/{secret} -n "
                f"{head.namespace})"
            )
        if "notfound" in error.lower().replace(" ", ""):
            raise CredentialError(
                f"secret {secret!r} not found in namespace {head.namespace!r}: is the stack "
                "deployed (pulumi up), and does kubectl point at its cluster?"
            )
        raise CredentialError(f"kubectl get secret {secret} failed: {error[-300:]}")
    try:
        token = base64.b64decode(result.stdout.strip(), validate=True).decode("utf-8").strip()
    except (binascii.Error, UnicodeDecodeError) as error:
        raise CredentialError(f"secret {secret!r}: auth_token is not base64 text") from error
    if not token:
        raise CredentialError(f"secret {secret!r} has no auth_token")
    return token
