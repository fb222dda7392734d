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
import functools
import json
import os
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from ray import serve

from raytpu.catalog import RAY_TPU_REQUEST_SIZES, SliceShape
from raytpu.entrypoints import CHECKPOINT_ENV, SERVE_FALLBACK_ENV, SERVE_TPU_DEFAULT
from raytpu.entrypoints import SERVE_TPU_ENV as TPU_ENV
from raytpu.ray_names import LABEL_POD_TYPE, LABEL_TOPOLOGY
from workloads import telemetry
from workloads.serving import openai_api
from workloads.serving.batching import AdaptiveBatcher
from workloads.serving.engine.prefix_cache import DEVICE_BLOCKS, HOST_BLOCKS
from workloads.serving.fallback import RETRY_AFTER_S, FallbackConfig
from workloads.serving.http import SERVED_BY, Head, refusal, respond_http, to_response
from workloads.serving.requests import (  # noqa: F401  (the request API, re-exported)
    BATCH_BUCKETS,
    BATCH_WAIT_S,
    DEFAULT_CHECKPOINT_DIR,
    MAX_BATCH_SIZE,
    MAX_NEW_TOKENS,
    MAX_PROMPT_CHARS,
    PAD_REQUEST,
    GenerateRequest,
    Reply,
    RequestError,
    batch_buckets,
    error_reply,
    json_reply,
    pad_to_bucket,
    parse_request,
    read_body,
    render_replies,
    run_isolated,
)

MODEL_NAME = "raytpu-byte-lm"
"""The ``model`` the OpenAI-compatible routes serve."""
MAX_QUEUE = 64
"""Backpressure bound: a replica with this many requests in flight answers 503 + Retry-After
(the router's cue to use the fallback)."""


@dataclass(frozen=True)
class ServeOptions:
    """How a :class:`TextGenerator` replica batches, caches and sheds load."""

    max_batch_size: int = MAX_BATCH_SIZE
    batch_wait_s: float = BATCH_WAIT_S
    """The longest a batch waits for more requests (:mod:`workloads.serving.batching`)."""
    adaptive: bool = True
    """False: every batch waits ``batch_wait_s`` unless full (Serve's ``@serve.batch`` rule)."""
    prefix_cache: bool = True
    shared_prefix: bool = True
    """Share prefix blocks with the other replicas through Ray's object store."""
    device_blocks: int = DEVICE_BLOCKS
    host_blocks: int = HOST_BLOCKS
    max_queue: int = MAX_QUEUE
    model_name: str = MODEL_NAME
    served_by: str = "tpu"
    precompile: bool = True
    """Compile every prompt-length bucket at start (False: only the shortest; tests)."""


@dataclass(frozen=True)
class Job:
    """One request in a batch; ``sink`` (streaming only) takes each chunk of its new tokens."""

    request: GenerateRequest
    sink: Callable[[list[int]], None] | None = None


@serve.deployment(max_ongoing_requests=MAX_QUEUE + 16, health_check_timeout_s=30)
class TextGenerator:
    """One replica: the latest checkpoint replicated on every chip of its host; adaptive batches
    through the prefix cache and the KV-cached decode loop, rows split over those chips (the
    byte LM), or through the family's decode step (a preset checkpoint:
    :mod:`workloads.serving.replica_model`)."""

    def __init__(self, checkpoint_dir: str, options: ServeOptions | None = None) -> None:
        # jax is imported in the replica, never in the driver.
        from workloads.model import byte_lm as model
        from workloads.serving.engine.engine import Timing
        from workloads.serving.replica_model import load_replica_model

        self._options = options = options or ServeOptions()
        self._mesh = model.local_mesh()
        # Only the buckets a batch of at most max_batch_size requests can need.
        every = batch_buckets(self._mesh.size)
        largest = next((b for b in every if b >= options.max_batch_size), every[-1])
        self._buckets = tuple(b for b in every if b <= largest)
        loaded = load_replica_model(
            checkpoint_dir, self._mesh, self._buckets, options, telemetry.of(self).prefix,
            MAX_NEW_TOKENS,
        )  # fmt: skip
        self._family, self._step, self._cfg = loaded.family, loaded.step, loaded.family.config
        self._engine, self._sampler = loaded.engine, loaded.sampler
        self._batcher: AdaptiveBatcher[Job, tuple[Any, dict[str, Any]]] = AdaptiveBatcher(
            self._run_batch,
            max_batch=options.max_batch_size,
            max_wait_s=options.batch_wait_s,
            key=self._batch_key,
            adaptive=options.adaptive,
        )
        self._draining = False
        self._calls = 0
        self._timing = Timing()

    def _batch_key(self, job: Job) -> bool:
        """Streaming and whole requests batch apart; prompts of any length share a batch (the
        engine prefills each length bucket on its own: :mod:`workloads.serving.engine.prefill_plan`)."""
        return job.sink is not None

    def _generate(self, jobs: list[Job]) -> list[str]:
        """Completions of a batch (``""`` for streamed jobs: their tokens went to the sinks)."""
        from workloads.model.byte_lm import decode as text
        from workloads.serving.engine.engine import Row, Timing

        self._calls += 1
        if self._sampler is not None:
            return self._sample(jobs)
        rows = [
            Row(j.request.prompt, j.request.max_new_tokens, j.request.temperature) for j in jobs
        ]
        self._timing = Timing()
        if jobs[0].sink is None:
            tokens, self._timing = self._engine.generate(rows, seed=self._calls)
            return [text(t) for t in tokens]
        for chunk in self._engine.stream(rows, seed=self._calls, timing=self._timing):
            for job, tokens in zip(jobs, chunk, strict=False):
                if tokens and job.sink is not None:
                    job.sink(tokens)
        return [""] * len(jobs)

    def _sample(self, jobs: list[Job]) -> list[str]:
        """A preset's completions; a streamed job gets its text's UTF-8 bytes in one chunk."""
        rows = [(j.request.prompt, j.request.max_new_tokens, j.request.temperature) for j in jobs]
        texts = [self._sampler.complete(*row, seed=self._calls) for row in rows]
        for job, text in zip(jobs, texts, strict=True):
            if job.sink is not None:
                job.sink(list(text.encode("utf-8")))
        return ["" if j.sink else text for j, text in zip(jobs, texts, strict=True)]

    async def _run_batch(self, jobs: list[Job]) -> list[tuple[Any, dict]]:
        began = time.monotonic()
        if jobs[0].sink is None:
            results = await asyncio.to_thread(run_isolated, jobs, self._generate)
        else:  # streamed tokens cannot be taken back: no per-row retry
            results = await asyncio.to_thread(self._generate, jobs)
        requests = [job.request for job in jobs]
        compute_s = time.monotonic() - began
        timing = self._timing
        steps = max(r.max_new_tokens for r in requests)
        telemetry.of(self).batch(len(requests), compute_s, steps)
        telemetry.of(self).first_token(timing.first_token_s)
        extra = {
            "checkpoint_step": self._step,
            "host": os.environ.get("TPU_NAME", ""),
            "batch_size": len(requests),
            "compute_ms": round(compute_s * 1000, 1),
            "prefill_ms": round(timing.prefill_s * 1000, 2),
            "prefill_tokens": timing.prefill_tokens,
            "prefill_positions": timing.prefill_positions,
            "prefill_groups": timing.prefill_groups,
        }
        tiers = timing.tiers or [""] * len(requests)
        starts = timing.starts or [0] * len(requests)
        return [
            (result, {**extra, "prefix_tier": tier, "prefix_cached_tokens": start})
            for result, tier, start in zip(results, tiers, starts, strict=False)
        ]

    def describe(self) -> dict[str, Any]:
        """Where this replica computes: its local devices, the devices every parameter is on,
        and the sharding of one batch and of its logits, read off the arrays themselves; and
        what its batcher and prefix cache did."""
        import jax

        from workloads.serving.engine import decode

        if self._engine is None:  # a preset: no KV cache, no prefix cache
            extra = {"buckets": list(self._buckets), "batches": list(self._batcher.batches)}
            return {**self._sampler.describe(), **extra, "prefix": None}
        rows, cfg = self._buckets[0], self._cfg
        kv = decode.new_cache(cfg, rows, self._mesh)
        ids = [decode.prompt_ids(cfg, " ", 1)] * rows
        state = decode.prefill(
            self._engine.params, cfg, kv, ids, [0] * rows, [0.0] * rows, 0, self._mesh
        )
        tokens, logits = state.positions, state.logits
        prefix = self._engine.prefix
        return {
            "local_devices": [str(d) for d in jax.local_devices()],
            "param_devices": sorted(
                {len(leaf.sharding.device_set) for leaf in jax.tree.leaves(self._engine.params)}
            ),
            "batch_rows": rows,
            "batch_devices": len(tokens.sharding.device_set),
            "batch_axes": [str(axis) for axis in tokens.sharding.spec],
            "rows_per_device": sorted({s.data.shape[0] for s in tokens.addressable_shards}),
            "logits_devices": len(logits.sharding.device_set),
            "buckets": list(self._buckets),
            "batches": list(self._batcher.batches),
            "prefix": prefix.counts.to_dict() if prefix else None,
            "context_len": cfg.context_len,
            "family": self._family.name,
        }

    def drain(self, draining: bool) -> bool:
        """Stop (True) or resume (False) taking requests: while draining every request is
        answered 503 + Retry-After, the router's cue to send it to the fallback."""
        self._draining = draining
        return draining

    async def respond(self, method: str, path: str, body: bytes) -> AsyncIterator[Any]:
        """A :class:`Head`, then the body in one or more chunks (SSE events when streaming).
        The HTTP entry point and the router (a streaming handle call) both read this."""
        route = openai_api.route_of(path)
        options = self._options
        if self._draining or self._batcher.depth >= options.max_queue:
            reason = "draining" if self._draining else f"{self._batcher.depth} requests queued"
            message = f"no capacity: this replica is {reason}; retry after {RETRY_AFTER_S} s"
            for item in refusal(503, message, route, RETRY_AFTER_S):
                yield item
            return
        with self._batcher.admit() as ticket:
            try:
                if route == openai_api.MODELS:
                    reply = openai_api.models(options.model_name)
                    yield Head(reply.status, headers={SERVED_BY: options.served_by})
                    yield reply.body
                    return
                if method != "POST":
                    raise RequestError(405, f"method: {method} is not valid; valid: POST")
                if route:
                    request = openai_api.parse(route, body, options.model_name)
                else:
                    parsed = parse_request(body)
            except RequestError as error:
                for item in refusal(error.status, str(error), route):
                    yield item
                return
            if route and request.stream:
                chunks: asyncio.Queue[list[int]] = asyncio.Queue()
                loop = asyncio.get_running_loop()
                sink = functools.partial(loop.call_soon_threadsafe, chunks.put_nowait)
                done = self._batcher.enqueue(Job(request.generate, sink), ticket)
            else:
                wanted = request.generate if route else parsed
                result, extra = await self._batcher.submit(Job(wanted), ticket)
        if not route:
            (reply,) = render_replies([parsed], [result], extra)
            yield Head(reply.status, headers={SERVED_BY: options.served_by})
            yield reply.body
            return
        if not request.stream:
            if isinstance(result, Exception):
                for item in refusal(500, f"generation failed: {type(result).__name__}", route):
                    yield item
                return
            # No stop sequences: every request gets exactly its max_new_tokens bytes.
            tokens = request.generate.max_new_tokens
            reply = openai_api.Completion(request).whole(result, tokens, {"raytpu": extra})
            yield Head(reply.status, headers={SERVED_BY: options.served_by})
            yield reply.body
            return
        yield Head(200, "text/event-stream", {SERVED_BY: options.served_by})
        async for event in stream_events(openai_api.Completion(request), chunks, done):
            yield event

    @telemetry.instrument_http
    async def __call__(self, request: Any) -> Any:
        try:
            body = await read_body(request)
        except RequestError as error:
            head, payload = refusal(error.status, str(error), openai_api.route_of(request.url.path))
            return to_response(head, payload)
        parts = self.respond(request.method, request.url.path, body)
        head = await anext(parts)
        return await respond_http(head, parts)


async def stream_events(
    completion: openai_api.Completion, chunks: asyncio.Queue, done: asyncio.Future
) -> AsyncIterator[bytes]:
    """SSE events for the chunks a streaming batch puts in ``chunks``, until the request has all
    its tokens; the batch's failure (``done``'s exception) is raised if it ends early."""
    wanted = completion.request.generate.max_new_tokens
    while completion.tokens < wanted:
        getter = asyncio.ensure_future(chunks.get())
        await asyncio.wait({getter, done}, return_when=asyncio.FIRST_COMPLETED)
        if getter.done():
            tokens = getter.result()
            yield completion.event(tokens, last=completion.tokens + len(tokens) >= wanted)
            continue
        getter.cancel()
        if chunks.empty():
            done.result()  # the batch failed: its exception
            raise RuntimeError(f"stream ended after {completion.tokens} of {wanted} tokens")


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
        valid = ", ".join(str(n) for n in RAY_TPU_REQUEST_SIZES)
        raise ValueError(f"{TPU_ENV}: {tpu!r} is not valid; valid: {valid}")
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
        raise ValueError(f"{SERVE_FALLBACK_ENV}: {text!r} is not valid; valid: a JSON object")
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
