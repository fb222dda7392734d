"""Rule 5, notebooks: no Jupyter server without its token, and none on a load balancer.

A Jupyter server runs whatever code reaches it, with the pod's Kubernetes and Ray credentials. A
workload (Deployment, StatefulSet, Pod) whose container runs Jupyter (``jupyter lab``,
``python -m jupyterlab``, ``jupyter-server``...) must

- take its token from a Secret: ``JUPYTER_TOKEN`` (or ``JUPYTER_TOKEN_FILE``) from a
  ``secretKeyRef``, or a ``--IdentityProvider.token`` / ``--ServerApp.token`` argument naming such
  a variable as ``$(VAR)``; never an empty token (that turns authentication off), never a literal
  one (a credential in the manifest);
- keep the XSRF check on (``--ServerApp.disable_check_xsrf=True`` lets any web page drive it).

A Service of type ``LoadBalancer`` or ``NodePort`` exposes no Jupyter server (a port 8888, or a
selector of pods labelled ``app.kubernetes.io/name: jupyterlab``). Reach it with
``raytpu notebook --stack`` (kubectl port-forward). Values unknown at preview are skipped.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from policies.props import as_int, as_list, get, is_unknown

WORKLOAD_PATHS = {
    "Deployment": "spec.template.spec",
    "StatefulSet": "spec.template.spec",
    "Pod": "spec",
}
"""The pod spec of each workload kind the rule reads."""
TYPES = {
    "kubernetes:apps/v1:Deployment": "Deployment",
    "kubernetes:apps/v1:StatefulSet": "StatefulSet",
    "kubernetes:core/v1:Pod": "Pod",
    "kubernetes:core/v1:Service": "Service",
}
JUPYTER_PORT = 8888
APP_LABEL = ("app.kubernetes.io/name", "jupyterlab")
TOKEN_ENVS = ("JUPYTER_TOKEN", "JUPYTER_TOKEN_FILE")
_TOKEN_ARG = re.compile(
    r"^--(IdentityProvider|ServerApp|NotebookApp)\.token(=(?P<value>.*))?$", re.IGNORECASE
)
_XSRF_OFF = re.compile(r"^--(ServerApp|NotebookApp)\.disable_check_xsrf(=(true|1))?$", re.I)
_ENV_REF = re.compile(r"^\$\((?P<name>[A-Za-z_][A-Za-z0-9_]*)\)$")
_FIX = "take the token from a Secret: env JUPYTER_TOKEN with valueFrom.secretKeyRef"


def _is_jupyter(argv: list[Any]) -> bool:
    return any(isinstance(a, str) and "jupyter" in a.lower() for a in argv)


def _secret_envs(container: Mapping[str, Any]) -> tuple[set[str], dict[str, Any]]:
    """(names set from a secretKeyRef, names set to a literal value) of a container's env."""
    from_secret, literal = set(), {}
    for entry in as_list(get(container, "env")) or []:
        name = get(entry, "name")
        if not isinstance(name, str):
            continue
        if get(entry, "valueFrom.secretKeyRef") is not None:
            from_secret.add(name)
        elif get(entry, "valueFrom") is None:
            literal[name] = get(entry, "value", "")
    return from_secret, literal


def _token_args(argv: list[Any]) -> list[tuple[int, str]]:
    """(index, value) of every token argument, ``--X.token=V`` or ``--X.token V``."""
    found = []
    for i, arg in enumerate(argv):
        match = _TOKEN_ARG.match(arg) if isinstance(arg, str) else None
        if match is None:
            continue
        value = match["value"]
        if value is None:
            value = argv[i + 1] if i + 1 < len(argv) and isinstance(argv[i + 1], str) else ""
        found.append((i, value.strip().strip("'\"")))
    return found


def _check_container(path: str, container: Mapping[str, Any]) -> list[str]:
    command = as_list(get(container, "command")) or []
    args = as_list(get(container, "args")) or []
    if is_unknown(command) or is_unknown(args):
        return []
    argv = [*command, *args]
    if not _is_jupyter(argv):
        return []
    from_secret, literal = _secret_envs(container)
    violations = []
    for i, arg in enumerate(argv):
        if isinstance(arg, str) and _XSRF_OFF.match(arg):
            violations.append(
                f"{path}: argument {i} {arg!r} turns Jupyter's XSRF check off: any web page the "
                "user opens could run code in the notebook; remove it"
            )
    tokens = _token_args(argv)
    for i, value in tokens:
        ref = _ENV_REF.match(value)
        if not value:
            violations.append(
                f"{path}: argument {i} sets an empty Jupyter token: that turns authentication "
                f"off and anyone who reaches the port runs code; {_FIX}"
            )
        elif ref is None:
            violations.append(
                f"{path}: argument {i} sets a literal Jupyter token in the manifest; {_FIX} "
                "(or pass it as $(JUPYTER_TOKEN))"
            )
        elif ref["name"] not in from_secret:
            violations.append(
                f"{path}: argument {i} takes the Jupyter token from ${ref['name']}, which no "
                f"secretKeyRef sets; {_FIX}"
            )
    for name in TOKEN_ENVS:
        if name in literal:
            what = "an empty" if not literal[name] else "a literal"
            violations.append(
                f"{path}.env {name}: {what} value; a Jupyter token must not be in the manifest "
                f"(empty turns authentication off); {_FIX}"
            )
    if not tokens and not from_secret.intersection(TOKEN_ENVS) and not violations:
        violations.append(
            f"{path}: a Jupyter server with no token from a Secret (it would print a random one "
            f"to its log, or run open where a config file turns it off); {_FIX}"
        )
    return violations


def check_workload(props: Mapping[str, Any], kind: str) -> list[str]:
    """Every Jupyter container of a Deployment, StatefulSet or Pod is token-authenticated."""
    spec_path = WORKLOAD_PATHS.get(kind)
    if spec_path is None:
        return []
    violations = []
    for key in ("initContainers", "containers"):
        containers = as_list(get(props, f"{spec_path}.{key}"))
        if is_unknown(containers):
            continue
        for i, container in enumerate(containers):
            if isinstance(container, Mapping):
                violations += _check_container(f"{spec_path}.{key}[{i}]", container)
    return violations


def check_service(props: Mapping[str, Any]) -> list[str]:
    """No ``LoadBalancer`` or ``NodePort`` Service in front of a Jupyter server."""
    kind = get(props, "spec.type")
    if kind not in ("LoadBalancer", "NodePort"):
        return []
    selector = get(props, "spec.selector")
    why = (
        "a Jupyter server runs arbitrary code with its pod's credentials: make the Service "
        "ClusterIP and reach it with `raytpu notebook --stack` (kubectl port-forward)"
    )
    if isinstance(selector, Mapping) and selector.get(APP_LABEL[0]) == APP_LABEL[1]:
        return [f"spec.type: {kind!r} exposes the pods {APP_LABEL[0]}={APP_LABEL[1]}; {why}"]
    ports = as_list(get(props, "spec.ports"))
    if is_unknown(ports):
        return []
    for i, port in enumerate(ports):
        for key in ("port", "targetPort"):
            if as_int(get(port, key)) == JUPYTER_PORT:
                return [
                    f"spec.ports[{i}].{key}: {JUPYTER_PORT} (Jupyter) on a {kind} Service; {why}"
                ]
    return []


def _kind(props: Mapping[str, Any]) -> str | None:
    """The object's ``kind``, else recognised by its shape (Pulumi inputs may lack ``kind``)."""
    kind = props.get("kind") if isinstance(props, Mapping) else None
    if isinstance(kind, str):
        return kind
    if get(props, "spec.template.spec") is not None:
        return "Deployment"
    if get(props, "spec.containers") is not None:
        return "Pod"
    if get(props, "spec.ports") is not None:
        return "Service"
    return None


def check_notebook(props: Mapping[str, Any]) -> list[str]:
    """Dispatches on the object's kind: a Service, or a workload (Deployment, StatefulSet, Pod)."""
    kind = _kind(props)
    if kind == "Service":
        return check_service(props)
    return check_workload(props, kind) if kind is not None else []


def applies_to(resource_type: str) -> bool:
    return resource_type in TYPES


__all__ = ["applies_to", "check_notebook", "check_service", "check_workload"]
