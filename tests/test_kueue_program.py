"""Three teams share a stack's slices through Kueue, under Pulumi mocks (tests/data/Pulumi.teams.yaml):
Kueue pinned, a ResourceFlavor per TPU flavor with the catalog's node labels, ClusterQueues in
chips, LocalQueues, WorkloadPriorityClasses, queue and priority labels on every team's Ray object,
every Kueue object valid against the Kueue CRDs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from infra.config.schema import StackConfig
from infra.config.stack import load_stack, load_stack_file
from infra.offline import DeclaredResource, ProgramRun, run_program_detailed
from raytpu import kueue

TEAMS_STACK = Path(__file__).parent / "data" / "Pulumi.teams.yaml"
KUEUE_TYPE = "kubernetes:kueue.x-k8s.io/v1beta2:"
QUEUE, PRIORITY = kueue.QUEUE_LABEL, kueue.PRIORITY_LABEL


@pytest.fixture(scope="module")
def stack() -> StackConfig:
    return load_stack_file(TEAMS_STACK)


@pytest.fixture(scope="module")
def run(stack: StackConfig) -> ProgramRun:
    return run_program_detailed(stack, stack="teams")


def _kind(run: ProgramRun, kind: str) -> dict[str, DeclaredResource]:
    found = {}
    for r in run.of_type(KUEUE_TYPE + kind):
        meta = r.props["metadata"]
        found["/".join(filter(None, (meta.get("namespace"), meta["name"])))] = r
    return found


def _manifest(resource: DeclaredResource) -> dict[str, Any]:
    return {k: v for k, v in resource.props.items() if k != "__defaults"}


def test_kueue_release_is_pinned(run: ProgramRun) -> None:
    (release,) = run.of_type("kubernetes:helm.sh/v3:Release")
    assert release.props["chart"] == "oci://registry.k8s.io/kueue/charts/kueue"
    assert release.props["version"] == "0.19.2"
    assert release.props["namespace"] == "kueue-system"
    (component,) = [r for r in run.resources if r.type == "ray-tpu:infra:Kueue"]
    children = [r for r in run.resources if r.type.startswith(KUEUE_TYPE)]
    assert release.parent == component.urn and all(c.parent == component.urn for c in children)
    assert all(release.urn in c.dependencies for c in children)  # after Kueue's webhooks


FLAVORS = {
    # flavor: node labels (catalog: accelerator, topology, machine type, Spot)
    "v6e-4x4-4t": ("tpu-v6e-slice", "4x4", "ct6e-standard-4t", False),
    "v5p-2x2x4-4t": ("tpu-v5p-slice", "2x2x4", "ct5p-hightpu-4t", False),
    "v6e-2x4-8t-spot": ("tpu-v6e-slice", "2x4", "ct6e-standard-8t", True),
}


@pytest.mark.parametrize(("flavor", "expected"), FLAVORS.items(), ids=FLAVORS)
def test_resource_flavor_per_tpu_flavor(run: ProgramRun, flavor: str, expected: tuple) -> None:
    accelerator, topology, machine, spot = expected
    labels = _kind(run, "ResourceFlavor")[flavor].props["spec"]["nodeLabels"]
    wanted = {
        "cloud.google.com/gke-tpu-accelerator": accelerator,
        "cloud.google.com/gke-tpu-topology": topology,
        "node.kubernetes.io/instance-type": machine,
    }
    if spot:
        wanted["cloud.google.com/gke-spot"] = "true"
    assert labels == wanted


def test_no_flavor_beyond_the_stack_slices(run: ProgramRun) -> None:
    assert sorted(_kind(run, "ResourceFlavor")) == sorted([*FLAVORS, "ray-tpu-default"])


# team: ({flavor: (nominal chips, borrowingLimit, lendingLimit)}, cohort, withinCQ, reclaim)
QUEUES = {
    "research": (
        {"v6e-4x4-4t": (32, None, 16), "v5p-2x2x4-4t": (32, None, None)},
        "tpu",
        "LowerPriority",
        "Any",
    ),
    "serving": (
        {"v6e-2x4-8t-spot": (16, None, None), "v6e-4x4-4t": (16, 16, None)},
        "tpu",
        "LowerPriority",
        "Any",
    ),
    "batch": ({"v6e-4x4-4t": (16, 32, None)}, "tpu", "Never", "LowerPriority"),
}


@pytest.mark.parametrize(("team", "expected"), QUEUES.items(), ids=QUEUES)
def test_cluster_queue_quotas_in_chips(run: ProgramRun, team: str, expected: tuple) -> None:
    quotas, cohort, within, reclaim = expected
    spec = _kind(run, "ClusterQueue")[team].props["spec"]
    tpu, other = spec["resourceGroups"]
    assert tpu["coveredResources"] == ["google.com/tpu"]
    found = {}
    for flavor in tpu["flavors"]:
        (resource,) = flavor["resources"]
        found[flavor["name"]] = tuple(
            resource.get(k) for k in ("nominalQuota", "borrowingLimit", "lendingLimit")
        )
    assert found == {
        f: tuple(None if v is None else float(v) for v in q) for f, q in quotas.items()
    }
    assert other["coveredResources"] == ["cpu", "memory"]  # listed, never the limit
    assert spec["cohortName"] == cohort
    assert spec["preemption"]["withinClusterQueue"] == within
    assert spec["preemption"]["reclaimWithinCohort"] == reclaim


LOCAL_QUEUES = {
    "research/research": "research",
    "ray/research": "research",  # paper-run: team research by its `team` key, namespace ray
    "serving/serving": "serving",
    "batch/batch": "batch",
}


def test_local_queues_per_namespace(run: ProgramRun) -> None:
    found = {k: r.props["spec"]["clusterQueue"] for k, r in _kind(run, "LocalQueue").items()}
    assert found == LOCAL_QUEUES


def test_priority_classes(run: ProgramRun) -> None:
    found = {k: r.props["value"] for k, r in _kind(run, "WorkloadPriorityClass").items()}
    assert found == {"low": 100.0, "normal": 500.0, "high": 1000.0}


# Ray object: (queue, priority) labels
LABELS = {
    "kubernetes:ray.io/v1:RayCluster:research-dev": ("research", "normal"),  # by namespace
    "kubernetes:ray.io/v1:RayService:chat": ("serving", "high"),
    "kubernetes:ray.io/v1:RayJob:nightly": ("batch", "low"),
    "kubernetes:ray.io/v1:RayJob:paper-run": ("research", "high"),  # team key, own priority
}


@pytest.mark.parametrize(("key", "expected"), LABELS.items(), ids=LABELS)
def test_team_objects_carry_queue_and_priority(
    run: ProgramRun, key: str, expected: tuple[str, str]
) -> None:
    type_, name = key.rsplit(":", 1)
    prefix = type_.rsplit(":", 1)[1].lower()  # resource names: <kind>-<name> (a RayJob's
    (obj,) = [r for r in run.of_type(type_) if r.name == f"{prefix}-{name}"]  # object: + digest)
    labels = obj.props["metadata"]["labels"]
    assert (labels[QUEUE], labels[PRIORITY]) == expected
    namespace = obj.props["metadata"]["namespace"]
    queue = _kind(run, "LocalQueue")[f"{namespace}/{expected[0]}"]
    assert queue.urn in obj.dependencies  # created once its queue exists
    assert obj.props["spec"].get("enableInTreeAutoscaling", False) is False


@pytest.mark.crds("kueue")
def test_every_kueue_object_is_valid_against_the_crds(run: ProgramRun) -> None:
    declared = [r for r in run.resources if r.type.startswith(KUEUE_TYPE)]
    assert len(declared) == 4 + 3 + 3 + 4
    for resource in declared:
        assert kueue.validate_object(_manifest(resource)) == [], resource.name


@pytest.mark.parametrize("name", ["dev", "prod"], ids=["dev", "prod"])
def test_stacks_without_teams_get_no_kueue_labels(name: str) -> None:
    config = load_stack(name)
    if config.teams:
        pytest.skip(f"{name} declares teams")
    run = run_program_detailed(config, stack=name)
    assert not [r for r in run.resources if r.type.startswith(KUEUE_TYPE)]
    for r in run.resources:
        if r.type.startswith("kubernetes:ray.io/"):
            assert QUEUE not in r.props["metadata"]["labels"]


CRD_PROBLEMS = {
    "fractional-quota-type": (
        lambda m: m["spec"]["resourceGroups"][0]["flavors"][0]["resources"][0].update(
            nominalQuota=[16]
        ),
        "nominalQuota",
    ),
    "bad-preemption": (
        lambda m: m["spec"]["preemption"].update(withinClusterQueue="Sometimes"),
        "'Sometimes' is not one of",
    ),
    "unknown-field": (lambda m: m["spec"].update(cohort="tpu"), "spec.cohort: unknown field"),
}


@pytest.mark.crds("kueue")
@pytest.mark.parametrize(("break_it", "message"), CRD_PROBLEMS.values(), ids=CRD_PROBLEMS)
def test_kueue_crd_check_refuses_bad_objects(stack: StackConfig, break_it, message: str) -> None:
    from infra.manifests import kueue as kueue_spec

    manifest = kueue_spec.cluster_queue(stack, stack.teams[0])
    break_it(manifest)
    assert any(message in p for p in kueue.validate_object(manifest))
