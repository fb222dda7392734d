"""The stack config schema: frozen dataclasses, one per section of ``Pulumi.<stack>.yaml``,
and :class:`ConfigError`. What the rest of the program reads; built only by the parsers."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import Any

from infra.config.notebook_schema import NotebooksConfig
from infra.config.team_schema import PriorityClassConfig, TeamConfig
from raytpu.catalog import SliceShape
from raytpu.errors import invalid

NAMESPACE = "ray-tpu"
"""Pulumi config namespace of this project (the project name in ``Pulumi.yaml``)."""
PROVISIONING = ("on-demand", "spot", "reservation", "flex-start", "queued")
FLEX_START = ("flex-start", "queued")
"""Provisioning through Dynamic Workload Scheduler (flex-start VMs); ``queued``: a Kueue
ProvisioningRequest obtains the whole slice at once (queued provisioning)."""
RELEASE_CHANNELS = ("RAPID", "REGULAR", "STABLE", "EXTENDED")
MAX_SLICE_COUNT = 64


class ConfigError(ValueError):
    """Invalid stack configuration. ``errors`` lists every problem found, one per line:
    :func:`raytpu.errors.invalid` of the key path, the bad value and the valid ones."""

    def __init__(self, errors: Iterable[str]) -> None:
        self.errors = list(errors)
        count = len(self.errors)
        header = "" if count == 1 else f"{count} problems in the stack configuration:\n"
        super().__init__(header + "\n".join(self.errors))


@dataclass(frozen=True)
class CpuPoolConfig:
    """The CPU node pool: Ray head pods and system pods (TPU hosts stay for Ray workers)."""

    name: str
    machine_type: str
    min_nodes: int
    """Per zone."""
    max_nodes: int
    """Per zone."""
    disk_size_gb: int
    zones: tuple[str, ...]
    """Zones of the pool (default: the zones of the slices)."""


@dataclass(frozen=True)
class AuthorizedNetwork:
    cidr_block: str
    display_name: str


@dataclass(frozen=True)
class MaintenanceWindow:
    """When GKE may upgrade the cluster: a recurring window (``recurring_window``)."""

    start: str
    """RFC 3339 UTC, e.g. ``2026-01-03T00:00:00Z``: the first window's start."""
    end: str
    recurrence: str
    """An RFC 5545 RRULE: ``FREQ=DAILY`` or ``FREQ=WEEKLY;BYDAY=SA,SU``."""


@dataclass(frozen=True)
class MaintenanceExclusion:
    """A span in which GKE does not upgrade what ``scope`` names (``maintenance_exclusions``)."""

    name: str
    start: str
    end: str | None
    """``None``: until the end of support of the cluster's minor version."""
    scope: str
    """``NO_UPGRADES``, ``NO_MINOR_UPGRADES`` or ``NO_MINOR_OR_NODE_UPGRADES``."""


@dataclass(frozen=True)
class MaintenanceConfig:
    """The cluster's maintenance policy: one recurring window and its exclusions."""

    window: MaintenanceWindow
    exclusions: tuple[MaintenanceExclusion, ...]


@dataclass(frozen=True)
class ClusterConfig:
    """The GKE cluster."""

    name: str
    location: str
    """A region (regional control plane) or a zone of ``gcp:region``."""
    release_channel: str
    min_master_version: str
    private_nodes: bool
    master_ipv4_cidr_block: str
    master_authorized_networks: tuple[AuthorizedNetwork, ...]
    deletion_protection: bool
    network: str
    subnetwork: str
    node_service_account: str | None
    cloud_nat: bool
    """A Cloud Router + NAT so private nodes can pull public images (default: privateNodes)."""
    cpu_pool: CpuPoolConfig
    maintenance: MaintenanceConfig | None = None
    """``None`` only for configs built by hand; the parser always sets it."""


@dataclass(frozen=True)
class SliceConfig:
    """``count`` identical TPU slices of one shape, one GKE node pool each."""

    name: str
    shape: SliceShape
    zone: str
    count: int
    provisioning: str
    """One of :data:`PROVISIONING`."""
    reservation: str | None
    """Reservation name (or ``projects/P/reservations/R``) when provisioning is ``reservation``."""
    scale_to_zero: bool = False
    """Whole-slice autoscaling between 0 and ``hosts`` nodes (else fixed at ``hosts``)."""

    @property
    def flex_start(self) -> bool:
        """Its VMs come from Dynamic Workload Scheduler (``flex-start`` or ``queued``)."""
        return self.provisioning in FLEX_START

    @property
    def queued(self) -> bool:
        """Queued provisioning: the pool grows only through a Kueue ProvisioningRequest."""
        return self.provisioning == "queued"

    def node_pool_names(self) -> tuple[str, ...]:
        """One GKE node pool per slice: ``<name>-0``, ``<name>-1``, ..."""
        return tuple(f"{self.name}-{index}" for index in range(self.count))


@dataclass(frozen=True)
class WorkerResources:
    """CPU and memory of one Ray pod (Kubernetes quantities); TPU chips come from the shape."""

    cpu: str
    memory: str


@dataclass(frozen=True)
class RayClusterConfig:
    """A long-lived KubeRay RayCluster with one TPU worker group on ``slice``."""

    name: str
    slice: str
    """A :class:`SliceConfig` name."""
    replicas: int
    """Slices the worker group starts with (each replica is one whole slice)."""
    min_replicas: int
    max_replicas: int
    namespace: str
    image: str | None
    """Overrides ``ray-tpu:rayImage`` for this object."""
    head: WorkerResources
    worker: WorkerResources
    team: str | None = field(default=None, kw_only=True)
    """A ``ray-tpu:teams`` name (default: the team whose namespace this is, if any)."""
    priority: str | None = field(default=None, kw_only=True)
    """A ``ray-tpu:priorityClasses`` name (default: the team's priority)."""


UPGRADE_STRATEGIES = ("None", "NewCluster")
"""``rayServices[].upgradeStrategy``, KubeRay's ``spec.upgradeStrategy.type``: ``None`` upgrades in
place (no second RayCluster: Serve config changes are applied to the running cluster), the TPU
default; ``NewCluster`` is KubeRay's blue-green upgrade, which brings up a whole second
RayCluster, so a second set of slices, before it switches traffic. (KubeRay's
``NewClusterWithIncrementalUpgrade`` needs the Gateway API and an alpha feature gate of the
operator, which the GKE add-on does not expose: not offered.)"""
ENGINES = ("builtin", "vllm")
"""``rayServices[].engine``: the built-in model (``workloads.serve:app``) or Ray Serve LLM with
vLLM's TPU backend (``ray.serve.llm:build_openai_app``)."""
LLM_ACCELERATOR_TYPES = ("TPU-V4", "TPU-V5P", "TPU-V5LITEPOD", "TPU-V6E")
"""The TPU ``accelerator_type`` values Ray Serve LLM's ``LLMConfig`` accepts (Ray's docs)."""
FALLBACK_KINDS = ("openai", "deployment")


@dataclass(frozen=True)
class LLMEngineConfig:
    """``rayServices[].llm``: the model Ray Serve LLM serves with vLLM."""

    model_id: str
    """The name clients ask for (``model`` in OpenAI requests)."""
    model_source: str
    """Hugging Face repo id or ``gs://`` path of the weights."""
    max_model_len: int = 4096
    hf_token_secret: str | None = None
    """``name/key`` of a Kubernetes secret with a Hugging Face token (gated models)."""


@dataclass(frozen=True)
class ServeFallbackConfig:
    """``rayServices[].fallback``: where requests go when the TPU deployment has no capacity."""

    kind: str
    url: str = ""
    model: str = ""
    api_key_secret: str | None = None
    """``name/key`` of the Kubernetes secret holding the external endpoint's API key."""
    max_attempts: int = 3
    timeout_s: float = 30.0
    probe_after_s: float = 5.0
    """After the TPU deployment could not be reached, how long requests go straight to the
    fallback before the next one tries it again (the router's circuit breaker)."""


@dataclass(frozen=True)
class RayServiceConfig(RayClusterConfig):
    """A KubeRay RayService: a Ray Serve application on ``slice`` (its RayCluster, plus Serve)."""

    import_path: str
    """``module:attribute`` of the Serve application, e.g. ``workloads.serve:app``."""
    application_name: str
    route_prefix: str
    runtime_env: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    checkpoint_run: str = "train"
    """The training run it serves: checkpoints from ``gs://<bucket>/<checkpoint_run>``."""
    target_ongoing_requests: float = 8.0
    """Serve autoscaling: requests in flight per replica the autoscaler aims for."""
    engine: str = "builtin"
    llm: LLMEngineConfig | None = None
    fallback: ServeFallbackConfig | None = None
    upgrade_strategy: str = "None"
    """KubeRay's ``upgradeStrategy.type`` (:data:`UPGRADE_STRATEGIES`); unset in the stack file:
    ``NewCluster`` only where its slice has a spare set of slices beside every object on it."""


@dataclass(frozen=True)
class RayJobConfig(RayClusterConfig):
    """A KubeRay RayJob: its own RayCluster on ``slice``, one entrypoint, then shut down.

    ``entrypoint`` (a shell command) replaces the default, the training workload sized to the
    slice (:mod:`infra.manifests.rayjob`); ``args`` are appended to that default instead.
    """

    entrypoint: str | None = None
    args: tuple[str, ...] = ()
    runtime_env: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    ttl_seconds_after_finished: int = 600
    active_deadline_seconds: int | None = None

    @property
    def cluster(self) -> RayClusterConfig:
        """The RayCluster the RayJob creates (its ``rayClusterSpec``)."""
        return RayClusterConfig(**{f.name: getattr(self, f.name) for f in fields(RayClusterConfig)})


RAY_AUTH_MODES = ("kubernetes", "token", "disabled")
"""``ray-tpu:security.rayAuth``: Kubernetes-RBAC tokens where KubeRay supports them, a token
Secret per object, or (explicitly, with a reason) none."""


@dataclass(frozen=True)
class DashboardIapConfig:
    """``ray-tpu:security.dashboardIap``: one Ray object's dashboard on an HTTPS host behind
    Identity-Aware Proxy, through an in-cluster proxy that adds the Ray token (docs/security.md)."""

    kind: str
    """``RayCluster`` or ``RayService`` (a RayJob's cluster is gone when the job ends)."""
    name: str
    namespace: str
    host: str
    """The DNS name of the endpoint (its ManagedCertificate's only domain)."""
    members: tuple[str, ...]
    """IAM principals granted ``roles/iap.httpsResourceAccessor`` for this host only."""
    oauth_secret: str | None = None
    """A Secret (``client_id``, ``client_secret``) of a custom OAuth client in ``namespace``;
    None: IAP's Google-managed OAuth client (users of the organization only)."""


@dataclass(frozen=True)
class SecurityConfig:
    """``ray-tpu:security``: who may talk to Ray's control plane (docs/security.md)."""

    ray_auth: str = "kubernetes"
    disabled_reason: str | None = None
    operator_namespaces: tuple[str, ...] = ("kube-system",)
    """Namespaces whose pods (the KubeRay operator) may reach a head's dashboard and Serve ports."""
    scraper_namespaces: tuple[str, ...] = ("gmp-system",)
    """Namespaces whose pods (Managed Prometheus collectors) may reach Ray's metrics port."""
    dashboard_iap: DashboardIapConfig | None = None
    """An IAP-protected HTTPS endpoint for one Ray object's dashboard (off when None)."""


@dataclass(frozen=True)
class StorageConfig:
    """``ray-tpu:storage``: the checkpoint bucket and the identity Ray pods use to reach it."""

    bucket: str
    location: str
    delete_after_days: int = 30
    """Lifecycle rule: objects older than this are deleted (old runs' checkpoints)."""
    soft_delete_days: int = 7
    """Deleted objects stay restorable this long (GCS soft delete)."""
    force_destroy: bool = False
    """``pulumi destroy`` may delete a bucket that still holds checkpoints."""
    service_account: str = "ray-tpu"
    """The Kubernetes ServiceAccount of every Ray pod (one per namespace with Ray objects)."""


PYTHON_VERSIONS = ("3.11", "3.12")
"""Python of the worker image (the ``rayproject/ray`` base it is built on)."""


@dataclass(frozen=True)
class ImageConfig:
    """The worker image built from ``Dockerfile`` and its Artifact Registry repository."""

    repository: str
    """Artifact Registry repository id (in ``gcp:region``)."""
    tag: str
    """``ray-tpu:imageTag``: the build's own part of the tag (the deploy workflow: the git sha)."""
    python: str = "3.11"
    """``ray-tpu:pythonVersion``: one of :data:`PYTHON_VERSIONS`."""

    @property
    def python_tag(self) -> str:
        return "py" + self.python.replace(".", "")


@dataclass(frozen=True)
class StackConfig:
    """Everything one stack declares."""

    project: str
    region: str
    cluster: ClusterConfig
    slices: tuple[SliceConfig, ...]
    ray_version: str
    ray_image: str
    ray_clusters: tuple[RayClusterConfig, ...]
    ray_services: tuple[RayServiceConfig, ...]
    ray_jobs: tuple[RayJobConfig, ...] = ()
    security: SecurityConfig = SecurityConfig()
    storage: StorageConfig | None = None
    """The checkpoint bucket and the Ray pods' identity (always set by the parser)."""
    image: ImageConfig | None = None
    """The worker image repository and tag (always set by the parser)."""
    teams: tuple[TeamConfig, ...] = ()
    """Teams sharing the slices through Kueue (docs/governance.md)."""
    priority_classes: tuple[PriorityClassConfig, ...] = ()
    notebooks: NotebooksConfig | None = None
    """``ray-tpu:notebooks``: JupyterLab next to the Ray clusters (docs/notebooks.md); None: none."""
    vllm_image: str | None = None
    """The image ``Dockerfile.vllm`` builds (``REGISTRY/ray-vllm:<rayVersion>-py312-vllm-tpu<pin>-
    <imageTag>``): what a RayService with ``engine: vllm`` runs unless it names its own."""

    @property
    def registry(self) -> str:
        """``REGION-docker.pkg.dev/PROJECT/REPOSITORY``: where the worker image is pushed."""
        repository = self.image.repository if self.image else "ray-tpu"
        return f"{self.region}-docker.pkg.dev/{self.project}/{repository}"

    def slice(self, name: str) -> SliceConfig:
        for candidate in self.slices:
            if candidate.name == name:
                return candidate
        valid = ", ".join(s.name for s in self.slices) or "(no slices configured)"
        raise ConfigError([invalid(f"{NAMESPACE}:slices", name, valid)])

    def image_for(self, obj: RayClusterConfig | RayServiceConfig | RayJobConfig) -> str:
        if obj.image:
            return obj.image
        if getattr(obj, "engine", "") == "vllm" and self.vllm_image:
            return self.vllm_image
        return self.ray_image

    @property
    def namespaces(self) -> tuple[str, ...]:
        """Kubernetes namespaces the Ray objects live in, in order of first use."""
        objs = (*self.ray_clusters, *self.ray_services, *self.ray_jobs)
        used = [*(o.namespace for o in objs), *(t.namespace for t in self.teams)]
        return tuple(dict.fromkeys(used))
