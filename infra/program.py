"""The Pulumi program: ``declare(config)`` wires the components and exports the stack outputs.

``__main__.py`` calls it with the stack's configuration in a real ``pulumi up``;
:mod:`infra.offline` calls it under Pulumi mocks.

Stack outputs (the contract with ``raytpu submit``): ``clusterName``, ``clusterEndpoint``,
``kubeconfig`` (secret), ``slices``, one output per KubeRay kind (``rayClusters``,
``rayServices``, ``rayJobs``: :data:`infra.manifests.ray_kinds.RAY_KINDS`), ``checkpointBucket`` (the
bucket training runs write to: ``gs://BUCKET/<run>``), ``rayServiceAccount`` (the Kubernetes
ServiceAccount of every Ray pod), ``imageRepository`` and ``workerImage`` (where the worker image
is pushed, and the image the Ray objects run); with ``ray-tpu:security.dashboardIap``,
``dashboardIap`` (``url``, ``host``, ``address``: where the host's DNS A record points); with
``ray-tpu:notebooks``, ``notebooks`` (name -> namespace, service, port, rayCluster, tokenSecret).
"""

from __future__ import annotations

from dataclasses import dataclass
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
from infra.components.notebook import Notebook, NotebookArgs
from infra.components.ray_object import RayObject, RayObjectArgs
from infra.components.tpu_slice import TpuSlice, TpuSliceArgs
from infra.config.schema import StackConfig
from infra.config.teams import team_of
from infra.manifests.ray_kinds import RAY_KINDS, RayKind


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


@dataclass(frozen=True)
class _Nodes:
    """The cluster and what its pods run on. Nothing waits on every TPU pool: a pool that cannot
    be created (a stockout) holds back only the Ray objects on its slice."""

    gke: GkeCluster
    cpu: list[pulumi.Resource]
    """What every pod needs before it starts: the CPU pool (Ray heads, controllers) and, on
    private nodes, NAT."""
    slices: dict[str, TpuSlice]
    """Slice name -> its node pools, which only the Ray objects on that slice wait for."""


def declare(config: StackConfig) -> None:
    """Declare the whole stack for ``config`` (already validated) and export its outputs."""
    assert config.storage is not None and config.image is not None  # set by the parser
    registry = ImageRegistry(
        "image-registry",
        ImageRegistryArgs(
            project=config.project,
            region=config.region,
            repository=config.image.repository,
            node_service_account=config.cluster.node_service_account,
        ),
    )
    nodes = _nodes(config)
    access = KubernetesAccess(
        "k8s",
        KubernetesAccessArgs(
            project=config.project,
            location=config.cluster.location,
            cluster_name=nodes.gke.name,
            endpoint=nodes.gke.endpoint,
            ca_certificate=nodes.gke.ca_certificate,
            namespaces=config.namespaces,
        ),
    )
    storage = CheckpointStorage(
        "checkpoints",
        CheckpointStorageArgs(
            project=config.project,
            storage=config.storage,
            provider=access.provider,
            namespaces=config.namespaces,
            namespace_resources=access.namespaces,
            cluster=nodes.gke.cluster,
        ),
    )
    ray_objects = _ray_objects(config, nodes, access, storage)
    if config.security.dashboard_iap is not None:
        pulumi.export("dashboardIap", _dashboard_iap(config, access, ray_objects).outputs)
    if config.notebooks is not None:
        pulumi.export("notebooks", _notebooks(config, access, ray_objects))
    Monitoring(
        "monitoring",
        MonitoringArgs(
            project=config.project,
            stack=pulumi.get_stack(),
            namespaces=config.namespaces,
            provider=access.provider,
            depends_on=list(access.namespaces.values()),
        ),
    )
    pulumi.export("clusterName", nodes.gke.name)
    pulumi.export("clusterEndpoint", nodes.gke.endpoint)
    pulumi.export("kubeconfig", access.kubeconfig)
    pulumi.export("slices", slice_summary(config))
    pulumi.export("checkpointBucket", storage.bucket_name)
    pulumi.export("rayServiceAccount", config.storage.service_account)
    pulumi.export("imageRepository", registry.url)
    pulumi.export("workerImage", config.ray_image)
    for kind, declared in ray_objects.items():
        pulumi.export(kind.config_key, {obj.name: obj.outputs for obj in declared})


def _nodes(config: StackConfig) -> _Nodes:
    """The GKE cluster, Cloud NAT where asked, the CPU pool and one TpuSlice per slice."""
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
    slices = {
        s.name: TpuSlice(
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
    }
    return _Nodes(gke, [cpu, *([nat] if nat is not None else [])], slices)


def _ray_objects(
    config: StackConfig, nodes: _Nodes, access: KubernetesAccess, storage: CheckpointStorage
) -> dict[RayKind, list[RayObject]]:
    """One RayObject per declared RayCluster, RayService and RayJob. Each waits for the CPU
    pool and its own slice's node pools (no other slice's), its namespace, its pods'
    ServiceAccount and its grant, and a team's for its Kueue queues."""
    namespaces = access.namespaces
    kueue = None
    if config.teams:
        kueue = Kueue(
            "kueue",
            KueueArgs(
                stack=config,
                provider=access.provider,
                nodes=nodes.cpu,
                depends_on=list(namespaces.values()),
            ),
        )

    def needs(obj: Any) -> list[pulumi.Resource]:
        found: list[pulumi.Resource] = (
            [namespaces[obj.namespace]] if obj.namespace in namespaces else []
        )
        found += [storage.service_accounts[obj.namespace], storage.members[obj.namespace]]
        return [*found, kueue] if kueue is not None and team_of(config.teams, obj) else found

    return {
        kind: [
            RayObject(
                f"{kind.resource_prefix}-{obj.name}",
                RayObjectArgs(
                    kind=kind,
                    stack=config,
                    config=obj,
                    provider=access.provider,
                    stack_name=pulumi.get_stack(),
                    depends_on=needs(obj),
                    nodes=[*nodes.cpu, nodes.slices[obj.slice]],
                ),
            )
            for obj in kind.objects(config)
        ]
        for kind in RAY_KINDS
    }


def _dashboard_iap(
    config: StackConfig, access: KubernetesAccess, ray_objects: dict[RayKind, list[RayObject]]
) -> DashboardIap:
    """The Ray Dashboard of one object behind IAP (docs/security.md)."""
    iap = config.security.dashboard_iap
    assert iap is not None
    (target,) = [
        o
        for k, objs in ray_objects.items()
        if k.kind == iap.kind
        for o in objs
        if o.name == iap.name
    ]
    return DashboardIap(
        f"dashboard-iap-{iap.name}",
        DashboardIapArgs(
            project=config.project,
            cluster_name=config.cluster.name,
            iap=iap,
            credential=target.credential,
            provider=access.provider,
            depends_on=[target],
        ),
    )


def _notebooks(
    config: StackConfig, access: KubernetesAccess, ray_objects: dict[RayKind, list[RayObject]]
) -> dict[str, dict[str, Any]]:
    """One JupyterLab per team or for the stack, next to its RayCluster (docs/notebooks.md)."""
    notebooks = config.notebooks
    assert notebooks is not None
    clusters = {
        o.name: o for k, objs in ray_objects.items() if k.kind == "RayCluster" for o in objs
    }
    found = {}
    for nb in notebooks.notebooks:
        target = clusters[nb.ray_cluster]
        namespace = access.namespaces.get(nb.namespace)
        declared = Notebook(
            f"notebook-{nb.name}",
            NotebookArgs(
                notebook=nb,
                credential=target.credential,
                image=notebooks.image or config.ray_image,
                cpu=notebooks.cpu,
                memory=notebooks.memory,
                provider=access.provider,
                depends_on=[*([namespace] if namespace is not None else []), target],
                iap=notebooks.iap,
                project=config.project,
                cluster_name=config.cluster.name,
            ),
        )
        found[nb.name] = declared.outputs
    return found
