"""The monitoring the Pulumi program declares per stack, under mocks: managed-Prometheus scraping
of every Ray pod, the alert rules, the Cloud Monitoring dashboards; GMP objects valid against the
GMP CRDs."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from infra.components import monitoring
from infra.config.stack import load_stack
from infra.manifests import dashboards, monitoring_rules
from infra.offline import ProgramRun, run_program_detailed
from raytpu import gmp_crds

POD_MONITORING = "kubernetes:monitoring.googleapis.com/v1:PodMonitoring"
RULES = "kubernetes:monitoring.googleapis.com/v1:Rules"
DASHBOARD = "gcp:monitoring/dashboard:Dashboard"
STACKS = ("dev", "prod")


@pytest.fixture(scope="module")
def runs() -> dict[str, ProgramRun]:
    return {stack: run_program_detailed(load_stack(stack), stack=stack) for stack in STACKS}


def _manifest(props: dict) -> dict:
    return {k: props[k] for k in ("apiVersion", "kind", "metadata", "spec")}


@pytest.mark.parametrize("stack", STACKS, ids=STACKS)
def test_every_ray_namespace_is_scraped(runs: dict[str, ProgramRun], stack: str) -> None:
    run = runs[stack]
    assert run.error is None
    found = {r.props["metadata"]["namespace"]: r for r in run.of_type(POD_MONITORING)}
    assert sorted(found) == sorted(load_stack(stack).namespaces)
    for resource in found.values():
        spec = resource.props["spec"]
        assert spec["selector"] == {"matchLabels": {"ray.io/is-ray-node": "yes"}}
        assert spec["endpoints"] == [{"port": 8080.0, "path": "/metrics", "interval": "30s"}]


@pytest.mark.parametrize("stack", STACKS, ids=STACKS)
def test_alert_rules_per_namespace(runs: dict[str, ProgramRun], stack: str) -> None:
    rules = runs[stack].of_type(RULES)
    assert len(rules) == len(load_stack(stack).namespaces)
    for resource in rules:
        (group,) = resource.props["spec"]["groups"]
        assert [r["alert"] for r in group["rules"]] == [a.name for a in monitoring_rules.ALERTS]
        assert [r["expr"] for r in group["rules"]] == [a.expr for a in monitoring_rules.ALERTS]


@pytest.mark.crds("gmp")
@pytest.mark.parametrize("stack", STACKS, ids=STACKS)
def test_monitoring_objects_pass_the_gmp_crds(runs: dict[str, ProgramRun], stack: str) -> None:
    declared = runs[stack].of_type(POD_MONITORING) + runs[stack].of_type(RULES)
    assert len(declared) == 2 * len(load_stack(stack).namespaces)
    for resource in declared:
        assert gmp_crds.validate_object(_manifest(resource.props)) == [], resource.name


@pytest.mark.parametrize("stack", STACKS, ids=STACKS)
def test_cloud_monitoring_dashboards(runs: dict[str, ProgramRun], stack: str) -> None:
    boards = runs[stack].of_type(DASHBOARD)
    names = sorted(json.loads(b.props["dashboardJson"])["displayName"] for b in boards)
    assert names == sorted(f"{d.title} ({stack})" for d in dashboards.DASHBOARDS)
    assert {b.props["project"] for b in boards} == {load_stack(stack).project}
    for board in boards:
        text = board.props["dashboardJson"]
        assert f'stack=~\\"{stack}\\"' in text and "$" not in text


def test_monitoring_component_parents_its_children(runs: dict[str, ProgramRun]) -> None:
    run = runs["dev"]
    (component,) = [r for r in run.resources if r.type == "ray-tpu:infra:Monitoring"]
    children = [*run.of_type(POD_MONITORING), *run.of_type(RULES), *run.of_type(DASHBOARD)]
    assert children and all(c.parent == component.urn for c in children)


CRD_PROBLEMS = {
    "unknown-field": (
        lambda m: m["spec"]["endpoints"][0].update(prot=1),
        "spec.endpoints[0].prot: unknown field",
    ),
    "missing-selector": (lambda m: m["spec"].pop("selector"), "'selector' is a required"),
    "wrong-api-version": (lambda m: m.update(apiVersion="v1"), "apiVersion: 'v1' is not valid"),
}


@pytest.mark.crds("gmp")
@pytest.mark.parametrize(("break_it", "message"), CRD_PROBLEMS.values(), ids=CRD_PROBLEMS.keys())
def test_gmp_validation_refuses_bad_objects(
    break_it: Callable[[dict], object], message: str
) -> None:
    manifest = monitoring.pod_monitoring("ray")
    break_it(manifest)
    assert any(message in p for p in gmp_crds.validate_object(manifest))
