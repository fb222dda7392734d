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

from infra import kuberay, ray_kinds
from infra.config import load_stack
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


def _samples(directory: Path) -> list[Path]:
    folder = directory.parent / "samples"
    return sorted(folder.glob("*.yaml")) if folder.is_dir() else []


def test_kuberay_tpu_samples_validate(crd_dir: Path) -> None:
    samples = _samples(crd_dir)
    if not samples:
        pytest.skip(f"no KubeRay samples in {crd_dir.parent / 'samples'}: sample check NOT run")
    kinds = set()
    for path in samples:
        with path.open() as handle:
            documents = [d for d in yaml.safe_load_all(handle) if d]
        assert documents, path
        for document in documents:
            assert crds.validate_object(document) == [], path.name
            kinds.add(document["kind"])
    assert kinds == {"RayCluster", "RayJob", "RayService"}


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
