"""Cloud NAT for a private GKE cluster: nodes without external IPs reach public registries.

Private nodes (``ray-tpu:cluster.privateNodes``) have no external IP, so without NAT they cannot
pull ``rayproject/ray`` from Docker Hub or ``pip install`` a runtime env. One Cloud Router and
one NAT gateway per region and network; if the network already has a NAT for the region, set
``ray-tpu:cluster.cloudNat: false`` (GCP allows one NAT per subnet range).
"""

from __future__ import annotations

from dataclasses import dataclass

import pulumi
import pulumi_gcp as gcp


@dataclass(frozen=True)
class CloudNatArgs:
    project: str
    region: str
    network: str
    name: str
    """Prefix of the router and NAT names (the cluster name)."""


class CloudNat(pulumi.ComponentResource):
    """A Cloud Router and a NAT gateway for every subnetwork of ``network`` in ``region``."""

    def __init__(
        self, name: str, args: CloudNatArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("ray-tpu:infra:CloudNat", name, None, opts)
        self.router = gcp.compute.Router(
            f"{name}-router",
            name=f"{args.name}-router",
            project=args.project,
            region=args.region,
            network=args.network,
            opts=pulumi.ResourceOptions(parent=self),
        )
        self.nat = gcp.compute.RouterNat(
            f"{name}-nat",
            name=f"{args.name}-nat",
            project=args.project,
            region=args.region,
            router=self.router.name,
            nat_ip_allocate_option="AUTO_ONLY",
            source_subnetwork_ip_ranges_to_nat="ALL_SUBNETWORKS_ALL_IP_RANGES",
            log_config=gcp.compute.RouterNatLogConfigArgs(enable=True, filter="ERRORS_ONLY"),
            opts=pulumi.ResourceOptions(parent=self),
        )
        self.register_outputs({"router": self.router.name, "nat": self.nat.name})
