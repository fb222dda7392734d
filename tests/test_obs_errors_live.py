"""Error classes produced for real: an upstream that answers 429 and one that never answers
(local stub servers) seen in ``raytpu submit``'s exit code; each class seen in the HTTP status
and the metric label a Serve replica's request wrapper gives it."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
from test_delivery_submit import outputs_file  # noqa: F401  (the saved dev-stack outputs)
from upstream_stub import upstream_stub

from raytpu import errors
from raytpu import metric_names as mn
from raytpu.catalog import shape
from raytpu_cli import main as cli
from workloads import telemetry
from workloads.slices.reservation import SliceReservationError


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("mode", "exit_code", "tag"),
    [("429", 7, "[RTPU-U01 upstream_rate_limited]"), ("hang", 6, "[RTPU-N01 network_timeout]")],
    ids=["upstream-429", "upstream-timeout"],
)
def test_submit_exit_code_names_the_upstream_failure(
    outputs_file: Path,  # noqa: F811
    capsys: pytest.CaptureFixture[str],
    mode: str,
    exit_code: int,
    tag: str,
) -> None:
    with upstream_stub(mode, retry_after=30) as upstream:
        began = time.monotonic()
        code = cli.main(
            [
                "submit",
                "--stack",
                "dev",
                "--outputs",
                str(outputs_file),
                "--address",
                upstream.address,
                "train",
            ]
        )
    err = capsys.readouterr().err
    assert code == exit_code, err
    assert err.startswith(f"error {tag}: ")
    assert time.monotonic() - began < 30


class _Response:
    def __init__(self, status_code: int) -> None:
        self.status_code = status_code


class _Replica:
    """A replica's ``__call__`` that fails with ``failure`` (or answers ``status``)."""

    def __init__(self, failure: BaseException | None = None, status: int = 200) -> None:
        self.failure = failure
        self.status = status

    @telemetry.instrument_http
    async def __call__(self, request: Any) -> Any:
        await asyncio.sleep(0)
        if self.failure is not None:
            raise self.failure
        return _Response(self.status)


@pytest.fixture
def recorded(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, dict[str, Any]]]:
    """Every metric the wrapper records: (name, extra labels)."""
    seen: list[tuple[str, dict[str, Any]]] = []

    def record(spec: mn.Metric, value: float, labels: telemetry.Labels, **extra: Any) -> None:
        seen.append((spec.name, {**labels.tags(), **extra}))

    monkeypatch.setattr(telemetry, "record", record)
    monkeypatch.setenv("TPU_ACCELERATOR_TYPE", "v6e-4")
    monkeypatch.setenv("TPU_TOPOLOGY", "2x2")
    monkeypatch.setenv("TPU_NAME", "serve-0")
    return seen


V6E = shape("v6e", "2x4", machine_type="ct6e-standard-4t")
SERVE_CASES = {
    "missized": (
        SliceReservationError(V6E, 1, 3.0, "too big", errors.MISSIZED_REQUEST),
        422,
        "scheduling_missized_request",
    ),
    "no-capacity": (SliceReservationError(V6E, 1, 3.0, "busy"), 503, "scheduling_no_capacity"),
    "nan": (errors.NonFiniteLossError("loss is nan"), 500, "runtime_nan"),
    "upstream-429": (errors.UpstreamRateLimitedError("429"), 429, "upstream_rate_limited"),
    "timeout": (TimeoutError("no answer"), 504, "network_timeout"),
    "bad-input": (ValueError("prompt: bad"), 400, "bad_input"),
}


@pytest.mark.parametrize(("failure", "status", "label"), SERVE_CASES.values(), ids=SERVE_CASES)
def test_serve_maps_the_class_to_http_status_and_metric_label(
    recorded: list[tuple[str, dict[str, Any]]],
    failure: BaseException,
    status: int,
    label: str,
) -> None:
    response = asyncio.run(_Replica(failure)(object()))
    assert response.status_code == status
    body = response.body.decode()
    assert f'"errorClass":"{label}"' in body and errors.BY_LABEL[label].code in body
    requests_seen = [extra for name, extra in recorded if name == mn.SERVE_REQUESTS.name]
    assert requests_seen == [
        {
            "stack": "local",
            "slice": "serve",
            "generation": "v6e",
            "topology": "2x2",
            "status_class": f"{status // 100}xx",
            "error_class": label,
        }
    ]
    base = {"stack": "local", "slice": "serve", "generation": "v6e", "topology": "2x2"}
    assert (mn.ERRORS.name, {**base, "workload": "serve", "error_class": label}) in recorded


def test_serve_success_and_queue_depth(recorded: list[tuple[str, dict[str, Any]]]) -> None:
    response = asyncio.run(_Replica(status=200)(object()))
    assert response.status_code == 200
    depth = [extra for name, extra in recorded if name == mn.SERVE_QUEUE.name]
    assert len(depth) == 2
    statuses = [e["status_class"] for n, e in recorded if n == mn.SERVE_REQUESTS.name]
    assert statuses == ["2xx"]
