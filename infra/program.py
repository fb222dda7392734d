"""The Pulumi program: ``declare(config)`` wires the components and exports the stack outputs.

``__main__.py`` calls it with the stack's configuration in a real ``pulumi up``;
:mod:`infra.offline` calls it under Pulumi mocks.

Stack outputs (the contract with ``raytpu submit``): ``clusterName``, ``clusterEndpoint``,
``kubeconfig`` (secret), ``slices``, one output per KubeRay kind (``rayClusters``,
``rayServices``, ``rayJobs``: :data:`infra.manifests.ray_kinds.RAY_KINDS`), ``checkpointBucket`` (the
bucket training runs write to: ``gs://BUCKET/<run>``), ``rayServiceAccount`` (the Kubernetes
ServiceAccount of every Ray pod), ``imageRepository`` and ``workerImage`` (where the worker image
is pushed, and the image the Ray objects run); with ``ray-tpu:security.dashboardIap``,
``dashboardIap`` (``url``, ``host``, ``address``: where the host's DNS A record points).
"""

from __future__ import annotations

from typing import Any

import pulumi

from infra.components.checkpoint_storage import CheckpointStorage, CheckpointStorageArgs
from infra.components.cloud_nat import CloudNat, CloudNatArgs
from infra.components.cpu_pool import CpuNodePool, CpuNodePoolArgs
from infra.components.dashboard_iap import DashboardIap, DashboardIapArgs
from infra.components.gke_cluster import GkeCluster, GkeClusterArgs
from infra.components.image_registry import ImageRegistry, ImageRegistryArgs
from infra.components.k8s_provider import KubernetesAccess, KubernetesAccessArgs
from infra.components.kueue import Kueue, KueueArgs
from infra.components.monitoring import Monitoring, MonitoringArgs
from infra.components.ray_object import RayObject, RayObjectArgs
from infra.components.tpu_slice import TpuSlice, TpuSliceArgs
from infra.config.schema import StackConfig
from infra.config.teams import team_of
from infra.manifests.ray_kinds import RAY_KINDS


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
    assert config.storage is not None and config.image is not None  # set by the parser
    registry = ImageRegistry(
        "image-registry",
        ImageRegistryArgs(
            project=config.project,
            region=config.region,
            repository=config.image.repository,
            node_service_account=cluster_cfg.node_service_account,
        ),
    )
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
    storage = CheckpointStorage(
        "checkpoints",
        CheckpointStorageArgs(
            project=config.project,
            storage=config.storage,
            provider=access.provider,
            namespaces=config.namespaces,
            namespace_resources=namespaces,
            cluster=gke.cluster,
        ),
    )

    def needs(namespace: str) -> list[pulumi.Resource]:
        """A Ray object waits for its namespace and its pods' ServiceAccount (and its grant)."""
        found: list[pulumi.Resource] = [namespaces[namespace]] if namespace in namespaces else []
        return [*found, storage.service_accounts[namespace], storage.members[namespace]]

    # Teams share the slices through Kueue; their Ray objects wait for their queues.
    kueue = None
    if config.teams:
        kueue = Kueue(
            "kueue",
            KueueArgs(stack=config, provider=access.provider, depends_on=list(namespaces.values())),
        )

    def queued(obj: Any) -> list[pulumi.Resource]:
        return [kueue] if kueue is not None and team_of(config.teams, obj) else []

    ray_objects = {
        kind: [
            RayObject(
                f"{kind.resource_prefix}-{obj.name}",
                RayObjectArgs(
                    kind=kind,
                    stack=config,
                    config=obj,
                    provider=access.provider,
                    stack_name=pulumi.get_stack(),
                    depends_on=[*needs(obj.namespace), *queued(obj)],
                ),
            )
            for obj in kind.objects(config)
        ]
        for kind in RAY_KINDS
    }

    iap = config.security.dashboard_iap
    if iap is not None:  # the Ray Dashboard of one object behind IAP (docs/security.md)
        (target,) = [
            o
            for k, objs in ray_objects.items()
            if k.kind == iap.kind
            for o in objs
            if o.name == iap.name
        ]
        dashboard = DashboardIap(
            f"dashboard-iap-{iap.name}",
            DashboardIapArgs(
                project=config.project,
                cluster_name=cluster_cfg.name,
                iap=iap,
                credential=target.credential,
                provider=access.provider,
                depends_on=[target],
            ),
        )
        pulumi.export("dashboardIap", dashboard.outputs)

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
    pulumi.export("checkpointBucket", storage.bucket_name)
    pulumi.export("rayServiceAccount", config.storage.service_account)
    pulumi.export("imageRepository", registry.url)
    pulumi.export("workerImage", config.ray_image)
    for kind, declared in ray_objects.items():
        pulumi.export(kind.config_key, {obj.name: obj.outputs for obj in declared})
