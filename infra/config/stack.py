"""A whole stack: ``parse_config`` checks every section and the rules across them; ``load_stack``
reads ``Pulumi.<stack>.yaml`` from the project folder."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from infra.config.cluster import parse_cluster
from infra.config.cross_rules import (
    check_gke_versions,
    check_model_sources,
    check_pool_names,
    check_runtime,
    check_scale_to_zero,
    check_slice_capacity,
    check_unique_ray_names,
    check_vllm_images,
)
from infra.config.gcp_rules import (
    PROJECT_RE,
    REGION_RE,
    image_check,
    parse_ray_version,
    zone_region,
)
from infra.config.image import parse_image, vllm_image, worker_image
from infra.config.notebooks import parse_notebooks
from infra.config.ray_objects import SECTIONS, with_upgrade_defaults
from infra.config.reader import Problems, check_unique, list_of
from infra.config.schema import NAMESPACE, ConfigError, ImageConfig, SliceConfig, StackConfig
from infra.config.security import parse_security
from infra.config.slices import parse_slice
from infra.config.storage import parse_storage
from infra.config.teams import check_team_objects, parse_priority_classes, parse_teams
from raytpu import inputs, project
from raytpu.errors import invalid

_TOP_KEYS = (
    "cluster",
    "slices",
    "rayClusters",
    "rayServices",
    "rayJobs",
    "rayVersion",
    "rayImage",
    "imageTag",
    "imageRepository",
    "pythonVersion",
    "security",
    "storage",
    "teams",
    "priorityClasses",
    "notebooks",
)


@dataclass(frozen=True)
class _Images:
    """The stack's Ray version and images (None where invalid: reported already)."""

    ray_version: str | None
    image: str | None
    """The Ray image of every object that names none (``rayImage``, else the built one)."""
    image_cfg: ImageConfig | None
    vllm: str | None
    """The image ``Dockerfile.vllm`` builds for this stack."""


@dataclass(frozen=True)
class _Slices:
    parsed: list[SliceConfig]
    by_name: dict[str, SliceConfig | None]
    """Every named slice, None where its entry is invalid (so objects on it add no second error)."""
    zones: tuple[str, ...]
    """The zones of the raw entries in the region (the CPU pool's default)."""


@dataclass(frozen=True)
class _RayObjects:
    clusters: list[Any]
    services: list[Any]
    jobs: list[Any]
    names: list[tuple[str, Any]]
    """(``rayClusters[0]``, name) of every raw entry, parsed or not."""

    @property
    def all(self) -> list[Any]:
        return [*self.clusters, *self.services, *self.jobs]


def parse_config(raw: Mapping[str, Any]) -> StackConfig:
    """Validate the ``config:`` mapping of a ``Pulumi.<stack>.yaml`` into a :class:`StackConfig`.

    Keys are namespaced like Pulumi's (``gcp:project``, ``ray-tpu:slices``). Raises
    :class:`ConfigError` listing every problem.
    """
    if not isinstance(raw, Mapping):
        raise ConfigError([invalid("config", raw, ["a mapping of namespaced keys"])])
    problems = Problems()
    _check_top_keys(problems, raw)
    project, region = _location(problems, raw)
    images = _images(problems, raw, project, region)
    slices = _slices(problems, raw, region)
    cluster = parse_cluster(problems, raw.get(f"{NAMESPACE}:cluster"), region, slices.zones)
    storage = parse_storage(
        problems,
        raw.get(f"{NAMESPACE}:storage"),
        project,
        region,
        cluster.name if cluster else None,
    )
    check_pool_names(problems, cluster, slices.parsed)
    objects = _ray_objects(problems, raw, slices.by_name, images.ray_version)
    check_unique_ray_names(problems, objects.names)
    check_slice_capacity(problems, slices.parsed, objects.all)
    object_paths = _object_paths(raw, SECTIONS, (objects.clusters, objects.services, objects.jobs))
    where = {id(obj): path for path, obj in object_paths}
    check_scale_to_zero(problems, slices.parsed, [*objects.clusters, *objects.services], where)
    check_runtime(problems, slices.parsed, objects.all, images.image, raw, where)
    check_vllm_images(problems, objects.services, images.vllm, images.ray_version, where)
    check_gke_versions(problems, cluster, slices.parsed)
    check_model_sources(problems, objects.services, storage and storage.bucket, where)
    security = parse_security(
        problems,
        raw.get(f"{NAMESPACE}:security"),
        {"RayCluster": objects.clusters, "RayService": objects.services, "RayJob": objects.jobs},
    )
    priorities = parse_priority_classes(problems, raw.get(f"{NAMESPACE}:priorityClasses"))
    teams = parse_teams(problems, raw.get(f"{NAMESPACE}:teams"), slices.by_name, priorities)
    check_team_objects(problems, teams, priorities, slices.by_name, object_paths)
    notebooks = parse_notebooks(
        problems, raw.get(f"{NAMESPACE}:notebooks"), teams, objects.clusters, images.ray_version
    )

    if problems.errors:
        raise ConfigError(problems.errors)
    ray_version, image, image_cfg = images.ray_version, images.image, images.image_cfg
    assert project and region and cluster and ray_version and image and security  # no errors
    assert storage and image_cfg
    return StackConfig(
        security=security,
        storage=storage,
        image=image_cfg,
        project=project,
        region=region,
        cluster=cluster,
        slices=tuple(slices.parsed),
        ray_version=ray_version,
        ray_image=image,
        ray_clusters=tuple(objects.clusters),
        ray_services=tuple(objects.services),
        ray_jobs=tuple(objects.jobs),
        teams=teams,
        priority_classes=priorities,
        notebooks=notebooks,
        vllm_image=images.vllm,
    )


def _check_top_keys(problems: Problems, raw: Mapping[str, Any]) -> None:
    for key in raw:
        namespace, _, short = str(key).partition(":")
        if namespace == NAMESPACE and short not in _TOP_KEYS:
            problems.bad(
                str(key), key, ", ".join(f"{NAMESPACE}:{k}" for k in _TOP_KEYS), "unknown key"
            )


def _location(problems: Problems, raw: Mapping[str, Any]) -> tuple[str | None, str | None]:
    """``gcp:project`` and ``gcp:region`` (None where invalid)."""
    project = raw.get("gcp:project")
    if not isinstance(project, str) or not PROJECT_RE.match(project):
        problems.bad(
            "gcp:project",
            project,
            "a GCP project id (6-30 chars: a-z, 0-9, '-')",
            "pulumi config set gcp:project YOUR_PROJECT",
        )
        project = None
    region = raw.get("gcp:region")
    if not isinstance(region, str) or not REGION_RE.match(region):
        problems.bad("gcp:region", region, "a GCP region, e.g. us-east5")
        region = None
    return project, region


def _images(
    problems: Problems, raw: Mapping[str, Any], project: str | None, region: str | None
) -> _Images:
    ray_version = parse_ray_version(problems, raw.get(f"{NAMESPACE}:rayVersion"))
    image = raw.get(f"{NAMESPACE}:rayImage")
    image_cfg = parse_image(problems, raw, needed=image is None)
    registry = None
    if ray_version and image_cfg and project and region:
        registry = f"{region}-docker.pkg.dev/{project}/{image_cfg.repository}"
    if image is None and registry and image_cfg and ray_version:
        image = worker_image(registry, ray_version, image_cfg)  # built from Dockerfile, pushed
    if image is not None and not image_check(problems, f"{NAMESPACE}:rayImage", image, ray_version):
        image = None
    vllm = (
        vllm_image(registry, ray_version, image_cfg)
        if registry and image_cfg and ray_version
        else None
    )
    return _Images(ray_version, image, image_cfg, vllm)


def _slices(problems: Problems, raw: Mapping[str, Any], region: str | None) -> _Slices:
    raw_slices = list_of(
        problems, f"{NAMESPACE}:slices", raw.get(f"{NAMESPACE}:slices"), required=True
    )
    parsed = [
        s
        for s in (parse_slice(problems, i, item, region) for i, item in enumerate(raw_slices))
        if s is not None
    ]
    check_unique(
        problems,
        f"{NAMESPACE}:slices",
        [(i, s.get("name")) for i, s in enumerate(raw_slices) if isinstance(s, Mapping)],
        "slice names",
    )
    named = {s.name: s for s in parsed}
    by_name: dict[str, SliceConfig | None] = {
        item["name"]: named.get(item["name"])
        for item in raw_slices
        if isinstance(item, Mapping) and isinstance(item.get("name"), str)
    }
    # From the raw entries, so that one invalid slice does not add a second, derived error.
    zones = tuple(
        dict.fromkeys(
            item["zone"]
            for item in raw_slices
            if isinstance(item, Mapping) and region and zone_region(item.get("zone")) == region
        )
    )
    return _Slices(parsed, by_name, zones)


def _ray_objects(
    problems: Problems,
    raw: Mapping[str, Any],
    by_name: Mapping[str, SliceConfig | None],
    ray_version: str | None,
) -> _RayObjects:
    """The RayClusters, RayServices and RayJobs, one parser per section (:data:`SECTIONS`)."""
    names: list[tuple[str, Any]] = []
    parsed: list[list[Any]] = []
    for key, parse in SECTIONS:
        items = list_of(
            problems, f"{NAMESPACE}:{key}", raw.get(f"{NAMESPACE}:{key}"), required=False
        )
        names.extend(
            (f"{key}[{i}]", o.get("name")) for i, o in enumerate(items) if isinstance(o, Mapping)
        )
        objects = (parse(problems, i, item, by_name, ray_version) for i, item in enumerate(items))
        parsed.append([obj for obj in objects if obj is not None])
    clusters, services, jobs = parsed
    services = with_upgrade_defaults(services, [*clusters, *jobs], by_name)
    return _RayObjects(clusters, services, jobs, names)


def _object_paths(raw: Mapping[str, Any], sections: Any, parsed: Any) -> list[tuple[str, Any]]:
    """(key path, object) of every parsed Ray object, its index from the raw list:
    ``ray-tpu:rayClusters[0]``."""
    found = []
    for (key, _), objects in zip(sections, parsed, strict=True):
        items = raw.get(f"{NAMESPACE}:{key}") or []
        names = [i.get("name") if isinstance(i, Mapping) else None for i in items]
        for obj in objects:
            found.append((f"{NAMESPACE}:{key}[{names.index(obj.name)}]", obj))
    return found


def project_root() -> Path:
    """The folder of this repository's ``Pulumi.yaml`` (the program and its shipped stacks).

    Commands do not read stacks from here: they resolve the project of the current directory
    with :func:`raytpu.project.find_project` and pass the stack file to :func:`load_stack_file`.
    """
    return Path(__file__).resolve().parents[2]


def stack_file(stack: str, project_dir: Path | None = None) -> Path:
    return project.stack_file(project_dir or project_root(), stack)


def available_stacks(project_dir: Path | None = None) -> tuple[str, ...]:
    return project.available_stacks(project_dir or project_root())


def load_stack_file(path: Path, *, image_tag: str | None = None) -> StackConfig:
    """Read and validate one ``Pulumi.<stack>.yaml``.

    Raises :class:`ConfigError` for anything wrong with it, unreadable files included (size,
    encoding, YAML syntax with line and column, nesting depth, alias bombs: see raytpu.inputs).
    """
    try:
        document = inputs.load_yaml(path)
    except inputs.InputError as error:
        raise ConfigError([str(error)]) from None
    if document is None:
        document = {}
    if not isinstance(document, Mapping):
        raise ConfigError(
            [invalid(str(path), type(document).__name__, "a YAML mapping with config:")]
        )
    config = document.get("config")
    config = {} if config is None else config
    if image_tag is not None and isinstance(config, Mapping):
        config = dict(config)
        config[f"{NAMESPACE}:imageTag"] = image_tag
    return parse_config(config)


def load_stack(
    stack: str, project_dir: Path | None = None, *, image_tag: str | None = None
) -> StackConfig:
    """Read and validate ``<project_dir>/Pulumi.<stack>.yaml`` (default: this repository)."""
    try:
        path = project.resolve_stack_file(stack, project_dir or project_root())
    except project.ProjectError as error:
        raise ConfigError([str(error)]) from None
    return load_stack_file(path, image_tag=image_tag)
