"""Ray Serve application: text generation from the latest training checkpoint, JSON over HTTP.

Glossary (Ray Serve's words):

- **application**: a bound deployment graph; ``app`` below is what the stack's RayService imports
  (``import_path: workloads.serve:app``).
- **deployment / replica**: :class:`TextGenerator`; each replica is a Ray actor that requests the
  serving slice's TPU (``ray_actor_options={"resources": {"TPU": chips per host}}``), so it lands
  on a TPU host of the single-host serving slice, loads the latest Orbax checkpoint there
  (``gs://`` on GKE) and keeps the parameters replicated on every chip of that host.
- **mesh**: a 1-D mesh (axis ``data``) over the replica's local devices; a batch's rows are
  split over it, so every chip of the host computes (:meth:`TextGenerator.describe` shows it).
- **autoscaling**: the replica count is not fixed here; a RayService's ``serveConfigV2`` sets
  the deployment's ``autoscaling_config`` (min/max replicas from the stack), and
  :func:`build_app` takes one for local use.
- **dynamic batching**: ``@serve.batch`` gathers concurrent requests into one forward pass.

Request: ``POST`` JSON ``{"prompt": str, "max_new_tokens": int, "temperature": float}``.
Response: JSON with ``completion``. Malformed input gets a 4xx with a message, never a 500.

Per-request isolation: a request is read (at most MAX_BODY_BYTES), parsed (at most
MAX_BODY_DEPTH levels), validated and encoded (the prompt's UTF-8 bytes, the reply's JSON) on
its own, before it joins a batch; a request that fails any of that is answered alone with its
4xx. Should a batch still fail in the model, each of its requests is run again on its own, so
that one bad row answers only its own request.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ray import serve

from raytpu import inputs
from raytpu.catalog import RAY_TPU_REQUEST_SIZES, SliceShape
from raytpu.entrypoints import CHECKPOINT_ENV, SERVE_TPU_DEFAULT
from raytpu.entrypoints import SERVE_TPU_ENV as TPU_ENV
from raytpu.ray_names import LABEL_POD_TYPE, LABEL_TOPOLOGY
from workloads import telemetry

MAX_PROMPT_CHARS = 1000
MAX_NEW_TOKENS = 256
MAX_TEMPERATURE = 2.0
MAX_BODY_BYTES = 16_384
MAX_BODY_DEPTH = 8
"""Nesting of the request JSON: the valid body is one flat object (depth 1)."""
DEFAULT_MAX_NEW_TOKENS = 64
DEFAULT_TEMPERATURE = 0.8
BATCH_WAIT_S = 0.05
BATCH_BUCKETS = (1, 2, 4, 8)
"""Batch sizes a replica runs on one device: ``generate`` compiles once per batch shape, so a batch
is padded up to the next bucket and every bucket is compiled when the replica starts, never on a
request. On ``n`` devices the buckets are the multiples of ``n`` (:func:`batch_buckets`)."""
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
    """Validate a request body; raises :class:`RequestError` (400, 413 or 422).

    Bounded in time and memory whatever the body: size first, then UTF-8, then a nesting scan
    before any recursive parsing.
    """
    if len(body) > MAX_BODY_BYTES:
        raise RequestError(413, f"body: {len(body)} bytes is too large; valid: <= {MAX_BODY_BYTES}")
    limits = inputs.Limits(max_bytes=MAX_BODY_BYTES, max_depth=MAX_BODY_DEPTH)
    try:
        raw = inputs.parse_json(inputs.decode(body, "body"), "body", limits)
    except inputs.InputError as error:  # "body: line L, column C: not valid JSON: ..." etc.
        raise RequestError(400, str(error)) from None
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
    try:
        prompt.encode("utf-8")  # the model reads UTF-8 bytes
    except UnicodeEncodeError as error:
        bad = prompt[error.start]
        raise RequestError(
            422,
            f"prompt: character {error.start} ({bad!a}) is an unpaired surrogate; valid: "
            "Unicode text (a \\ud800-\\udfff escape only as half of a surrogate pair)",
        ) from None
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


@dataclass(frozen=True)
class Reply:
    """One request's answer, already encoded: HTTP status and a JSON body."""

    status: int
    body: bytes


def json_reply(status: int, payload: dict[str, Any]) -> Reply:
    return Reply(status, json.dumps(payload, ensure_ascii=False, allow_nan=False).encode("utf-8"))


def error_reply(status: int, message: str) -> Reply:
    return json_reply(status, {"error": message})


def run_isolated(
    requests: list[GenerateRequest], run: Callable[[list[GenerateRequest]], list[str]]
) -> list[str | Exception]:
    """Completions of ``requests`` as one batch; if the batch fails, each request on its own,
    so that a row the model cannot run fails only its own request (its exception, in its place)."""
    try:
        return list(run(requests))
    except Exception as error:  # isolated per request below, never swallowed
        if len(requests) == 1:
            return [error]
    results: list[str | Exception] = []
    for request in requests:
        try:
            results.append(run([request])[0])
        except Exception as error:  # this row's own failure: answered to its request alone
            results.append(error)
    return results


def render_replies(
    requests: list[GenerateRequest], results: list[str | Exception], extra: dict[str, Any]
) -> list[Reply]:
    """One encoded :class:`Reply` per request; an error in one row answers that request alone."""
    replies = []
    for request, result in zip(requests, results, strict=True):
        if isinstance(result, Exception):
            replies.append(error_reply(500, f"generation failed: {type(result).__name__}"))
            continue
        payload = {
            "prompt": request.prompt,
            "completion": result,
            "max_new_tokens": request.max_new_tokens,
            "temperature": request.temperature,
            **extra,
        }
        try:
            replies.append(json_reply(200, payload))
        except (TypeError, ValueError) as error:
            replies.append(error_reply(500, f"reply could not be encoded: {error}"))
    return replies


PAD_REQUEST = GenerateRequest(prompt=" ", max_new_tokens=1, temperature=0.0)


def batch_buckets(devices: int) -> tuple[int, ...]:
    """Padded batch sizes on ``devices`` devices: each a multiple of ``devices`` (every chip gets
    rows), covering 1..MAX_BATCH_SIZE requests."""
    if devices < 1:
        raise ValueError(f"devices: {devices!r} is not valid; valid: an integer >= 1")
    sizes = {-(-b // devices) * devices for b in BATCH_BUCKETS}
    return tuple(sorted(sizes))


def pad_to_bucket(
    requests: list[GenerateRequest], buckets: tuple[int, ...] = BATCH_BUCKETS
) -> list[GenerateRequest]:
    """``requests`` followed by one-token filler rows, up to the next size in ``buckets``."""
    if not 1 <= len(requests) <= MAX_BATCH_SIZE:
        raise ValueError(f"batch size: {len(requests)} is not valid; valid: 1..{MAX_BATCH_SIZE}")
    size = next(b for b in buckets if b >= len(requests))
    return [*requests, *[PAD_REQUEST] * (size - len(requests))]


@serve.deployment(max_ongoing_requests=32, health_check_timeout_s=30)
class TextGenerator:
    """One replica: the latest checkpoint replicated on every chip of its host, batched generation
    with each batch's rows split over those chips."""

    def __init__(self, checkpoint_dir: str, batch_wait_s: float = BATCH_WAIT_S) -> None:
        # jax is imported in the replica, never in the driver.
        from workloads import model
        from workloads.checkpoint import restore_params

        self.generate_batch.set_batch_wait_timeout_s(batch_wait_s)
        self._mesh = model.local_mesh()
        self._buckets = batch_buckets(self._mesh.size)
        self._params, self._cfg, self._step = restore_params(
            checkpoint_dir, sharding=model.replicated(self._mesh)
        )
        self._checkpoint_dir = checkpoint_dir
        self._calls = 0
        # Compile the forward pass for every batch bucket now, not on a request.
        for size in self._buckets:
            self._run([PAD_REQUEST] * size)

    def _run(self, requests: list[GenerateRequest]) -> list[str]:
        from workloads.decode import generate

        self._calls += 1
        batch = pad_to_bucket(requests, self._buckets)
        completions = generate(
            self._params,
            self._cfg,
            [r.prompt for r in batch],
            [r.max_new_tokens for r in batch],
            [r.temperature for r in batch],
            seed=self._calls,
            mesh=self._mesh,
        )
        return completions[: len(requests)]

    def describe(self) -> dict[str, Any]:
        """Where this replica computes: its local devices, the devices every parameter is on,
        and the sharding of one batch and of its logits, read off the arrays themselves."""
        import jax

        from workloads import decode

        rows = self._buckets[0]
        kv = decode.new_cache(self._cfg, rows, self._mesh)
        ids = [decode.prompt_ids(self._cfg, " ", 1)] * rows
        state = decode.prefill(
            self._params, self._cfg, kv, ids, [0] * rows, [0.0] * rows, 0, self._mesh
        )
        tokens, logits = state.positions, state.logits
        return {
            "local_devices": [str(d) for d in jax.local_devices()],
            "param_devices": sorted(
                {len(leaf.sharding.device_set) for leaf in jax.tree.leaves(self._params)}
            ),
            "batch_rows": rows,
            "batch_devices": len(tokens.sharding.device_set),
            "batch_axes": [str(axis) for axis in tokens.sharding.spec],
            "rows_per_device": sorted({s.data.shape[0] for s in tokens.addressable_shards}),
            "logits_devices": len(logits.sharding.device_set),
            "buckets": list(self._buckets),
        }

    @serve.batch(max_batch_size=MAX_BATCH_SIZE, batch_wait_timeout_s=BATCH_WAIT_S)
    async def generate_batch(self, requests: list[GenerateRequest]) -> list[Reply]:
        began = time.monotonic()
        results = await asyncio.to_thread(run_isolated, requests, self._run)
        compute_s = time.monotonic() - began
        tokens = max(r.max_new_tokens for r in requests)
        telemetry.of(self).batch(len(requests), compute_s, tokens)
        extra = {
            "checkpoint_step": self._step,
            "host": os.environ.get("TPU_NAME", ""),
            "batch_size": len(requests),
            "compute_ms": round(compute_s * 1000, 1),
        }
        return render_replies(requests, results, extra)

    @telemetry.instrument_http
    async def __call__(self, request: Any) -> Any:
        from starlette.responses import Response

        reply = await self._answer(request)
        return Response(reply.body, status_code=reply.status, media_type="application/json")

    async def _answer(self, request: Any) -> Reply:
        if request.method != "POST":
            return error_reply(405, f"method: {request.method} is not valid; valid: POST")
        try:
            body = await read_body(request)
            parsed = parse_request(body)
        except RequestError as error:
            return error_reply(error.status, str(error))
        return await self.generate_batch(parsed)


async def read_body(request: Any) -> bytes:
    """The body, read no further than MAX_BODY_BYTES + 1 (a 1 GB body is refused, not buffered)."""
    declared = request.headers.get("content-length", "")
    if declared.isascii() and declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise RequestError(413, f"body: {declared} bytes is too large; valid: <= {MAX_BODY_BYTES}")
    chunks, size = [], 0
    async for chunk in request.stream():
        chunks.append(chunk)
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise RequestError(
                413, f"body: more than {MAX_BODY_BYTES} bytes; valid: <= {MAX_BODY_BYTES}"
            )
    return b"".join(chunks)


def build_app(
    checkpoint_dir: str,
    shape: SliceShape | None = None,
    *,
    tpu_per_replica: int | None = None,
    num_replicas: int | None = None,
    autoscaling_config: dict[str, Any] | None = None,
    batch_wait_s: float = BATCH_WAIT_S,
) -> Any:
    """The Serve application for ``checkpoint_dir``; replicas request the shape's chips per host.

    Multi-host serving slices are not supported: a replica is one process on one host.
    ``num_replicas`` or ``autoscaling_config`` (Serve's), not both; neither: one replica, or
    what a Serve config (a RayService's ``serveConfigV2``) sets for the ``TextGenerator``
    deployment. ``batch_wait_s``: how long a batch waits for more requests
    (``@serve.batch``'s ``batch_wait_timeout_s``) unless it fills up first.
    """
    if num_replicas is not None and autoscaling_config is not None:
        raise ValueError(
            "num_replicas and autoscaling_config: both given; valid: one of them "
            "(autoscaling_config's min_replicas/max_replicas bound the replica count)"
        )
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
    options: dict[str, Any] = {"ray_actor_options": actor_options}
    if num_replicas is not None:
        options["num_replicas"] = num_replicas
    if autoscaling_config is not None:
        options["autoscaling_config"] = autoscaling_config
    return TextGenerator.options(**options).bind(checkpoint_dir, batch_wait_s)


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
