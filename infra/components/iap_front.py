"""The public side of an IAP endpoint (:mod:`infra.manifests.iap_endpoint`), declared the same
way for the Ray Dashboard (:mod:`infra.components.dashboard_iap`) and a notebook
(:mod:`infra.components.notebook`): the global static IP, the GCE Ingress on it, and the
``roles/iap.httpsResourceAccessor`` grants for that host only. A helper, not a component: its
resources belong to the caller's component (``parent``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pulumi
import pulumi_gcp as gcp
import pulumi_kubernetes as k8s

from infra.manifests import iap_endpoint
from raytpu.gke_iap import IAP_ACCESSOR_ROLE


@dataclass(frozen=True)
class IapFront:
    address_name: str
    address: gcp.compute.GlobalAddress
    ingress: k8s.networking.v1.Ingress
    members: list[gcp.iap.WebTypeComputeIamMember]


def declare_front(
    name: str,
    ep: iap_endpoint.IapEndpoint,
    *,
    project: str,
    cluster_name: str,
    members: Sequence[str],
    title: str,
    address_description: str,
    after: Sequence[pulumi.Resource],
    parent: pulumi.Resource,
    child: pulumi.ResourceOptions,
) -> IapFront:
    """``after``: what the Ingress waits for besides its address (Service, certificate,
    BackendConfig); ``child``: the Kubernetes options (provider, parent) of the caller."""
    address_name = iap_endpoint.address_name(cluster_name, ep)
    address = gcp.compute.GlobalAddress(
        f"{name}-ip",
        name=address_name,
        project=project,
        description=address_description,
        opts=pulumi.ResourceOptions(parent=parent),
    )
    ingress = iap_endpoint.ingress(ep, address_name)
    declared = k8s.networking.v1.Ingress(
        name,
        metadata=ingress["metadata"],
        spec=ingress["spec"],
        opts=pulumi.ResourceOptions.merge(
            child, pulumi.ResourceOptions(depends_on=[*after, address])
        ),
    )
    condition = iap_endpoint.iam_condition(ep, title)
    grants = [
        gcp.iap.WebTypeComputeIamMember(
            f"{name}-access-{member.replace(':', '-')}",
            project=project,
            role=IAP_ACCESSOR_ROLE,
            member=member,
            condition=gcp.iap.WebTypeComputeIamMemberConditionArgs(**condition),
            opts=pulumi.ResourceOptions(parent=parent),
        )
        for member in members
    ]
    return IapFront(address_name, address, declared, grants)
