"""The rules across a stack's sections, each a pure check that adds to :class:`Problems`:
node pool names against the CPU pool, Ray object names, slices against the worker groups on
them, scale-to-zero, images against generations, GKE versions against what the slices need."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from infra.config.gcp_rules import FLEX_START_TPU_GKE_VERSION, gke_version_ok
from infra.config.reader import Problems
from infra.config.schema import NAMESPACE, PYTHON_VERSIONS, ClusterConfig, SliceConfig
from raytpu.ray_versions import image_python, vllm_image_problems


def check_pool_names(
    problems: Problems, cluster: ClusterConfig | None, slices: list[SliceConfig]
) -> None:
    """Every slice's node pools are named apart from the CPU pool and each other."""
    if cluster is None:
        return
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


def check_unique_ray_names(problems: Problems, names: list[tuple[str, Any]]) -> None:
    """A RayService N owns the Services N-head-svc / N-serve-svc as a RayCluster N would: names
    are unique across all kinds (per namespace would do; overall is simpler)."""
    seen: dict[str, str] = {}
    for where, name in names:
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


def check_slice_capacity(problems: Problems, slices: list[SliceConfig], objects: list[Any]) -> None:
    """Each replica of a worker group holds a whole slice: the objects on one slice (a RayJob's
    cluster holds its slices while it runs, so it counts) may not ask for more than it has."""
    for index, slice_cfg in enumerate(slices):
        users = [o for o in objects if o.slice == slice_cfg.name]
        wanted = sum(o.max_replicas for o in users)
        if wanted > slice_cfg.count:
            problems.bad(
                f"{NAMESPACE}:slices[{index}].count",
                slice_cfg.count,
                f"an integer >= {wanted}",
                "the maxReplicas of "
                + ", ".join(o.name for o in users)
                + f" add up to {wanted} slices",
            )


def check_gke_versions(
    problems: Problems, cluster: ClusterConfig | None, slices: list[SliceConfig]
) -> None:
    """The cluster's GKE version runs what the slices need: flex-start TPUs, and generations GKE
    runs only from a given version on (tpu7x: 1.34.0-gke.2201000)."""
    if cluster is None:
        return
    version = cluster.min_master_version
    flex = [s.name for s in slices if s.flex_start]
    if flex and not gke_version_ok(version, FLEX_START_TPU_GKE_VERSION):
        problems.bad(
            f"{NAMESPACE}:cluster.minMasterVersion",
            version,
            f"a GKE version >= {FLEX_START_TPU_GKE_VERSION}",
            f"flex-start TPU slices: {', '.join(flex)}",
        )
    for gen in {s.shape.generation.name: s.shape.generation for s in slices}.values():
        named = [s.name for s in slices if s.shape.generation is gen]
        if gen.min_gke_version and not gke_version_ok(version, gen.min_gke_version):
            problems.bad(
                f"{NAMESPACE}:cluster.minMasterVersion",
                version,
                f"a GKE version >= {gen.min_gke_version}",
                f"{gen.name} slices need it: {', '.join(named)}",
            )


def check_scale_to_zero(
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


def check_runtime(
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


def check_vllm_images(
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


def check_model_sources(
    problems: Problems, services: list[Any], bucket: str | None, where: Mapping[int, str]
) -> None:
    """A ``gs://`` ``llm.modelSource`` is a Hugging Face folder in the stack's own bucket: the
    Ray pods' identity (Workload Identity) reads that bucket and no other, so vLLM would fail
    to download from anywhere else, after the slice was up."""
    for service in services:
        llm = service.llm
        if llm is None or not llm.model_source.startswith("gs://"):
            continue
        path = f"{where[id(service)]}.llm.modelSource"
        found = llm.model_source.removeprefix("gs://").split("/", 1)
        folder = found[1].strip("/") if len(found) > 1 else ""
        valid = f"gs://{bucket}/FOLDER (the stack's bucket; `raytpu train --export-to` writes one)"
        if bucket is None:
            continue  # ray-tpu:storage has its own errors
        if found[0] != bucket or not folder:
            problems.bad(
                path, llm.model_source, valid,
                f"the Ray pods' service account reads only gs://{bucket}" if found[0] != bucket
                else "the folder (config.json, safetensors, tokenizer.json) is missing",
            )  # fmt: skip
