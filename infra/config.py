"""Stack configuration: the ``config:`` of ``Pulumi.<stack>.yaml``, read once and validated.

Stdlib + PyYAML only (no pulumi import at module level), so tests, the policy pack and the
``raytpu`` command can read a stack without the Pulumi engine.

Every problem is collected before anything is declared, and each one names the key path, the bad
value and the valid values::

    ray-tpu:slices[1].topology: '4x5' is not valid; valid: 1x1, 2x2, 2x4, 4x4, ...

Glossary: a **slice** is one TPU topology on its hosts (one GKE node pool); ``count`` identical
slices become ``count`` node pools. A **RayCluster** / **RayService** worker group has one
``replica`` per slice and ``numOfHosts`` = hosts per slice.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from types import MappingProxyType
from typing import Any

import yaml

from raytpu import catalog
from raytpu.catalog import SliceShape
from raytpu.ray_versions import MINIMUM_RAY_VERSION, image_version, parse_version

__all__ = [
    "PROVISIONING",
    "RELEASE_CHANNELS",
    "ClusterConfig",
    "ConfigError",
    "CpuPoolConfig",
    "RayClusterConfig",
    "RayJobConfig",
    "RayServiceConfig",
    "SliceConfig",
    "StackConfig",
    "from_pulumi",
    "load_stack",
    "parse_config",
]

NAMESPACE = "ray-tpu"
"""Pulumi config namespace of this project (the project name in ``Pulumi.yaml``)."""
PROVISIONING = ("on-demand", "spot", "reservation", "flex-start")
RELEASE_CHANNELS = ("RAPID", "REGULAR", "STABLE", "EXTENDED")
MIN_RAY_VERSION = parse_version(MINIMUM_RAY_VERSION)
"""Ray's slice placement (``ray.util.tpu.slice_placement_group``) needs 2.55 or later."""
MIN_GKE_VERSION = "1.30.0-gke.1747000"
"""The Ray Operator add-on needs this GKE version or later."""
FLEX_START_TPU_GKE_VERSION = "1.33.0-gke.1712000"
"""Flex-start TPU node pools need this GKE version or later."""
DEFAULT_GKE_VERSION = "1.33"
DEFAULT_RAY_IMAGE = "rayproject/ray:{version}-py311"
MAX_SLICE_COUNT = 64

_NAME_RE = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_ZONE_RE = re.compile(r"^([a-z]+-[a-z]+[0-9]+)-[a-z]$")
_REGION_RE = re.compile(r"^[a-z]+-[a-z]+[0-9]+$")
_PROJECT_RE = re.compile(r"^[a-z][-a-z0-9]{4,28}[a-z0-9]$")
_GKE_VERSION_RE = re.compile(r"^([0-9]+)\.([0-9]+)(?:\.([0-9]+)(?:-gke\.([0-9]+))?)?$")
_QUANTITY_RE = re.compile(r"^[0-9]+(\.[0-9]+)?(m|k|M|G|T|Ki|Mi|Gi|Ti)?$")
_CIDR_RE = re.compile(r"^([0-9]{1,3}\.){3}[0-9]{1,3}/([0-9]|[12][0-9]|3[0-2])$")
_IMPORT_PATH_RE = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
_RESERVATION_RE = re.compile(
    r"^(projects/[a-z][-a-z0-9]+/reservations/)?[a-z]([-a-z0-9]*[a-z0-9])?$"
)
_SLICE_NAME_MAX = 28
"""Node pool names are ``<slice>-<index>`` and GKE allows 40 characters."""
_RAY_NAME_MAX = 40
"""KubeRay derives Service and Pod names from the object name; keep room for suffixes."""


class ConfigError(ValueError):
    """Invalid stack configuration. ``errors`` lists every problem found, one per line:
    ``"<key path>: <bad value> is not valid; valid: <...>"``."""

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


@dataclass(frozen=True)
class RayServiceConfig(RayClusterConfig):
    """A KubeRay RayService: a Ray Serve application on ``slice`` (its RayCluster, plus Serve)."""

    import_path: str
    """``module:attribute`` of the Serve application, e.g. ``workloads.serve:app``."""
    application_name: str
    route_prefix: str
    runtime_env: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))


@dataclass(frozen=True)
class RayJobConfig(RayClusterConfig):
    """A KubeRay RayJob: its own RayCluster on ``slice``, one entrypoint, then shut down.

    ``entrypoint`` (a shell command) replaces the default, the training workload sized to the
    slice (:mod:`infra.rayjob_spec`); ``args`` are appended to that default instead.
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

    def slice(self, name: str) -> SliceConfig:
        for candidate in self.slices:
            if candidate.name == name:
                return candidate
        valid = ", ".join(s.name for s in self.slices) or "(no slices configured)"
        raise ConfigError([f"{NAMESPACE}:slices: slice {name!r} is not valid; valid: {valid}"])

    def image_for(self, obj: RayClusterConfig | RayServiceConfig | RayJobConfig) -> str:
        return obj.image or self.ray_image

    @property
    def namespaces(self) -> tuple[str, ...]:
        """Kubernetes namespaces the Ray objects live in, in order of first use."""
        objs = (*self.ray_clusters, *self.ray_services, *self.ray_jobs)
        return tuple(dict.fromkeys(o.namespace for o in objs))


# --------------------------------------------------------------------------------------------
# Reading: a small helper that walks a mapping with a key path and collects problems.


class _Problems:
    def __init__(self) -> None:
        self.errors: list[str] = []

    def bad(self, path: str, value: Any, valid: str, hint: str = "") -> None:
        problem = "is required" if value is None else f"{value!r} is not valid"
        message = f"{path}: {problem}; valid: {valid}"
        if hint:
            message += f" ({hint})"
        self.errors.append(message)


_MISSING = object()


class _Section:
    """One mapping of the config at ``path``: unknown keys are reported, values read by key."""

    def __init__(self, problems: _Problems, path: str, raw: Any, keys: Iterable[str]) -> None:
        self.problems = problems
        self.path = path
        self.keys = tuple(keys)
        self.ok = isinstance(raw, Mapping)
        if not self.ok:
            problems.bad(path, raw, f"a mapping with keys {', '.join(self.keys)}")
            raw = {}
        self.raw: Mapping[str, Any] = raw
        for key in raw:
            if key not in self.keys:
                problems.bad(f"{path}.{key}", key, ", ".join(self.keys), "unknown key")

    def sub(self, key: str) -> str:
        return f"{self.path}.{key}"

    def get(
        self,
        key: str,
        kind: type | tuple[type, ...],
        default: Any = _MISSING,
        *,
        valid: str,
        check: Callable[[Any], bool] | None = None,
        hint: str = "",
    ) -> Any:
        """The value at ``key`` (``default`` when absent; required when no default)."""
        value = self.raw.get(key, _MISSING)
        if value is _MISSING or value is None:
            if default is _MISSING:
                self.problems.bad(self.sub(key), None, valid, hint)
                return None
            return default
        kinds = kind if isinstance(kind, tuple) else (kind,)
        is_bool = isinstance(value, bool)
        if (is_bool and bool not in kinds) or not isinstance(value, kinds):
            self.problems.bad(self.sub(key), value, valid, hint)
            return None
        if check is not None and not check(value):
            self.problems.bad(self.sub(key), value, valid, hint)
            return None
        return value


def _name_check(max_len: int) -> Callable[[Any], bool]:
    return lambda v: bool(_NAME_RE.match(v)) and len(v) <= max_len


def _name_valid(max_len: int) -> str:
    return f"lowercase letters, digits and '-', starting with a letter, at most {max_len} chars"


def _int_range(low: int, high: int) -> Callable[[Any], bool]:
    return lambda v: low <= v <= high


def _parse_gke_version(text: str) -> tuple[int, int, int, int] | None:
    match = _GKE_VERSION_RE.match(text)
    if not match:
        return None
    major, minor, patch, gke = match.groups()
    # "1.31" means the newest 1.31 patch: compare it as the largest.
    big = 10**9
    return (
        int(major),
        int(minor),
        int(patch) if patch is not None else big,
        int(gke) if gke is not None else big,
    )


def _gke_version_ok(text: str, minimum_text: str = MIN_GKE_VERSION) -> bool:
    parsed = _parse_gke_version(text)
    minimum = _parse_gke_version(minimum_text)
    return parsed is not None and minimum is not None and parsed >= minimum


def _parse_ray_version(problems: _Problems, value: Any) -> str | None:
    path = f"{NAMESPACE}:rayVersion"
    minimum = ".".join(str(p) for p in MIN_RAY_VERSION)
    valid = f"an explicit Ray version X.Y.Z >= {minimum}, quoted (e.g. '2.60.0'); never 'latest'"
    if value is None:
        problems.bad(path, None, valid)
        return None
    if not isinstance(value, str):
        problems.bad(path, value, valid, "quote it: YAML reads 2.60 as a number")
        return None
    parsed = parse_version(value)
    if parsed is None or parsed < MIN_RAY_VERSION:
        problems.bad(path, value, valid)
        return None
    return value


def _image_check(problems: _Problems, path: str, image: Any, ray_version: str | None) -> bool:
    """An image's tag must name the Ray version it runs, the same as ``rayVersion`` (the policy
    pack's ``pinned-ray-version`` judges images with the same :func:`image_version`)."""
    version_text = ray_version or "X.Y.Z"
    valid = (
        f"an image whose tag names Ray {version_text}, e.g. rayproject/ray:{version_text}-py311 "
        f"or REGISTRY/ray:{version_text}-py311-abc123 (a @sha256 digest may follow; never :latest)"
    )
    if not isinstance(image, str) or not image.strip():
        problems.bad(path, image, valid)
        return False
    version, why = image_version(image)
    if version is None:
        problems.bad(path, image, valid, why)
        return False
    if ray_version and version != ray_version:
        problems.bad(
            path, image, valid, f"it runs Ray {version}, KubeRay is told {NAMESPACE}:rayVersion"
        )
        return False
    return True


def _list(problems: _Problems, path: str, raw: Any, *, required: bool) -> list[Any]:
    if raw is None:
        if required:
            problems.bad(path, None, "a list of mappings")
        return []
    if not isinstance(raw, list):
        problems.bad(path, raw, "a list of mappings")
        return []
    return raw


def _resources(section: _Section, key: str, default: WorkerResources) -> WorkerResources:
    inner = _Section(
        section.problems, section.sub(key), section.raw.get(key, {}), ("cpu", "memory")
    )
    valid = "a Kubernetes quantity as a string, e.g. '8', '500m', '32Gi'"

    def quantity(v: Any) -> bool:
        return bool(_QUANTITY_RE.match(v))

    cpu = inner.get("cpu", str, default.cpu, valid=valid, check=quantity)
    memory = inner.get("memory", str, default.memory, valid=valid, check=quantity)
    return WorkerResources(cpu or default.cpu, memory or default.memory)


def _parse_cluster(
    problems: _Problems, raw: Any, region: str | None, slice_zones: tuple[str, ...]
) -> ClusterConfig | None:
    keys = (
        "name",
        "location",
        "releaseChannel",
        "minMasterVersion",
        "privateNodes",
        "masterIpv4CidrBlock",
        "masterAuthorizedNetworks",
        "deletionProtection",
        "network",
        "subnetwork",
        "nodeServiceAccount",
        "cloudNat",
        "cpuPool",
    )
    s = _Section(problems, f"{NAMESPACE}:cluster", raw if raw is not None else {}, keys)
    name = s.get("name", str, valid=_name_valid(40), check=_name_check(40))
    location = s.get(
        "location",
        str,
        region,
        valid=f"the region {region} or one of its zones ({region}-a, ...)",
        check=lambda v: v == region or (_zone_region(v) == region),
    )
    channel = s.get(
        "releaseChannel",
        str,
        "REGULAR",
        valid=", ".join(RELEASE_CHANNELS),
        check=lambda v: v in RELEASE_CHANNELS,
    )
    version = s.get(
        "minMasterVersion",
        str,
        DEFAULT_GKE_VERSION,
        valid=f"a GKE version >= {MIN_GKE_VERSION} (the Ray Operator add-on needs it)",
        check=_gke_version_ok,
    )
    private = s.get("privateNodes", bool, False, valid="true or false")
    cidr = s.get(
        "masterIpv4CidrBlock",
        str,
        "172.16.0.32/28",
        valid="a /28 IPv4 CIDR block, e.g. 172.16.0.32/28",
        check=lambda v: bool(_CIDR_RE.match(v)) and v.endswith("/28"),
    )
    networks = []
    for index, item in enumerate(
        _list(
            problems,
            s.sub("masterAuthorizedNetworks"),
            s.raw.get("masterAuthorizedNetworks"),
            required=False,
        )
    ):
        n = _Section(
            problems,
            f"{s.sub('masterAuthorizedNetworks')}[{index}]",
            item,
            ("cidrBlock", "displayName"),
        )
        block = n.get(
            "cidrBlock",
            str,
            valid="an IPv4 CIDR block, e.g. 203.0.113.0/24",
            check=lambda v: bool(_CIDR_RE.match(v)),
        )
        display = n.get("displayName", str, "", valid="a string")
        if block:
            networks.append(AuthorizedNetwork(block, display or ""))
    protection = s.get("deletionProtection", bool, True, valid="true or false")
    cloud_nat = s.get(
        "cloudNat",
        bool,
        bool(private),
        valid="true or false",
        hint="private nodes reach Docker Hub (rayproject/ray) only through Cloud NAT",
    )
    network = s.get("network", str, "default", valid="a VPC network name")
    subnetwork = s.get("subnetwork", str, "default", valid="a subnetwork name")
    account = s.get(
        "nodeServiceAccount",
        str,
        None,
        valid="a service account email, e.g. gke-nodes@PROJECT.iam.gserviceaccount.com",
        check=lambda v: "@" in v,
    )
    pool = _parse_cpu_pool(
        problems, s.sub("cpuPool"), s.raw.get("cpuPool", {}), region, slice_zones
    )
    if None in (name, location, channel, version, private, cidr, protection, cloud_nat, pool):
        return None
    return ClusterConfig(
        name=name,
        location=location,
        release_channel=channel,
        min_master_version=version,
        private_nodes=private,
        master_ipv4_cidr_block=cidr,
        master_authorized_networks=tuple(networks),
        deletion_protection=protection,
        network=network,
        subnetwork=subnetwork,
        node_service_account=account,
        cloud_nat=cloud_nat,
        cpu_pool=pool,
    )


def _parse_cpu_pool(
    problems: _Problems, path: str, raw: Any, region: str | None, slice_zones: tuple[str, ...]
) -> CpuPoolConfig | None:
    s = _Section(
        problems, path, raw, ("name", "machineType", "minNodes", "maxNodes", "diskSizeGb", "zones")
    )
    name = s.get("name", str, "cpu", valid=_name_valid(40), check=_name_check(40))
    machine = s.get(
        "machineType",
        str,
        "n2-standard-8",
        valid="a GCE machine type without accelerators, e.g. n2-standard-8",
        check=lambda v: bool(re.match(r"^[a-z0-9]+-[a-z0-9-]+$", v)) and catalog_free_machine(v),
    )
    min_nodes = s.get("minNodes", int, 1, valid="an integer 0..100", check=_int_range(0, 100))
    max_nodes = s.get("maxNodes", int, 3, valid="an integer 1..100", check=_int_range(1, 100))
    if min_nodes is not None and max_nodes is not None and max_nodes < min_nodes:
        problems.bad(f"{path}.maxNodes", max_nodes, f"an integer >= minNodes ({min_nodes})")
        max_nodes = None
    disk = s.get("diskSizeGb", int, 100, valid="an integer 20..2000", check=_int_range(20, 2000))
    zones_raw = s.raw.get("zones")
    zones: tuple[str, ...] = slice_zones
    if zones_raw is not None:
        if not isinstance(zones_raw, list) or not zones_raw:
            problems.bad(f"{path}.zones", zones_raw, f"a non-empty list of zones of {region}")
            zones = ()
        else:
            good = []
            for index, zone in enumerate(zones_raw):
                if _check_zone(problems, f"{path}.zones[{index}]", zone, region):
                    good.append(zone)
            zones = tuple(dict.fromkeys(good))
    if not zones and zones_raw is None:
        problems.bad(
            f"{path}.zones",
            None,
            f"a non-empty list of zones of {region}",
            "no slice zone to default to",
        )
    if None in (name, machine, min_nodes, max_nodes, disk):
        return None
    return CpuPoolConfig(name, machine, min_nodes, max_nodes, disk, zones)


def catalog_free_machine(machine_type: str) -> bool:
    """True unless ``machine_type`` is a TPU host (those belong in ``ray-tpu:slices``)."""
    try:
        catalog.shape_from_machine_type(machine_type, None)
    except catalog.CatalogError as error:
        return error.field == "machineType" and error.value == machine_type
    return False


def _zone_region(zone: str) -> str | None:
    match = _ZONE_RE.match(zone) if isinstance(zone, str) else None
    return match.group(1) if match else None


def _check_zone(problems: _Problems, path: str, zone: Any, region: str | None) -> bool:
    valid = (
        f"a zone of gcp:region {region}, e.g. {region}-a" if region else "a zone, e.g. us-east5-b"
    )
    if not isinstance(zone, str) or _zone_region(zone) is None:
        problems.bad(path, zone, valid)
        return False
    if region is not None and _zone_region(zone) != region:
        problems.bad(path, zone, valid, f"{zone} is in {_zone_region(zone)}")
        return False
    return True


def _parse_slice(
    problems: _Problems, index: int, raw: Any, region: str | None
) -> SliceConfig | None:
    path = f"{NAMESPACE}:slices[{index}]"
    keys = (
        "name",
        "generation",
        "topology",
        "machineType",
        "zone",
        "count",
        "provisioning",
        "reservation",
        "scaleToZero",
    )
    s = _Section(problems, path, raw, keys)
    if not s.ok:
        return None
    name = s.get(
        "name", str, valid=_name_valid(_SLICE_NAME_MAX), check=_name_check(_SLICE_NAME_MAX)
    )
    gen = s.get("generation", str, valid=", ".join(catalog.GENERATIONS))
    topology = s.get(
        "topology", str, valid="a topology string such as 2x4 or 2x2x4", hint="quote it"
    )
    machine = s.get("machineType", str, None, valid="a TPU machine type, e.g. ct6e-standard-4t")
    shape = None
    if gen is not None and topology is not None:
        try:
            shape = catalog.shape(gen, topology, machine_type=machine)
        except catalog.CatalogError as error:
            hint = f" ({error.args[0].split(' (', 1)[1]}" if " (" in error.args[0] else ""
            problems.errors.append(
                f"{path}.{error.field}: "
                + ("is required" if error.value is None else f"{error.value!r} is not valid")
                + f"; valid: {error.valid}{hint}"
            )
    zone = s.get("zone", str, valid=f"a zone of gcp:region {region}")
    if zone is not None and not _check_zone(problems, f"{path}.zone", zone, region):
        zone = None
    count = s.get(
        "count",
        int,
        1,
        valid=f"an integer 1..{MAX_SLICE_COUNT} (identical slices)",
        check=_int_range(1, MAX_SLICE_COUNT),
    )
    provisioning = s.get(
        "provisioning",
        str,
        "on-demand",
        valid=", ".join(PROVISIONING),
        check=lambda v: v in PROVISIONING,
    )
    reservation = s.get(
        "reservation",
        str,
        None,
        valid="a reservation name or projects/PROJECT/reservations/NAME",
        check=lambda v: bool(_RESERVATION_RE.match(v)),
    )
    scale_to_zero = s.get("scaleToZero", bool, provisioning == "flex-start", valid="true or false")
    if provisioning == "reservation" and reservation is None and "reservation" not in s.raw:
        problems.bad(
            f"{path}.reservation",
            None,
            "a reservation name or projects/PROJECT/reservations/NAME",
            "provisioning is reservation",
        )
    if provisioning not in (None, "reservation") and reservation is not None:
        problems.bad(
            f"{path}.provisioning",
            provisioning,
            "reservation",
            f"reservation {reservation!r} is set",
        )
    if provisioning == "flex-start" and scale_to_zero is False:
        problems.bad(
            f"{path}.scaleToZero",
            False,
            "true",
            "flex-start pools start empty and scale whole slices up on demand",
        )
    if None in (name, shape, zone, count, provisioning, scale_to_zero):
        return None
    return SliceConfig(name, shape, zone, count, provisioning, reservation, scale_to_zero)


_RAY_OBJECT_KEYS = (
    "name",
    "slice",
    "replicas",
    "minReplicas",
    "maxReplicas",
    "namespace",
    "image",
    "head",
    "worker",
)
_DEFAULT_HEAD = WorkerResources(cpu="2", memory="8Gi")
_DEFAULT_WORKER = WorkerResources(cpu="8", memory="32Gi")


def _parse_ray_common(
    s: _Section,
    slices: Mapping[str, SliceConfig | None],
    ray_version: str | None,
) -> dict[str, Any] | None:
    problems = s.problems
    name = s.get("name", str, valid=_name_valid(_RAY_NAME_MAX), check=_name_check(_RAY_NAME_MAX))
    slice_valid = ", ".join(slices) or "(no slices configured)"
    slice_name = s.get(
        "slice", str, valid=slice_valid, check=lambda v: v in slices, hint="a ray-tpu:slices name"
    )
    known = slices.get(slice_name) if slice_name is not None else None
    # A slice that is declared but itself invalid was reported already: check no further.
    available = known.count if known is not None else MAX_SLICE_COUNT
    replicas = s.get(
        "replicas",
        int,
        known.count if known is not None else 1,
        valid=f"an integer 0..{available} (slices of {slice_name!r})",
        check=_int_range(0, available),
    )
    min_replicas = s.get(
        "minReplicas",
        int,
        replicas,
        valid=f"an integer 0..{replicas} (<= replicas)",
        check=lambda v: replicas is not None and 0 <= v <= replicas,
    )
    max_replicas = s.get(
        "maxReplicas",
        int,
        replicas,
        valid=f"an integer {replicas}..{available} (>= replicas, <= slice count {available})",
        check=lambda v: replicas is not None and replicas <= v <= available,
    )
    namespace = s.get("namespace", str, "ray", valid=_name_valid(63), check=_name_check(63))
    image = s.raw.get("image")
    if image is not None and not _image_check(problems, s.sub("image"), image, ray_version):
        image = False
    head = _resources(s, "head", _DEFAULT_HEAD)
    worker = _resources(s, "worker", _DEFAULT_WORKER)
    values = (name, slice_name, replicas, min_replicas, max_replicas, namespace, image)
    if any(v is None for v in values[:-1]) or image is False or known is None:
        return None
    return {
        "name": name,
        "slice": slice_name,
        "replicas": replicas,
        "min_replicas": min_replicas,
        "max_replicas": max_replicas,
        "namespace": namespace,
        "image": image,
        "head": head,
        "worker": worker,
    }


def _runtime_env(s: _Section) -> dict[str, Any] | None:
    """``runtimeEnv``: a Ray runtime_env mapping of plain values (it is written out as YAML)."""
    runtime_env = s.get("runtimeEnv", dict, {}, valid="a mapping (Ray runtime_env)")
    if runtime_env:
        try:
            json.dumps(runtime_env)
        except (TypeError, ValueError):
            s.problems.bad(
                s.sub("runtimeEnv"), runtime_env, "plain strings, numbers, lists, mappings"
            )
            return None
    return runtime_env


def _parse_ray_cluster(
    problems: _Problems,
    index: int,
    raw: Any,
    slices: Mapping[str, SliceConfig | None],
    ray_version: str | None,
) -> RayClusterConfig | None:
    s = _Section(problems, f"{NAMESPACE}:rayClusters[{index}]", raw, _RAY_OBJECT_KEYS)
    if not s.ok:
        return None
    common = _parse_ray_common(s, slices, ray_version)
    return RayClusterConfig(**common) if common else None


def _parse_ray_service(
    problems: _Problems,
    index: int,
    raw: Any,
    slices: Mapping[str, SliceConfig | None],
    ray_version: str | None,
) -> RayServiceConfig | None:
    keys = (*_RAY_OBJECT_KEYS, "importPath", "applicationName", "routePrefix", "runtimeEnv")
    s = _Section(problems, f"{NAMESPACE}:rayServices[{index}]", raw, keys)
    if not s.ok:
        return None
    common = _parse_ray_common(s, slices, ray_version)
    import_path = s.get(
        "importPath",
        str,
        valid="module:attribute of a Ray Serve application, e.g. workloads.serve:app",
        check=lambda v: bool(_IMPORT_PATH_RE.match(v)),
    )
    app_name = s.get(
        "applicationName",
        str,
        common["name"] if common else "app",
        valid="a non-empty string",
        check=bool,
    )
    route = s.get(
        "routePrefix",
        str,
        "/",
        valid="a URL path starting with '/'",
        check=lambda v: v.startswith("/"),
    )
    runtime_env = _runtime_env(s)
    if common is None or None in (import_path, app_name, route, runtime_env):
        return None
    return RayServiceConfig(
        **common,
        import_path=import_path,
        application_name=app_name,
        route_prefix=route,
        runtime_env=MappingProxyType(dict(runtime_env)),
    )


def _parse_ray_job(
    problems: _Problems,
    index: int,
    raw: Any,
    slices: Mapping[str, SliceConfig | None],
    ray_version: str | None,
) -> RayJobConfig | None:
    keys = (
        *_RAY_OBJECT_KEYS,
        "entrypoint",
        "args",
        "runtimeEnv",
        "ttlSecondsAfterFinished",
        "activeDeadlineSeconds",
    )
    s = _Section(problems, f"{NAMESPACE}:rayJobs[{index}]", raw, keys)
    if not s.ok:
        return None
    common = _parse_ray_common(s, slices, ray_version)
    entrypoint = s.get(
        "entrypoint", str, "", valid="a shell command, e.g. python -m raytpu_cli train", check=bool
    )
    args = s.get(
        "args",
        list,
        [],
        valid="a list of strings appended to the default training entrypoint",
        check=lambda v: all(isinstance(a, str) for a in v),
    )
    if entrypoint and args:
        problems.bad(s.sub("args"), args, "[] when entrypoint is set", "put them in entrypoint")
        args = None
    runtime_env = _runtime_env(s)
    ttl = s.get(
        "ttlSecondsAfterFinished", int, 600, valid="an integer >= 0", check=_int_range(0, 10**7)
    )
    deadline = s.get(
        "activeDeadlineSeconds", int, 0, valid="an integer >= 1", check=_int_range(1, 10**8)
    )
    if common is None or None in (entrypoint, args, runtime_env, ttl, deadline):
        return None
    return RayJobConfig(
        **common,
        entrypoint=entrypoint or None,
        args=tuple(args),
        runtime_env=MappingProxyType(dict(runtime_env)),
        ttl_seconds_after_finished=ttl,
        active_deadline_seconds=deadline or None,
    )


def _check_unique(problems: _Problems, path: str, names: list[tuple[int, str]], what: str) -> None:
    seen: dict[str, int] = {}
    for index, name in names:
        if name in seen:
            problems.bad(
                f"{path}[{index}].name",
                name,
                f"a name not used elsewhere ({what})",
                f"duplicate of {path}[{seen[name]}]",
            )
        else:
            seen[name] = index


_TOP_KEYS = (
    "cluster",
    "slices",
    "rayClusters",
    "rayServices",
    "rayJobs",
    "rayVersion",
    "rayImage",
)


def parse_config(raw: Mapping[str, Any]) -> StackConfig:
    """Validate the ``config:`` mapping of a ``Pulumi.<stack>.yaml`` into a :class:`StackConfig`.

    Keys are namespaced like Pulumi's (``gcp:project``, ``ray-tpu:slices``). Raises
    :class:`ConfigError` listing every problem.
    """
    problems = _Problems()
    if not isinstance(raw, Mapping):
        raise ConfigError([f"config: {raw!r} is not valid; valid: a mapping of namespaced keys"])
    for key in raw:
        namespace, _, short = str(key).partition(":")
        if namespace == NAMESPACE and short not in _TOP_KEYS:
            problems.bad(
                str(key), key, ", ".join(f"{NAMESPACE}:{k}" for k in _TOP_KEYS), "unknown key"
            )

    project = raw.get("gcp:project")
    if not isinstance(project, str) or not _PROJECT_RE.match(project):
        problems.bad(
            "gcp:project",
            project,
            "a GCP project id (6-30 chars: a-z, 0-9, '-')",
            "pulumi config set gcp:project YOUR_PROJECT",
        )
        project = None
    region = raw.get("gcp:region")
    if not isinstance(region, str) or not _REGION_RE.match(region):
        problems.bad("gcp:region", region, "a GCP region, e.g. us-east5")
        region = None

    ray_version = _parse_ray_version(problems, raw.get(f"{NAMESPACE}:rayVersion"))
    image = raw.get(f"{NAMESPACE}:rayImage")
    if image is None and ray_version is not None:
        image = DEFAULT_RAY_IMAGE.format(version=ray_version)
    if image is not None and not _image_check(
        problems, f"{NAMESPACE}:rayImage", image, ray_version
    ):
        image = None

    slices: list[SliceConfig] = []
    raw_slices = _list(
        problems, f"{NAMESPACE}:slices", raw.get(f"{NAMESPACE}:slices"), required=True
    )
    for index, item in enumerate(raw_slices):
        parsed = _parse_slice(problems, index, item, region)
        if parsed is not None:
            slices.append(parsed)
    _check_unique(
        problems,
        f"{NAMESPACE}:slices",
        [(i, s.get("name")) for i, s in enumerate(raw_slices) if isinstance(s, Mapping)],
        "slice names",
    )
    parsed_slices = {s.name: s for s in slices}
    by_name: dict[str, SliceConfig | None] = {
        item["name"]: parsed_slices.get(item["name"])
        for item in raw_slices
        if isinstance(item, Mapping) and isinstance(item.get("name"), str)
    }

    # The CPU pool defaults to the slices' zones; take them from the raw entries so that one
    # invalid slice does not add a second, derived error here.
    slice_zones = tuple(
        dict.fromkeys(
            item["zone"]
            for item in raw_slices
            if isinstance(item, Mapping) and region and _zone_region(item.get("zone")) == region
        )
    )
    cluster = _parse_cluster(problems, raw.get(f"{NAMESPACE}:cluster"), region, slice_zones)
    if cluster is not None:
        taken = {cluster.cpu_pool.name}
        for index, item in enumerate(slices):
            clash = taken.intersection(item.node_pool_names())
            if clash:
                problems.bad(
                    f"{NAMESPACE}:slices[{index}].name",
                    item.name,
                    "a name whose node pools do not clash with another pool",
                    f"node pool {sorted(clash)[0]!r} exists already",
                )
            taken.update(item.node_pool_names())

    # A RayService N owns the Services N-head-svc / N-serve-svc like a RayCluster N would:
    # names must be unique across all kinds (per namespace; we keep it simple: overall).
    ray_names: list[tuple[str, Any]] = []

    def ray_objects(key: str, parse: Any) -> list[Any]:
        items = _list(problems, f"{NAMESPACE}:{key}", raw.get(f"{NAMESPACE}:{key}"), required=False)
        ray_names.extend(
            (f"{key}[{i}]", o.get("name")) for i, o in enumerate(items) if isinstance(o, Mapping)
        )
        parsed = (
            parse(problems, index, item, by_name, ray_version) for index, item in enumerate(items)
        )
        return [obj for obj in parsed if obj is not None]

    clusters: list[RayClusterConfig] = ray_objects("rayClusters", _parse_ray_cluster)
    services: list[RayServiceConfig] = ray_objects("rayServices", _parse_ray_service)
    jobs: list[RayJobConfig] = ray_objects("rayJobs", _parse_ray_job)
    seen: dict[str, str] = {}
    for where, name in ray_names:
        if name in seen:
            problems.bad(
                f"{NAMESPACE}:{where}.name",
                name,
                "a name unique across ray-tpu:rayClusters and ray-tpu:rayServices (and rayJobs)",
                f"duplicate of {NAMESPACE}:{seen[name]} (both would own {name}-head-svc)",
            )
        elif name is not None:
            seen[name] = where
    # Each replica of a worker group holds a whole slice: the objects on one slice may not ask
    # for more slices than it has.
    for slice_cfg in slices:
        # A RayJob's cluster holds its slices while it runs: count it too.
        users = [o for o in (*clusters, *services, *jobs) if o.slice == slice_cfg.name]
        wanted = sum(o.max_replicas for o in users)
        if wanted > slice_cfg.count:
            index = slices.index(slice_cfg)
            problems.bad(
                f"{NAMESPACE}:slices[{index}].count",
                slice_cfg.count,
                f"an integer >= {wanted}",
                "the maxReplicas of "
                + ", ".join(o.name for o in users)
                + f" add up to {wanted} slices",
            )

    flex = [s.name for s in slices if s.provisioning == "flex-start"]
    too_old = cluster is not None and not _gke_version_ok(
        cluster.min_master_version, FLEX_START_TPU_GKE_VERSION
    )
    if flex and too_old:
        assert cluster is not None
        problems.bad(
            f"{NAMESPACE}:cluster.minMasterVersion",
            cluster.min_master_version,
            f"a GKE version >= {FLEX_START_TPU_GKE_VERSION}",
            f"flex-start TPU slices: {', '.join(flex)}",
        )

    if problems.errors:
        raise ConfigError(problems.errors)
    assert project and region and cluster and ray_version and image  # guaranteed by no errors
    return StackConfig(
        project=project,
        region=region,
        cluster=cluster,
        slices=tuple(slices),
        ray_version=ray_version,
        ray_image=image,
        ray_clusters=tuple(clusters),
        ray_services=tuple(services),
        ray_jobs=tuple(jobs),
    )


def project_root() -> Path:
    """The folder holding ``Pulumi.yaml`` (the repository root)."""
    return Path(__file__).resolve().parents[1]


def stack_file(stack: str, project_dir: Path | None = None) -> Path:
    return (project_dir or project_root()) / f"Pulumi.{stack}.yaml"


def available_stacks(project_dir: Path | None = None) -> tuple[str, ...]:
    folder = project_dir or project_root()
    return tuple(
        sorted(p.name[len("Pulumi.") : -len(".yaml")] for p in folder.glob("Pulumi.*.yaml"))
    )


def load_stack(stack: str, project_dir: Path | None = None) -> StackConfig:
    """Read and validate ``<project_dir>/Pulumi.<stack>.yaml`` (default: this repository)."""
    path = stack_file(stack, project_dir)
    if not path.is_file():
        valid = ", ".join(available_stacks(project_dir)) or "(no Pulumi.<stack>.yaml found)"
        raise ConfigError([f"stack: {stack!r} is not valid; valid: {valid} (no {path})"])
    with path.open() as handle:
        document = yaml.safe_load(handle) or {}
    if not isinstance(document, Mapping):
        raise ConfigError([f"{path}: {type(document).__name__} is not valid; valid: a mapping"])
    return parse_config(document.get("config") or {})


def _decode(value: Any) -> Any:
    """Pulumi hands structured config to the program as JSON text."""
    if isinstance(value, str) and value[:1] in ("{", "["):
        try:
            return json.loads(value)
        except ValueError:
            return value
    if value in ("true", "false"):
        return value == "true"
    return value


def from_pulumi() -> StackConfig:
    """The configuration of the stack being deployed (inside ``pulumi up`` / ``preview``)."""
    from pulumi.runtime import config as runtime_config

    merged: dict[str, Any] = dict(runtime_config.get_config_env())
    merged.update(runtime_config.CONFIG.get())
    raw: dict[str, Any] = {}
    for key, value in merged.items():
        # Older engines spell keys "ray-tpu:config:slices"; newer ones "ray-tpu:slices".
        namespace, _, rest = key.partition(":")
        if rest.startswith("config:"):
            key = f"{namespace}:{rest[len('config:') :]}"
        raw[key] = _decode(value)
    return parse_config(raw)
