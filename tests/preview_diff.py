"""What ``pulumi preview`` would plan between two runs of the program under mocks.

A model of the engine's decision for each resource, reduced to the rules the deploy tests lean
on: a resource only in the new run is created; one only in the old run is deleted, or forgotten
and left in the cluster when it has ``retain_on_delete``; inputs named in ``ignore_changes``
are not compared once the resource exists; a Kubernetes object whose ``metadata.name`` or
``metadata.namespace`` changes is replaced (pulumi-kubernetes cannot rename an object), any
other change of inputs is an update (a patch).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from infra.offline import DeclaredResource


def _compared(resource: DeclaredResource, ignored: Iterable[str]) -> dict[str, Any]:
    return {k: v for k, v in resource.props.items() if k not in set(ignored)}


def _identity(resource: DeclaredResource) -> tuple[Any, Any]:
    metadata = resource.props.get("metadata") or {}
    return metadata.get("name"), metadata.get("namespace")


def step(old: DeclaredResource | None, new: DeclaredResource | None) -> str:
    """``create``, ``delete``, ``forget`` (dropped from the stack, left running), ``same``,
    ``update`` or ``replace`` (a replaced object with ``retain_on_delete``: its old copy is
    left running beside the new one)."""
    if old is None:
        return "create"
    if new is None:
        return "forget" if old.retain_on_delete else "delete"
    if new.type.startswith("kubernetes:") and _identity(old) != _identity(new):
        return "replace"
    if _compared(old, new.ignore_changes) == _compared(new, new.ignore_changes):
        return "same"
    return "update"


def plan(before: Iterable[DeclaredResource], after: Iterable[DeclaredResource]) -> dict[str, str]:
    """URN -> step, for every custom resource of either run."""
    old = {r.urn: r for r in before if r.custom}
    new = {r.urn: r for r in after if r.custom}
    return {urn: step(old.get(urn), new.get(urn)) for urn in {*old, *new}}
