"""The CPU node pool: Ray head pods and the cluster's system pods.

Ray heads select it by GKE's own ``cloud.google.com/gke-nodepool`` label (see
:func:`infra.manifests.kuberay.head_group`), so TPU hosts stay free for Ray workers.
"""

from __future__ import annotations

from dataclasses import dataclass

import pulumi
import pulumi_gcp as gcp

from infra.config.schema import CpuPoolConfig

GCP_SCOPE = "https://www.googleapis.com/auth/cloud-platform"


@dataclass(frozen=True)
class CpuNodePoolArgs:
    project: str
    cluster_name: pulumi.Input[str]
    location: str
    pool: CpuPoolConfig
    service_account: str | None = None


class CpuNodePool(pulumi.ComponentResource):
    """An autoscaled CPU node pool. Outputs: ``name`` (the GKE node pool name)."""

    def __init__(
        self, name: str, args: CpuNodePoolArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("ray-tpu:infra:CpuNodePool", name, None, opts)
        pool = args.pool
        self.node_pool = gcp.container.NodePool(
            name,
            name=pool.name,
            project=args.project,
            cluster=args.cluster_name,
            location=args.location,
            node_locations=list(pool.zones),
            initial_node_count=max(pool.min_nodes, 1),
            autoscaling=gcp.container.NodePoolAutoscalingArgs(
                min_node_count=pool.min_nodes, max_node_count=pool.max_nodes
            ),
            management=gcp.container.NodePoolManagementArgs(auto_repair=True, auto_upgrade=True),
            node_config=gcp.container.NodePoolNodeConfigArgs(
                machine_type=pool.machine_type,
                disk_size_gb=pool.disk_size_gb,
                oauth_scopes=[GCP_SCOPE],
                service_account=args.service_account,
                workload_metadata_config=gcp.container.NodePoolNodeConfigWorkloadMetadataConfigArgs(
                    mode="GKE_METADATA"
                ),
                labels={"ray-tpu/pool": "cpu"},
            ),
            opts=pulumi.ResourceOptions(parent=self),
        )
        self.name = self.node_pool.name
        self.register_outputs({"name": self.name})
