"""Requests and replies of the serving application, without Ray: bounded reading, strict
validation (every refusal a 4xx naming the field, the bad value and the valid ones), encoded
replies, per-request isolation inside a batch, and the batch buckets.

Request: ``POST`` JSON ``{"prompt": str, "max_new_tokens": int, "temperature": float}``.
Response: JSON with ``completion``. Malformed input gets a 4xx with a message, never a 500.
:mod:`workloads.serving.openai_api` validates the OpenAI-compatible routes with the same field checks.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from raytpu import inputs
from raytpu.errors import invalid

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
FIELDS = ("prompt", "max_new_tokens", "temperature", "seed")


class Clipped:
    """A value whose repr is cut to ``width`` characters: a refusal does not echo a whole body."""

    def __init__(self, value: Any, width: int = 80) -> None:
        self.value, self.width = value, width

    def __repr__(self) -> str:
        return f"{self.value!r:.{self.width}}"


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
    seed: int | None = None
    """Sampling seed: the same prompt, temperature and seed give the same tokens (None: any)."""


def parse_request(body: bytes) -> GenerateRequest:
    """Validate a request body; raises :class:`RequestError` (400, 413 or 422).

    Bounded in time and memory whatever the body: size first, then UTF-8, then a nesting scan
    before any recursive parsing.
    """
    raw = load_object(body, FIELDS)
    return GenerateRequest(
        prompt=check_prompt(raw.get("prompt"), "prompt"),
        max_new_tokens=check_max_tokens(
            raw.get("max_new_tokens", DEFAULT_MAX_NEW_TOKENS), "max_new_tokens"
        ),
        temperature=check_temperature(raw.get("temperature", DEFAULT_TEMPERATURE)),
        seed=check_seed(raw.get("seed")),
    )


def load_object(body: bytes, fields: tuple[str, ...]) -> dict[str, Any]:
    """``body`` as a JSON object with only ``fields`` (400, 413 or 422 otherwise)."""
    if len(body) > MAX_BODY_BYTES:
        raise RequestError(413, f"body: {len(body)} bytes is too large; valid: <= {MAX_BODY_BYTES}")
    limits = inputs.Limits(max_bytes=MAX_BODY_BYTES, max_depth=MAX_BODY_DEPTH)
    try:
        raw = inputs.parse_json(inputs.decode(body, "body"), "body", limits)
    except inputs.InputError as error:  # "body: line L, column C: not valid JSON: ..." etc.
        raise RequestError(400, str(error)) from None
    if not isinstance(raw, dict):
        raise RequestError(400, invalid("body", type(raw).__name__, "a JSON object"))
    unknown = sorted(set(raw) - set(fields))
    if unknown:
        raise RequestError(422, f"{unknown[0]}: unknown field; valid: {', '.join(fields)}")
    return raw


def check_prompt(prompt: Any, field: str, limit: int = MAX_PROMPT_CHARS) -> str:
    """A non-empty string of at most ``limit`` characters that encodes as UTF-8."""
    if not isinstance(prompt, str):
        raise RequestError(422, invalid(field, prompt, "a non-empty string"))
    if not prompt.strip():
        shown = Clipped(prompt)  # whitespace only, perhaps a thousand characters of it
        raise RequestError(422, invalid(field, shown, "a non-empty string", reason="empty prompt"))
    if len(prompt) > limit:
        raise RequestError(413, f"{field}: {len(prompt)} characters is too long; valid: <= {limit}")
    try:
        prompt.encode("utf-8")  # the model reads UTF-8 bytes
    except UnicodeEncodeError as error:
        bad = prompt[error.start]
        raise RequestError(
            422,
            f"{field}: character {error.start} ({bad!a}) is an unpaired surrogate; valid: "
            "Unicode text (a \\ud800-\\udfff escape only as half of a surrogate pair)",
        ) from None
    return prompt


def check_max_tokens(tokens: Any, field: str) -> int:
    if isinstance(tokens, bool) or not isinstance(tokens, int) or not 1 <= tokens <= MAX_NEW_TOKENS:
        raise RequestError(422, invalid(field, tokens, f"an integer 1..{MAX_NEW_TOKENS}"))
    return tokens


MAX_SEED = 2**31 - 1


def check_seed(seed: Any) -> int | None:
    """``seed``: absent (None) or an integer 0..2**31-1."""
    if seed is None:
        return None
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED:
        raise RequestError(422, invalid("seed", seed, f"an integer 0..{MAX_SEED}"))
    return seed


def check_temperature(temperature: Any) -> float:
    if (
        isinstance(temperature, bool)
        or not isinstance(temperature, int | float)
        or not math.isfinite(temperature)
        or not 0.0 <= temperature <= MAX_TEMPERATURE
    ):
        raise RequestError(
            422,
            invalid("temperature", temperature, f"a number 0..{MAX_TEMPERATURE:g}"),
        )
    return float(temperature)


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
        raise ValueError(invalid("devices", devices, "an integer >= 1"))
    sizes = {-(-b // devices) * devices for b in BATCH_BUCKETS}
    return tuple(sorted(sizes))


def pad_to_bucket(
    requests: list[GenerateRequest], buckets: tuple[int, ...] = BATCH_BUCKETS
) -> list[GenerateRequest]:
    """``requests`` followed by one-token filler rows, up to the next size in ``buckets``."""
    if not 1 <= len(requests) <= MAX_BATCH_SIZE:
        raise ValueError(invalid("batch size", len(requests), f"1..{MAX_BATCH_SIZE}"))
    size = next(b for b in buckets if b >= len(requests))
    return [*requests, *[PAD_REQUEST] * (size - len(requests))]


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
