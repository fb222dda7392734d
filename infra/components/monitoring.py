"""Metrics collection, dashboards and alerts of one stack on Google Cloud Observability.

- **PodMonitoring** (Managed Service for Prometheus, managed collection): in every namespace
  that holds Ray objects, scrape every Ray head and worker pod (KubeRay labels them
  ``ray.io/is-ray-node: yes``) on Ray's metrics export port. Ray's own system metrics and the
  ``ray_raytpu_*`` series of :mod:`workloads.telemetry` come from that one endpoint.
- **Rules**: the alert rules of :mod:`infra.manifests.monitoring_rules` in each of those namespaces,
  evaluated by GMP's managed rule evaluator (alerts go to the Alertmanager GMP is configured
  with).
- **Dashboards**: the slices, training and serving dashboards of :mod:`infra.manifests.dashboards` as
  Cloud Monitoring dashboards whose charts query the same series with PromQL.

Every GMP object is checked against the GMP CRDs (:mod:`raytpu.gmp_crds`) by the offline checks
(``raytpu preview``, ``raytpu check``, the tests), never while declaring: ``pulumi up`` needs no
CRD file.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pulumi
import pulumi_gcp as gcp
import pulumi_kubernetes as k8s

from infra.components import custom_resource
from infra.manifests import dashboards, monitoring_rules
from raytpu import gmp_crds
from raytpu.ray_names import K8S_LABEL_IS_RAY_NODE, METRICS_PORT

SCRAPE_INTERVAL = "30s"


@dataclass(frozen=True)
class MonitoringArgs:
    project: str
    stack: str
    namespaces: Sequence[str]
    """Namespaces holding Ray objects."""
    provider: k8s.Provider
    depends_on: Sequence[pulumi.Resource] = field(default_factory=tuple)


def pod_monitoring(namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": gmp_crds.API_VERSION,
        "kind": "PodMonitoring",
        "metadata": {"name": "ray-metrics", "namespace": namespace},
        "spec": {
            "selector": {"matchLabels": {K8S_LABEL_IS_RAY_NODE: "yes"}},
            "endpoints": [{"port": METRICS_PORT, "path": "/metrics", "interval": SCRAPE_INTERVAL}],
            "targetLabels": {
                "fromPod": [{"from": "ray.io/cluster", "to": "ray_cluster"}],
            },
        },
    }


def alert_rules(namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": gmp_crds.API_VERSION,
        "kind": "Rules",
        "metadata": {"name": "raytpu-alerts", "namespace": namespace},
        "spec": monitoring_rules.rule_groups(),
    }


class Monitoring(pulumi.ComponentResource):
    """Outputs: ``podMonitorings``, ``rules`` (namespace/name) and ``dashboards`` (ids)."""

    def __init__(
        self, name: str, args: MonitoringArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("ray-tpu:infra:Monitoring", name, None, opts)
        k8s_opts = pulumi.ResourceOptions(
            parent=self, provider=args.provider, depends_on=list(args.depends_on)
        )
        self.pod_monitorings = []
        self.rules = []
        for namespace in args.namespaces:
            self.pod_monitorings.append(
                custom_resource.declare(
                    f"{name}-scrape-{namespace}", pod_monitoring(namespace), k8s_opts
                )
            )
            self.rules.append(
                custom_resource.declare(
                    f"{name}-alerts-{namespace}", alert_rules(namespace), k8s_opts
                )
            )
        self.dashboards = [
            gcp.monitoring.Dashboard(
                f"{name}-{spec.uid}",
                project=args.project,
                dashboard_json=json.dumps(
                    dashboards.cloud_monitoring_dashboard(spec, args.stack), sort_keys=True
                ),
                opts=pulumi.ResourceOptions(parent=self),
            )
            for spec in dashboards.DASHBOARDS
        ]
        self.register_outputs(
            {
                "podMonitorings": [f"{ns}/ray-metrics" for ns in args.namespaces],
                "rules": [f"{ns}/raytpu-alerts" for ns in args.namespaces],
                "dashboards": [d.id for d in self.dashboards],
            }
        )
