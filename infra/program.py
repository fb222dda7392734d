"""The Pulumi program: ``declare(config)`` wires the components and exports the stack outputs.

``__main__.py`` calls it with the stack's configuration in a real ``pulumi up``;
:mod:`infra.offline` calls it under Pulumi mocks.

Stack outputs (the contract with ``raytpu submit``): ``clusterName``, ``clusterEndpoint``,
``kubeconfig`` (secret), ``slices``, ``rayClusters``, ``rayServices``.
"""

from __future__ import annotations

from typing import Any

import pulumi

from infra.cloud_nat import CloudNat, CloudNatArgs
from infra.config import StackConfig
from infra.cpu_pool import CpuNodePool, CpuNodePoolArgs
from infra.gke_cluster import GkeCluster, GkeClusterArgs
from infra.k8s_provider import KubernetesAccess, KubernetesAccessArgs
from infra.monitoring import Monitoring, MonitoringArgs
from infra.ray_cluster import RayCluster, RayClusterArgs
from infra.ray_job import RayJob, RayJobArgs
from infra.ray_service import RayService, RayServiceArgs
from infra.tpu_slice import TpuSlice, TpuSliceArgs
from raytpu.ray_names import DASHBOARD_PORT


def slice_summary(config: StackConfig) -> dict[str, dict[str, Any]]:
    """The ``slices`` stack output: shape summary and node pool names per slice."""
    return {
        s.name: {
            "generation": s.shape.generation.name,
            "topology": s.shape.topology,
            "machineType": s.shape.machine_type,
            "chipsPerHost": s.shape.chips_per_host,
            "hosts": s.shape.hosts,
            "chips": s.shape.chips,
            "count": s.count,
            "nodePools": list(s.node_pool_names()),
        }
        for s in config.slices
    }


def declare(config: StackConfig) -> None:
    """Declare the whole stack for ``config`` (already validated) and export its outputs."""
    cluster_cfg = config.cluster
    gke = GkeCluster("gke", GkeClusterArgs(project=config.project, cluster=cluster_cfg))
    nat = None
    if cluster_cfg.cloud_nat:
        nat = CloudNat(
            "nat",
            CloudNatArgs(
                project=config.project,
                region=config.region,
                network=cluster_cfg.network,
                name=cluster_cfg.name,
            ),
        )
    cpu = CpuNodePool(
        "cpu-pool",
        CpuNodePoolArgs(
            project=config.project,
            cluster_name=gke.name,
            location=cluster_cfg.location,
            pool=cluster_cfg.cpu_pool,
            service_account=cluster_cfg.node_service_account,
        ),
    )
    slices = [
        TpuSlice(
            f"slice-{s.name}",
            TpuSliceArgs(
                project=config.project,
                region=config.region,
                cluster_name=gke.name,
                location=cluster_cfg.location,
                slice=s,
                service_account=cluster_cfg.node_service_account,
            ),
        )
        for s in config.slices
    ]
    access = KubernetesAccess(
        "k8s",
        KubernetesAccessArgs(
            project=config.project,
            location=cluster_cfg.location,
            cluster_name=gke.name,
            endpoint=gke.endpoint,
            ca_certificate=gke.ca_certificate,
            # Pods need nodes (and, on private nodes, NAT to pull images) before they start.
            wait_for=[cpu, *slices, *([nat] if nat is not None else [])],
            namespaces=config.namespaces,
        ),
    )
    namespaces = access.namespaces

    def needs(namespace: str) -> list[pulumi.Resource]:
        return [namespaces[namespace]] if namespace in namespaces else []

    ray_clusters = {
        c.name: RayCluster(
            f"raycluster-{c.name}",
            RayClusterArgs(
                stack=config, cluster=c, provider=access.provider, depends_on=needs(c.namespace)
            ),
        )
        for c in config.ray_clusters
    }
    ray_services = {
        s.name: RayService(
            f"rayservice-{s.name}",
            RayServiceArgs(
                stack=config, service=s, provider=access.provider, depends_on=needs(s.namespace)
            ),
        )
        for s in config.ray_services
    }
    ray_jobs = {
        j.name: RayJob(
            f"rayjob-{j.name}",
            RayJobArgs(
                stack=config,
                job=j,
                provider=access.provider,
                stack_name=pulumi.get_stack(),
                depends_on=needs(j.namespace),
            ),
        )
        for j in config.ray_jobs
    }

    Monitoring(
        "monitoring",
        MonitoringArgs(
            project=config.project,
            stack=pulumi.get_stack(),
            namespaces=config.namespaces,
            provider=access.provider,
            depends_on=list(namespaces.values()),
        ),
    )

    pulumi.export("clusterName", gke.name)
    pulumi.export("clusterEndpoint", gke.endpoint)
    pulumi.export("kubeconfig", access.kubeconfig)
    pulumi.export("slices", slice_summary(config))
    pulumi.export(
        "rayClusters",
        {
            name: {
                "namespace": rc.namespace,
                "slice": config_obj.slice,
                "headService": rc.head_service,
                "dashboardPort": DASHBOARD_PORT,
            }
            for (name, rc), config_obj in zip(
                ray_clusters.items(), config.ray_clusters, strict=True
            )
        },
    )
    pulumi.export(
        "rayServices",
        {
            name: {
                "namespace": rs.namespace,
                "slice": config_obj.slice,
                "headService": rs.head_service,
                "serveService": rs.serve_service,
                "dashboardPort": DASHBOARD_PORT,
            }
            for (name, rs), config_obj in zip(
                ray_services.items(), config.ray_services, strict=True
            )
        },
    )
    pulumi.export(
        "rayJobs",
        {
            name: {"namespace": job.namespace, "slice": cfg.slice, "entrypoint": job.entrypoint}
            for (name, job), cfg in zip(ray_jobs.items(), config.ray_jobs, strict=True)
        },
    )
