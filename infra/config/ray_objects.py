"""``ray-tpu:rayClusters[]``, ``rayServices[]``, ``rayJobs[]``: the KubeRay objects on the slices.

One common parser for what every kind shares, one parser per kind for its own keys."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import replace
from types import MappingProxyType
from typing import Any

from infra.config.gcp_rules import IMPORT_PATH_RE, RAY_NAME_MAX, image_check
from infra.config.reader import (
    MISSING,
    Problems,
    Section,
    int_range,
    name_check,
    name_valid,
    resources,
)
from infra.config.schema import (
    ENGINES,
    FALLBACK_KINDS,
    LLM_ACCELERATOR_TYPES,
    MAX_SLICE_COUNT,
    NAMESPACE,
    UPGRADE_STRATEGIES,
    LLMEngineConfig,
    RayClusterConfig,
    RayJobConfig,
    RayServiceConfig,
    ServeFallbackConfig,
    SliceConfig,
    WorkerResources,
)
from raytpu.entrypoints import DEFAULT_RUN, LLM_IMPORT_PATH

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
        "engine",
        "llm",
        "fallback",
        "upgradeStrategy",
    )
    s = Section(problems, f"{NAMESPACE}:rayServices[{index}]", raw, keys)
    if not s.ok:
        return None
    common = _parse_ray_common(s, slices, ray_version)
    engine = s.get(
        "engine",
        str,
        "builtin",
        valid=", ".join(ENGINES) + " (vllm: Ray Serve LLM with vLLM's TPU backend)",
        check=lambda v: v in ENGINES,
    )
    vllm = engine == "vllm"
    import_path = s.get(
        "importPath",
        str,
        LLM_IMPORT_PATH if vllm else MISSING,
        valid=f"{LLM_IMPORT_PATH} (engine vllm)"
        if vllm
        else "module:attribute of a Ray Serve application, e.g. workloads.serve:app",
        check=(lambda v: v == LLM_IMPORT_PATH)
        if vllm
        else (lambda v: bool(IMPORT_PATH_RE.match(v))),
    )
    llm = _parse_llm(s, vllm, slices.get(common["slice"]) if common else None)
    fallback = _parse_fallback(s, vllm)
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
    upgrade = s.get(
        "upgradeStrategy",
        str,
        "",
        valid=", ".join(UPGRADE_STRATEGIES) + " (KubeRay's upgradeStrategy.type: None upgrades in "
        "place; NewCluster brings up a second RayCluster, so a second set of slices)",
        check=lambda v: v in UPGRADE_STRATEGIES,
    )
    values = (import_path, app_name, route, runtime_env, run, target, engine, upgrade)
    if common is None or None in values or (vllm and llm is None) or fallback is False:
        return None
    return RayServiceConfig(
        **common,
        import_path=import_path,
        application_name=app_name,
        route_prefix=route,
        runtime_env=MappingProxyType(dict(runtime_env)),
        checkpoint_run=run,
        target_ongoing_requests=float(target),
        engine=engine,
        llm=llm,
        fallback=fallback or None,
        upgrade_strategy=upgrade,  # "" until with_upgrade_defaults: it needs every object
    )


def with_upgrade_defaults(
    services: list[RayServiceConfig],
    others: list[RayClusterConfig],
    slices: Mapping[str, SliceConfig | None],
) -> list[RayServiceConfig]:
    """Each RayService with its ``upgradeStrategy``: as given, else ``NewCluster`` only where its
    slice has ``maxReplicas`` spare slices beside what every object on it may hold (the second
    RayCluster of a blue-green upgrade), else ``None`` (in place: the TPU default)."""
    everyone = [*others, *services]
    resolved = []
    for service in services:
        strategy = service.upgrade_strategy
        if not strategy:
            declared = slices.get(service.slice)
            used = sum(o.max_replicas for o in everyone if o.slice == service.slice)
            spare = (declared.count if declared else 0) - used
            strategy = "NewCluster" if spare >= service.max_replicas else "None"
        resolved.append(replace(service, upgrade_strategy=strategy))
    return resolved


SECRET_REF_RE = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[-._a-zA-Z0-9]+$")
_SECRET_VALID = "name/key of a Kubernetes secret in the RayService's namespace (never the value)"


def _parse_llm(s: Section, vllm: bool, slice_config: SliceConfig | None) -> LLMEngineConfig | None:
    """``llm``: required with ``engine: vllm`` (and only then); single-host serving slice whose
    accelerator Ray Serve LLM knows."""
    raw = s.raw.get("llm")
    if not vllm:
        if raw is not None:
            s.problems.bad(s.sub("llm"), raw, "absent unless engine is vllm")
        return None
    inner = Section(
        s.problems, s.sub("llm"), raw, ("modelId", "modelSource", "maxModelLen", "hfTokenSecret")
    )
    if not inner.ok:
        return None
    model_id = inner.get("modelId", str, valid="a non-empty model name", check=bool)
    source = inner.get(
        "modelSource", str, valid="a Hugging Face repo id (org/name) or a gs:// path", check=bool
    )
    length = inner.get(
        "maxModelLen", int, 4096, valid="an integer 128..131072", check=int_range(128, 131072)
    )
    token = inner.get("hfTokenSecret", str, None, valid=_SECRET_VALID, check=SECRET_REF_RE.match)
    if slice_config is not None:
        shape = slice_config.shape
        if shape.multi_host:
            s.problems.bad(
                s.sub("slice"),
                slice_config.name,
                "a single-host serving slice for engine vllm (tensor parallel over its chips)",
                f"{shape.name} has {shape.hosts} hosts",
            )
            return None
        if shape.ray_accelerator_type not in LLM_ACCELERATOR_TYPES:
            s.problems.bad(
                s.sub("slice"),
                slice_config.name,
                f"a slice whose accelerator Ray Serve LLM accepts: {', '.join(LLM_ACCELERATOR_TYPES)}",
                f"{shape.name} is {shape.ray_accelerator_type}",
            )
            return None
    if None in (model_id, source, length):
        return None
    return LLMEngineConfig(model_id, source, length, token)


def _parse_fallback(s: Section, vllm: bool) -> ServeFallbackConfig | bool | None:
    """``fallback`` (built-in engine only); False when it is present and bad."""
    raw = s.raw.get("fallback")
    if raw is None:
        return None
    if vllm:
        s.problems.bad(s.sub("fallback"), raw, "absent with engine vllm (built-in engine only)")
        return False
    keys = ("kind", "url", "model", "apiKeySecret", "maxAttempts", "timeoutS", "probeAfterS")
    inner = Section(s.problems, s.sub("fallback"), raw, keys)
    if not inner.ok:
        return False
    kind = inner.get(
        "kind",
        str,
        valid=", ".join(FALLBACK_KINDS) + " (an external OpenAI-compatible API, or a CPU "
        "replica of the same model)",
        check=lambda v: v in FALLBACK_KINDS,
    )
    external = kind == "openai"
    url = inner.get(
        "url",
        str,
        MISSING if external else "",
        valid="an https:// URL of an OpenAI-compatible API base (https://host/v1)"
        if external
        else "absent for kind deployment",
        check=(lambda v: v.startswith("https://")) if external else (lambda v: v == ""),
    )
    model = inner.get("model", str, "", valid="the upstream's model name", check=lambda v: True)
    secret = inner.get("apiKeySecret", str, None, valid=_SECRET_VALID, check=SECRET_REF_RE.match)
    attempts = inner.get("maxAttempts", int, 3, valid="an integer 1..10", check=int_range(1, 10))
    timeout = inner.get(
        "timeoutS", (int, float), 30.0, valid="seconds, 1..600", check=lambda v: 1 <= v <= 600
    )
    probe = inner.get(
        "probeAfterS",
        (int, float),
        5.0,
        valid="seconds, 0..600 (0: every request tries the TPU deployment first)",
        check=lambda v: 0 <= v <= 600,
    )
    if None in (kind, url, model, attempts, timeout, probe):
        return False
    return ServeFallbackConfig(kind, url, model, secret, attempts, float(timeout), float(probe))


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
:data:`infra.manifests.ray_kinds.RAY_KINDS`."""
