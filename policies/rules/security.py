"""Security rules: Ray's control plane behind a token, its pods behind a NetworkPolicy, and no
secret in plain sight.

Ray's GCS (6379), dashboard / Jobs API (8265) and client (10001) run whatever code they are sent.
Since Ray 2.52 they can require a bearer token; KubeRay sets it up from ``spec.authOptions``
(``mode: token``, with ``enableK8sTokenAuth`` for Kubernetes-RBAC tokens on RayClusters, Ray >=
2.55). A token is worth nothing when it sits in a manifest: values of secret-looking variables
come from a Secret (``valueFrom.secretKeyRef``), never as literals in ``env`` or ``runtimeEnv``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import yaml

from policies.props import as_list, get, is_unknown
from policies.resources import cluster_spec, kind_of, pod_templates

NETWORK_POLICY = "kubernetes:networking.k8s.io/v1:NetworkPolicy"
NAMESPACE = "kubernetes:core/v1:Namespace"
SECRET_NAME = re.compile(
    r"(^|_)(TOKEN|SECRET|PASSWORD|PASSWD|API_?KEY|ACCESS_?KEY|PRIVATE_?KEY|CREDENTIALS?)($|_)",
    re.IGNORECASE,
)
"""Environment variable names whose value is a credential."""
_AUTH_FIX = (
    "set authOptions: {mode: token, enableK8sTokenAuth: true} (RayCluster, Ray >= 2.55) or "
    "{mode: token} (KubeRay creates the token Secret; or secretName: <Secret with auth_token>)"
)


def check_ray_auth(props: Mapping[str, Any], kind: str | None = None) -> list[str]:
    """A KubeRay object's Ray cluster requires a token (``authOptions.mode: token``)."""
    found = cluster_spec(props, kind)
    if found is None:
        return []
    path, spec = found
    if is_unknown(spec) or not isinstance(spec, Mapping):
        return []
    mode = get(spec, "authOptions.mode")
    if is_unknown(mode) or mode == "token":
        return []
    env_modes = {
        get(env, "value")
        for _, template in pod_templates(props, kind)
        for container in as_list(get(template, "containers"))
        if isinstance(container, Mapping)
        for env in as_list(container.get("env"))
        if isinstance(env, Mapping) and env.get("name") == "RAY_AUTH_MODE"
    }
    if "token" in env_modes:  # KubeRay < 1.5.1: the manual form (RAY_AUTH_MODE + token Secret)
        return []
    shown = "not set" if mode is None else f"{mode!r}"
    return [
        f"{path}.authOptions.mode: {shown}; without a token anyone who reaches the Ray head's "
        f"dashboard (8265), client (10001) or GCS (6379) runs code on every TPU host: {_AUTH_FIX}"
    ]


def _secret_literals(where: str, env: Any) -> list[str]:
    found = []
    if isinstance(env, Mapping):  # runtime_env env_vars: {NAME: value}
        items = [(name, value) for name, value in env.items()]
    else:
        items = [
            (e.get("name"), e.get("value"))
            for e in as_list(env)
            if isinstance(e, Mapping) and "value" in e
        ]
    for name, value in items:
        if isinstance(name, str) and SECRET_NAME.search(name) and isinstance(value, str) and value:
            found.append(
                f"{where}.{name}: a literal value for a credential; put it in a Kubernetes "
                f"Secret and use valueFrom.secretKeyRef (a runtime_env cannot reference "
                f"Secrets: set it on the pods instead)"
            )
    return found


def _runtime_envs(props: Mapping[str, Any], kind: str | None) -> list[tuple[str, Any]]:
    """(path, env_vars) of every runtime_env a KubeRay object carries as YAML text."""
    found: list[tuple[str, Any]] = []
    for path in ("spec.serveConfigV2", "spec.runtimeEnvYAML"):
        text = get(props, path)
        if not isinstance(text, str):
            continue
        try:
            doc = yaml.safe_load(text)
        except yaml.YAMLError:
            continue  # not ours to judge here: the CRD check reports broken YAML
        envs: Sequence[Any] = []
        if path.endswith("serveConfigV2") and isinstance(doc, Mapping):
            envs = [
                (f"{path}.applications[{i}].runtime_env.env_vars", get(app, "runtime_env.env_vars"))
                for i, app in enumerate(as_list(doc.get("applications")))
                if isinstance(app, Mapping)
            ]
        elif isinstance(doc, Mapping):
            envs = [(f"{path}.env_vars", doc.get("env_vars"))]
        found.extend((where, env) for where, env in envs if isinstance(env, Mapping))
    return found


def check_secret_values(props: Mapping[str, Any], kind: str | None = None) -> list[str]:
    """No literal credential in a container's ``env`` or a ``runtimeEnv``'s ``env_vars``."""
    kind = kind or kind_of(props)
    if kind is None:
        return []
    violations: list[str] = []
    for path, template in pod_templates(props, kind):
        for index, container in enumerate(as_list(get(template, "containers"))):
            if isinstance(container, Mapping):
                where = f"{path}.containers[{index}].env"
                violations += _secret_literals(where, container.get("env"))
    for where, env in _runtime_envs(props, kind):
        violations += _secret_literals(where, env)
    return violations


def check_network_policies(resources: Sequence[Any]) -> list[str]:
    """Every namespace declared here (a Namespace object) that holds a KubeRay object also holds
    a NetworkPolicy. Namespaces not declared alongside (a lone manifest) are not judged."""
    ray_namespaces: dict[str, str] = {}
    guarded: set[str] = set()
    declared: set[str] = set()
    for resource in resources:
        namespace = get(resource.props, "metadata.namespace")
        if not isinstance(namespace, str):
            namespace = "default"
        if resource.type == NAMESPACE or get(resource.props, "kind") == "Namespace":
            name = get(resource.props, "metadata.name")
            declared.add(name if isinstance(name, str) else resource.name)
        elif resource.type == NETWORK_POLICY or get(resource.props, "kind") == "NetworkPolicy":
            guarded.add(namespace)
        elif kind_of(resource.props, resource.type) is not None:
            name = get(resource.props, "metadata.name")
            ray_namespaces.setdefault(
                namespace, str(name if isinstance(name, str) else resource.name)
            )
    return [
        f"namespace {namespace!r} (e.g. {example}): no NetworkPolicy; any pod in the cluster can "
        f"reach Ray's ports there: declare one that admits only the Ray object's own pods, the "
        f"metrics scraper and the KubeRay operator (infra/manifests/ray_access.py builds it)"
        for namespace, example in sorted(ray_namespaces.items())
        if namespace in declared and namespace not in guarded
    ]


__all__ = ["check_network_policies", "check_ray_auth", "check_secret_values"]
