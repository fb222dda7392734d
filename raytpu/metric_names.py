"""The metrics contract: every series the workloads emit, as the dashboards and alerts query it.

Stdlib only. :mod:`workloads.telemetry` records these through ``ray.util.metrics`` (Ray's own
metrics API); Ray's per-node metrics agent exports them on its Prometheus endpoint with the
``ray_`` prefix, so a metric named ``raytpu_train_loss`` here is ``ray_raytpu_train_loss`` in
PromQL (:func:`promql_name`). :mod:`infra.manifests.monitoring_rules` and :mod:`infra.manifests.dashboards` build
their PromQL from this module only.

Every series carries :data:`BASE_LABELS` (stack, slice, generation, topology). No label ever
takes a per-request value: the extra labels below have small, fixed value sets.
"""

from __future__ import annotations

from dataclasses import dataclass

RAY_PREFIX = "ray_"
"""What Ray's Prometheus exporter puts before an application metric's name."""

BASE_LABELS: tuple[str, ...] = ("stack", "slice", "generation", "topology")
STACK_ENV = "RAYTPU_STACK"
"""The stack name a process reports (set by the Pulumi program in every Ray container);
``local`` when unset."""
SLICE_ENV = "RAYTPU_SLICE"
"""The stack's slice config name (``train``); falls back to ``TPU_NAME`` on a TPU host."""


@dataclass(frozen=True)
class Metric:
    name: str
    kind: str
    """``counter``, ``gauge`` or ``histogram``."""
    description: str
    labels: tuple[str, ...] = ()
    """Labels beyond :data:`BASE_LABELS`."""
    boundaries: tuple[float, ...] = ()
    """Histogram bucket upper bounds."""
    unit: str = ""
    """Grafana unit id of the plotted value (``s``, ``percentunit``...)."""

    @property
    def tag_keys(self) -> tuple[str, ...]:
        return (*BASE_LABELS, *self.labels)

    @property
    def promql(self) -> str:
        """The series name in PromQL (``_total``/``_bucket`` suffixes are the caller's)."""
        return promql_name(self.name)


def promql_name(name: str) -> str:
    return RAY_PREFIX + name


_SECONDS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)

RESERVATIONS = Metric(
    "raytpu_slice_reservations",
    "counter",
    "Slice reservations by outcome (ok or the error class)",
    ("outcome", "hosts", "slices"),
)
RESERVATION_WAIT = Metric(
    "raytpu_slice_reservation_wait_seconds",
    "histogram",
    "Seconds from the request until every host bundle was placed (or it failed)",
    ("outcome",),
    _SECONDS,
    "s",
)
TRAIN_STEPS = Metric("raytpu_train_steps", "counter", "Optimizer steps done")
TRAIN_STEP_SECONDS = Metric(
    "raytpu_train_step_seconds", "histogram", "Wall time per training step", (), _SECONDS, "s"
)
TRAIN_LOSS = Metric("raytpu_train_loss", "gauge", "Training loss of the last step")
TRAIN_TOKENS_PER_S = Metric(
    "raytpu_train_tokens_per_second",
    "gauge",
    "Training tokens per second (all slices)",
    (),
    (),
    "short",
)
TRAIN_MFU = Metric(
    "raytpu_train_mfu",
    "gauge",
    "Model FLOPs utilisation: 6 x params x tokens/s over chips x the catalog's peak bf16 FLOP/s",
    (),
    (),
    "percentunit",
)
CHECKPOINT_SECONDS = Metric(
    "raytpu_checkpoint_seconds",
    "histogram",
    "Checkpoint save / restore time",
    ("operation",),
    _SECONDS,
    "s",
)
TRAIN_GOODPUT = Metric(
    "raytpu_train_goodput",
    "gauge",
    "Productive step time over wall time of the last finished training run",
    (),
    (),
    "percentunit",
)
RESTART_CLASSES = ("hang", "host_loss", "slice_loss", "preemption")
"""Training fault event classes that end an attempt (the run restarts from a checkpoint)."""
FAULT_CLASSES = (*RESTART_CLASSES, "loss_spike", "slow_host")
"""Every training fault event class (``event_class`` of :data:`TRAIN_FAULT_EVENTS`)."""
TRAIN_FAULT_EVENTS = Metric(
    "raytpu_train_fault_events",
    "counter",
    f"Training fault events by class ({', '.join(FAULT_CLASSES)})",
    ("event_class",),
)
TRAIN_RECOVERY_SECONDS = Metric(
    "raytpu_train_recovery_seconds",
    "histogram",
    "Seconds from a failed training attempt until the next one finished a step",
    ("event_class",),
    _SECONDS,
    "s",
)
ERRORS = Metric(
    "raytpu_errors", "counter", "Failures by workload and error class", ("workload", "error_class")
)
SERVE_REQUESTS = Metric(
    "raytpu_serve_requests",
    "counter",
    "HTTP requests by status class (2xx/4xx/5xx) and error class",
    ("status_class", "error_class"),
)
SERVE_LATENCY = Metric(
    "raytpu_serve_request_seconds",
    "histogram",
    "Request latency in the replica",
    (),
    _SECONDS,
    "s",
)
SERVE_TPOT = Metric(
    "raytpu_serve_time_per_output_token_seconds",
    "histogram",
    "Batch generation time over the tokens generated per sequence",
    (),
    (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0),
    "s",
)
SERVE_QUEUE = Metric("raytpu_serve_queue_depth", "gauge", "Requests in flight in the replica")
SERVE_BATCH = Metric(
    "raytpu_serve_batch_size", "histogram", "Requests per generation batch", (), (1, 2, 4, 8, 16)
)
SERVE_TTFT = Metric(
    "raytpu_serve_time_to_first_token_seconds",
    "histogram",
    "Time to first token: prefill (after the prefix cache) plus one decode step",
    (),
    (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5),
    "s",
)
SERVE_PREFIX_HITS = Metric(
    "raytpu_serve_prefix_cache_hits",
    "counter",
    "Prompt KV blocks found in the prefix cache, by tier (device, host, shared)",
    ("tier",),
)
SERVE_PREFIX_MISSES = Metric(
    "raytpu_serve_prefix_cache_misses",
    "counter",
    "Full prompt KV blocks not found in any tier of the prefix cache (prefilled)",
)

ALL_METRICS: tuple[Metric, ...] = (
    RESERVATIONS,
    RESERVATION_WAIT,
    TRAIN_STEPS,
    TRAIN_STEP_SECONDS,
    TRAIN_LOSS,
    TRAIN_TOKENS_PER_S,
    TRAIN_MFU,
    CHECKPOINT_SECONDS,
    TRAIN_GOODPUT,
    TRAIN_FAULT_EVENTS,
    TRAIN_RECOVERY_SECONDS,
    ERRORS,
    SERVE_REQUESTS,
    SERVE_LATENCY,
    SERVE_TPOT,
    SERVE_QUEUE,
    SERVE_BATCH,
    SERVE_TTFT,
    SERVE_PREFIX_HITS,
    SERVE_PREFIX_MISSES,
)
