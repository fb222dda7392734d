"""Every RayCluster / RayService the program declares, for both stacks, validates against the
real KubeRay CRDs; so do KubeRay's own TPU samples; and a broken spec is rejected.

The CRDs come from ``$RAYTPU_KUBERAY_CRDS`` or ``../shared/kuberay/crds``. When they are absent
these tests skip and say so: they never pass without having checked anything.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from infra.config.stack import load_stack
from infra.manifests import kuberay, ray_kinds
from infra.offline import ProgramRun, run_program_detailed
from raytpu import crds

RAY_KINDS = ("kubernetes:ray.io/v1:RayCluster", "kubernetes:ray.io/v1:RayService")


@pytest.fixture(scope="module")
def crd_dir() -> Path:
    """The CRD folder; skips (saying why) when the CRDs are not there."""
    directory = crds.crds_dir()
    try:
        for kind in crds.KINDS:
            crds.validate_spec(kind, {})
    except crds.CrdsMissingError as missing:
        pytest.skip(f"KubeRay CRDs absent, CRD validation NOT run: {missing}")
    return directory


@pytest.fixture(scope="module")
def runs(crd_dir: Path) -> dict[str, ProgramRun]:
    return {
        stack: run_program_detailed(load_stack(stack), stack=stack) for stack in ("dev", "prod")
    }


EXPECTED_OBJECTS = {
    "dev": {("RayCluster", "train"), ("RayService", "serve")},
    "prod": {("RayCluster", "train"), ("RayCluster", "research"), ("RayService", "serve")},
}


@pytest.mark.parametrize("stack", sorted(EXPECTED_OBJECTS), ids=sorted(EXPECTED_OBJECTS))
def test_declared_ray_objects_validate(runs: dict[str, ProgramRun], stack: str) -> None:
    """The specs as the engine sees them (what pulumi-kubernetes would send)."""
    checked = set()
    for resource in runs[stack].resources:
        if resource.type in RAY_KINDS:
            assert crds.validate_object(resource.props) == [], resource.urn
            checked.add((resource.props["kind"], resource.props["metadata"]["name"]))
    assert checked == EXPECTED_OBJECTS[stack]


@pytest.mark.parametrize("stack", ["dev", "prod"], ids=["dev", "prod"])
def test_builder_objects_validate(crd_dir: Path, stack: str) -> None:
    """The same objects straight from the pure builders (ints, not floats)."""
    config = load_stack(stack)
    objects = ray_kinds.manifests(config)
    assert {o["kind"] for o in objects} >= {"RayCluster", "RayService"}
    for obj in objects:
        assert crds.validate_object(obj) == [], obj["metadata"]["name"]


def _samples(directory: Path, folder: str) -> list[Path]:
    found = directory.parent / folder
    return sorted(found.rglob("*.yaml")) if found.is_dir() else []


@pytest.mark.parametrize("folder", ["samples", "samples-v1.7.0"])
def test_kuberay_tpu_samples_validate(crd_dir: Path, folder: str) -> None:
    samples = _samples(crd_dir, folder)
    if not samples:
        pytest.skip(f"no KubeRay samples in {crd_dir.parent / folder}: sample check NOT run")
    kinds = set()
    for path in samples:
        with path.open() as handle:
            documents = [d for d in yaml.safe_load_all(handle) if d]
        assert documents, path
        for document in documents:
            assert crds.validate_object(document) == [], path.name
            kinds.add(document["kind"])
    assert kinds == {"RayCluster", "RayJob", "RayService"}


def _interactive_job() -> dict[str, Any]:
    """The shape of KubeRay's ``ray-job.interactive-mode.yaml`` sample: an empty ``jobId``, a
    worker group with neither minReplicas nor maxReplicas (the CRD defaults them)."""
    container = {"name": "ray-worker", "image": "rayproject/ray:2.60.0"}
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayJob",
        "metadata": {"name": "rayjob-interactive-mode"},
        "spec": {
            "submissionMode": "InteractiveMode",
            "jobId": "",
            "rayClusterSpec": {
                "rayVersion": "2.60.0",
                "headGroupSpec": {"template": {"spec": {"containers": [dict(container)]}}},
                "workerGroupSpecs": [
                    {
                        "groupName": "default-group",
                        "replicas": 1,
                        "template": {"spec": {"containers": [dict(container)]}},
                    }
                ],
            },
        },
    }


def _worker(obj: dict[str, Any]) -> dict[str, Any]:
    return obj["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]


Edit = Callable[[dict[str, Any]], Any]

# What the API server accepts because it prunes non-nullable nulls and applies schema defaults
# before it validates (each was a false `kuberay-crd-schema` violation before).
ADMITTED: list[tuple[str, Edit]] = [
    ("interactive-mode-sample", lambda o: None),
    ("no-min-max-replicas", lambda o: _worker(o).update(replicas=2)),
    ("empty-command", lambda o: _worker(o)["template"]["spec"]["containers"][0].update(command=None)),
    ("null-args-and-env", lambda o: _worker(o)["template"]["spec"]["containers"][0].update(args=None, env=None)),
    ("null-numOfHosts-defaults-to-1", lambda o: _worker(o).update(numOfHosts=None)),
    ("null-ports-protocol", lambda o: _worker(o)["template"]["spec"]["containers"][0].update(ports=[{"containerPort": 8000, "protocol": None}])),
]  # fmt: skip


@pytest.mark.parametrize("edit", [c[1] for c in ADMITTED], ids=[c[0] for c in ADMITTED])
def test_api_server_admits_after_pruning_and_defaulting(crd_dir: Path, edit: Edit) -> None:
    obj = _interactive_job()
    edit(obj)
    assert crds.validate_object(obj) == []


def test_admitted_shows_the_defaults_and_the_pruned_nulls(crd_dir: Path) -> None:
    obj = _interactive_job()
    _worker(obj)["template"]["spec"]["containers"][0]["command"] = None
    spec = crds.admitted("RayJob", obj["spec"])
    group = spec["rayClusterSpec"]["workerGroupSpecs"][0]
    assert (group["minReplicas"], group["maxReplicas"], group["numOfHosts"]) == (0, 2147483647, 1)
    assert "command" not in group["template"]["spec"]["containers"][0]
    assert "minReplicas" not in _worker(obj), "admitted() must not change its input"


# Real errors stay errors: a default never fixes a wrong type, and a required field without a
# default is still required.
STILL_REJECTED: list[tuple[str, Edit, str]] = [
    ("minReplicas-text", lambda o: _worker(o).update(minReplicas="0"), "spec.rayClusterSpec.workerGroupSpecs.0.minReplicas"),
    ("replicas-text", lambda o: _worker(o).update(replicas="1"), "spec.rayClusterSpec.workerGroupSpecs.0.replicas"),
    ("no-groupName", lambda o: _worker(o).pop("groupName"), "spec.rayClusterSpec.workerGroupSpecs.0"),
    ("null-groupName", lambda o: _worker(o).update(groupName=None), "spec.rayClusterSpec.workerGroupSpecs.0"),
    ("command-text", lambda o: _worker(o)["template"]["spec"]["containers"][0].update(command="python"), "spec.rayClusterSpec.workerGroupSpecs.0.template.spec.containers.0.command"),
    ("no-container-name", lambda o: _worker(o)["template"]["spec"]["containers"][0].pop("name"), "spec.rayClusterSpec.workerGroupSpecs.0.template.spec.containers.0"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("edit", "path"), [c[1:] for c in STILL_REJECTED], ids=[c[0] for c in STILL_REJECTED]
)
def test_real_schema_errors_still_fail(crd_dir: Path, edit: Edit, path: str) -> None:
    obj = _interactive_job()
    edit(obj)
    errors = crds.validate_object(obj)
    assert any(e.startswith(f"{path}: ") for e in errors), errors


Break = Callable[[dict[str, Any]], None]


def _group(spec: dict[str, Any]) -> dict[str, Any]:
    return spec["workerGroupSpecs"][0]


BROKEN = [
    ("numOfHosts-text", lambda s: _group(s).__setitem__("numOfHosts", "two"),
     "spec.workerGroupSpecs.0.numOfHosts"),
    ("no-groupName", lambda s: _group(s).pop("groupName"), "spec.workerGroupSpecs.0"),
    ("no-headGroupSpec", lambda s: s.pop("headGroupSpec"), "spec"),
    ("no-worker-template", lambda s: _group(s).pop("template"), "spec.workerGroupSpecs.0"),
    ("containers-not-a-list",
     lambda s: s["headGroupSpec"]["template"]["spec"].__setitem__("containers", {}),
     "spec.headGroupSpec.template.spec.containers"),
    ("replicas-text", lambda s: _group(s).__setitem__("replicas", "1"),
     "spec.workerGroupSpecs.0.replicas"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("breaks", "path"), [case[1:] for case in BROKEN], ids=[case[0] for case in BROKEN]
)
def test_broken_spec_is_rejected(crd_dir: Path, breaks: Break, path: str) -> None:
    config = load_stack("dev")
    spec = copy.deepcopy(kuberay.ray_cluster_spec(config, config.ray_clusters[0]))
    assert crds.validate_spec("RayCluster", spec) == []
    breaks(spec)
    errors = crds.validate_spec("RayCluster", spec)
    assert any(e.startswith(f"{path}: ") for e in errors), errors


def test_broken_ray_service_is_rejected(crd_dir: Path) -> None:
    config = load_stack("dev")
    obj = kuberay.ray_service_object(config, config.ray_services[0])
    obj["spec"]["serveConfigV2"] = {"applications": []}  # must be YAML text, not a mapping
    errors = crds.validate_object(obj)
    assert any(e.startswith("spec.serveConfigV2: ") for e in errors), errors
