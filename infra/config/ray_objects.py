"""``ray-tpu:rayClusters[]``, ``rayServices[]``, ``rayJobs[]``: the KubeRay objects on the slices.

One common parser for what every kind shares, one parser per kind for its own keys."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from infra.config.reader import Problems, Section, int_range, name_check, name_valid, resources
from infra.config.schema import (
    MAX_SLICE_COUNT,
    NAMESPACE,
    RayClusterConfig,
    RayJobConfig,
    RayServiceConfig,
    SliceConfig,
    WorkerResources,
)
from infra.config.values import IMPORT_PATH_RE, RAY_NAME_MAX, image_check
from raytpu.entrypoints import DEFAULT_RUN

RUN_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
"""A run name is one object-name segment: gs://BUCKET/<run>."""
DEFAULT_TARGET_ONGOING_REQUESTS = 8.0
"""A quarter of TextGenerator's max_ongoing_requests (32): a replica's batches fill before the
autoscaler asks for another host."""

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
    "team",
    "priority",
)
_DEFAULT_HEAD = WorkerResources(cpu="2", memory="8Gi")
_DEFAULT_WORKER = WorkerResources(cpu="8", memory="32Gi")


def _parse_ray_common(
    s: Section,
    slices: Mapping[str, SliceConfig | None],
    ray_version: str | None,
) -> dict[str, Any] | None:
    problems = s.problems
    name = s.get("name", str, valid=name_valid(RAY_NAME_MAX), check=name_check(RAY_NAME_MAX))
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
        check=int_range(0, available),
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
    namespace = s.get("namespace", str, "ray", valid=name_valid(63), check=name_check(63))
    image = s.raw.get("image")
    if image is not None and not image_check(problems, s.sub("image"), image, ray_version):
        image = False
    head = resources(s, "head", _DEFAULT_HEAD)
    worker = resources(s, "worker", _DEFAULT_WORKER)
    # Checked against ray-tpu:teams / priorityClasses in infra.config.teams.
    team = s.get("team", str, None, valid=name_valid(40), check=name_check(40))
    priority = s.get("priority", str, None, valid=name_valid(63), check=name_check(63))
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
        "team": team,
        "priority": priority,
    }


def _runtime_env(s: Section) -> dict[str, Any] | None:
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


def parse_ray_cluster(
    problems: Problems,
    index: int,
    raw: Any,
    slices: Mapping[str, SliceConfig | None],
    ray_version: str | None,
) -> RayClusterConfig | None:
    s = Section(problems, f"{NAMESPACE}:rayClusters[{index}]", raw, _RAY_OBJECT_KEYS)
    if not s.ok:
        return None
    common = _parse_ray_common(s, slices, ray_version)
    return RayClusterConfig(**common) if common else None


def parse_ray_service(
    problems: Problems,
    index: int,
    raw: Any,
    slices: Mapping[str, SliceConfig | None],
    ray_version: str | None,
) -> RayServiceConfig | None:
    keys = (
        *_RAY_OBJECT_KEYS,
        "importPath",
        "applicationName",
        "routePrefix",
        "runtimeEnv",
        "checkpointRun",
        "targetOngoingRequests",
    )
    s = Section(problems, f"{NAMESPACE}:rayServices[{index}]", raw, keys)
    if not s.ok:
        return None
    common = _parse_ray_common(s, slices, ray_version)
    import_path = s.get(
        "importPath",
        str,
        valid="module:attribute of a Ray Serve application, e.g. workloads.serve:app",
        check=lambda v: bool(IMPORT_PATH_RE.match(v)),
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
    run = s.get(
        "checkpointRun",
        str,
        DEFAULT_RUN,
        valid="a training run name: its checkpoints are gs://<ray-tpu:storage.bucket>/<run> "
        "(raytpu submit train --run NAME; default: the RayCluster's name)",
        check=lambda v: bool(RUN_RE.match(v)),
    )
    target = s.get(
        "targetOngoingRequests",
        (int, float),
        DEFAULT_TARGET_ONGOING_REQUESTS,
        valid="a number > 0 and <= 32 (the deployment's max_ongoing_requests): requests in "
        "flight per Serve replica the autoscaler aims for",
        check=lambda v: 0 < v <= 32,
    )
    if common is None or None in (import_path, app_name, route, runtime_env, run, target):
        return None
    return RayServiceConfig(
        **common,
        import_path=import_path,
        application_name=app_name,
        route_prefix=route,
        runtime_env=MappingProxyType(dict(runtime_env)),
        checkpoint_run=run,
        target_ongoing_requests=float(target),
    )


def parse_ray_job(
    problems: Problems,
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
    s = Section(problems, f"{NAMESPACE}:rayJobs[{index}]", raw, keys)
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
        "ttlSecondsAfterFinished", int, 600, valid="an integer >= 0", check=int_range(0, 10**7)
    )
    deadline = s.get(
        "activeDeadlineSeconds", int, 0, valid="an integer >= 1", check=int_range(1, 10**8)
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


SECTIONS = (
    ("rayClusters", parse_ray_cluster),
    ("rayServices", parse_ray_service),
    ("rayJobs", parse_ray_job),
)
"""Each KubeRay kind's key under ``ray-tpu:`` and its parser, in the order of
:data:`infra.ray_kinds.RAY_KINDS`."""
