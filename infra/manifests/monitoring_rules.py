"""Prometheus alert rules as code: a training hang, a loss spike, degraded throughput, a run that
keeps restarting, the serving error rate and a p99 latency bound.

Pure (no Pulumi): :func:`rule_groups` is the ``groups:`` document that ``promtool check rules``
reads, :mod:`infra.components.monitoring` declares the same groups as a Managed Service for Prometheus
``Rules`` object, ``raytpu observability`` writes them to a file. Each alert is a *signal*
(a PromQL expression that returns one series per workload whenever the workload reports) and a
*condition* on it; the real-Prometheus test checks that every signal returns data with
:data:`raytpu.metric_names.BASE_LABELS`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from raytpu import metric_names as mn
from raytpu.errors import invalid

BY = ", ".join(mn.BASE_LABELS)
"""Every aggregation keeps the base labels: one alert per stack / slice / generation / topology."""
GROUP_NAME = "raytpu"
EVALUATION_INTERVAL = "30s"


@dataclass(frozen=True)
class Alert:
    name: str
    signal: str
    """PromQL that returns one series per workload while it reports."""
    condition: str
    """Comparison appended to the signal: ``== 0``, ``> 1.5``."""
    for_: str
    severity: str
    summary: str
    description: str

    @property
    def expr(self) -> str:
        return f"{self.signal} {self.condition}"

    def rule(self) -> dict[str, Any]:
        return {
            "alert": self.name,
            "expr": self.expr,
            "for": self.for_,
            "labels": {"severity": self.severity, "team": "ray-tpu"},
            "annotations": {"summary": self.summary, "description": self.description},
        }


def _train_steps_increase(window: str) -> str:
    return f"sum by ({BY}) (increase({mn.TRAIN_STEPS.promql}_total[{window}]))"


def _serve_rate(selector: str = "") -> str:
    return f"sum by ({BY}) (rate({mn.SERVE_REQUESTS.promql}_total{selector}[5m]))"


TRAINING_RESTARTS = (
    f"sum by ({BY}) (increase({mn.TRAIN_FAULT_EVENTS.promql}_total"
    f'{{event_class=~"{"|".join(mn.RESTART_CLASSES)}"}}[1h]))'
)
"""Restarts of the workload's training attempts in the last hour."""

SERVE_ERROR_RATIO = (
    "(" + _serve_rate('{status_class="5xx"}') + f" or {_serve_rate()} * 0) / {_serve_rate()}"
)
"""Share of 5xx answers; 0 (not absent) while a replica answers and nothing fails."""
SERVE_P99 = (
    f"histogram_quantile(0.99, sum by (le, {BY}) (rate({mn.SERVE_LATENCY.promql}_bucket[5m])))"
)

ALERTS: tuple[Alert, ...] = (
    Alert(
        name="RayTpuTrainingHang",
        signal=_train_steps_increase("10m"),
        condition="== 0",
        for_="5m",
        severity="critical",
        summary="Training on {{ $labels.slice }} ({{ $labels.generation }} "
        "{{ $labels.topology }}) made no step in 10 minutes",
        description="The workers report but the step counter stands still: a multi-host slice "
        "that lost a host hangs in its first collective. Check the slice's hosts "
        "(raytpu status) and the workers' logs.",
    ),
    Alert(
        name="RayTpuLossSpike",
        signal=f"max by ({BY}) ({mn.TRAIN_LOSS.promql}) / "
        f"max by ({BY}) (avg_over_time({mn.TRAIN_LOSS.promql}[30m]))",
        condition="> 1.5",
        for_="2m",
        severity="warning",
        summary="Loss on {{ $labels.slice }} is over 1.5x its 30-minute mean",
        description="A loss spike: check the learning rate schedule and the last data shards; "
        "a NaN stops the run with runtime_nan.",
    ),
    Alert(
        name="RayTpuThroughputDegraded",
        signal=f"max by ({BY}) (avg_over_time({mn.TRAIN_TOKENS_PER_S.promql}[5m])) / "
        f"max by ({BY}) (max_over_time({mn.TRAIN_TOKENS_PER_S.promql}[1h]))",
        condition="< 0.5",
        for_="10m",
        severity="warning",
        summary="Training throughput on {{ $labels.slice }} is below half its 1-hour best",
        description="Tokens per second fell: look for checkpoint stalls, input pipeline "
        "stalls or a slow host.",
    ),
    Alert(
        name="RayTpuTrainingRestarts",
        signal=TRAINING_RESTARTS,
        condition="> 3",
        for_="1m",
        severity="warning",
        summary="Training on {{ $labels.slice }} restarted more than 3 times in an hour",
        description="Hangs, lost hosts or preemptions keep restarting the run; each restart "
        "loses the steps since the newest checkpoint. The run's events.jsonl names each fault "
        "and host; check the slice's hosts (raytpu status) and the recovery time panel.",
    ),
    Alert(
        name="RayTpuServeErrorRate",
        signal=SERVE_ERROR_RATIO,
        condition="> 0.05",
        for_="5m",
        severity="critical",
        summary="More than 5% of requests to {{ $labels.slice }} fail (5xx)",
        description="Serving answers 5xx: the error_class label of "
        f"{mn.SERVE_REQUESTS.promql}_total says which layer fails.",
    ),
    Alert(
        name="RayTpuServeLatencyP99",
        signal=SERVE_P99,
        condition="> 2",
        for_="5m",
        severity="warning",
        summary="p99 request latency on {{ $labels.slice }} is above 2 s",
        description="Check queue depth and batch size on the serving dashboard.",
    ),
)


def rule_groups() -> dict[str, Any]:
    """The Prometheus rule file (``groups:``), also the ``spec`` of a GMP ``Rules`` object."""
    return {
        "groups": [
            {
                "name": GROUP_NAME,
                "interval": EVALUATION_INTERVAL,
                "rules": [alert.rule() for alert in ALERTS],
            }
        ]
    }


def alert(name: str) -> Alert:
    for candidate in ALERTS:
        if candidate.name == name:
            return candidate
    raise ValueError(invalid("alert", name, (a.name for a in ALERTS)))
