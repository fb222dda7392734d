"""Alert rules and dashboards as code, checked by the tools that consume them: ``promtool check
rules`` and ``promtool test rules`` (the hang, loss-spike and restart alerts fire on synthetic
series and stay silent on healthy ones), and the Grafana Foundation SDK's own dashboard model."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from obs_tools import binary

from infra.manifests import dashboards, monitoring_rules
from raytpu import metric_names as mn

LABELS = {"stack": "dev", "slice": "train", "generation": "v6e", "topology": "2x4"}
SERIES_LABELS = ",".join(f'{k}="{v}"' for k, v in LABELS.items()) + ',WorkerId="w0"'
ALERT_LABELS = {**LABELS, "team": "ray-tpu"}


def _promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [binary("promtool"), *args], cwd=cwd, capture_output=True, text=True, timeout=60
    )


@pytest.fixture
def rules_dir(tmp_path: Path) -> Path:
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(monitoring_rules.rule_groups()))
    return tmp_path


def test_promtool_check_rules(rules_dir: Path) -> None:
    result = _promtool("check", "rules", "rules.yaml", cwd=rules_dir)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(monitoring_rules.ALERTS)} rules found" in result.stdout


def test_every_dashboard_query_parses(tmp_path: Path) -> None:
    """promtool parses every dashboard expression (as recording rules: a syntax check)."""
    rules = [
        {"record": f"raytpu:dashboard_query_{i}", "expr": dashboards.concrete(q.expr)}
        for i, (_, q) in enumerate(dashboards.all_queries())
    ]
    (tmp_path / "queries.yaml").write_text(
        yaml.safe_dump({"groups": [{"name": "dashboards", "rules": rules}]})
    )
    result = _promtool("check", "rules", "queries.yaml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


def _alert_case(
    alert: str,
    metric: str,
    values: str,
    eval_time: str,
    fires: bool,
    severity: str,
    extra_labels: str = "",
) -> dict[str, Any]:
    rule = monitoring_rules.alert(alert).rule()
    summary = rule["annotations"]["summary"].replace("{{ $labels.slice }}", LABELS["slice"])
    summary = summary.replace("{{ $labels.generation }}", LABELS["generation"])
    summary = summary.replace("{{ $labels.topology }}", LABELS["topology"])
    expected = [
        {
            "exp_labels": {**ALERT_LABELS, "severity": severity},
            "exp_annotations": {
                "summary": summary,
                "description": rule["annotations"]["description"],
            },
        }
    ]
    return {
        "interval": "1m",
        "input_series": [
            {"series": f"{metric}{{{SERIES_LABELS}{extra_labels}}}", "values": values}
        ],
        "alert_rule_test": [
            {"eval_time": eval_time, "alertname": alert, "exp_alerts": expected if fires else []}
        ],
    }


STEPS = f"{mn.TRAIN_STEPS.promql}_total"
LOSS = mn.TRAIN_LOSS.promql
FAULTS = f"{mn.TRAIN_FAULT_EVENTS.promql}_total"
ALERT_CASES = {
    # 5 minutes of steps, then the counter stands still: fires once 10 min flat + 5 min "for".
    "hang-fires": ("RayTpuTrainingHang", STEPS, "0+10x5 50x30", "25m", True, "critical"),
    "steady-steps-silent": ("RayTpuTrainingHang", STEPS, "0+10x40", "25m", False, "critical"),
    "hang-not-yet-for-long-enough": (
        "RayTpuTrainingHang",
        STEPS,
        "0+10x5 50x30",
        "12m",
        False,
        "critical",
    ),
    # Loss 2.0 for 30 minutes, then 6.0: 3x its 30-minute mean.
    "loss-spike-fires": ("RayTpuLossSpike", LOSS, "2x30 6x10", "35m", True, "warning"),
    "falling-loss-silent": ("RayTpuLossSpike", LOSS, "4-0.05x60", "35m", False, "warning"),
    "noisy-loss-silent": (
        "RayTpuLossSpike",
        LOSS,
        "2 2.3 2.1 2.4 2 2.2 2.3 2.1 2 2.4 2.2 2.1 2.3 2 2.2 2.4 2.1 2 2.3 2.2 2.1 2.4 2 2.2 "
        "2.3 2.1 2 2.4 2.2 2.1 2.3 2 2.2 2.4 2.1 2.3",
        "35m",
        False,
        "warning",
    ),
    # One more lost host a minute for 5 minutes: 5 restarts in the hour.
    "restarts-fire": (
        "RayTpuTrainingRestarts", FAULTS, "0+1x5 5x20", "10m", True, "warning",
        ',event_class="host_loss"',
    ),
    "one-restart-silent": (
        "RayTpuTrainingRestarts", FAULTS, "0 1x30", "10m", False, "warning",
        ',event_class="hang"',
    ),
    "skipped-spikes-are-no-restarts": (
        "RayTpuTrainingRestarts", FAULTS, "0+1x10", "10m", False, "warning",
        ',event_class="loss_spike"',
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", ALERT_CASES.values(), ids=ALERT_CASES.keys())
def test_promtool_alert_unit_tests(rules_dir: Path, case: tuple[Any, ...]) -> None:
    document = {
        "rule_files": ["rules.yaml"],
        "evaluation_interval": "1m",
        "tests": [_alert_case(*case)],
    }
    (rules_dir / "test.yaml").write_text(yaml.safe_dump(document, sort_keys=False))
    result = _promtool("test", "rules", "test.yaml", cwd=rules_dir)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_promtool_unit_test_can_fail(rules_dir: Path) -> None:
    """The unit test above is not vacuous: expecting silence where the hang fires fails."""
    case = _alert_case("RayTpuTrainingHang", STEPS, "0+10x5 50x30", "25m", False, "critical")
    document = {"rule_files": ["rules.yaml"], "evaluation_interval": "1m", "tests": [case]}
    (rules_dir / "test.yaml").write_text(yaml.safe_dump(document, sort_keys=False))
    result = _promtool("test", "rules", "test.yaml", cwd=rules_dir)
    assert result.returncode != 0
    assert "RayTpuTrainingHang" in result.stdout + result.stderr


@pytest.mark.parametrize("spec", dashboards.DASHBOARDS, ids=[d.uid for d in dashboards.DASHBOARDS])
def test_grafana_dashboard_round_trips_through_the_sdk_model(
    spec: dashboards.DashboardSpec,
) -> None:
    from grafana_foundation_sdk.cog.plugins import register_default_plugins
    from grafana_foundation_sdk.models.dashboard import Dashboard
    from grafana_foundation_sdk.models.prometheus import Dataquery

    register_default_plugins()  # so that targets decode as Prometheus queries
    raw = dashboards.grafana_dashboard(spec)
    model = Dashboard.from_json(raw)
    assert model.uid == spec.uid and model.title == spec.title
    assert [p.title for p in model.panels] == [p.title for p in spec.panels]
    targets = [t for p in model.panels for t in p.targets]
    assert all(isinstance(t, Dataquery) for t in targets)
    exprs = [t.expr for t in targets]
    assert exprs == [q.expr for p in spec.panels for q in p.queries]
    assert {v.name for v in model.templating.list_val} == {"datasource", "stack"}


@pytest.mark.parametrize("spec", dashboards.DASHBOARDS, ids=[d.uid for d in dashboards.DASHBOARDS])
def test_cloud_monitoring_dashboard_has_concrete_promql(spec: dashboards.DashboardSpec) -> None:
    board = dashboards.cloud_monitoring_dashboard(spec, "prod")
    queries = [
        d["timeSeriesQuery"]["prometheusQuery"]
        for t in board["mosaicLayout"]["tiles"]
        for d in t["widget"]["xyChart"]["dataSets"]
    ]
    assert len(queries) == sum(len(p.queries) for p in spec.panels)
    assert not [q for q in queries if "$" in q]
    filtered = [q for q in queries if "stack=~" in q]
    assert filtered and all('stack=~"prod"' in q for q in filtered)
    assert board["displayName"].endswith("(prod)")


def test_every_series_is_labelled_and_no_per_request_label() -> None:
    per_request = {"request_id", "prompt", "trace_id", "user"}
    for metric in mn.ALL_METRICS:
        assert metric.tag_keys[:4] == mn.BASE_LABELS, metric.name
        assert not per_request & set(metric.tag_keys), metric.name
