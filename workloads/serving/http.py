"""HTTP pieces shared by the replica (:mod:`workloads.serving.replica`) and the router
(:mod:`workloads.serving.router`): a reply's head, refusals in each route's error shape, and
Starlette responses, streamed for server-sent events."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from workloads.serving import openai_api
from workloads.serving.requests import error_reply

SERVED_BY = "X-Raytpu-Served-By"
"""Response header: ``tpu``, ``fallback-cpu`` or ``fallback-openai``."""


@dataclass(frozen=True)
class Head:
    """The first item of :meth:`TextGenerator.respond`: status, media type and headers."""

    status: int
    media_type: str = "application/json"
    headers: dict[str, str] = field(default_factory=dict)


def refusal(status: int, message: str, route: str, retry_after: int = 0) -> tuple[Head, bytes]:
    """A refusal in the route's error shape (OpenAI's on ``/v1``), with ``Retry-After`` if set."""
    reply = openai_api.error_body(status, message) if route else error_reply(status, message)
    headers = {"Retry-After": str(retry_after)} if retry_after else {}
    return Head(reply.status, headers=headers), reply.body


async def respond_http(head: Head, parts: AsyncIterator[bytes]) -> Any:
    """A Starlette response for :meth:`TextGenerator.respond`'s head and the rest of its parts:
    streamed for ``text/event-stream``, else read whole."""
    from starlette.responses import StreamingResponse

    if head.media_type == "text/event-stream":
        return StreamingResponse(
            parts, status_code=head.status, media_type=head.media_type, headers=head.headers
        )
    return to_response(head, b"".join([part async for part in parts]))


def to_response(head: Head, body: bytes) -> Any:
    from starlette.responses import Response

    return Response(body, status_code=head.status, media_type=head.media_type, headers=head.headers)
