"""The pure KubeRay builders for every shape the catalog lists: GKE's TPU webhook rules hold,
the worker group validates against the CRD, and bad replica bounds are clear errors."""

from __future__ import annotations

import math

import pytest
import yaml

from infra.config.schema import WorkerResources
from infra.manifests import kuberay
from raytpu import catalog, crds
from raytpu_cli.common import SliceChoice
from workloads.sim.local_cluster import host_specs

IMAGE = "rayproject/ray:2.60.0-py311"
SHAPES = catalog.common_shapes()


def _webhook_hosts(group: dict) -> int:
    """What GKE's TPU webhook requires: max(chips(topology) / google.com/tpu per pod, 1)."""
    pod = group["template"]["spec"]
    topology = pod["nodeSelector"]["cloud.google.com/gke-tpu-topology"]
    chips = math.prod(int(d) for d in topology.split("x"))
    per_pod = int(pod["containers"][0]["resources"]["limits"]["google.com/tpu"])
    return max(chips // per_pod, 1)


@pytest.mark.parametrize(
    "shape", SHAPES, ids=[f"{s.generation.name}-{s.topology}-{s.chips_per_host}c" for s in SHAPES]
)
def test_worker_group_for_every_catalog_shape(shape: catalog.SliceShape) -> None:
    group = kuberay.tpu_worker_group(shape, 2, IMAGE, max_replicas=3)
    assert group["numOfHosts"] == shape.hosts == _webhook_hosts(group)
    assert (group["replicas"], group["minReplicas"], group["maxReplicas"]) == (2, 2, 3)
    pod = group["template"]["spec"]
    resources = pod["containers"][0]["resources"]
    assert resources["requests"] == resources["limits"]
    assert resources["limits"]["google.com/tpu"] == str(shape.chips_per_host)
    assert pod["nodeSelector"] == shape.node_selector
    assert pod["tolerations"] == [dict(kuberay.TPU_TOLERATION)]
    ports = [p["name"] for p in pod["containers"][0].get("ports", [])]
    assert ports == (["mxla"] if shape.multi_host else [])
    # The labels Ray's autoscaler needs to add the group from zero: exactly those every host of
    # the shape carries whatever its slice (the simulated hosts advertise the same).
    declared = dict(item.split("=", 1) for item in group["rayStartParams"]["labels"].split(", "))
    assert declared == {
        "ray.io/tpu-pod-type": shape.pod_type,
        "ray.io/tpu-topology": shape.topology,
        "ray.io/accelerator-type": shape.ray_accelerator_type,
    }
    (host, *_) = host_specs([SliceChoice("s", shape, 1)])
    assert declared.items() <= dict(host.labels).items()


def test_worker_groups_validate_against_the_crd() -> None:
    head = kuberay.head_group(IMAGE, WorkerResources("2", "8Gi"), "cpu")
    spec = {
        "rayVersion": "2.60.0",
        "headGroupSpec": head,
        "workerGroupSpecs": [
            {**kuberay.tpu_worker_group(s, 1, IMAGE), "groupName": f"g{i}"}
            for i, s in enumerate(SHAPES)
        ],
    }
    try:
        errors = crds.validate_spec("RayCluster", spec)
    except crds.CrdsMissingError as missing:
        pytest.skip(f"KubeRay CRDs absent, CRD validation NOT run: {missing}")
    assert errors == []


@pytest.mark.parametrize(
    ("replicas", "low", "high"),
    [(-1, None, None), (2, 3, None), (2, None, 1)],
    ids=["negative", "min-above-replicas", "max-below-replicas"],
)
def test_bad_replica_bounds(replicas: int, low: int | None, high: int | None) -> None:
    shape = catalog.shape("v6e", "4x4")
    with pytest.raises(ValueError, match=r"is not valid; valid: "):
        kuberay.tpu_worker_group(shape, replicas, IMAGE, min_replicas=low, max_replicas=high)


def test_serve_config_is_yaml_text_with_the_import_path() -> None:
    from infra.config.stack import load_stack

    config = load_stack("dev")
    text = kuberay.serve_config_v2(config, config.ray_services[0])
    assert text.startswith("applications:\n")
    assert "import_path: workloads.serve:app" in text
    (app,) = yaml.safe_load(text)["applications"]
    # The dev serving slice is a v6e 2x2 host: each replica asks for its 4 chips.
    assert app["runtime_env"]["env_vars"]["RAYTPU_SERVE_TPU_PER_REPLICA"] == "4"
