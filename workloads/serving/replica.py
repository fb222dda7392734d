"""One serving replica: :class:`TextGenerator`, a Ray Serve deployment on one TPU host.

Glossary (Ray Serve's words):

- **deployment / replica**: :class:`TextGenerator`; each replica is a Ray actor that requests the
  serving slice's TPU (``ray_actor_options={"resources": {"TPU": chips per host}}``), so it lands
  on a TPU host of the single-host serving slice, loads the latest Orbax checkpoint there
  (``gs://`` on GKE) and keeps the parameters replicated on every chip of that host.
- **mesh**: a 1-D mesh (axis ``data``) over the replica's local devices; a batch's rows are
  split over it, so every chip of the host computes (:meth:`TextGenerator.describe` shows it).
- **dynamic batching**: concurrent requests join one batch (:mod:`workloads.serving.batching`).

Routes, one handler each (:attr:`TextGenerator._ROUTES`): the JSON endpoint (``POST``
``{"prompt": str, "max_new_tokens": int, "temperature": float}``, answered with
``completion``), and the OpenAI-compatible ``/v1/completions``, ``/v1/chat/completions`` and
``/v1/models``. Malformed input gets a 4xx with a message, never a 500.

Per-request isolation: a request is read (at most MAX_BODY_BYTES), parsed (at most
MAX_BODY_DEPTH levels), validated and encoded (the prompt's UTF-8 bytes, the reply's JSON) on
its own, before it joins a batch; a request that fails any of that is answered alone with its
4xx. Should a batch still fail in the model, each of its requests is run again on its own, so
that one bad row answers only its own request.
"""

from __future__ import annotations

import asyncio
import functools
import os
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from ray import serve

from raytpu.errors import invalid
from workloads import telemetry
from workloads.serving import openai_api
from workloads.serving.batching import AdaptiveBatcher
from workloads.serving.engine.prefix_cache import DEVICE_BLOCKS, HOST_BLOCKS, PrefixHit
from workloads.serving.fallback import RETRY_AFTER_S
from workloads.serving.http import SERVED_BY, Head, refusal, respond_http, to_response
from workloads.serving.requests import (
    BATCH_WAIT_S,
    MAX_BATCH_SIZE,
    MAX_NEW_TOKENS,
    GenerateRequest,
    RequestError,
    batch_buckets,
    parse_request,
    read_body,
    render_replies,
    run_isolated,
)

if TYPE_CHECKING:
    from workloads.serving.engine.engine import Timing

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
    """One request in a batch; ``sink`` (streaming only) takes each chunk of its new tokens as
    ``(UTF-8 bytes, token count)``."""

    request: GenerateRequest
    sink: Callable[[tuple[list[int], int]], None] | None = None


@dataclass(frozen=True)
class Completed:
    """One job's completion (``""`` when streamed: its tokens went to its sink), its
    prefix-cache hit, and the timing of the batch that computed it."""

    text: str
    hit: PrefixHit
    timing: Timing


@serve.deployment(max_ongoing_requests=MAX_QUEUE + 16, health_check_timeout_s=30)
class TextGenerator:
    """One replica: the latest checkpoint replicated on every chip of its host; adaptive batches
    through the prefix cache and the KV-cached decode loop, rows split over those chips (the
    byte LM), or through the family's decode step (a preset checkpoint:
    :mod:`workloads.serving.replica_model`)."""

    def __init__(self, checkpoint_dir: str, options: ServeOptions | None = None) -> None:
        # jax is imported in the replica, never in the driver.
        from workloads.model import byte_lm as model
        from workloads.model import compile_cache
        from workloads.serving.replica_model import load_replica_model

        compile_cache.from_env()  # before the first jit: a new replica loads the compilations
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
        self._family, self._step, self._engine = loaded.family, loaded.step, loaded.engine
        self._batcher: AdaptiveBatcher[Job, tuple[Any, dict[str, Any]]] = AdaptiveBatcher(
            self._run_batch,
            max_batch=options.max_batch_size,
            max_wait_s=options.batch_wait_s,
            key=self._batch_key,
            adaptive=options.adaptive,
        )
        self._draining = False
        self._calls = 0

    def _batch_key(self, job: Job) -> bool:
        """Streaming and whole requests batch apart; prompts of any length share a batch (the
        engine prefills each length bucket on its own: :mod:`workloads.serving.engine.prefill_plan`)."""
        return job.sink is not None

    def _generate(self, jobs: list[Job]) -> list[Completed]:
        """The batch's completions, one per job."""
        from workloads.serving.engine.decoders import TextStream
        from workloads.serving.engine.engine import Row

        self._calls += 1
        decoder = self._engine.cfg
        rows = [
            Row(j.request.prompt, j.request.max_new_tokens, j.request.temperature, j.request.seed)
            for j in jobs
        ]
        if jobs[0].sink is None:
            tokens, timing = self._engine.generate(rows, seed=self._calls)
            return [
                Completed(decoder.decode(t), hit, timing)
                for t, hit in zip(tokens, timing.hits, strict=True)
            ]
        texts = [TextStream(decoder, j.request.max_new_tokens) for j in jobs]
        for chunk in self._engine.stream(rows, seed=self._calls):
            for job, text, tokens in zip(jobs, texts, chunk.tokens, strict=True):
                if tokens and job.sink is not None:
                    job.sink((text.push(tokens), len(tokens)))
        return [Completed("", hit, chunk.timing) for hit in chunk.timing.hits]

    async def _run_batch(self, jobs: list[Job]) -> list[tuple[Any, dict]]:
        """Each job's text (or its exception) and what the replica says about it."""
        began = time.monotonic()
        if jobs[0].sink is None:
            results = await asyncio.to_thread(run_isolated, jobs, self._generate)
        else:  # streamed tokens cannot be taken back: no per-row retry
            results = await asyncio.to_thread(self._generate, jobs)
        compute_s = time.monotonic() - began
        done = [r for r in results if isinstance(r, Completed)]
        steps = max(job.request.max_new_tokens for job in jobs)
        telemetry.of(self).batch(len(jobs), compute_s, steps)
        if done:
            telemetry.of(self).first_token(done[-1].timing.first_token_s)
        return [self._answer(result, len(jobs), compute_s) for result in results]

    def _answer(
        self, result: Completed | Exception, batch_size: int, compute_s: float
    ) -> tuple[Any, dict]:
        """A job's text (or exception) and its ``raytpu`` extra: batch, prefill and prefix hit."""
        extra: dict[str, Any] = {
            "checkpoint_step": self._step,
            "host": os.environ.get("TPU_NAME", ""),
            "batch_size": batch_size,
            "compute_ms": round(compute_s * 1000, 1),
        }
        if isinstance(result, Exception):
            return result, extra
        timing = result.timing
        extra.update(
            prefill_ms=round(timing.prefill_s * 1000, 2),
            prefill_tokens=timing.prefill_tokens,
            prefill_positions=timing.prefill_positions,
            prefill_groups=timing.prefill_groups,
            prefix_tier=result.hit.tier,
            prefix_cached_tokens=result.hit.start,
        )
        return result.text, extra

    def _check_fits(self, generate: GenerateRequest, field: str) -> None:
        """Refuse (422) more new tokens than the model's context holds after one prompt token."""
        context = self._engine.cfg.context_len
        if generate.max_new_tokens >= context:
            valid = f"1..{context - 1} (this model's context_len is {context})"
            raise RequestError(422, invalid(field, generate.max_new_tokens, valid))

    def _prompt_tokens(self, request: Any) -> int:
        """The prompt's length in the model's tokens, as the engine reads it (cut to fit)."""
        from workloads.serving.engine import decode

        generate = request.generate
        return len(decode.prompt_ids(self._engine.cfg, generate.prompt, generate.max_new_tokens))

    def describe(self) -> dict[str, Any]:
        """Where this replica computes: its local devices, the devices every parameter is on,
        and the sharding of one batch and of its logits, read off the arrays themselves; and
        what its batcher and prefix cache did."""
        import jax

        from workloads.serving.engine import decode

        rows, cfg = self._buckets[0], self._engine.cfg
        kv = decode.new_cache(cfg, rows, self._mesh)
        ids = [decode.prompt_ids(cfg, " ", 1)] * rows
        inputs = decode.PrefillInputs.fresh(ids, [0.0] * rows)
        state = decode.prefill(self._engine.params, cfg, kv, inputs, self._mesh)
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
            "model": getattr(self._family.config, "name", ""),
        }

    def drain(self, draining: bool) -> bool:
        """Stop (True) or resume (False) taking requests: while draining every request is
        answered 503 + Retry-After, the router's cue to send it to the fallback."""
        self._draining = draining
        return draining

    async def respond(self, method: str, path: str, body: bytes) -> AsyncIterator[Any]:
        """A :class:`Head`, then the body in one or more chunks (SSE events when streaming).
        The HTTP entry point and the router (a streaming handle call) both read this; each
        route has its handler (:attr:`_ROUTES`)."""
        route = openai_api.route_of(path)
        if self._draining or self._batcher.depth >= self._options.max_queue:
            reason = "draining" if self._draining else f"{self._batcher.depth} requests queued"
            message = f"no capacity: this replica is {reason}; retry after {RETRY_AFTER_S} s"
            for item in refusal(503, message, route, RETRY_AFTER_S):
                yield item
            return
        try:
            async for item in self._ROUTES[route](self, method, route, body):
                yield item
        except RequestError as error:
            for item in refusal(error.status, str(error), route):
                yield item

    def _head(self, status: int, content_type: str = "application/json") -> Head:
        return Head(status, content_type, {SERVED_BY: self._options.served_by})

    async def _models(self, method: str, route: str, body: bytes) -> AsyncIterator[Any]:
        """``GET /v1/models``: the one model this replica serves."""
        reply = openai_api.models(self._options.model_name)
        yield self._head(reply.status)
        yield reply.body

    async def _generate_json(self, method: str, route: str, body: bytes) -> AsyncIterator[Any]:
        """``POST`` of the JSON endpoint: ``{"prompt", "max_new_tokens", "temperature"}``."""
        with self._batcher.admit() as ticket:
            _post_only(method)
            parsed = parse_request(body)
            self._check_fits(parsed, "max_new_tokens")
            result, extra = await self._batcher.submit(Job(parsed), ticket)
        (reply,) = render_replies([parsed], [result], extra)
        yield self._head(reply.status)
        yield reply.body

    async def _openai(self, method: str, route: str, body: bytes) -> AsyncIterator[Any]:
        """``POST /v1/completions`` and ``/v1/chat/completions``, whole or streamed (SSE)."""
        with self._batcher.admit() as ticket:
            _post_only(method)
            request = openai_api.parse(route, body, self._options.model_name)
            self._check_fits(request.generate, "max_tokens")
            if request.stream:
                chunks: asyncio.Queue[tuple[list[int], int]] = asyncio.Queue()
                loop = asyncio.get_running_loop()
                sink = functools.partial(loop.call_soon_threadsafe, chunks.put_nowait)
                done = self._batcher.enqueue(Job(request.generate, sink), ticket)
            else:
                result, extra = await self._batcher.submit(Job(request.generate), ticket)
        if request.stream:
            yield self._head(200, "text/event-stream")
            completion = openai_api.Completion(request, self._prompt_tokens(request))
            async for event in stream_events(completion, chunks, done):
                yield event
            return
        if isinstance(result, Exception):
            for item in refusal(500, f"generation failed: {type(result).__name__}", route):
                yield item
            return
        # No stop sequences: every request gets exactly its max_new_tokens bytes.
        tokens = request.generate.max_new_tokens
        completion = openai_api.Completion(request, self._prompt_tokens(request))
        reply = completion.whole(result, tokens, {"raytpu": extra})
        yield self._head(reply.status)
        yield reply.body

    _ROUTES: ClassVar[dict[str, Callable[..., AsyncIterator[Any]]]] = {
        "": _generate_json,
        openai_api.COMPLETIONS: _openai,
        openai_api.CHAT: _openai,
        openai_api.MODELS: _models,
    }
    """Route (:func:`workloads.serving.openai_api.route_of`) to its handler."""

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


def _post_only(method: str) -> None:
    if method != "POST":
        raise RequestError(405, invalid("method", method, ["POST"]))


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
            data, tokens = getter.result()
            yield completion.event(data, completion.tokens + tokens >= wanted, tokens)
            continue
        getter.cancel()
        if chunks.empty():
            done.result()  # the batch failed: its exception
            raise RuntimeError(f"stream ended after {completion.tokens} of {wanted} tokens")
