"""Write the alert rules and dashboards as files: Prometheus rules, Grafana and Cloud Monitoring JSON.

Examples:
  raytpu observability --out build/observability
  promtool check rules build/observability/prometheus/rules.yaml

Writes ``prometheus/rules.yaml`` (the alert rules, the same groups the stack declares as a
Managed Service for Prometheus Rules object), ``grafana/<uid>.json`` (import into any Grafana,
e.g. the one the Ray Dashboard embeds) and ``cloud-monitoring/<uid>.json`` for ``--stack``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import yaml


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("--out", default="build/observability", help="folder to write into")
    parser.add_argument(
        "--stack", default="dev", help="stack the Cloud Monitoring dashboards filter on"
    )


def write_all(out: Path, stack: str) -> list[Path]:
    from infra.manifests import dashboards, monitoring_rules

    written = []
    rules = out / "prometheus" / "rules.yaml"
    rules.parent.mkdir(parents=True, exist_ok=True)
    rules.write_text(yaml.safe_dump(monitoring_rules.rule_groups(), sort_keys=False))
    written.append(rules)
    for spec in dashboards.DASHBOARDS:
        for folder, body in (
            ("grafana", dashboards.grafana_dashboard(spec)),
            ("cloud-monitoring", dashboards.cloud_monitoring_dashboard(spec, stack)),
        ):
            path = out / folder / f"{spec.uid}.json"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(body, indent=2, sort_keys=True) + "\n")
            written.append(path)
    return written


def run(args: argparse.Namespace) -> int:
    for path in write_all(Path(args.out), args.stack):
        print(path)
    return 0
