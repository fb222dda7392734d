"""Pure builders of KubeRay objects (``ray.io/v1``): plain dicts, camelCase as the CRDs want.

No pulumi import: the Pulumi components, the RayJob builder, the policy pack and the tests all use
these, and ``raytpu.crds`` checks their output against the real CRD schemas.

Glossary (KubeRay's and Ray's words):

- **head group**: the Ray head pod (GCS, dashboard, autoscaler). Here it runs on the CPU node pool
  and advertises no CPUs (``num-cpus: 0``) so that no task lands on it.
- **worker group**: pods of one shape. For TPUs one **replica** is one whole slice and
  ``numOfHosts`` is the hosts of that slice: KubeRay creates ``replicas x numOfHosts`` pods, and
  GKE's TPU webhook checks ``numOfHosts`` against the topology node selector.
- **serveConfigV2**: the Ray Serve config (YAML text) a RayService deploys.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import yaml

from infra.config.schema import (
    RayClusterConfig,
    RayServiceConfig,
    ServeFallbackConfig,
    StackConfig,
    WorkerResources,
)
from infra.manifests import ray_auth
from infra.manifests.kueue import workload_labels
from infra.manifests.ray_access import RAY_OBJECT_LABEL
from raytpu.catalog import TPU_RESOURCE, TPU_TAINT_KEY, SliceShape
from raytpu.entrypoints import (
    CHECKPOINT_ENV,
    COMPILATION_CACHE_ENV,
    FALLBACK_KEY_ENV,
    LLM_IMPORT_PATH,
    SERVE_DEPLOYMENT,
    SERVE_FALLBACK_ENV,
    SERVE_IMPORT_PATH,
    SERVE_TPU_ENV,
    checkpoint_uri,
    compilation_cache_uri,
    serve_env,
    slice_env,
)
from raytpu.errors import invalid
from raytpu.ray_names import HEAD_PORTS, ray_start_labels, shape_labels

__all__ = [
    "API_VERSION",
    "NODE_POOL_LABEL",
    "TPU_TOLERATION",
    "head_group",
    "head_service_name",
    "ray_cluster_object",
    "ray_cluster_spec",
    "ray_service_object",
    "ray_service_spec",
    "serve_config_v2",
    "serve_deployment",
    "serve_service_name",
    "tpu_worker_group",
]

API_VERSION = "ray.io/v1"
NODE_POOL_LABEL = "cloud.google.com/gke-nodepool"
"""GKE puts this label (value: the node pool name) on every node; heads select the CPU pool by it."""
TPU_TOLERATION: Mapping[str, str] = {
    "key": TPU_TAINT_KEY,
    "operator": "Exists",
    "effect": "NoSchedule",
}
"""GKE taints TPU nodes ``google.com/tpu=present:NoSchedule``; TPU pods tolerate it."""
TPU_GROUP_NAME = "tpu-group"
MXLA_PORT = 8081
"""Multi-host TPU slices talk over the megascale/XLA port."""
HEAD_ENV: Mapping[str, str] = {"GRPC_ENABLE_FORK_SUPPORT": "0"}
"""On every head: the Ray Client server (the head's client port, which ``raytpu notebook
--stack`` tunnels to) forks a server process per client while its gRPC threads are busy, and
with gRPC's fork handlers on that child sometimes dies at once, empty-handed (Ray issue
ray-project/ray#63202): the client's ``ray.init()`` fails "Starting Ray client server failed".
Seen here in 2 of 4 runs of ``tests/test_notebook_stack.py`` beside another cluster; 0 of 4 with
the handlers off. Ray does not rely on them (it sets nothing)."""


def head_service_name(name: str) -> str:
    """KubeRay's head Service of RayCluster (or RayService) ``name``."""
    return f"{name}-head-svc"


def serve_service_name(name: str) -> str:
    """KubeRay's Serve traffic Service of RayService ``name``."""
    return f"{name}-serve-svc"


def _resources(resources: WorkerResources, tpu_chips: int | None = None) -> dict[str, Any]:
    """Requests == limits (Guaranteed QoS); TPU chips as the ``google.com/tpu`` resource."""
    amounts: dict[str, str] = {"cpu": resources.cpu, "memory": resources.memory}
    if tpu_chips is not None:
        amounts[TPU_RESOURCE] = str(tpu_chips)
    return {"requests": dict(amounts), "limits": dict(amounts)}


def head_group(image: str, resources: WorkerResources, cpu_pool: str) -> dict[str, Any]:
    """The head group: on the CPU node pool ``cpu_pool``, no CPUs offered to Ray tasks, and
    :data:`HEAD_ENV`."""
    return {
        "rayStartParams": {"num-cpus": "0", "dashboard-host": "0.0.0.0"},
        "template": {
            "spec": {
                "nodeSelector": {NODE_POOL_LABEL: cpu_pool},
                "containers": [
                    {
                        "name": "ray-head",
                        "image": image,
                        "imagePullPolicy": "IfNotPresent",
                        "resources": _resources(resources),
                        "ports": [{"name": n, "containerPort": p} for n, p in HEAD_PORTS],
                        "env": [{"name": k, "value": v} for k, v in HEAD_ENV.items()],
                    }
                ],
            }
        },
    }


def tpu_worker_group(
    shape: SliceShape,
    replicas: int,
    image: str,
    *,
    min_replicas: int | None = None,
    max_replicas: int | None = None,
    resources: WorkerResources | None = None,
    group_name: str = TPU_GROUP_NAME,
    env: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """A worker group of ``replicas`` whole slices of ``shape``.

    ``numOfHosts`` = hosts per slice, ``google.com/tpu`` requests == limits == chips per host,
    both TPU node selectors, and the TPU toleration.
    """
    if replicas < 0:
        raise ValueError(invalid("replicas", replicas, "an integer >= 0"))
    low = replicas if min_replicas is None else min_replicas
    high = replicas if max_replicas is None else max_replicas
    if not 0 <= low <= replicas <= high:
        raise ValueError(
            invalid(
                "minReplicas/replicas/maxReplicas",
                f"{low}/{replicas}/{high}",
                "0 <= minReplicas <= replicas <= maxReplicas",
            )
        )
    container: dict[str, Any] = {
        "name": "ray-worker",
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "resources": _resources(
            resources or WorkerResources(cpu="8", memory="32Gi"), shape.chips_per_host
        ),
    }
    if env:
        container["env"] = [{"name": k, "value": v} for k, v in env.items()]
    if shape.multi_host:
        container["ports"] = [{"name": "mxla", "containerPort": MXLA_PORT}]
    return {
        "groupName": group_name,
        "replicas": replicas,
        "minReplicas": low,
        "maxReplicas": high,
        "numOfHosts": shape.hosts,
        # What the autoscaler must know of a host that does not exist yet to add this group
        # for a label-selected slice reservation (the slice name and worker id come per pod).
        "rayStartParams": {"labels": ray_start_labels(shape_labels(shape))},
        "template": {
            "metadata": {
                "labels": {
                    "ray-tpu/generation": shape.generation.name,
                    "ray-tpu/topology": shape.topology,
                }
            },
            "spec": {
                "nodeSelector": dict(shape.node_selector),
                "tolerations": [dict(TPU_TOLERATION)],
                "containers": [container],
            },
        },
    }


def _cluster_spec(
    stack: StackConfig, obj: RayClusterConfig | RayServiceConfig, kind: str, stack_name: str
) -> dict[str, Any]:
    image = stack.image_for(obj)
    shape = stack.slice(obj.slice).shape
    env = [
        {"name": k, "value": v}
        for k, v in slice_env(stack_name, obj.name, obj.slice, shape).items()
    ]
    if isinstance(obj, RayServiceConfig):
        env += secret_env(obj)
    if stack.storage is not None:
        # Workers and replicas keep JAX's compilations on the bucket: a restarted worker or a
        # new replica loads them instead of compiling (workloads.model.compile_cache).
        env.append(
            {"name": COMPILATION_CACHE_ENV, "value": compilation_cache_uri(stack.storage.bucket)}
        )
    spec = {
        "rayVersion": stack.ray_version,
        "authOptions": ray_auth.auth_options(stack.security.ray_auth, kind, obj.name),
        "enableInTreeAutoscaling": obj.min_replicas != obj.max_replicas,
        "headGroupSpec": head_group(image, obj.head, stack.cluster.cpu_pool.name),
        "workerGroupSpecs": [
            tpu_worker_group(
                shape,
                obj.replicas,
                image,
                min_replicas=obj.min_replicas,
                max_replicas=obj.max_replicas,
                resources=obj.worker,
            )
        ],
    }
    for group in (spec["headGroupSpec"], *spec["workerGroupSpecs"]):
        metadata = group["template"].setdefault("metadata", {})
        metadata.setdefault("labels", {})[RAY_OBJECT_LABEL] = obj.name
        pod = group["template"]["spec"]
        if stack.storage is not None:
            # Workload Identity: the pods act as this ServiceAccount towards GCS (the bucket).
            pod["serviceAccountName"] = stack.storage.service_account
        for container in pod["containers"]:
            container["env"] = [*container.get("env", []), *env]
    return spec


def ray_cluster_spec(
    stack: StackConfig, cluster: RayClusterConfig, kind: str = "RayCluster", stack_name: str = ""
) -> dict[str, Any]:
    """``spec`` of the Ray cluster of ``cluster`` (a RayCluster's, or a RayJob's with
    ``kind="RayJob"``): head on the CPU pool, one TPU worker group, token authentication, the
    stack's ServiceAccount and the slice's environment (``RAYTPU_STACK``, ``RAYTPU_SLICE``...)
    on every pod."""
    return _cluster_spec(stack, cluster, kind, stack_name)


def serve_deployment(stack: StackConfig, service: RayServiceConfig) -> dict[str, Any]:
    """The Serve config of ``workloads.serve:app``'s deployment: one replica per serving host,
    between the RayService's ``minReplicas`` and ``maxReplicas`` slices.

    When they differ, ``num_replicas: auto`` with an ``autoscaling_config`` (Serve refuses an
    integer ``num_replicas`` beside an ``autoscaling_config``; ``auto`` lets the config's
    bounds replace the code's ``num_replicas``); Ray's in-tree autoscaler then adds or removes
    worker group replicas (slices) for the replicas Serve asks for.
    """
    hosts = stack.slice(service.slice).shape.hosts
    deployment: dict[str, Any] = {"name": SERVE_DEPLOYMENT}
    if service.min_replicas == service.max_replicas:
        deployment["num_replicas"] = service.replicas * hosts
        return deployment
    deployment["num_replicas"] = "auto"
    deployment["autoscaling_config"] = {
        "min_replicas": service.min_replicas * hosts,
        "initial_replicas": service.replicas * hosts,
        "max_replicas": service.max_replicas * hosts,
        "target_ongoing_requests": service.target_ongoing_requests,
    }
    return deployment


def serve_config_v2(stack: StackConfig, service: RayServiceConfig) -> str:
    """The Serve config of ``service`` as YAML text (what ``serveConfigV2`` holds).

    The application's ``runtime_env`` carries the serving slice's chips per host
    (``RAYTPU_SERVE_TPU_PER_REPLICA``) so each replica asks for a whole host, and where the
    checkpoints are (``RAYTPU_CHECKPOINT_DIR`` = ``gs://<bucket>/<checkpointRun>``); the
    stack's own ``runtimeEnv.env_vars`` come on top. For ``workloads.serve:app`` the
    ``TextGenerator`` deployment's replicas follow the RayService's replica bounds
    (:func:`serve_deployment`).
    """
    runtime_env = plain(service.runtime_env) if service.runtime_env else {}
    env_vars = serve_env(stack.slice(service.slice).shape)
    if stack.storage is not None:
        env_vars[CHECKPOINT_ENV] = checkpoint_uri(stack.storage.bucket, service.checkpoint_run)
    env_vars.update(runtime_env.get("env_vars", {}))
    app: dict[str, Any] = {
        "name": service.application_name,
        "import_path": service.import_path,
        "route_prefix": service.route_prefix,
        "runtime_env": {**runtime_env, "env_vars": env_vars},
    }
    if service.import_path == SERVE_IMPORT_PATH:
        app["deployments"] = [serve_deployment(stack, service)]
    if service.fallback is not None:
        env_vars[SERVE_FALLBACK_ENV] = json.dumps(fallback_env(service.fallback), sort_keys=True)
    if service.engine == "vllm":
        app = llm_application(stack, service, app)
    return yaml.safe_dump({"applications": [app]}, sort_keys=False)


def fallback_env(fallback: ServeFallbackConfig) -> dict[str, Any]:
    """``workloads.serving.fallback.FallbackConfig``'s fields for ``RAYTPU_SERVE_FALLBACK``: the key is
    not among them (``RAYTPU_FALLBACK_API_KEY`` comes from the secret, :func:`secret_env`)."""
    return {
        "kind": fallback.kind,
        "url": fallback.url,
        "model": fallback.model,
        "api_key_env": FALLBACK_KEY_ENV if fallback.api_key_secret else "",
        "max_attempts": fallback.max_attempts,
        "timeout_s": fallback.timeout_s,
        "probe_after_s": fallback.probe_after_s,
    }


def llm_application(
    stack: StackConfig, service: RayServiceConfig, app: dict[str, Any]
) -> dict[str, Any]:
    """The production engine path: Ray Serve LLM's OpenAI app (``build_openai_app``) with one
    ``LLMConfig``: vLLM on the serving slice's accelerator, tensor parallel over all its chips,
    automatic prefix caching on, one replica per slice between the RayService's bounds."""
    llm = service.llm
    if llm is None:
        raise ValueError(f"rayServices {service.name}: engine vllm without llm settings")
    shape = stack.slice(service.slice).shape
    config = {
        "model_loading_config": {"model_id": llm.model_id, "model_source": llm.model_source},
        "accelerator_type": shape.ray_accelerator_type,
        "deployment_config": {
            "autoscaling_config": {
                "min_replicas": service.min_replicas,
                "initial_replicas": service.replicas,
                "max_replicas": service.max_replicas,
                "target_ongoing_requests": service.target_ongoing_requests,
            }
        },
        "engine_kwargs": {
            "tensor_parallel_size": shape.chips,
            "enable_prefix_caching": True,
            "max_model_len": llm.max_model_len,
        },
    }
    runtime_env = {**app["runtime_env"]}
    runtime_env["env_vars"] = {
        k: v for k, v in runtime_env["env_vars"].items() if k not in (SERVE_TPU_ENV, CHECKPOINT_ENV)
    }
    return {
        "name": app["name"],
        "import_path": LLM_IMPORT_PATH,
        "route_prefix": app["route_prefix"],
        "runtime_env": runtime_env,
        "args": {"llm_configs": [config]},
    }


def secret_env(service: RayServiceConfig) -> list[dict[str, Any]]:
    """Pod environment filled from Kubernetes secrets: the fallback's API key, the Hugging Face
    token of a gated model. Only names are in the manifest, never a value."""
    refs = []
    if service.fallback is not None and service.fallback.api_key_secret:
        refs.append((FALLBACK_KEY_ENV, service.fallback.api_key_secret))
    if service.llm is not None and service.llm.hf_token_secret:
        refs.append(("HF_TOKEN", service.llm.hf_token_secret))
    env = []
    for name, ref in refs:
        secret, key = ref.split("/", 1)
        env.append({"name": name, "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}})
    return env


def ray_service_spec(
    stack: StackConfig, service: RayServiceConfig, stack_name: str = ""
) -> dict[str, Any]:
    """``spec`` of the RayService ``service``: its Serve config and its RayCluster."""
    return {
        # Explicit, never KubeRay's default (NewCluster): on TPU a second RayCluster is a
        # second set of slices (docs/infra.md, "Upgrades").
        "upgradeStrategy": {"type": service.upgrade_strategy},
        "serveConfigV2": serve_config_v2(stack, service),
        "rayClusterConfig": _cluster_spec(stack, service, "RayService", stack_name),
    }


def _labels(stack: StackConfig, obj: RayClusterConfig | RayServiceConfig) -> dict[str, str]:
    return {
        "app.kubernetes.io/managed-by": "pulumi",
        "app.kubernetes.io/part-of": "ray-tpu",
        "ray-tpu/slice": obj.slice,
        "ray-tpu/cluster": stack.cluster.name,
        **workload_labels(stack, obj),  # a team's queue and priority (Kueue)
    }


def metadata(stack: StackConfig, obj: RayClusterConfig | RayServiceConfig) -> dict[str, Any]:
    return {"name": obj.name, "namespace": obj.namespace, "labels": _labels(stack, obj)}


def ray_cluster_object(
    stack: StackConfig, cluster: RayClusterConfig, stack_name: str = ""
) -> dict[str, Any]:
    """The whole RayCluster manifest (apiVersion, kind, metadata, spec)."""
    return {
        "apiVersion": API_VERSION,
        "kind": "RayCluster",
        "metadata": metadata(stack, cluster),
        "spec": ray_cluster_spec(stack, cluster, stack_name=stack_name),
    }


def ray_service_object(
    stack: StackConfig, service: RayServiceConfig, stack_name: str = ""
) -> dict[str, Any]:
    """The whole RayService manifest (apiVersion, kind, metadata, spec)."""
    return {
        "apiVersion": API_VERSION,
        "kind": "RayService",
        "metadata": metadata(stack, service),
        "spec": ray_service_spec(stack, service, stack_name),
    }


def plain(value: Any) -> Any:
    """Read-only mappings (config is frozen) back to dicts, for YAML and the engine."""
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return value
