"""Ray Serve application: text generation from the latest training checkpoint, JSON over HTTP.

Glossary (Ray Serve's words):

- **application**: a bound deployment graph; ``app`` below is what the stack's RayService imports
  (``import_path: workloads.serve:app``).
- **deployment / replica**: :class:`workloads.serving.replica.TextGenerator`, one per TPU host
  of the serving slice; with a fallback, a :class:`workloads.serving.router.Router` in front.
- **autoscaling**: the replica count is not fixed here; a RayService's ``serveConfigV2`` sets
  the deployment's ``autoscaling_config`` (min/max replicas from the stack), and
  :func:`build_app` takes one for local use.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from typing import Any

from ray import serve

from raytpu.catalog import RAY_TPU_REQUEST_SIZES, SliceShape
from raytpu.entrypoints import CHECKPOINT_ENV, SERVE_FALLBACK_ENV, SERVE_TPU_DEFAULT
from raytpu.entrypoints import SERVE_TPU_ENV as TPU_ENV
from raytpu.errors import invalid
from raytpu.ray_names import LABEL_POD_TYPE, LABEL_TOPOLOGY
from workloads import ray_compat, telemetry
from workloads.serving.fallback import FallbackConfig
from workloads.serving.replica import ServeOptions, TextGenerator
from workloads.serving.requests import DEFAULT_CHECKPOINT_DIR


def build_app(
    checkpoint_dir: str,
    shape: SliceShape | None = None,
    *,
    tpu_per_replica: int | None = None,
    num_replicas: int | None = None,
    autoscaling_config: dict[str, Any] | None = None,
    options: ServeOptions | None = None,
    fallback: FallbackConfig | None = None,
    tpu_timeout_s: float = 30.0,
    slice_name: str = "",
) -> Any:
    """The Serve application for ``checkpoint_dir``; replicas request the shape's chips per host.

    Multi-host serving slices are not supported: a replica is one process on one host.
    ``num_replicas`` or ``autoscaling_config`` (Serve's), not both; neither: one replica, or
    what a Serve config (a RayService's ``serveConfigV2``) sets for the ``TextGenerator``
    deployment. ``options``: batching, prefix cache and queue bound (:class:`ServeOptions`).
    With a ``fallback`` the ingress is a :class:`workloads.serving.router.Router` in front of the
    TPU deployment that sends what it cannot take to the fallback (:mod:`workloads.serving.fallback`);
    ``deployment`` fallbacks are a CPU ``TextGenerator`` of the same checkpoint. The router's
    series carry ``shape``'s labels and ``slice_name`` (default: :func:`telemetry.slice_label`
    here), since it may run on any node; without a shape, its own host's.
    """
    if num_replicas is not None and autoscaling_config is not None:
        raise ValueError(
            "num_replicas and autoscaling_config: both given; valid: one of them "
            "(autoscaling_config's min_replicas/max_replicas bound the replica count)"
        )
    if shape is not None and shape.multi_host:
        raise ValueError(
            invalid(
                "serve slice", shape.name, "a single-host shape (one replica runs on one TPU host)"
            )
        )
    tpu = tpu_per_replica or (shape.chips_per_host if shape else SERVE_TPU_DEFAULT)
    actor_options: dict[str, Any] = {"resources": {"TPU": tpu}, "num_cpus": 0}
    if shape is not None:
        # Only hosts of the serving slice's shape: in a cluster that also has training slices
        # of the same chip count, TPU alone would not keep replicas off them.
        actor_options.update(
            ray_compat.label_selector_options(
                {LABEL_POD_TYPE: shape.pod_type, LABEL_TOPOLOGY: shape.topology}
            )
        )
    deployment_options: dict[str, Any] = {"ray_actor_options": actor_options}
    if num_replicas is not None:
        deployment_options["num_replicas"] = num_replicas
    if autoscaling_config is not None:
        deployment_options["autoscaling_config"] = autoscaling_config
    options = options or ServeOptions()
    tpu_app = TextGenerator.options(**deployment_options).bind(checkpoint_dir, options)
    if fallback is None:
        return tpu_app
    from workloads.serving.router import Router

    cpu_app = None
    if fallback.kind == "deployment":
        cpu_options = ServeOptions(**{**options.__dict__, "served_by": "fallback-cpu"})
        cpu_app = TextGenerator.options(
            name="CpuTextGenerator", num_replicas=1, ray_actor_options={"num_cpus": 1}
        ).bind(checkpoint_dir, cpu_options)
    labels = telemetry.labels_for(shape, slice_name) if shape is not None else None
    return Router.bind(tpu_app, fallback, cpu_app, options.model_name, tpu_timeout_s, labels)


def _app_from_env() -> Any:
    tpu = os.environ.get(TPU_ENV, str(SERVE_TPU_DEFAULT))
    if not tpu.isdigit() or int(tpu) not in RAY_TPU_REQUEST_SIZES:
        raise ValueError(invalid(TPU_ENV, tpu, RAY_TPU_REQUEST_SIZES))
    return build_app(
        os.environ.get(CHECKPOINT_ENV, DEFAULT_CHECKPOINT_DIR),
        tpu_per_replica=int(tpu),
        fallback=fallback_from_env(os.environ.get(SERVE_FALLBACK_ENV, "")),
    )


def fallback_from_env(text: str) -> FallbackConfig | None:
    """``RAYTPU_SERVE_FALLBACK`` (JSON of :class:`FallbackConfig`'s fields, from the stack's
    ``rayServices[].fallback``); empty: no fallback."""
    if not text:
        return None
    try:
        fields = json.loads(text)
    except ValueError as error:
        raise ValueError(
            f"{SERVE_FALLBACK_ENV}: not valid JSON ({error}); valid: an object"
        ) from None
    if not isinstance(fields, dict):
        raise ValueError(invalid(SERVE_FALLBACK_ENV, text, "a JSON object"))
    known = set(FallbackConfig.__dataclass_fields__)
    unknown = sorted(set(fields) - known)
    if unknown:
        raise ValueError(
            f"{SERVE_FALLBACK_ENV}.{unknown[0]}: unknown; valid: {', '.join(sorted(known))}"
        )
    return FallbackConfig(**fields)


app = _app_from_env()
"""``workloads.serve:app``: the RayService import path. Configure with RAYTPU_CHECKPOINT_DIR and
RAYTPU_SERVE_TPU_PER_REPLICA in the RayService's runtime_env (the Pulumi program sets the latter
from the serving slice)."""


# ---------------------------------------------------------------- driver side: deploy and call
@dataclass(frozen=True)
class ServeHandle:
    url: str
    name: str
    deploy_s: float


def deploy(
    application: Any,
    *,
    port: int,
    name: str = "generate",
    route_prefix: str = "/generate",
    timeout_s: float = 120.0,
) -> ServeHandle:
    """Start Serve (proxy on the head only, HTTP on 127.0.0.1:``port``) and run ``application``.

    Waits at most ``timeout_s`` for it to be RUNNING; on failure or timeout deletes it and raises
    ``TimeoutError`` / ``RuntimeError`` with Serve's status message.
    """
    from ray.serve.api import RunTarget, _run_many

    began = time.monotonic()
    serve.start(
        proxy_location="HeadOnly",
        http_options={"host": "127.0.0.1", "port": port, "request_timeout_s": 60},
    )
    _run_many(
        [RunTarget(target=application, name=name, route_prefix=route_prefix)],
        wait_for_ingress_deployment_creation=False,
        wait_for_applications_running=False,
    )
    last = ""
    while time.monotonic() - began < timeout_s:
        status = serve.status().applications.get(name)
        state = str(status.status) if status else "NOT_STARTED"
        if state.endswith("RUNNING"):
            return ServeHandle(
                url=f"http://127.0.0.1:{port}{route_prefix}",
                name=name,
                deploy_s=time.monotonic() - began,
            )
        if state.endswith("DEPLOY_FAILED"):
            message = status.message if status else ""
            serve.delete(name)
            raise RuntimeError(f"serve application {name!r} failed to deploy: {message}")
        last = f"{state}: {status.message if status else ''}"
        time.sleep(0.5)
    serve.delete(name, _blocking=False)
    raise TimeoutError(f"serve application {name!r} not RUNNING after {timeout_s:.0f} s ({last})")


def shutdown() -> None:
    """Delete every application and the Serve system actors."""
    serve.shutdown()
