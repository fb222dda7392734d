"""What ``raytpu check`` reads: Kubernetes YAML, ``pulumi stack export`` and ``pulumi preview
--json``, turned into the resources the policies read, or one :class:`InputError` naming the
file, the document and the field.

Reading (size, encoding, depth, YAML aliases, syntax errors with line and column) is
:mod:`raytpu.inputs`; this module checks the shape of what was read, so that the policies only
ever see mappings where they expect mappings.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from raytpu import inputs
from raytpu.errors import invalid

KUBERAY_GROUP = "ray.io"
VALID_FILES = "Kubernetes YAML, `pulumi stack export` or `pulumi preview --json`"


class InputError(ValueError):
    """A file that is not readable as one of the supported formats."""


def kubernetes_type(obj: Mapping[str, Any]) -> str:
    """Pulumi's type token for a Kubernetes object: ``kubernetes:ray.io/v1:RayCluster``."""
    api_version = str(obj.get("apiVersion", ""))
    group_version = "core/v1" if api_version == "v1" else api_version
    return f"kubernetes:{group_version}:{obj.get('kind')}"


def _name_from_urn(urn: str) -> str:
    return urn.rsplit("::", 1)[-1] if "::" in urn else urn


def _type_name(value: Any) -> str:
    return {dict: "mapping", list: "list", str: "string"}.get(type(value), type(value).__name__)


class _Kind:
    """A value too long or too nested to print, shown by its kind (``a mapping``)."""

    def __init__(self, value: Any) -> None:
        self.text = f"a {_type_name(value)}"

    def __repr__(self) -> str:
        return self.text


def _bad(where: str, field: str, value: Any, valid: str) -> InputError:
    short = isinstance(value, str | int | float | bool | None) and len(repr(value)) <= 60
    return InputError(invalid(f"{where}: {field}", value if short else _Kind(value), valid))


def _check_kind(where: str, kind: Any, api_version: str) -> None:
    """A kind that looks like KubeRay's but is not one of its kinds is an error (a typo)."""
    from policies.resources import RAY_KINDS

    if not isinstance(kind, str) or not kind:
        raise _bad(where, "kind", kind, "a Kubernetes kind such as " + ", ".join(RAY_KINDS))
    if kind in RAY_KINDS:
        return
    group = api_version.split("/", 1)[0] if "/" in api_version else ""
    lowered = {k.lower(): k for k in RAY_KINDS}
    close = difflib.get_close_matches(kind.lower(), list(lowered), n=1, cutoff=0.88)
    if group == KUBERAY_GROUP or close:
        hint = f" (did you mean {lowered[close[0]]}?)" if close else ""
        raise _bad(where, "kind", kind, f"a KubeRay kind: {', '.join(RAY_KINDS)}{hint}")


def _kubernetes_objects(documents: list[Any], path: Path) -> Iterator[Any]:
    from policies.resources import Resource

    for index, document in enumerate(documents):
        if document is None:
            continue
        where = f"{path}: document {index + 1}"
        items: list[Any] = [document]
        if isinstance(document, Mapping) and document.get("kind") == "List":
            listed = document.get("items")
            if listed is None:
                listed = []
            if not isinstance(listed, list):
                raise _bad(where, "items", listed, "a list of Kubernetes objects")
            items = listed
        for position, item in enumerate(items):
            at = where if item is document else f"{where} items[{position}]"
            if not isinstance(item, Mapping) or not item.get("kind") or not item.get("apiVersion"):
                raise InputError(
                    f"{at} is not a Kubernetes object (no apiVersion/kind); valid: {VALID_FILES}"
                )
            api_version = item.get("apiVersion")
            if not isinstance(api_version, str):
                raise _bad(at, "apiVersion", api_version, "a string such as ray.io/v1 or v1")
            _check_kind(at, item.get("kind"), api_version)
            metadata = item.get("metadata")
            if metadata is None:
                metadata = {}
            if not isinstance(metadata, Mapping):
                raise _bad(at, "metadata", metadata, "a mapping with name (and namespace)")
            name = metadata.get("name")
            if name is not None and not isinstance(name, str):
                raise _bad(at, "metadata.name", name, "a string")
            yield Resource(
                type=kubernetes_type(item),
                name=name or f"document-{index + 1}",
                urn=f"{path}#{index + 1}",
                props=item,
                source=f"{path}#{index + 1}",
            )


def _pulumi_states(document: Mapping[str, Any], path: Path) -> Iterator[tuple[str, Any]]:
    """(where, resource state) of a stack export's resources or a preview's steps."""
    if "deployment" in document:
        deployment = document.get("deployment")
        if not isinstance(deployment, Mapping):
            raise _bad(
                str(path),
                "deployment",
                deployment,
                "a mapping with resources (pulumi stack export)",
            )
        entries = deployment.get("resources")
        if entries is None:
            entries = []
        if not isinstance(entries, list):
            raise _bad(str(path), "deployment.resources", entries, "a list of resource states")
        for index, entry in enumerate(entries):
            where = f"deployment.resources[{index}]"
            if not isinstance(entry, Mapping):
                raise _bad(str(path), where, entry, "a resource state (a mapping with type, urn)")
            yield where, entry
        return
    steps = document.get("steps")
    if steps is None:
        steps = []
    if not isinstance(steps, list):
        raise _bad(str(path), "steps", steps, "a list of steps (pulumi preview --json)")
    for index, step in enumerate(steps):
        where = f"steps[{index}]"
        if not isinstance(step, Mapping):
            raise _bad(str(path), where, step, "a step (a mapping with op, newState)")
        state = step.get("newState")
        if state is None:
            continue  # a delete step: nothing will exist to check
        if not isinstance(state, Mapping):
            raise _bad(str(path), f"{where}.newState", state, "a resource state (a mapping)")
        yield f"{where}.newState", state


def _pulumi_resources(document: Mapping[str, Any], path: Path) -> Iterator[Any]:
    from policies.resources import Resource

    for where, state in _pulumi_states(document, path):
        type_ = state.get("type", "")
        if not isinstance(type_, str):
            raise _bad(str(path), f"{where}.type", type_, "a Pulumi type token (a string)")
        if type_ == "pulumi:pulumi:Stack" or type_.startswith("pulumi:providers:"):
            continue
        urn = state.get("urn", "")
        if not isinstance(urn, str):
            raise _bad(str(path), f"{where}.urn", urn, "a Pulumi URN (a string)")
        props = state.get("inputs")
        if props is None:
            props = {}
        if not isinstance(props, Mapping):
            raise _bad(str(path), f"{where}.inputs", props, "a mapping of the resource's inputs")
        if type_.startswith("kubernetes:"):
            kind = type_.rsplit(":", 1)[-1]
            _check_kind(f"{path}: {where}", kind, type_.split(":")[1] if ":" in type_ else "")
            metadata = props.get("metadata")
            if metadata is not None and not isinstance(metadata, Mapping):
                raise _bad(f"{path}: {where}", "inputs.metadata", metadata, "a mapping")
        yield Resource(type=type_, name=_name_from_urn(urn), urn=urn, props=props, source=str(path))


def read_documents(path: Path) -> list[Any]:
    """The documents of one file: JSON (``.json`` or text starting with ``{``) or YAML."""
    try:
        text = inputs.read_text(path)
        if path.suffix == ".json" or text.lstrip().startswith("{"):
            return [inputs.parse_json(text, str(path))]
        return inputs.parse_yaml_documents(text, str(path))
    except inputs.InputError as error:
        raise InputError(str(error)) from None


def read_resources(path: Path) -> list[Any]:
    """Every resource of one file, in the form the policies read. Raises InputError."""
    documents = read_documents(path)
    if len(documents) == 1 and isinstance(documents[0], Mapping):
        document = documents[0]
        if "deployment" in document or "steps" in document:
            return list(_pulumi_resources(document, path))
    resources = list(_kubernetes_objects(documents, path))
    if not resources:
        raise InputError(f"{path}: holds no Kubernetes object or Pulumi resource")
    return resources
