"""The error taxonomy: every class has a distinct code, label and exit code; existing errors map
onto it (keeping their messages); the CLI prints the class and exits with its code."""

from __future__ import annotations

import io
import urllib.error

import pytest
import requests

from infra.config.schema import ConfigError
from raytpu import errors
from raytpu.catalog import shape
from raytpu.generations import CatalogError
from raytpu_cli import failure
from raytpu_cli.common import UsageError
from workloads.slices.reservation import SliceReservationError
from workloads.training.driver import TrainingError

V6E_2X4 = shape("v6e", "2x4", machine_type="ct6e-standard-4t")


def test_codes_labels_are_unique_and_stable() -> None:
    codes = [c.code for c in errors.ERROR_CLASSES]
    labels = [c.label for c in errors.ERROR_CLASSES]
    assert len(set(codes)) == len(codes) and len(set(labels)) == len(labels)
    assert {c.label: (c.exit_code, c.http_status) for c in errors.ERROR_CLASSES} == {
        "scheduling_no_capacity": (4, 503),
        "scheduling_partial_slice": (4, 503),
        "scheduling_missized_request": (4, 422),
        "runtime_model_error": (5, 500),
        "runtime_nan": (5, 500),
        "network_timeout": (6, 504),
        "upstream_rate_limited": (7, 429),
        "bad_input": (2, 400),
        "unclassified": (1, 500),
    }


def _reservation_error(error_class: errors.ErrorClass) -> SliceReservationError:
    return SliceReservationError(V6E_2X4, 1, 2.0, "why", error_class)


def _wrapped(inner: BaseException, outer: BaseException) -> BaseException:
    try:
        try:
            raise inner
        except BaseException as error:
            raise outer from error
    except BaseException as caught:
        return caught


CASES = {
    "reservation-no-capacity": (_reservation_error(errors.NO_CAPACITY), errors.NO_CAPACITY),
    "reservation-partial": (_reservation_error(errors.PARTIAL_SLICE), errors.PARTIAL_SLICE),
    "training-caused-by-missized-reservation": (
        _wrapped(_reservation_error(errors.MISSIZED_REQUEST), TrainingError("cannot start")),
        errors.MISSIZED_REQUEST,
    ),
    "reservation-wrapping-a-timeout-stays-scheduling": (
        _wrapped(TimeoutError("head pg"), _reservation_error(errors.NO_CAPACITY)),
        errors.NO_CAPACITY,
    ),
    "nan-re-raised-by-ray-as-text": (
        TrainingError("worker 0 failed: NonFiniteLossError: [RTPU-R02 runtime_nan] loss is nan"),
        errors.RUNTIME_NAN,
    ),
    "xla-error-in-a-traceback": (
        TrainingError("Traceback ... jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED"),
        errors.RUNTIME_MODEL,
    ),
    "floating-point": (FloatingPointError("overflow"), errors.RUNTIME_NAN),
    "builtin-timeout": (TimeoutError("timed out"), errors.NETWORK_TIMEOUT),
    "requests-read-timeout": (requests.exceptions.ReadTimeout("read"), errors.NETWORK_TIMEOUT),
    "http-429": (
        urllib.error.HTTPError("http://x", 429, "Too Many Requests", None, None),  # type: ignore[arg-type]
        errors.UPSTREAM_RATE_LIMITED,
    ),
    "config-error": (ConfigError(["ray-tpu:slices[0].topology: bad"]), errors.BAD_INPUT),
    "catalog-error": (CatalogError("topology", "4x5", "2x4"), errors.BAD_INPUT),
    "usage-error": (UsageError("--num-slices: 0"), errors.BAD_INPUT),
    "plain-runtime-error": (RuntimeError("boom"), errors.UNCLASSIFIED),
}


@pytest.mark.parametrize(("error", "expected"), CASES.values(), ids=CASES.keys())
def test_classify(error: BaseException, expected: errors.ErrorClass) -> None:
    assert errors.classify(error) == expected


def test_existing_messages_are_kept() -> None:
    error = _reservation_error(errors.PARTIAL_SLICE)
    assert str(error).startswith("could not reserve 1 x v6e 2x4 (2 hosts x 4 chips")
    assert error.reason == "why"


@pytest.mark.parametrize(
    ("error", "code", "line"),
    [
        (_reservation_error(errors.MISSIZED_REQUEST), 4, "error [RTPU-S03 scheduling_missized"),
        (
            errors.NonFiniteLossError("loss at step 3 is nan"),
            5,
            "error [RTPU-R02 runtime_nan]: loss",
        ),
        (errors.UpstreamRateLimitedError("429"), 7, "error [RTPU-U01 upstream_rate_limited]: 429"),
        (errors.NetworkTimeoutError("no answer"), 6, "error [RTPU-N01 network_timeout]: no"),
        (RuntimeError("boom"), 1, "error [RTPU-X00 unclassified]: boom"),
    ],
    ids=["scheduling", "nan", "rate-limit", "timeout", "unclassified"],
)
def test_cli_report_prints_the_class_and_returns_its_exit_code(
    error: BaseException, code: int, line: str
) -> None:
    out = io.StringIO()
    assert failure.report(error, stream=out) == code
    assert out.getvalue().startswith(line)
    assert out.getvalue().count("[RTPU-") == 1


def test_connection_refused_is_not_a_timeout() -> None:
    with pytest.raises(requests.exceptions.ConnectionError) as caught:
        requests.get("http://127.0.0.1:9/", timeout=5)
    assert errors.classify(caught.value) == errors.UNCLASSIFIED


def test_the_module_table_matches_the_classes() -> None:
    """The table in :mod:`raytpu.errors`' docstring is what people read: it must not drift."""
    rows = [
        [cell.strip() for cell in line.strip("|").split("|")]
        for line in (errors.__doc__ or "").splitlines()
        if line.startswith("| ") and not line.startswith("| class")
    ]
    expected = [
        [c.label, c.code, str(c.exit_code), str(c.http_status), rows[i][4] if i < len(rows) else ""]
        for i, c in enumerate(errors.ERROR_CLASSES)
    ]
    assert rows == expected


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        (200, None),
        (302, None),
        (400, errors.BAD_INPUT),
        (404, errors.BAD_INPUT),
        (429, errors.UPSTREAM_RATE_LIMITED),
        (500, errors.UNCLASSIFIED),
        (502, errors.UNCLASSIFIED),
        (503, errors.NO_CAPACITY),
        (504, errors.NETWORK_TIMEOUT),
    ],
    ids=["ok", "redirect", "bad-request", "not-found", "429", "500", "502", "503", "504"],
)
def test_a_handlers_own_answer_is_counted_under_its_status_class(
    status: int, expected: errors.ErrorClass | None
) -> None:
    assert errors.of_status(status) == expected
    if expected is not None and status in (429, 503, 504):
        assert expected.http_status == status  # the class answers with that status itself


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("topology", "4x5", ["2x2", "2x4"]), "topology: '4x5' is not valid; valid: 2x2, 2x4"),
        (("steps", 0, "an integer >= 1"), "steps: 0 is not valid; valid: an integer >= 1"),
        (
            ("stack", "qa", ("dev", "prod"), "add Pulumi.qa.yaml"),
            "stack: 'qa' is not valid; valid: dev, prod; add Pulumi.qa.yaml",
        ),
    ],
    ids=["list", "phrase", "hint"],
)
def test_invalid_names_field_value_and_valid_ones(args: tuple, message: str) -> None:
    assert errors.invalid(*args) == message


@pytest.mark.parametrize(
    ("args", "reason", "message"),
    [
        (
            ("--port", 5, "a free port"),
            "Address already in use",
            "--port: 5 is not valid (Address already in use); valid: a free port",
        ),
        (
            ("model", "gpt", ["tiny", "small"], "pick one"),
            "not in the catalog",
            "model: 'gpt' is not valid (not in the catalog); valid: tiny, small; pick one",
        ),
        (("steps", 0, "an integer >= 1"), "", "steps: 0 is not valid; valid: an integer >= 1"),
    ],
    ids=["reason", "reason-and-hint", "empty-reason-is-omitted"],
)
def test_invalid_says_why_in_parentheses(args: tuple, reason: str, message: str) -> None:
    assert errors.invalid(*args, reason=reason) == message
