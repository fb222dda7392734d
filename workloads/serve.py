"""Ray Serve application: text generation from the latest training checkpoint, JSON over HTTP.

Glossary (Ray Serve's words):

- **application**: a bound deployment graph; ``app`` below is what the stack's RayService imports
  (``import_path: workloads.serve:app``).
- **deployment / replica**: :class:`TextGenerator`; each replica is a Ray actor that requests the
  serving slice's TPU (``ray_actor_options={"resources": {"TPU": chips per host}}``), so it lands
  on a TPU host of the single-host serving slice, loads the latest Orbax checkpoint there and
  keeps the parameters on that host's devices.
- **dynamic batching**: ``@serve.batch`` gathers concurrent requests into one forward pass.

Request: ``POST`` JSON ``{"prompt": str, "max_new_tokens": int, "temperature": float}``.
Response: JSON with ``completion``. Malformed input gets a 4xx with a message, never a 500.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import time
from dataclasses import dataclass
from typing import Any

from ray import serve

from raytpu.catalog import RAY_TPU_REQUEST_SIZES, SliceShape
from raytpu.entrypoints import CHECKPOINT_ENV, SERVE_TPU_DEFAULT
from raytpu.entrypoints import SERVE_TPU_ENV as TPU_ENV
from raytpu.ray_names import LABEL_POD_TYPE, LABEL_TOPOLOGY
from workloads import telemetry

MAX_PROMPT_CHARS = 1000
MAX_NEW_TOKENS = 256
MAX_TEMPERATURE = 2.0
MAX_BODY_BYTES = 16_384
DEFAULT_MAX_NEW_TOKENS = 64
DEFAULT_TEMPERATURE = 0.8
BATCH_WAIT_S = 0.05
BATCH_BUCKETS = (1, 2, 4, 8)
"""Batch sizes a replica runs: ``generate`` compiles once per batch shape, so a batch is padded
up to the next bucket and every bucket is compiled when the replica starts, never on a request."""
MAX_BATCH_SIZE = BATCH_BUCKETS[-1]

DEFAULT_CHECKPOINT_DIR = "/tmp/raytpu/checkpoints"
FIELDS = ("prompt", "max_new_tokens", "temperature")


class RequestError(ValueError):
    """A request the server refuses: HTTP ``status`` and a message naming field and valid values."""

    def __init__(self, status: int, message: str) -> None:
        self.status = status
        super().__init__(message)


@dataclass(frozen=True)
class GenerateRequest:
    prompt: str
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    temperature: float = DEFAULT_TEMPERATURE


def parse_request(body: bytes) -> GenerateRequest:
    """Validate a request body; raises :class:`RequestError` (400, 413 or 422)."""
    if len(body) > MAX_BODY_BYTES:
        raise RequestError(413, f"body: {len(body)} bytes is too large; valid: <= {MAX_BODY_BYTES}")
    try:
        raw = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise RequestError(400, f"body: not valid JSON ({error})") from error
    if not isinstance(raw, dict):
        raise RequestError(400, f"body: a JSON {type(raw).__name__} is not valid; valid: an object")
    unknown = sorted(set(raw) - set(FIELDS))
    if unknown:
        raise RequestError(422, f"{unknown[0]}: unknown field; valid: {', '.join(FIELDS)}")
    prompt = raw.get("prompt")
    if not isinstance(prompt, str):
        raise RequestError(422, f"prompt: {prompt!r} is not valid; valid: a non-empty string")
    if not prompt.strip():
        raise RequestError(422, "prompt: empty prompt is not valid; valid: a non-empty string")
    if len(prompt) > MAX_PROMPT_CHARS:
        raise RequestError(
            413, f"prompt: {len(prompt)} characters is too long; valid: <= {MAX_PROMPT_CHARS}"
        )
    tokens = raw.get("max_new_tokens", DEFAULT_MAX_NEW_TOKENS)
    if isinstance(tokens, bool) or not isinstance(tokens, int) or not 1 <= tokens <= MAX_NEW_TOKENS:
        raise RequestError(
            422, f"max_new_tokens: {tokens!r} is not valid; valid: an integer 1..{MAX_NEW_TOKENS}"
        )
    temperature = raw.get("temperature", DEFAULT_TEMPERATURE)
    if (
        isinstance(temperature, bool)
        or not isinstance(temperature, int | float)
        or not math.isfinite(temperature)
        or not 0.0 <= temperature <= MAX_TEMPERATURE
    ):
        raise RequestError(
            422,
            f"temperature: {temperature!r} is not valid; valid: a number 0..{MAX_TEMPERATURE:g}",
        )
    return GenerateRequest(prompt=prompt, max_new_tokens=tokens, temperature=float(temperature))


PAD_REQUEST = GenerateRequest(prompt=" ", max_new_tokens=1, temperature=0.0)


def pad_to_bucket(requests: list[GenerateRequest]) -> list[GenerateRequest]:
    """``requests`` followed by one-token filler rows, up to the next size in BATCH_BUCKETS."""
    if not 1 <= len(requests) <= MAX_BATCH_SIZE:
        raise ValueError(f"batch size: {len(requests)} is not valid; valid: 1..{MAX_BATCH_SIZE}")
    size = next(b for b in BATCH_BUCKETS if b >= len(requests))
    return [*requests, *[PAD_REQUEST] * (size - len(requests))]


@serve.deployment(max_ongoing_requests=32, health_check_timeout_s=30)
class TextGenerator:
    """One replica: the latest checkpoint on this host's devices, batched generation."""

    def __init__(self, checkpoint_dir: str) -> None:
        import jax  # noqa: F401  (imported in the replica, never in the driver)

        from workloads.checkpoint import restore_params

        self._params, self._cfg, self._step = restore_params(checkpoint_dir)
        self._checkpoint_dir = checkpoint_dir
        self._calls = 0
        # Compile the forward pass for every batch bucket now, not on a request.
        for size in BATCH_BUCKETS:
            self._run([PAD_REQUEST] * size)

    def _run(self, requests: list[GenerateRequest]) -> list[str]:
        from workloads.model import generate

        self._calls += 1
        batch = pad_to_bucket(requests)
        completions = generate(
            self._params,
            self._cfg,
            [r.prompt for r in batch],
            [r.max_new_tokens for r in batch],
            [r.temperature for r in batch],
            seed=self._calls,
        )
        return completions[: len(requests)]

    @serve.batch(max_batch_size=MAX_BATCH_SIZE, batch_wait_timeout_s=BATCH_WAIT_S)
    async def generate_batch(self, requests: list[GenerateRequest]) -> list[dict[str, Any]]:
        began = time.monotonic()
        completions = await asyncio.to_thread(self._run, requests)
        compute_ms = (time.monotonic() - began) * 1000
        tokens = max(r.max_new_tokens for r in requests)
        telemetry.of(self).batch(len(requests), compute_ms / 1000, tokens)
        return [
            {
                "prompt": r.prompt,
                "completion": text,
                "max_new_tokens": r.max_new_tokens,
                "temperature": r.temperature,
                "checkpoint_step": self._step,
                "host": os.environ.get("TPU_NAME", ""),
                "batch_size": len(requests),
                "compute_ms": round(compute_ms, 1),
            }
            for r, text in zip(requests, completions, strict=True)
        ]

    @telemetry.instrument_http
    async def __call__(self, request: Any) -> Any:
        from starlette.responses import JSONResponse

        if request.method != "POST":
            return JSONResponse(
                {"error": f"method: {request.method} is not valid; valid: POST"}, status_code=405
            )
        try:
            parsed = parse_request(await request.body())
        except RequestError as error:
            return JSONResponse({"error": str(error)}, status_code=error.status)
        return JSONResponse(await self.generate_batch(parsed))


def build_app(
    checkpoint_dir: str,
    shape: SliceShape | None = None,
    *,
    tpu_per_replica: int | None = None,
    num_replicas: int = 1,
) -> Any:
    """The Serve application for ``checkpoint_dir``; replicas request the shape's chips per host.

    Multi-host serving slices are not supported: a replica is one process on one host.
    """
    if shape is not None and shape.multi_host:
        raise ValueError(
            f"serve slice: {shape.name} is not valid; valid: a single-host shape "
            "(one replica runs on one TPU host)"
        )
    tpu = tpu_per_replica or (shape.chips_per_host if shape else SERVE_TPU_DEFAULT)
    actor_options: dict[str, Any] = {"resources": {"TPU": tpu}, "num_cpus": 0}
    if shape is not None:
        # Only hosts of the serving slice's shape: in a cluster that also has training slices
        # of the same chip count, TPU alone would not keep replicas off them.
        actor_options["label_selector"] = {
            LABEL_POD_TYPE: shape.pod_type,
            LABEL_TOPOLOGY: shape.topology,
        }
    return TextGenerator.options(num_replicas=num_replicas, ray_actor_options=actor_options).bind(
        checkpoint_dir
    )


def _app_from_env() -> Any:
    tpu = os.environ.get(TPU_ENV, str(SERVE_TPU_DEFAULT))
    if not tpu.isdigit() or int(tpu) not in RAY_TPU_REQUEST_SIZES:
        valid = ", ".join(str(n) for n in RAY_TPU_REQUEST_SIZES)
        raise ValueError(f"{TPU_ENV}: {tpu!r} is not valid; valid: {valid}")
    return build_app(
        os.environ.get(CHECKPOINT_ENV, DEFAULT_CHECKPOINT_DIR), tpu_per_replica=int(tpu)
    )


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
