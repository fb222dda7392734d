"""Fallback and backpressure: where a request goes when the TPU deployment has no capacity.

Glossary:

- **no capacity**: the TPU deployment cannot take the request now: no replica answers (none
  running, none placed because no slice is free, the replica died or is unhealthy), it does not
  answer within ``tpu_timeout_s``, or it refuses with 503 because its queue is past its bound or
  it is draining (:class:`NoCapacityError`).
- **fallback**: where such a request goes instead, from the stack config (``FallbackConfig``):
  ``openai``, an external OpenAI-compatible endpoint (its key read from an environment variable
  that the RayService fills from a Kubernetes secret, never from the repository), or
  ``deployment``, a Serve deployment of the same model on CPU (:func:`workloads.serving.app.build_app`).
- **bounded retries**: an upstream 429, 5xx or timeout is retried at most ``max_attempts`` times
  with exponential backoff (``backoff_s`` doubling, at most ``max_backoff_s``, and never longer than
  the upstream's ``Retry-After`` allows); then the client gets the status of the failure's class
  in the taxonomy (:mod:`raytpu.errors`), with ``Retry-After``: 429 ``upstream_rate_limited``
  when the upstream kept answering 429, 504 ``network_timeout`` when it kept failing or never
  answered; the error is counted under that class.
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass

from raytpu import errors

KINDS = ("openai", "deployment")
RETRY_AFTER_S = 2
"""What a client is told to wait when nothing better is known."""


@dataclass(frozen=True)
class FallbackConfig:
    """Where requests go when the TPU deployment has no capacity."""

    kind: str
    url: str = ""
    """``openai``: the API base, ``https://host/v1`` (``/completions`` is appended)."""
    model: str = ""
    """``openai``: the upstream's model name (the client's is replaced by it)."""
    api_key_env: str = ""
    """``openai``: the environment variable holding the key (a Kubernetes secret's)."""
    timeout_s: float = 30.0
    max_attempts: int = 3
    backoff_s: float = 0.25
    max_backoff_s: float = 2.0
    probe_after_s: float = 5.0
    """After the TPU deployment could not be reached (no replica, a dead one, no first part in
    time), requests go straight to the fallback for this long; then the next one tries the TPU
    deployment again (a circuit breaker: no request waits out a known outage)."""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(errors.invalid("fallback.kind", self.kind, KINDS))
        if self.kind == "openai" and not self.url.startswith(("http://", "https://")):
            raise ValueError(
                errors.invalid(
                    "fallback.url",
                    self.url,
                    "an http(s) URL of an OpenAI-compatible API base (https://host/v1)",
                )
            )
        if not 1 <= self.max_attempts <= 10:
            raise ValueError(errors.invalid("fallback.max_attempts", self.max_attempts, "1..10"))
        for name in ("timeout_s", "backoff_s", "max_backoff_s", "probe_after_s"):
            value = getattr(self, name)
            if not 0 <= value <= 600:
                raise ValueError(errors.invalid(f"fallback.{name}", value, "0..600 seconds"))


class NoCapacityError(errors.RayTpuError):
    """The TPU deployment cannot take the request now (and there is no fallback)."""

    error_class = errors.NO_CAPACITY


@dataclass(frozen=True)
class UpstreamReply:
    status: int
    body: bytes
    retry_after: int = 0
    attempts: int = 1


def retry_after_of(value: str | None, default: int = RETRY_AFTER_S) -> int:
    """Seconds from a ``Retry-After`` header (an integer; anything else: ``default``)."""
    if value and value.strip().isdigit():
        return min(int(value.strip()), 3600)
    return default


def call_openai(
    config: FallbackConfig,
    route: str,
    payload: dict,
    sleep: Callable[[float], None] = time.sleep,
) -> UpstreamReply:
    """POST ``payload`` (non-streaming, model replaced) to ``config.url`` + ``route``; retried on
    429 / 5xx / timeout / refused connection, at most ``max_attempts`` times in all.

    The last refusal comes back as 429 or 503 with ``retry_after``; it never raises for HTTP.
    """
    key = os.environ.get(config.api_key_env, "") if config.api_key_env else ""
    url = config.url.rstrip("/") + route.removeprefix("/v1")
    body = json.dumps({**payload, "model": config.model or payload.get("model"), "stream": False})
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    last = UpstreamReply(503, b"", RETRY_AFTER_S)
    for attempt in range(1, config.max_attempts + 1):
        request = urllib.request.Request(url, body.encode(), headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=config.timeout_s) as response:
                return UpstreamReply(response.status, response.read(), 0, attempt)
        except urllib.error.HTTPError as error:
            retry = retry_after_of(error.headers.get("Retry-After"))
            status = 429 if error.code == 429 else 503
            if error.code < 500 and error.code != 429:  # the upstream refused the request itself
                return UpstreamReply(error.code, error.read(), 0, attempt)
            last = UpstreamReply(status, error.read(), retry, attempt)
        except (TimeoutError, urllib.error.URLError, ConnectionError):
            last = UpstreamReply(503, b"", RETRY_AFTER_S, attempt)
        if attempt < config.max_attempts:
            wait = min(config.backoff_s * 2 ** (attempt - 1), config.max_backoff_s)
            sleep(min(wait, last.retry_after) if last.retry_after else wait)
    return last


def failure_of(reply: UpstreamReply) -> errors.RayTpuError:
    """The taxonomy's exception for a final upstream refusal (for counting, not raising)."""
    if reply.status == 429:
        return errors.UpstreamRateLimitedError(
            f"fallback upstream answered 429 {reply.attempts} times; retry after "
            f"{reply.retry_after} s"
        )
    return errors.NetworkTimeoutError(
        f"fallback upstream unavailable after {reply.attempts} attempts"
    )
