"""Declare a custom resource (a plain manifest: KubeRay, managed Prometheus) in Pulumi."""

from __future__ import annotations

from typing import Any

import pulumi
import pulumi_kubernetes as k8s


def declare(
    name: str, manifest: dict[str, Any], opts: pulumi.ResourceOptions
) -> k8s.apiextensions.CustomResource:
    """``manifest`` (``apiVersion``, ``kind``, ``metadata``, ``spec``) as a ``CustomResource``."""
    return k8s.apiextensions.CustomResource(
        name,
        api_version=manifest["apiVersion"],
        kind=manifest["kind"],
        metadata=manifest["metadata"],
        spec=manifest["spec"],
        opts=opts,
    )
