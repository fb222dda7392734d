"""Dashboards as code: slices, training and serving, from one panel list, in two renderings.

Pure (no Pulumi). :data:`DASHBOARDS` holds each dashboard's panels (title, PromQL, unit).
:func:`grafana_dashboard` renders one with the Grafana Foundation SDK's builders (the
``grafana-foundation-sdk`` package, Grafana Labs' maintained successor of grafanalib) for a
Grafana (the Ray Dashboard embeds Grafana panels); :func:`cloud_monitoring_dashboard` renders
the same panels as a Cloud Monitoring dashboard whose charts query Managed Service for
Prometheus with PromQL (what :mod:`infra.components.monitoring` declares per stack).

The PromQL uses two Grafana variables: ``$stack`` (a regex, from the ``stack`` label) and
``$__rate_interval``; :func:`concrete` substitutes them for Cloud Monitoring and for tests.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from infra.manifests import monitoring_rules as rules
from raytpu import metric_names as mn

BY = rules.BY
SEL = '{stack=~"$stack"}'
RATE = "$__rate_interval"
DATASOURCE_UID = "${datasource}"


@dataclass(frozen=True)
class Query:
    expr: str
    legend: str
    labels: tuple[str, ...] = mn.BASE_LABELS
    """Labels every series of the result carries (checked against a real Prometheus)."""


@dataclass(frozen=True)
class PanelSpec:
    title: str
    queries: tuple[Query, ...]
    unit: str = "short"
    description: str = ""


@dataclass(frozen=True)
class DashboardSpec:
    uid: str
    title: str
    panels: tuple[PanelSpec, ...]


def _quantile(q: float, metric: mn.Metric, *extra: str, window: str = "") -> str:
    """The ``q`` quantile over ``$__rate_interval``; with ``window`` (``1h``), over that window's
    increase instead (for events too rare to show in a rate)."""
    by = ", ".join(("le", *mn.BASE_LABELS, *extra))
    series = f"{metric.promql}_bucket{SEL}"
    over = f"increase({series}[{window}])" if window else f"rate({series}[{RATE}])"
    return f"histogram_quantile({q}, sum by ({by}) ({over}))"


def _gauge(metric: mn.Metric) -> str:
    return f"max by ({BY}) ({metric.promql}{SEL})"


LEGEND = "{{stack}}/{{slice}} {{generation}} {{topology}}"

SLICES = DashboardSpec(
    "raytpu-slices",
    "ray-tpu: TPU slices",
    (
        PanelSpec(
            "Slice reservations by outcome",
            (
                Query(
                    f"sum by ({BY}, outcome, hosts, slices) "
                    f"(increase({mn.RESERVATIONS.promql}_total{SEL}[{RATE}]))",
                    LEGEND + " {{outcome}}",
                    (*mn.BASE_LABELS, "outcome", "hosts", "slices"),
                ),
            ),
            description="ok, or the scheduling error class (no capacity, partial slice, "
            "mis-sized request)",
        ),
        PanelSpec(
            "Reservation wait p90",
            (Query(_quantile(0.9, mn.RESERVATION_WAIT, "outcome"), LEGEND + " {{outcome}}"),),
            unit="s",
        ),
        PanelSpec(
            "Failures by error class",
            (
                Query(
                    f"sum by ({BY}, workload, error_class) "
                    f"(increase({mn.ERRORS.promql}_total{SEL}[{RATE}]))",
                    LEGEND + " {{workload}} {{error_class}}",
                    (*mn.BASE_LABELS, "workload", "error_class"),
                ),
            ),
        ),
    ),
)

TRAINING = DashboardSpec(
    "raytpu-training",
    "ray-tpu: training",
    (
        PanelSpec("Loss", (Query(_gauge(mn.TRAIN_LOSS), LEGEND),)),
        PanelSpec(
            "Steps per second",
            (
                Query(
                    f"sum by ({BY}) (rate({mn.TRAIN_STEPS.promql}_total{SEL}[{RATE}]))",
                    LEGEND,
                ),
            ),
        ),
        PanelSpec(
            "Step time p50 / p95",
            (
                Query(_quantile(0.5, mn.TRAIN_STEP_SECONDS), LEGEND + " p50"),
                Query(_quantile(0.95, mn.TRAIN_STEP_SECONDS), LEGEND + " p95"),
            ),
            unit="s",
        ),
        PanelSpec("Tokens per second", (Query(_gauge(mn.TRAIN_TOKENS_PER_S), LEGEND),)),
        PanelSpec(
            "MFU (estimate)",
            (Query(_gauge(mn.TRAIN_MFU), LEGEND),),
            unit="percentunit",
            description="6 x parameters x tokens/s over chips x the catalog's peak bf16 FLOP/s",
        ),
        PanelSpec(
            "Goodput of the last run",
            (Query(_gauge(mn.TRAIN_GOODPUT), LEGEND),),
            unit="percentunit",
            description="Productive step time over wall time (restarts and lost steps excluded)",
        ),
        PanelSpec(
            "Fault events (last hour)",
            (
                Query(
                    f"sum by ({BY}, event_class) "
                    f"(increase({mn.TRAIN_FAULT_EVENTS.promql}_total{SEL}[1h]))",
                    LEGEND + " {{event_class}}",
                    (*mn.BASE_LABELS, "event_class"),
                ),
            ),
            description="Hangs, lost hosts and slices, preemptions, loss spikes and slow hosts "
            f"the goodput layer handled; each restart is one of {', '.join(mn.RESTART_CLASSES)}",
        ),
        PanelSpec(
            "Recovery time p90 (last hour)",
            (
                Query(
                    _quantile(0.9, mn.TRAIN_RECOVERY_SECONDS, "event_class", window="1h"),
                    LEGEND + " {{event_class}}",
                    (*mn.BASE_LABELS, "event_class"),
                ),
            ),
            unit="s",
            description="From a failed attempt until the next one finished a step",
        ),
        PanelSpec(
            "Checkpoint time p90",
            (
                Query(
                    _quantile(0.9, mn.CHECKPOINT_SECONDS, "operation"),
                    LEGEND + " {{operation}}",
                    (*mn.BASE_LABELS, "operation"),
                ),
            ),
            unit="s",
        ),
    ),
)

SERVING = DashboardSpec(
    "raytpu-serving",
    "ray-tpu: serving",
    (
        PanelSpec(
            "Requests per second by status class",
            (
                Query(
                    f"sum by ({BY}, status_class) "
                    f"(rate({mn.SERVE_REQUESTS.promql}_total{SEL}[{RATE}]))",
                    LEGEND + " {{status_class}}",
                    (*mn.BASE_LABELS, "status_class"),
                ),
            ),
            unit="reqps",
        ),
        PanelSpec("5xx ratio", (Query(rules.SERVE_ERROR_RATIO, LEGEND),), unit="percentunit"),
        PanelSpec(
            "Request latency p50 / p99",
            (
                Query(_quantile(0.5, mn.SERVE_LATENCY), LEGEND + " p50"),
                Query(_quantile(0.99, mn.SERVE_LATENCY), LEGEND + " p99"),
            ),
            unit="s",
        ),
        PanelSpec(
            "Time to first token p50 / p99",
            (
                Query(_quantile(0.5, mn.SERVE_TTFT), LEGEND + " p50"),
                Query(_quantile(0.99, mn.SERVE_TTFT), LEGEND + " p99"),
            ),
            unit="s",
        ),
        PanelSpec(
            "Time per output token p50", (Query(_quantile(0.5, mn.SERVE_TPOT), LEGEND),), unit="s"
        ),
        PanelSpec(
            "Prefix cache hit ratio",
            (
                Query(
                    f"sum by ({BY}) (rate({mn.SERVE_PREFIX_HITS.promql}_total{SEL}[{RATE}])) / "
                    f"(sum by ({BY}) (rate({mn.SERVE_PREFIX_HITS.promql}_total{SEL}[{RATE}])) + "
                    f"sum by ({BY}) (rate({mn.SERVE_PREFIX_MISSES.promql}_total{SEL}[{RATE}])))",
                    LEGEND,
                ),
            ),
            unit="percentunit",
            description="Prompt KV blocks found in any tier over blocks looked up",
        ),
        PanelSpec("Queue depth", (Query(_gauge(mn.SERVE_QUEUE), LEGEND),)),
        PanelSpec(
            "Mean batch size",
            (
                Query(
                    f"sum by ({BY}) (rate({mn.SERVE_BATCH.promql}_sum{SEL}[{RATE}])) / "
                    f"sum by ({BY}) (rate({mn.SERVE_BATCH.promql}_count{SEL}[{RATE}]))",
                    LEGEND,
                ),
            ),
        ),
    ),
)

DASHBOARDS: tuple[DashboardSpec, ...] = (SLICES, TRAINING, SERVING)


def concrete(expr: str, *, stack: str = ".*", rate_interval: str = "1m") -> str:
    """``expr`` with the Grafana variables replaced (Cloud Monitoring, tests)."""
    return expr.replace("$stack", stack).replace("$__rate_interval", rate_interval)


def all_queries() -> list[tuple[str, Query]]:
    """(where, query) for every panel query: what the real-Prometheus test evaluates."""
    return [(f"{d.uid}/{p.title}", q) for d in DASHBOARDS for p in d.panels for q in p.queries]


# ------------------------------------------------------------------------------ Grafana
def grafana_dashboard(spec: DashboardSpec) -> dict[str, Any]:
    """``spec`` as Grafana dashboard JSON, built with the Grafana Foundation SDK."""
    from grafana_foundation_sdk.builders import dashboard, prometheus, timeseries
    from grafana_foundation_sdk.cog.encoder import JSONEncoder
    from grafana_foundation_sdk.models.dashboard import DataSourceRef

    source = DataSourceRef(type_val="prometheus", uid=DATASOURCE_UID)
    builder = (
        dashboard.Dashboard(spec.title)
        .uid(spec.uid)
        .tags(["ray-tpu", "tpu"])
        .refresh("30s")
        .time("now-3h", "now")
        .timezone("browser")
        .with_variable(
            dashboard.DatasourceVariable("datasource").label("Data source").type("prometheus")
        )
        .with_variable(
            dashboard.QueryVariable("stack")
            .label("Stack")
            .datasource(source)
            .query("label_values(stack)")
            .include_all(True)
            .all_value(".*")
            .multi(True)
        )
    )
    for panel in spec.panels:
        chart = (
            timeseries.Panel()
            .title(panel.title)
            .description(panel.description)
            .unit(panel.unit)
            .datasource(source)
            .height(8)
            .span(12)
        )
        for index, query in enumerate(panel.queries):
            chart = chart.with_target(
                prometheus.Dataquery()
                .expr(query.expr)
                .legend_format(query.legend)
                .ref_id(chr(ord("A") + index))
            )
        builder = builder.with_panel(chart)
    return json.loads(json.dumps(builder.build(), cls=JSONEncoder))


# --------------------------------------------------------------------- Cloud Monitoring
def cloud_monitoring_dashboard(spec: DashboardSpec, stack: str) -> dict[str, Any]:
    """``spec`` as a Cloud Monitoring dashboard (``mosaicLayout``, PromQL charts) for ``stack``."""
    tiles = []
    for index, panel in enumerate(spec.panels):
        tiles.append(
            {
                "xPos": (index % 2) * 24,
                "yPos": (index // 2) * 16,
                "width": 24,
                "height": 16,
                "widget": {
                    "title": panel.title,
                    "xyChart": {
                        "chartOptions": {"mode": "COLOR"},
                        "dataSets": [
                            {
                                "plotType": "LINE",
                                "targetAxis": "Y1",
                                "timeSeriesQuery": {
                                    "prometheusQuery": concrete(
                                        q.expr, stack=stack, rate_interval="5m"
                                    ),
                                },
                            }
                            for q in panel.queries
                        ],
                    },
                },
            }
        )
    return {
        "displayName": f"{spec.title} ({stack})",
        "mosaicLayout": {"columns": 48, "tiles": tiles},
        "labels": {"ray-tpu": "", f"stack-{stack}": ""},
    }
