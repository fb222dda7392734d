"""Slice, training and serving telemetry through Ray's own metrics API (``ray.util.metrics``).

Glossary (Ray's words):

- **application metric**: a ``ray.util.metrics`` Counter, Gauge or Histogram recorded in any
  Ray process (driver, task, actor, Serve replica). The node's **metrics agent** aggregates it
  and serves it on the node's Prometheus endpoint (``metrics_export_port``, 8080 on KubeRay
  pods) with the ``ray_`` prefix: no second exporter, and the Ray Dashboard's Grafana panels
  and Google Cloud Managed Service for Prometheus read the same series.
- **tags**: Ray's word for Prometheus labels. Every series here carries ``stack``, ``slice``,
  ``generation`` and ``topology`` (:data:`raytpu.metric_names.BASE_LABELS`); no tag ever holds
  a per-request value.

The series are declared once in :mod:`raytpu.metric_names`. Call sites stay one line:
``telemetry.reservation(shape, ...)``, ``TrainTelemetry(...)``, ``@telemetry.instrument_http``.
Recording never raises into the workload: a metrics failure is logged once and dropped.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import os
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from raytpu import errors
from raytpu import metric_names as mn
from raytpu.catalog import SliceShape
from raytpu.generations import GENERATIONS

logger = logging.getLogger(__name__)

_metrics: dict[str, Any] = {}
_warned: set[str] = set()


@dataclass(frozen=True)
class Labels:
    """The base labels of every series of one workload."""

    stack: str
    slice: str
    generation: str
    topology: str

    def tags(self, **extra: Any) -> dict[str, str]:
        return {
            "stack": self.stack,
            "slice": self.slice,
            "generation": self.generation,
            "topology": self.topology,
            **{k: str(v) for k, v in extra.items()},
        }


def stack_name() -> str:
    return os.environ.get(mn.STACK_ENV) or "local"


def slice_label(fallback: str) -> str:
    """The ``slice`` label: the stack's slice config name (``train``).

    From ``RAYTPU_SLICE``; else from the host's ``TPU_NAME`` without its copy index
    (``train-0`` -> ``train``); else ``fallback`` (the pod type).
    """
    explicit = os.environ.get(mn.SLICE_ENV)
    if explicit:
        return explicit
    host_slice = os.environ.get("TPU_NAME", "")
    base, _, index = host_slice.rpartition("-")
    if base and index.isdigit():
        return base
    return host_slice or fallback


def labels_for(shape: SliceShape, slice_name: str = "") -> Labels:
    """Labels of a workload on ``shape``."""
    name = slice_name or slice_label(shape.pod_type)
    return Labels(stack_name(), name, shape.generation.name, shape.topology)


def labels_from_host() -> Labels:
    """Labels from the TPU host's environment (a Serve replica does not know its shape)."""
    pod_type = os.environ.get("TPU_ACCELERATOR_TYPE", "")
    generation = next(
        (g.name for g in GENERATIONS.values() if pod_type.startswith(f"{g.accelerator_version}-")),
        "unknown",
    )
    topology = os.environ.get("TPU_TOPOLOGY", "unknown")
    return Labels(stack_name(), slice_label(pod_type or "unknown"), generation, topology)


def _metric(spec: mn.Metric) -> Any:
    """The process's one ``ray.util.metrics`` object for ``spec`` (created on first use)."""
    if spec.name not in _metrics:
        from ray.util import metrics

        common = {"description": spec.description, "tag_keys": spec.tag_keys}
        if spec.kind == "counter":
            _metrics[spec.name] = metrics.Counter(spec.name, **common)
        elif spec.kind == "gauge":
            _metrics[spec.name] = metrics.Gauge(spec.name, **common)
        else:
            _metrics[spec.name] = metrics.Histogram(
                spec.name, boundaries=list(spec.boundaries), **common
            )
    return _metrics[spec.name]


def record(spec: mn.Metric, value: float, labels: Labels, **extra: Any) -> None:
    """Counter: add ``value``; gauge: set it; histogram: observe it. Never raises."""
    try:
        metric = _metric(spec)
        tags = labels.tags(**extra)
        if spec.kind == "counter":
            metric.inc(value, tags=tags)
        elif spec.kind == "gauge":
            metric.set(value, tags=tags)
        else:
            metric.observe(value, tags=tags)
    except Exception as error:  # metrics must never break the workload they observe
        if spec.name not in _warned:
            _warned.add(spec.name)
            logger.warning("metric %s not recorded: %s", spec.name, error)


def error(workload: str, failure: BaseException, labels: Labels) -> errors.ErrorClass:
    """Count ``failure`` under its error class; returns the class."""
    error_class = errors.classify(failure)
    record(mn.ERRORS, 1, labels, workload=workload, error_class=error_class.label)
    return error_class


# ------------------------------------------------------------------------ slice reservations
def reservation(
    shape: SliceShape, num_slices: int, wait_s: float, failure: BaseException | None = None
) -> None:
    """One reservation attempt: outcome ``ok`` or the error class, and how long it waited."""
    labels = labels_for(shape)
    outcome = "ok" if failure is None else errors.classify(failure).label
    record(mn.RESERVATIONS, 1, labels, outcome=outcome, hosts=shape.hosts, slices=num_slices)
    record(mn.RESERVATION_WAIT, wait_s, labels, outcome=outcome)
    if failure is not None:
        error("reservation", failure, labels)


# ------------------------------------------------------------------------------- training
def worker_config(shape: SliceShape, num_slices: int) -> dict[str, Any]:
    """What training workers need to label their series like the driver (plain values)."""
    labels = labels_for(shape)
    return {
        "labels": labels.tags(),
        "chips": shape.chips * int(num_slices),
        "peakBf16Tflops": shape.generation.peak_bf16_tflops,
    }


class TrainTelemetry:
    """Per-step training metrics of one worker (recorded by process 0 only: one series)."""

    def __init__(
        self,
        labels: Labels,
        *,
        chips: int,
        peak_bf16_tflops: float,
        tokens_per_step: int,
        params: int,
        enabled: bool = True,
        flops_per_token: float | None = None,
    ) -> None:
        self.labels = labels
        self.enabled = enabled
        self.tokens_per_step = tokens_per_step
        # The model's training FLOPs per token (a preset counts its attention too), else 6 per
        # parameter (forward + backward); over the peak of every chip.
        per_token = flops_per_token if flops_per_token is not None else 6.0 * params
        self._flops_per_step = per_token * tokens_per_step
        self._peak_flops = chips * peak_bf16_tflops * 1e12

    @classmethod
    def from_config(
        cls,
        config: dict[str, Any] | None,
        run: Any,
        model: Any,
        params: Any,
        flops_per_token: float | None = None,
    ) -> TrainTelemetry:
        """In a worker: from :func:`worker_config`, the TrainConfig, the model's config (its
        ``seq_len``) and params."""
        import jax

        config = config or {}
        raw = config.get("labels") or {}
        labels = Labels(*(str(raw.get(k, "unknown")) for k in mn.BASE_LABELS))
        return cls(
            labels,
            chips=int(config.get("chips", jax.device_count())),
            peak_bf16_tflops=float(config.get("peakBf16Tflops", 0.0)) or math.inf,
            tokens_per_step=int(run.global_batch) * int(model.seq_len),
            params=sum(int(leaf.size) for leaf in jax.tree.leaves(params)),
            enabled=bool(config) and jax.process_index() == 0,
            flops_per_token=flops_per_token,
        )

    def step(self, seconds: float, loss: float) -> None:
        if not self.enabled:
            return
        record(mn.TRAIN_STEPS, 1, self.labels)
        record(mn.TRAIN_STEP_SECONDS, seconds, self.labels)
        if math.isfinite(loss):
            record(mn.TRAIN_LOSS, loss, self.labels)
        if seconds > 0:
            record(mn.TRAIN_TOKENS_PER_S, self.tokens_per_step / seconds, self.labels)
            record(mn.TRAIN_MFU, self._flops_per_step / seconds / self._peak_flops, self.labels)

    @contextlib.contextmanager
    def checkpoint(self, operation: str) -> Iterator[None]:
        """Time a checkpoint ``save`` or ``restore``."""
        began = time.monotonic()
        yield
        if self.enabled:
            record(
                mn.CHECKPOINT_SECONDS, time.monotonic() - began, self.labels, operation=operation
            )

    def failed(self, failure: BaseException) -> None:
        if self.enabled:
            error("train", failure, self.labels)


def goodput(ratio: float, events: Iterable[Any], labels: Labels) -> None:
    """A finished run's goodput and its fault events (:class:`workloads.training.goodput.GoodputEvent`)."""
    record(mn.TRAIN_GOODPUT, ratio, labels)
    for event in events:
        record(mn.TRAIN_FAULT_EVENTS, 1, labels, event_class=event.kind)
        if event.duration_s > 0:
            record(mn.TRAIN_RECOVERY_SECONDS, event.duration_s, labels, event_class=event.kind)


def check_loss(step: int, loss: float) -> None:
    """Raise :class:`raytpu.errors.NonFiniteLossError` when ``loss`` is NaN or infinite."""
    if not math.isfinite(loss):
        raise errors.NonFiniteLossError(f"loss at step {step} is {loss}; the run stops here")


# -------------------------------------------------------------------------------- serving
class ServeTelemetry:
    """Request, queue and batch metrics of one Serve replica."""

    def __init__(self, labels: Labels | None = None) -> None:
        self.labels = labels or labels_from_host()
        self.in_flight = 0

    def request(self, seconds: float, status: int, error_class: str = "none") -> None:
        record(
            mn.SERVE_REQUESTS,
            1,
            self.labels,
            status_class=errors.status_class(status),
            error_class=error_class,
        )
        record(mn.SERVE_LATENCY, seconds, self.labels)

    def queue(self, delta: int) -> None:
        self.in_flight += delta
        record(mn.SERVE_QUEUE, self.in_flight, self.labels)

    def batch(self, size: int, seconds: float, tokens_per_sequence: int) -> None:
        record(mn.SERVE_BATCH, size, self.labels)
        if tokens_per_sequence > 0:
            record(mn.SERVE_TPOT, seconds / tokens_per_sequence, self.labels)

    def first_token(self, seconds: float) -> None:
        record(mn.SERVE_TTFT, seconds, self.labels)

    def prefix(self, counts: Any) -> None:
        """One prefix-cache lookup's block hits per tier and misses
        (:class:`workloads.serving.engine.prefix_cache.Counts`)."""
        for tier, hits in counts.hits.items():
            if hits:
                record(mn.SERVE_PREFIX_HITS, hits, self.labels, tier=tier)
        if counts.misses:
            record(mn.SERVE_PREFIX_MISSES, counts.misses, self.labels)


def of(replica: Any) -> ServeTelemetry:
    """The replica's one :class:`ServeTelemetry` (created on first use)."""
    found = replica.__dict__.get("_telemetry")
    if found is None:
        found = replica.__dict__["_telemetry"] = ServeTelemetry()
    return found


def instrument_http(handler: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    """Wrap a replica's ``async __call__(self, request)``: queue depth, latency, status class.

    An exception that escapes the handler is answered with its error class's HTTP status and a
    JSON body naming the class (``{"error", "code", "errorClass"}``), and counted.
    """

    @functools.wraps(handler)
    async def wrapper(self: Any, request: Any) -> Any:
        from starlette.responses import JSONResponse

        telemetry = of(self)
        began = time.monotonic()
        telemetry.queue(+1)
        try:
            response = await handler(self, request)
            status = int(getattr(response, "status_code", 200))
            answered = errors.of_status(status)
            label = answered.label if answered else "none"
        except Exception as failure:
            error_class = error("serve", failure, telemetry.labels)
            status, label = error_class.http_status, error_class.label
            response = JSONResponse(
                {"error": str(failure), "code": error_class.code, "errorClass": label},
                status_code=status,
            )
        finally:
            telemetry.queue(-1)
        telemetry.request(time.monotonic() - began, status, label)
        return response

    return wrapper
