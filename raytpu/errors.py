"""One error taxonomy for every layer: which layer an incident belongs to, named once.

Stdlib only. Each :class:`ErrorClass` has a stable ``code`` (``RTPU-S01``...), a metric label
(``error_class="scheduling_no_capacity"``), the exit code ``raytpu`` returns and the HTTP status
Ray Serve answers. Exceptions carry their class in an ``error_class`` attribute (the classes
below, or any exception that sets it, such as ``SliceReservationError``); :func:`classify`
finds the class of any exception, also across process boundaries (Ray re-raises a worker's
error as text: the ``[RTPU-..]`` tag in the message survives).

| class | code | exit | HTTP | what |
|---|---|---|---|---|
| scheduling_no_capacity | RTPU-S01 | 4 | 503 | no free slice of the shape in time |
| scheduling_partial_slice | RTPU-S02 | 4 | 503 | a slice lacks hosts: it would hang |
| scheduling_missized_request | RTPU-S03 | 4 | 422 | bundles larger than any host |
| runtime_model_error | RTPU-R01 | 5 | 500 | the model / XLA failed |
| runtime_nan | RTPU-R02 | 5 | 500 | the loss became NaN or infinite |
| network_timeout | RTPU-N01 | 6 | 504 | a peer did not answer in time |
| upstream_rate_limited | RTPU-U01 | 7 | 429 | an upstream answered 429 |
| bad_input | RTPU-I01 | 2 | 400 | input refused before anything ran |
| unclassified | RTPU-X00 | 1 | 500 | none of the above |
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass


@dataclass(frozen=True)
class ErrorClass:
    """One class of the taxonomy."""

    label: str
    """The metric label value (``error_class``) and the name in summaries."""
    code: str
    """Stable code, printed as ``[RTPU-S01 scheduling_no_capacity]``."""
    layer: str
    """``scheduling``, ``runtime``, ``network``, ``upstream``, ``input`` or ``unknown``."""
    exit_code: int
    http_status: int
    summary: str

    @property
    def tag(self) -> str:
        return f"[{self.code} {self.label}]"


NO_CAPACITY = ErrorClass(
    "scheduling_no_capacity", "RTPU-S01", "scheduling", 4, 503, "no free slice in time"
)
PARTIAL_SLICE = ErrorClass(
    "scheduling_partial_slice", "RTPU-S02", "scheduling", 4, 503, "a slice lacks hosts"
)
MISSIZED_REQUEST = ErrorClass(
    "scheduling_missized_request", "RTPU-S03", "scheduling", 4, 422, "request no host can hold"
)
RUNTIME_MODEL = ErrorClass("runtime_model_error", "RTPU-R01", "runtime", 5, 500, "model/XLA")
RUNTIME_NAN = ErrorClass("runtime_nan", "RTPU-R02", "runtime", 5, 500, "loss is NaN or inf")
NETWORK_TIMEOUT = ErrorClass("network_timeout", "RTPU-N01", "network", 6, 504, "no answer in time")
UPSTREAM_RATE_LIMITED = ErrorClass(
    "upstream_rate_limited", "RTPU-U01", "upstream", 7, 429, "an upstream answered 429"
)
BAD_INPUT = ErrorClass("bad_input", "RTPU-I01", "input", 2, 400, "input refused")
UNCLASSIFIED = ErrorClass("unclassified", "RTPU-X00", "unknown", 1, 500, "not classified")

ERROR_CLASSES: tuple[ErrorClass, ...] = (
    NO_CAPACITY,
    PARTIAL_SLICE,
    MISSIZED_REQUEST,
    RUNTIME_MODEL,
    RUNTIME_NAN,
    NETWORK_TIMEOUT,
    UPSTREAM_RATE_LIMITED,
    BAD_INPUT,
    UNCLASSIFIED,
)
BY_CODE: dict[str, ErrorClass] = {c.code: c for c in ERROR_CLASSES}
BY_LABEL: dict[str, ErrorClass] = {c.label: c for c in ERROR_CLASSES}
_RUNTIME_NAMES = ("XlaRuntimeError", "JaxRuntimeError")
"""Exception names of a failed XLA computation, as they appear in a re-raised traceback."""
_TAG = re.compile(r"\[(RTPU-[A-Z]\d\d) [a-z_]+\]")


class RayTpuError(RuntimeError):
    """Base of the taxonomy's exceptions; the message starts with the class tag."""

    error_class: ErrorClass = UNCLASSIFIED

    def __init__(self, message: str) -> None:
        super().__init__(f"{self.error_class.tag} {message}")


class NonFiniteLossError(RayTpuError, FloatingPointError):
    """The training loss became NaN or infinite: the run stops instead of training on garbage."""

    error_class = RUNTIME_NAN


class ModelRuntimeError(RayTpuError):
    """The model or XLA failed while running (compile, out of memory, a bad shape)."""

    error_class = RUNTIME_MODEL


class UpstreamRateLimitedError(RayTpuError):
    """An upstream service answered HTTP 429 (Too Many Requests)."""

    error_class = UPSTREAM_RATE_LIMITED


class NetworkTimeoutError(RayTpuError, TimeoutError):
    """A peer did not answer within its bound."""

    error_class = NETWORK_TIMEOUT


def _chain(error: BaseException) -> Iterator[BaseException]:
    """``error`` and its causes/contexts, outermost first, each once."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def _explicit(error: BaseException) -> ErrorClass | None:
    found = getattr(error, "error_class", None)
    return found if isinstance(found, ErrorClass) else None


def _by_type(error: BaseException) -> ErrorClass | None:
    # By its own class name (requests' ReadTimeout, urllib3's ReadTimeoutError), not its bases:
    # urllib3's NewConnectionError (connection refused) derives from ConnectTimeoutError.
    timeout_name = type(error).__name__.endswith(("Timeout", "TimeoutError"))
    if isinstance(error, TimeoutError) or timeout_name:
        return NETWORK_TIMEOUT
    if 429 in (getattr(error, "status_code", None), getattr(error, "code", None)):
        return UPSTREAM_RATE_LIMITED
    if isinstance(error, FloatingPointError):
        return RUNTIME_NAN
    return None


def _tagged(error: BaseException) -> ErrorClass | None:
    text = str(error)
    match = _TAG.search(text)
    if match:
        return BY_CODE.get(match.group(1))
    if any(name in text for name in _RUNTIME_NAMES):
        return RUNTIME_MODEL
    return None


def classify(error: BaseException) -> ErrorClass:
    """The class of ``error`` and its causes, in this order: the innermost exception that names
    its class (a training error caused by a reservation failure is a scheduling error); a
    ``[RTPU-..]`` tag in a message (a worker's error that Ray re-raised as text); the innermost
    timeout / HTTP 429 / floating-point error; an outermost ``ValueError`` (bad input)."""
    chain = list(_chain(error))
    for finder, links in (
        (_explicit, reversed(chain)),
        (_tagged, chain),
        (_by_type, reversed(chain)),
    ):
        for link in links:
            found = finder(link)
            if found is not None:
                return found
    if isinstance(error, ValueError | KeyError | TypeError):
        return BAD_INPUT
    return UNCLASSIFIED


def of_status(http_status: int) -> ErrorClass | None:
    """The class a handler's own error answer is counted under (it raised nothing to classify):
    429 an upstream's rate limit, 503 no capacity, 504 a network timeout, any other 4xx bad
    input, any other 5xx unclassified; ``None`` below 400."""
    status = int(http_status)
    if status < 400:
        return None
    by_status = {429: UPSTREAM_RATE_LIMITED, 503: NO_CAPACITY, 504: NETWORK_TIMEOUT}
    return by_status.get(status, BAD_INPUT if status < 500 else UNCLASSIFIED)


def status_class(http_status: int) -> str:
    """``2xx``/``4xx``/``5xx``: the bounded label for HTTP statuses."""
    return f"{int(http_status) // 100}xx"


def invalid(
    field: str, value: object, valid: str | Iterable[object], hint: str = "", *, reason: str = ""
) -> str:
    """The one message for refused input: the field, the bad value and the valid ones.

    ``invalid("slices[1].topology", "4x5", ["2x2", "2x4"])`` is
    ``"slices[1].topology: '4x5' is not valid; valid: 2x2, 2x4"``; ``valid`` is a list of values
    or a phrase (``"an integer >= 1"``), and ``hint`` says how to fix it, after a semicolon.
    ``reason`` says why, in parentheses: ``invalid("--port", 5, "a free port", reason="in use")``
    is ``"--port: 5 is not valid (in use); valid: a free port"``.
    """
    shown = valid if isinstance(valid, str) else ", ".join(str(v) for v in valid)
    why = f" ({reason})" if reason else ""
    message = f"{field}: {value!r} is not valid{why}; valid: {shown}"
    return f"{message}; {hint}" if hint else message
