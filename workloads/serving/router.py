"""The ingress when a fallback is configured: the TPU deployment first, the fallback when it has
no capacity (:mod:`workloads.serving.fallback` defines both words).

The router validates a request exactly as a replica does (so a bad request is refused here, not
sent upstream), then asks the TPU deployment through a streaming handle call
(:meth:`workloads.serving.replica.TextGenerator.respond`). If that call cannot be placed (no replica,
back-pressure, the replica died), gives no first part within ``tpu_timeout_s``, or answers 503,
the request goes to the fallback. An unreachable TPU deployment (not a busy one: back-pressure
and 503 are per request) also opens a circuit breaker: for ``fallback.probe_after_s`` every
request goes straight to the fallback, then the next one probes the TPU deployment again and a
success closes it (the fallback disengages when the replicas are back). The reply says who
served it in ``X-Raytpu-Served-By``. With no fallback the client gets 503 with ``Retry-After``;
when the fallback fails too, 429 (it is rate limited) or 504 (it kept failing or never
answered), each counted under its error class.

The router's series carry the serving slice's labels when :func:`workloads.serving.app.build_app` knows
the shape (the router itself may run on any node); else its own host's.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from ray import serve

from workloads import telemetry
from workloads.serving import openai_api
from workloads.serving.fallback import (
    RETRY_AFTER_S,
    FallbackConfig,
    NoCapacityError,
    UpstreamReply,
    call_openai,
    failure_of,
)
from workloads.serving.http import SERVED_BY, Head, refusal, respond_http, to_response
from workloads.serving.requests import RequestError, parse_request, read_body


def _unreachable() -> tuple[type[BaseException], ...]:
    """What a handle call raises when the TPU deployment cannot take a request: down (no
    replica, a dead one, nothing in time) or busy (:func:`_busy`)."""
    from ray import exceptions as ray_errors
    from ray.serve import exceptions as serve_errors

    return (
        TimeoutError,
        asyncio.TimeoutError,
        ray_errors.RayActorError,
        ray_errors.ActorUnavailableError,
        serve_errors.BackPressureError,
        serve_errors.DeploymentUnavailableError,
        serve_errors.ReplicaUnavailableError,
    )


def _busy() -> tuple[type[BaseException], ...]:
    """The unreachable errors that mean busy, not down: they open no breaker."""
    from ray.serve import exceptions as serve_errors

    return (serve_errors.BackPressureError,)


@serve.deployment(max_ongoing_requests=512, ray_actor_options={"num_cpus": 0})
class Router:
    """Ingress: TPU deployment first, ``fallback`` when it has no capacity."""

    def __init__(
        self,
        tpu: Any,
        fallback: FallbackConfig,
        cpu: Any | None,
        model_name: str,
        tpu_timeout_s: float,
        labels: telemetry.Labels | None = None,
    ) -> None:
        if labels is not None:
            self._telemetry = telemetry.ServeTelemetry(labels)
        self._tpu, self._fallback, self._cpu = tpu, fallback, cpu
        self._model, self._timeout_s = model_name, tpu_timeout_s
        self.fallbacks = 0
        self.breaker_opened = 0
        self._down_until = 0.0
        """Monotonic time until which the TPU deployment is taken as down (0: closed)."""

    def stats(self) -> dict[str, Any]:
        return {
            "fallbacks": self.fallbacks,
            "breaker_opened": self.breaker_opened,
            "tpu_down": time.monotonic() < self._down_until,
        }

    @telemetry.instrument_http
    async def __call__(self, request: Any) -> Any:
        path, method = request.url.path, request.method
        route = openai_api.route_of(path)
        try:
            body = await read_body(request)
            if method == "POST" and route != openai_api.MODELS:
                validated = (
                    openai_api.parse(route, body, self._model) if route else parse_request(body)
                )
        except RequestError as error:
            return to_response(*refusal(error.status, str(error), route))
        head: Head | None = None
        if time.monotonic() >= self._down_until:  # closed, or time to probe
            parts = self._tpu.options(stream=True).respond.remote(method, path, body)
            try:
                head = await asyncio.wait_for(parts.__anext__(), self._timeout_s)
            except _unreachable() as error:
                parts.cancel()
                if not isinstance(error, _busy()):
                    self._open_breaker()
            if head is not None and head.status != 503:
                self._down_until = 0.0
                return await respond_http(head, parts)
            if head is not None:
                parts.cancel()
        self.fallbacks += 1
        if self._cpu is not None:
            cpu_parts = self._cpu.options(stream=True).respond.remote(method, path, body)
            return await respond_http(await cpu_parts.__anext__(), cpu_parts)
        if method != "POST" or route == openai_api.MODELS:
            return to_response(*refusal(503, "no capacity", route, RETRY_AFTER_S))
        return await self._upstream(route, validated)

    def _open_breaker(self) -> None:
        if time.monotonic() >= self._down_until:
            self.breaker_opened += 1
        self._down_until = time.monotonic() + self._fallback.probe_after_s

    async def _upstream(self, route: str, validated: Any) -> Any:
        """The request to the external OpenAI-compatible fallback (bounded retries)."""
        generate = validated.generate if route else validated
        payload = {
            "prompt": generate.prompt,
            "max_tokens": generate.max_new_tokens,
            "temperature": generate.temperature,
        }
        upstream_route = openai_api.COMPLETIONS
        if route == openai_api.CHAT:
            payload = {k: v for k, v in payload.items() if k != "prompt"}
            payload["messages"] = [{"role": "user", "content": generate.prompt}]
            upstream_route = openai_api.CHAT
        reply = await asyncio.to_thread(call_openai, self._fallback, upstream_route, payload)
        if reply.status in (429, 503):
            failure = failure_of(reply)
            status = telemetry.error("serve", failure, telemetry.of(self).labels).http_status
            message = f"no capacity: TPU deployment busy and {failure}"
            return to_response(*refusal(status, message, route, reply.retry_after))
        return self._relay(route, validated, reply)

    def _relay(self, route: str, validated: Any, reply: UpstreamReply) -> Any:
        headers = {SERVED_BY: "fallback-openai"}
        if reply.status != 200:
            return to_response(Head(reply.status, headers=headers), reply.body)
        try:
            answer = json.loads(reply.body)
            choice = answer["choices"][0]
            text = choice["message"]["content"] if route == openai_api.CHAT else choice["text"]
        except (ValueError, KeyError, IndexError, TypeError) as error:
            failure = NoCapacityError(f"fallback upstream reply unreadable: {error}")
            return to_response(*refusal(502, str(failure), route))
        if not route:
            body = {"prompt": validated.prompt, "completion": text, "served_by": "fallback"}
            return to_response(Head(200, headers=headers), json.dumps(body).encode())
        completion = openai_api.Completion(validated)
        tokens = len(str(text).encode("utf-8"))
        if not validated.stream:
            whole = completion.whole(str(text), tokens, {})
            return to_response(Head(200, headers=headers), whole.body)
        event = completion.event(list(str(text).encode("utf-8")), last=True)
        return to_response(Head(200, "text/event-stream", headers), event)
