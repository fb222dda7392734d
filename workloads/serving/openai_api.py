"""OpenAI-compatible requests and replies: ``/v1/completions``, ``/v1/chat/completions`` (both
with ``"stream": true`` as server-sent events) and ``/v1/models``, beside the JSON endpoint.

Validation is as strict as the JSON endpoint's (:mod:`workloads.serving.requests`: the same limits
and messages naming the field, the bad value and the valid ones) and refusals use OpenAI's error
body, ``{"error": {"message", "type", "param", "code"}}``, so client libraries show the message.
The model reads bytes: a chat is rendered as ``role: content`` lines ending in ``assistant:``.
"""

from __future__ import annotations

import codecs
import json
import time
import uuid
from dataclasses import dataclass
from typing import Any

from raytpu.errors import invalid
from workloads.serving.requests import (
    DEFAULT_MAX_NEW_TOKENS,
    DEFAULT_TEMPERATURE,
    MAX_PROMPT_CHARS,
    Clipped,
    GenerateRequest,
    Reply,
    RequestError,
    check_max_tokens,
    check_prompt,
    check_seed,
    check_temperature,
    json_reply,
    load_object,
)

COMPLETIONS = "/v1/completions"
CHAT = "/v1/chat/completions"
MODELS = "/v1/models"
COMPLETION_FIELDS = (
    "model",
    "prompt",
    "max_tokens",
    "temperature",
    "stream",
    "stream_options",
    "n",
    "user",
    "seed",
)
CHAT_FIELDS = (
    "model",
    "messages",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "stream",
    "stream_options",
    "n",
    "user",
    "seed",
)
ROLES = ("system", "user", "assistant")
MAX_MESSAGES = 32
MAX_CHAT_CHARS = 4 * MAX_PROMPT_CHARS


@dataclass(frozen=True)
class OpenAIRequest:
    """A validated ``/v1`` request: what to generate, and how to answer (route, stream)."""

    route: str
    model: str
    generate: GenerateRequest
    stream: bool
    include_usage: bool = False
    """``stream_options.include_usage``: one more event, ``choices: []`` and ``usage``, before
    ``[DONE]`` (OpenAI's; benchmark clients such as AIPerf always send it when streaming)."""


def route_of(path: str) -> str:
    """The ``/v1`` route ``path`` ends with, or ``""`` (the JSON endpoint)."""
    for route in (CHAT, COMPLETIONS, MODELS):
        if path.rstrip("/").endswith(route):
            return route
    return ""


def parse(route: str, body: bytes, model: str) -> OpenAIRequest:
    """Validate a ``/v1/completions`` or ``/v1/chat/completions`` body for the served ``model``."""
    raw = load_object(body, CHAT_FIELDS if route == CHAT else COMPLETION_FIELDS)
    name = raw.get("model")
    if name != model:
        raise RequestError(404, invalid("model", name, model))
    if raw.get("n", 1) != 1 or isinstance(raw.get("n"), bool):
        raise RequestError(422, invalid("n", raw.get("n"), "1"))
    stream = raw.get("stream", False)
    if not isinstance(stream, bool):
        raise RequestError(422, invalid("stream", stream, "true or false"))
    include_usage = _include_usage(raw.get("stream_options"), stream)
    user = raw.get("user", "")
    if not isinstance(user, str) or len(user) > 256:
        raise RequestError(422, invalid("user", user, "a string of <= 256 chars"))
    if route == CHAT:
        prompt = render_chat(raw.get("messages"))
        tokens_field = "max_completion_tokens" if "max_completion_tokens" in raw else "max_tokens"
    else:
        prompt = check_prompt(raw.get("prompt"), "prompt")
        tokens_field = "max_tokens"
    tokens = check_max_tokens(raw.get(tokens_field, DEFAULT_MAX_NEW_TOKENS), tokens_field)
    temperature = check_temperature(raw.get("temperature", DEFAULT_TEMPERATURE))
    generate = GenerateRequest(prompt, tokens, temperature, check_seed(raw.get("seed")))
    return OpenAIRequest(route, model, generate, stream, include_usage)


def _include_usage(options: Any, stream: bool) -> bool:
    """``stream_options`` as OpenAI has it: only with ``stream``, ``{"include_usage": bool}``
    (``continuous_usage_stats``, vLLM's, is accepted and only ``false`` is)."""
    if options is None:
        return False
    if not stream:
        raise RequestError(422, invalid("stream_options", Clipped(options), "only with stream"))
    valid = "an object with include_usage: true or false"
    if not isinstance(options, dict) or set(options) - {"include_usage", "continuous_usage_stats"}:
        raise RequestError(422, invalid("stream_options", Clipped(options), valid))
    if options.get("continuous_usage_stats", False) is not False:
        raise RequestError(
            422,
            invalid(
                "stream_options.continuous_usage_stats",
                options["continuous_usage_stats"],
                "false",
            ),
        )
    include = options.get("include_usage", False)
    if not isinstance(include, bool):
        raise RequestError(422, invalid("stream_options.include_usage", include, "true or false"))
    return include


def render_chat(messages: Any) -> str:
    """``messages`` as the model's prompt: ``role: content`` lines, then ``assistant:``."""
    if not isinstance(messages, list) or not 1 <= len(messages) <= MAX_MESSAGES:
        raise RequestError(
            422, invalid("messages", Clipped(messages), f"a list of 1..{MAX_MESSAGES}")
        )
    lines = []
    for index, message in enumerate(messages):
        where = f"messages[{index}]"
        if not isinstance(message, dict) or set(message) - {"role", "content", "name"}:
            raise RequestError(
                422, invalid(where, Clipped(message), "an object with role, content")
            )
        role = message.get("role")
        if role not in ROLES:
            raise RequestError(422, invalid(f"{where}.role", role, ROLES))
        content = check_prompt(message.get("content"), f"{where}.content")
        lines.append(f"{role}: {content}\n")
    prompt = "".join(lines) + "assistant:"
    if len(prompt) > MAX_CHAT_CHARS:
        raise RequestError(
            413,
            f"messages: {len(prompt)} characters in all is too long; valid: <= {MAX_CHAT_CHARS}",
        )
    return prompt


def error_body(status: int, message: str) -> Reply:
    """OpenAI's error shape; ``param`` is the field the message starts with."""
    param = message.split(":", 1)[0] if ":" in message else None
    kind = "invalid_request_error" if status < 500 else "server_error"
    if status == 429:
        kind = "rate_limit_error"
    return json_reply(
        status, {"error": {"message": message, "type": kind, "param": param, "code": status}}
    )


def models(model: str) -> Reply:
    return json_reply(
        200,
        {"object": "list", "data": [{"id": model, "object": "model", "owned_by": "raytpu"}]},
    )


class Completion:
    """The reply to one request, whole (:meth:`whole`) or as SSE events (:meth:`event`)."""

    def __init__(self, request: OpenAIRequest, prompt_tokens: int | None = None) -> None:
        self.request = request
        self.prompt_tokens = prompt_tokens
        """The prompt's length in the model's tokens (default: its UTF-8 bytes, the byte LM's)."""
        chat = request.route == CHAT
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        self.created = int(time.time())
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.tokens = 0
        self._role_sent = False

    def _base(self, kind: str) -> dict[str, Any]:
        return {"id": self.id, "object": kind, "created": self.created, "model": self.request.model}

    def _usage(self, completion_tokens: int) -> dict[str, int]:
        prompt_tokens = self.prompt_tokens
        if prompt_tokens is None:
            prompt_tokens = len(self.request.generate.prompt.encode("utf-8"))
        return {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        }

    def whole(self, text: str, tokens: int, extra: dict[str, Any]) -> Reply:
        if self.request.route == CHAT:
            choice = {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "finish_reason": "length",
            }
            payload = self._base("chat.completion")
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": "length"}
            payload = self._base("text_completion")
        return json_reply(
            200, {**payload, "choices": [choice], "usage": self._usage(tokens), **extra}
        )

    def event(self, data: list[int], last: bool, tokens: int | None = None) -> bytes:
        """One SSE event for the next UTF-8 bytes ``data``, made of ``tokens`` new tokens
        (default: one per byte, the byte LM's), decoded incrementally (a character split over
        two chunks arrives whole); after the last, ``[DONE]``."""
        self.tokens += len(data) if tokens is None else tokens
        text = self._decoder.decode(bytes(data), final=last)
        finish = "length" if last else None
        if self.request.route == CHAT:
            delta: dict[str, Any] = {"content": text}
            if not self._role_sent:
                delta["role"], self._role_sent = "assistant", True
            choice = {"index": 0, "delta": delta, "finish_reason": finish}
            payload = {**self._base("chat.completion.chunk"), "choices": [choice]}
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
            payload = {**self._base("text_completion"), "choices": [choice]}
        event = f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"
        if last and self.request.include_usage:
            kind = "chat.completion.chunk" if self.request.route == CHAT else "text_completion"
            usage = {**self._base(kind), "choices": [], "usage": self._usage(self.tokens)}
            event += f"data: {json.dumps(usage)}\n\n"
        if last:
            event += "data: [DONE]\n\n"
        return event.encode("utf-8")
