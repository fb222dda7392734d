"""The GKE cluster that hosts Ray: no default node pool, Ray Operator add-on, Workload Identity.

GKE runs KubeRay (and its TPU webhook) itself through the Ray Operator add-on, so nothing here
installs KubeRay with Helm. Node pools are separate components (:mod:`infra.components.cpu_pool`,
:mod:`infra.components.tpu_slice`).
"""

from __future__ import annotations

from dataclasses import dataclass

import pulumi
import pulumi_gcp as gcp

from infra.config.schema import ClusterConfig, MaintenanceConfig


@dataclass(frozen=True)
class GkeClusterArgs:
    project: str
    cluster: ClusterConfig


class GkeCluster(pulumi.ComponentResource):
    """A standard GKE cluster for Ray on TPU slices.

    Outputs: ``name``, ``location``, ``endpoint`` (IP of the control plane),
    ``ca_certificate`` (base64 PEM) and ``cluster`` (the ``gcp.container.Cluster``).
    """

    def __init__(
        self, name: str, args: GkeClusterArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("ray-tpu:infra:GkeCluster", name, None, opts)
        cfg = args.cluster
        private = None
        if cfg.private_nodes:
            private = gcp.container.ClusterPrivateClusterConfigArgs(
                enable_private_nodes=True,
                # Keep a public endpoint (guarded by masterAuthorizedNetworks) so that
                # `pulumi up` and kubectl can reach the control plane from outside the VPC.
                enable_private_endpoint=False,
                master_ipv4_cidr_block=cfg.master_ipv4_cidr_block,
            )
        authorized = None
        if cfg.master_authorized_networks:
            authorized = gcp.container.ClusterMasterAuthorizedNetworksConfigArgs(
                cidr_blocks=[
                    gcp.container.ClusterMasterAuthorizedNetworksConfigCidrBlockArgs(
                        cidr_block=n.cidr_block, display_name=n.display_name or None
                    )
                    for n in cfg.master_authorized_networks
                ]
            )
        self.cluster = gcp.container.Cluster(
            name,
            name=cfg.name,
            project=args.project,
            location=cfg.location,
            # Node pools are declared separately; GKE still needs one node to create a cluster.
            remove_default_node_pool=True,
            initial_node_count=1,
            min_master_version=cfg.min_master_version,
            release_channel=gcp.container.ClusterReleaseChannelArgs(channel=cfg.release_channel),
            deletion_protection=cfg.deletion_protection,
            network=cfg.network,
            subnetwork=cfg.subnetwork,
            networking_mode="VPC_NATIVE",
            # Dataplane V2 enforces the Ray objects' NetworkPolicies (docs/security.md).
            # It is fixed at create: switching an existing cluster to it replaces the cluster.
            datapath_provider="ADVANCED_DATAPATH",
            ip_allocation_policy=gcp.container.ClusterIpAllocationPolicyArgs(stack_type="IPV4"),
            private_cluster_config=private,
            master_authorized_networks_config=authorized,
            workload_identity_config=gcp.container.ClusterWorkloadIdentityConfigArgs(
                workload_pool=f"{args.project}.svc.id.goog"
            ),
            addons_config=gcp.container.ClusterAddonsConfigArgs(
                # A list in pulumi-gcp 10.x (Terraform's block is singular).
                ray_operator_configs=[
                    gcp.container.ClusterAddonsConfigRayOperatorConfigArgs(
                        enabled=True,
                        ray_cluster_logging_config=gcp.container.ClusterAddonsConfigRayOperatorConfigRayClusterLoggingConfigArgs(
                            enabled=True
                        ),
                        ray_cluster_monitoring_config=gcp.container.ClusterAddonsConfigRayOperatorConfigRayClusterMonitoringConfigArgs(
                            enabled=True
                        ),
                    )
                ],
                # Off: checkpoints go to gs:// through native clients, no pod mounts a bucket
                # (docs/workloads/training.md, "Checkpoint storage"). Turn it on for FUSE data mounts.
                gcs_fuse_csi_driver_config=gcp.container.ClusterAddonsConfigGcsFuseCsiDriverConfigArgs(
                    enabled=False
                ),
            ),
            maintenance_policy=_maintenance_policy(cfg.maintenance),
            resource_labels={"managed-by": "pulumi", "part-of": "ray-tpu"},
            opts=pulumi.ResourceOptions(parent=self),
        )
        self.name = self.cluster.name
        self.location = self.cluster.location
        self.endpoint = self.cluster.endpoint
        self.ca_certificate = self.cluster.master_auth.apply(
            lambda auth: auth.cluster_ca_certificate if auth else None
        )
        self.register_outputs(
            {
                "name": self.name,
                "location": self.location,
                "endpoint": self.endpoint,
                "caCertificate": self.ca_certificate,
            }
        )


def _maintenance_policy(
    policy: MaintenanceConfig | None,
) -> gcp.container.ClusterMaintenancePolicyArgs | None:
    """The stack's window and exclusions (infra/config/maintenance.py has the defaults)."""
    if policy is None:
        return None
    window = policy.window
    return gcp.container.ClusterMaintenancePolicyArgs(
        recurring_window=gcp.container.ClusterMaintenancePolicyRecurringWindowArgs(
            start_time=window.start, end_time=window.end, recurrence=window.recurrence
        ),
        maintenance_exclusions=[
            gcp.container.ClusterMaintenancePolicyMaintenanceExclusionArgs(
                exclusion_name=e.name,
                start_time=e.start,
                end_time=e.end,
                exclusion_options=gcp.container.ClusterMaintenancePolicyMaintenanceExclusionExclusionOptionsArgs(
                    scope=e.scope,
                    end_time_behavior="UNTIL_END_OF_SUPPORT" if e.end is None else None,
                ),
            )
            for e in policy.exclusions
        ]
        or None,
    )
