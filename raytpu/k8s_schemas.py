"""Validate core Kubernetes objects against Kubernetes' published OpenAPI schemas.

The one module that talks to ``kubernetes-validate`` (pinned in pyproject.toml): it ships the JSON
schemas of each Kubernetes minor release, generated from the API server's OpenAPI document, in a
*strict* flavour that refuses fields the API does not define (the API server would drop them,
or refuse them with ``fieldValidation=Strict``). Namespaces, ServiceAccounts, Roles and
RoleBindings, NetworkPolicies, Services, Deployments, Ingresses, ConfigMaps and Secrets are
checked at the Kubernetes minor the stack's GKE release channel runs (:func:`kubernetes_minor`).
Objects of other API groups (custom resources: KubeRay, Kueue, GKE's BackendConfig...) are not
core objects: :func:`is_core` is false for them and :mod:`raytpu.crds` checks what it has CRDs for.

Stdlib at module level; ``kubernetes_validate`` is imported when a check runs.
"""

from __future__ import annotations

import functools
import re
from typing import Any

from raytpu.errors import invalid

CHANNEL_MINORS = {"RAPID": "1.36", "REGULAR": "1.35", "STABLE": "1.35", "EXTENDED": "1.35"}
"""The Kubernetes minor of a new cluster's default version per GKE release channel (GKE release
notes, "Current versions"; check with ``gcloud container get-server-config``). A stack that sets
``minMasterVersion`` is checked at that minor instead."""
CORE_GROUPS = ("core", "apps", "batch", "networking.k8s.io", "rbac.authorization.k8s.io", "policy")
"""Pulumi's type-token groups whose kinds Kubernetes itself defines (``core`` is ``v1``)."""
_TOKEN = re.compile(r"^kubernetes:(?P<group>[^/]+)/(?P<version>[^:]+):(?P<kind>\w+)$")


def kubernetes_minor(release_channel: str, min_master_version: str = "") -> str:
    """``1.35`` for a REGULAR stack; the minor of ``min_master_version`` when it is set."""
    if min_master_version:
        match = re.match(r"^(\d+\.\d+)", min_master_version)
        if match:
            return match.group(1)
    if release_channel not in CHANNEL_MINORS:
        raise ValueError(invalid("releaseChannel", release_channel, CHANNEL_MINORS))
    return CHANNEL_MINORS[release_channel]


def api_version_of(type_token: str) -> tuple[str, str] | None:
    """``("apps/v1", "Deployment")`` for ``kubernetes:apps/v1:Deployment``; ``None`` when the
    token is not a core Kubernetes kind."""
    match = _TOKEN.match(type_token)
    if not match or match["group"] not in CORE_GROUPS:
        return None
    group, version = match["group"], match["version"]
    return (version if group == "core" else f"{group}/{version}"), match["kind"]


def is_core(type_token: str) -> bool:
    return api_version_of(type_token) is not None


def validate_object(obj: dict[str, Any], minor: str) -> list[str]:
    """Schema errors of a core object at Kubernetes ``minor``: ``["spec.replicas: 'two' is not
    of type 'integer', 'null'"]``, empty when the API server would accept it. Unknown fields are
    errors (strict schemas). The validator stops at the first error, as ``kubectl`` does."""
    import kubernetes_validate

    try:
        kubernetes_validate.validate(obj, supported_minor(minor), strict=True)
    except kubernetes_validate.ValidationError as error:
        path = ".".join(str(part) for part in error.path) or "(object)"
        return [f"{path}: {error.message}"]
    return []


@functools.cache
def supported_minor(minor: str) -> str:
    """``minor`` when kubernetes-validate has its schemas; ValueError naming the valid range."""
    from kubernetes_validate.utils import latest_version

    latest = ".".join(latest_version().split(".")[:2])
    valid = f"a minor such as 1.35, up to {latest}"
    if not re.fullmatch(r"1\.\d+", minor):
        raise ValueError(invalid("kubernetes version", minor, valid))
    if int(minor.split(".")[1]) > int(latest.split(".")[1]):
        raise ValueError(invalid("kubernetes version", minor, valid, "upgrade kubernetes-validate"))
    return minor
