"""Declare a custom resource (a plain manifest: KubeRay, managed Prometheus, Kueue) in Pulumi."""

from __future__ import annotations

from typing import Any

import pulumi
import pulumi_kubernetes as k8s

_OBJECT_KEYS = ("apiVersion", "kind", "metadata")


def declare(name: str, manifest: dict[str, Any], opts: pulumi.ResourceOptions) -> pulumi.Resource:
    """``manifest`` (``apiVersion``, ``kind``, ``metadata``, ``spec``) as a ``CustomResource``.

    A kind without a ``spec`` (Kueue's WorkloadPriorityClass: ``value``, ``description``) is
    registered with its own top-level fields, under the same ``kubernetes:<apiVersion>:<kind>``
    type the Kubernetes provider serves every custom resource by (pulumi_kubernetes' Python
    ``CustomResource`` takes ``spec`` only; its TypeScript one calls these ``otherFields``).
    """
    if "spec" in manifest:
        return k8s.apiextensions.CustomResource(
            name,
            api_version=manifest["apiVersion"],
            kind=manifest["kind"],
            metadata=manifest["metadata"],
            spec=manifest["spec"],
            opts=opts,
        )
    body = {k: v for k, v in manifest.items() if k not in _OBJECT_KEYS}
    return pulumi.CustomResource(
        f"kubernetes:{manifest['apiVersion']}:{manifest['kind']}",
        name,
        {k: manifest[k] for k in _OBJECT_KEYS} | body,
        opts=pulumi.ResourceOptions.merge(
            opts, pulumi.ResourceOptions(version=k8s._utilities.get_version())
        ),
    )
