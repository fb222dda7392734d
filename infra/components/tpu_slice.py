"""TPU slices as GKE node pools: one node pool per slice, ``count`` pools per slice config.

The GKE rules (see ``tpu-on-gke-facts.md``) this component follows:

- single-host slice: no ``placement_policy`` at all (the API rejects ``tpu_topology`` there);
- multi-host slice: ``placement_policy {type: COMPACT, tpu_topology}``, exactly one zone in
  ``node_locations``;
- node count, one form per pool, so that nothing fights the cluster autoscaler and no refresh
  shows a diff (see docs/infra.md, "Node count and autoscaling"):
  a fixed pool sets ``node_count`` == hosts and no ``autoscaling``; a scale-to-zero pool (and
  every flex-start pool) sets ``autoscaling`` (per-zone ``min_node_count`` 0, ``max_node_count``
  == hosts) with ``initial_node_count`` (hosts, 0 for flex-start) and never ``node_count``
  (pulumi-gcp: "should not be used alongside autoscaling"), ignoring later changes of
  ``initialNodeCount`` (a creation-time value GKE cannot change in place);
- tpu7x multi-host: a ``gcp.compute.ResourcePolicy`` workload policy (HIGH_THROUGHPUT,
  ``accelerator_topology``) named by ``placement_policy.policy_name`` together with
  ``tpu_topology`` and an empty ``type``: the form GKE stores (COMPACT would diff against it);
- provisioning: ``spot``, a specific reservation, or flex-start (``node_config.flex_start``,
  starting empty, no reservation).

GKE itself labels each TPU node with ``cloud.google.com/gke-tpu-accelerator`` and
``cloud.google.com/gke-tpu-topology`` and taints it ``google.com/tpu=present:NoSchedule``; the
taint is not repeated here (GKE adds it to every TPU node pool), Ray worker pods tolerate it
(:data:`infra.manifests.kuberay.TPU_TOLERATION`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_gcp as gcp

from infra.config.schema import SliceConfig
from raytpu.catalog import WORKLOAD_POLICY_TYPE

GCP_SCOPE = "https://www.googleapis.com/auth/cloud-platform"
RESERVATION_KEY = "compute.googleapis.com/reservation-name"
SLICE_LABEL = "ray-tpu/slice"
SLICE_INDEX_LABEL = "ray-tpu/slice-index"


@dataclass(frozen=True)
class TpuSliceArgs:
    project: str
    region: str
    cluster_name: pulumi.Input[str]
    location: str
    """The cluster's location (region or zone)."""
    slice: SliceConfig
    service_account: str | None = None


def workload_policy_name(cluster: str, pool: str) -> str:
    """Resource policy names are at most 63 characters."""
    base = f"{cluster}-{pool}"[:60].rstrip("-")
    return f"{base}-wp"


def node_count_args(cfg: SliceConfig) -> dict[str, Any]:
    """The node count of one slice's pool: ``node_count`` for a fixed pool, ``autoscaling`` plus
    ``initial_node_count`` for a scale-to-zero one (flex-start starts empty); never both counts."""
    hosts = cfg.shape.hosts
    if not cfg.scale_to_zero:
        return {"node_count": hosts}
    return {
        "initial_node_count": 0 if cfg.flex_start else hosts,
        "autoscaling": gcp.container.NodePoolAutoscalingArgs(
            min_node_count=0, max_node_count=hosts
        ),
    }


class TpuSlice(pulumi.ComponentResource):
    """``slice.count`` identical TPU slices, one GKE node pool each.

    Outputs: ``node_pool_names`` (the GKE names, ``<slice>-<index>``) and ``node_pools``.
    """

    def __init__(
        self, name: str, args: TpuSliceArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("ray-tpu:infra:TpuSlice", name, None, opts)
        cfg = args.slice
        shape = cfg.shape
        self.node_pools: list[gcp.container.NodePool] = []
        self.workload_policies: list[gcp.compute.ResourcePolicy] = []
        for index, pool_name in enumerate(cfg.node_pool_names()):
            placement = None
            if shape.uses_workload_policy:
                policy = gcp.compute.ResourcePolicy(
                    f"{name}-{index}-workload-policy",
                    name=pulumi.Output.from_input(args.cluster_name).apply(
                        lambda cluster, p=pool_name: workload_policy_name(cluster, p)
                    ),
                    project=args.project,
                    region=args.region,
                    workload_policy=gcp.compute.ResourcePolicyWorkloadPolicyArgs(
                        type=WORKLOAD_POLICY_TYPE, accelerator_topology=shape.topology
                    ),
                    opts=pulumi.ResourceOptions(parent=self),
                )
                self.workload_policies.append(policy)
                # What GKE stores for a workload-policy pool: policyName and tpuTopology, no
                # type. pulumi-gcp requires the key; "" is how it says "no type" (sent as absent,
                # read back as ""), so refreshes agree with GKE instead of replacing the pool.
                placement = gcp.container.NodePoolPlacementPolicyArgs(
                    type="", policy_name=policy.name, tpu_topology=shape.topology
                )
            elif shape.multi_host:
                placement = gcp.container.NodePoolPlacementPolicyArgs(
                    type="COMPACT", tpu_topology=shape.topology
                )
            pool = gcp.container.NodePool(
                f"{name}-{index}",
                name=pool_name,
                project=args.project,
                cluster=args.cluster_name,
                location=args.location,
                node_locations=[cfg.zone],
                **node_count_args(cfg),
                placement_policy=placement,
                # GKE refuses auto-repair on a queued-provisioning pool: its nodes live as long
                # as the ProvisioningRequest that brought them.
                management=gcp.container.NodePoolManagementArgs(
                    auto_repair=not cfg.queued, auto_upgrade=True
                ),
                queued_provisioning=(
                    gcp.container.NodePoolQueuedProvisioningArgs(enabled=True)
                    if cfg.queued
                    else None
                ),
                node_config=self._node_config(args, index),
                opts=pulumi.ResourceOptions(
                    parent=self,
                    # initial_node_count only matters at creation; GKE cannot change it in place.
                    ignore_changes=["initialNodeCount"] if cfg.scale_to_zero else None,
                ),
            )
            self.node_pools.append(pool)
        self.node_pool_names = pulumi.Output.all(*(p.name for p in self.node_pools))
        self.register_outputs({"nodePoolNames": self.node_pool_names})

    @staticmethod
    def _node_config(args: TpuSliceArgs, index: int) -> gcp.container.NodePoolNodeConfigArgs:
        cfg = args.slice
        reservation = None
        if cfg.provisioning == "reservation":
            reservation = gcp.container.NodePoolNodeConfigReservationAffinityArgs(
                consume_reservation_type="SPECIFIC_RESERVATION",
                key=RESERVATION_KEY,
                values=[cfg.reservation],
            )
        elif cfg.flex_start:
            reservation = gcp.container.NodePoolNodeConfigReservationAffinityArgs(
                consume_reservation_type="NO_RESERVATION"
            )
        return gcp.container.NodePoolNodeConfigArgs(
            machine_type=cfg.shape.machine_type,
            spot=True if cfg.provisioning == "spot" else None,
            flex_start=True if cfg.flex_start else None,
            reservation_affinity=reservation,
            oauth_scopes=[GCP_SCOPE],
            service_account=args.service_account,
            workload_metadata_config=gcp.container.NodePoolNodeConfigWorkloadMetadataConfigArgs(
                mode="GKE_METADATA"
            ),
            labels={SLICE_LABEL: cfg.name, SLICE_INDEX_LABEL: str(index)},
        )
