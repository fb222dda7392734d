"""A whole stack: ``parse_config`` checks every section and the rules across them; ``load_stack``
reads ``Pulumi.<stack>.yaml`` from the project folder."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from infra.config.cluster import parse_cluster
from infra.config.gcp_rules import (
    FLEX_START_TPU_GKE_VERSION,
    PROJECT_RE,
    REGION_RE,
    gke_version_ok,
    image_check,
    parse_ray_version,
    zone_region,
)
from infra.config.image import parse_image, vllm_image, worker_image
from infra.config.ray_objects import SECTIONS
from infra.config.reader import Problems, check_unique, list_of
from infra.config.schema import (
    NAMESPACE,
    PYTHON_VERSIONS,
    ConfigError,
    SliceConfig,
    StackConfig,
)
from infra.config.security import parse_security
from infra.config.slices import parse_slice
from infra.config.storage import parse_storage
from infra.config.teams import check_team_objects, parse_priority_classes, parse_teams
from raytpu import inputs, project
from raytpu.ray_versions import image_python, vllm_image_problems

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
)


def parse_config(raw: Mapping[str, Any]) -> StackConfig:
    """Validate the ``config:`` mapping of a ``Pulumi.<stack>.yaml`` into a :class:`StackConfig`.

    Keys are namespaced like Pulumi's (``gcp:project``, ``ray-tpu:slices``). Raises
    :class:`ConfigError` listing every problem.
    """
    problems = Problems()
    if not isinstance(raw, Mapping):
        raise ConfigError([f"config: {raw!r} is not valid; valid: a mapping of namespaced keys"])
    for key in raw:
        namespace, _, short = str(key).partition(":")
        if namespace == NAMESPACE and short not in _TOP_KEYS:
            problems.bad(
                str(key), key, ", ".join(f"{NAMESPACE}:{k}" for k in _TOP_KEYS), "unknown key"
            )

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

    ray_version = parse_ray_version(problems, raw.get(f"{NAMESPACE}:rayVersion"))
    image = raw.get(f"{NAMESPACE}:rayImage")
    image_cfg = parse_image(problems, raw, needed=image is None)
    if image is None and ray_version and image_cfg and project and region:
        # The worker image built from Dockerfile and pushed to the stack's registry.
        registry = f"{region}-docker.pkg.dev/{project}/{image_cfg.repository}"
        image = worker_image(registry, ray_version, image_cfg)
    if image is not None and not image_check(problems, f"{NAMESPACE}:rayImage", image, ray_version):
        image = None
    vllm = None
    if ray_version and image_cfg and project and region:
        registry = f"{region}-docker.pkg.dev/{project}/{image_cfg.repository}"
        vllm = vllm_image(registry, ray_version, image_cfg)

    slices: list[SliceConfig] = []
    raw_slices = list_of(
        problems, f"{NAMESPACE}:slices", raw.get(f"{NAMESPACE}:slices"), required=True
    )
    for index, item in enumerate(raw_slices):
        parsed = parse_slice(problems, index, item, region)
        if parsed is not None:
            slices.append(parsed)
    check_unique(
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
            if isinstance(item, Mapping) and region and zone_region(item.get("zone")) == region
        )
    )
    cluster = parse_cluster(problems, raw.get(f"{NAMESPACE}:cluster"), region, slice_zones)
    storage = parse_storage(
        problems,
        raw.get(f"{NAMESPACE}:storage"),
        project,
        region,
        cluster.name if cluster else None,
    )
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
        items = list_of(
            problems, f"{NAMESPACE}:{key}", raw.get(f"{NAMESPACE}:{key}"), required=False
        )
        ray_names.extend(
            (f"{key}[{i}]", o.get("name")) for i, o in enumerate(items) if isinstance(o, Mapping)
        )
        parsed = (
            parse(problems, index, item, by_name, ray_version) for index, item in enumerate(items)
        )
        return [obj for obj in parsed if obj is not None]

    clusters, services, jobs = (ray_objects(key, parse) for key, parse in SECTIONS)
    seen: dict[str, str] = {}
    for where, name in ray_names:
        if not isinstance(name, str):
            continue  # reported where the object is parsed
        if name in seen:
            problems.bad(
                f"{NAMESPACE}:{where}.name",
                name,
                "a name unique across ray-tpu:rayClusters and ray-tpu:rayServices (and rayJobs)",
                f"duplicate of {NAMESPACE}:{seen[name]} (both would own {name}-head-svc)",
            )
        else:
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

    object_paths = _object_paths(raw, SECTIONS, (clusters, services, jobs))
    where = {id(obj): path for path, obj in object_paths}
    _check_scale_to_zero(problems, slices, [*clusters, *services], where)
    _check_runtime(problems, slices, [*clusters, *services, *jobs], image, raw, where)
    _check_vllm_images(problems, services, vllm, ray_version, where)

    flex = [s.name for s in slices if s.provisioning == "flex-start"]
    too_old = cluster is not None and not gke_version_ok(
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

    # Generations that GKE runs only from a given version on (tpu7x: 1.34.0-gke.2201000).
    for gen in {s.shape.generation.name: s.shape.generation for s in slices}.values():
        named = [s.name for s in slices if s.shape.generation is gen]
        if (
            cluster is not None
            and gen.min_gke_version
            and not gke_version_ok(cluster.min_master_version, gen.min_gke_version)
        ):
            problems.bad(
                f"{NAMESPACE}:cluster.minMasterVersion",
                cluster.min_master_version,
                f"a GKE version >= {gen.min_gke_version}",
                f"{gen.name} slices need it: {', '.join(named)}",
            )

    security = parse_security(
        problems,
        raw.get(f"{NAMESPACE}:security"),
        {"RayCluster": clusters, "RayService": services, "RayJob": jobs},
    )

    priorities = parse_priority_classes(problems, raw.get(f"{NAMESPACE}:priorityClasses"))
    teams = parse_teams(problems, raw.get(f"{NAMESPACE}:teams"), by_name, priorities)
    check_team_objects(
        problems,
        teams,
        priorities,
        by_name,
        object_paths,
    )

    if problems.errors:
        raise ConfigError(problems.errors)
    assert project and region and cluster and ray_version and image and security  # no errors
    assert storage and image_cfg
    return StackConfig(
        security=security,
        storage=storage,
        image=image_cfg,
        project=project,
        region=region,
        cluster=cluster,
        slices=tuple(slices),
        ray_version=ray_version,
        ray_image=image,
        ray_clusters=tuple(clusters),
        ray_services=tuple(services),
        ray_jobs=tuple(jobs),
        teams=teams,
        priority_classes=priorities,
        vllm_image=vllm,
    )


def _check_scale_to_zero(
    problems: Problems, slices: list[SliceConfig], objects: list[Any], where: Mapping[int, str]
) -> None:
    """A ``scaleToZero`` slice reaches zero only if no long-lived worker group keeps a replica
    on it: a RayCluster's or RayService's ``minReplicas`` must be 0 there (in-tree autoscaling
    then adds the slice when Ray asks for its TPUs and removes it when idle). A RayJob's
    cluster is deleted when the job ends, so it does not pin the slice."""
    for slice_cfg in slices:
        if not slice_cfg.scale_to_zero:
            continue
        for obj in objects:
            if obj.slice == slice_cfg.name and obj.min_replicas > 0:
                problems.bad(
                    f"{where[id(obj)]}.minReplicas",
                    obj.min_replicas,
                    "0 (with replicas: 0 and maxReplicas >= 1: Ray's autoscaler adds the slice "
                    "when a job asks for its TPUs)",
                    f"slice {slice_cfg.name!r} has scaleToZero, and a worker group that keeps "
                    f"{obj.min_replicas} replica(s) keeps their TPU hosts up: the pool never "
                    "reaches zero",
                )


def _check_runtime(
    problems: Problems,
    slices: list[SliceConfig],
    objects: list[Any],
    stack_image: str | None,
    raw: Mapping[str, Any],
    where: Mapping[int, str],
) -> None:
    """An image whose Python cannot run a generation's jax[tpu] (tpu7x: 3.12) is refused on
    that generation's slices."""
    by_name = {s.name: s for s in slices}
    for obj in objects:
        gen = by_name[obj.slice].shape.generation if obj.slice in by_name else None
        image = obj.image or stack_image
        if gen is None or gen.min_python is None or not isinstance(image, str):
            continue
        python = image_python(image)
        if python is None or python >= gen.min_python:
            continue
        wanted = ".".join(str(p) for p in gen.min_python)
        if obj.image:
            path, value = f"{where[id(obj)]}.image", image
        elif f"{NAMESPACE}:rayImage" in raw:
            path, value = f"{NAMESPACE}:rayImage", image
        else:
            path = f"{NAMESPACE}:pythonVersion"
            value = raw.get(path, PYTHON_VERSIONS[0])
        problems.bad(
            path,
            value,
            f"an image on Python >= {wanted} (tag -py{wanted.replace('.', '')}) for "
            f"{gen.name} slices",
            f"{obj.name} runs on {gen.name} slice {obj.slice!r}: {gen.runtime_note}; set "
            f"ray-tpu:pythonVersion '{wanted}' and build the Dockerfile with "
            f"--build-arg PYTHON_TAG=py{wanted.replace('.', '')}",
        )


def _check_vllm_images(
    problems: Problems,
    services: list[Any],
    default: str | None,
    ray_version: str | None,
    where: Mapping[int, str],
) -> None:
    """A RayService with ``engine: vllm`` runs an image that says it holds the vllm-tpu Ray's
    Serve LLM was released with, on Python 3.12 (:func:`raytpu.ray_versions.vllm_image_problems`):
    its own ``image``, else the one ``Dockerfile.vllm`` builds for this stack."""
    for service in services:
        if service.engine != "vllm" or not ray_version:
            continue
        image = service.image or default
        path = f"{where[id(service)]}.image"
        fix = (
            "leave image unset to run the image Dockerfile.vllm builds and the deploy workflow "
            "pushes (ray-vllm:<rayVersion>-py312-vllm-tpu<pin>-<imageTag>), or name one tagged so"
        )
        if image is None:
            problems.bad(path, None, "an image with vllm-tpu", f"engine vllm; {fix}")
            continue
        found = vllm_image_problems(image, ray_version)
        if found:
            problems.bad(
                path, image, "an image with the pinned vllm-tpu", f"{'; '.join(found)}; {fix}"
            )


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
            [
                f"{path}: a YAML {type(document).__name__} is not valid; valid: a mapping with config:"
            ]
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
