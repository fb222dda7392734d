"""Rules 4 and 5: pinned Ray version, no public Ray head port, Workload Identity on the cluster."""

from __future__ import annotations

import pytest
from policies_factories import DELETE, cluster_spec, edit, gke_cluster_props, ray_object, tpu_group

from policies.resources import CLUSTER_SPEC_PATH
from policies.rules.exposure import (
    check_ingress,
    check_ray_head_service,
    check_service,
    check_workload_identity,
)
from policies.rules.ray_version import check_ray_version
from raytpu import catalog
from raytpu.ray_versions import MINIMUM_RAY_VERSION, image_version

KINDS = ["RayCluster", "RayService", "RayJob"]
SHAPE = catalog.shape("v6e", "4x4")
UNKNOWN_STRING = "04da6b54-80e4-46f7-96ec-b56ff0331ba9"
UNKNOWN_OBJECT = "dd056dcd-154b-4c76-9bd3-c8f88648b5ff"


def ray(kind: str = "RayCluster", **spec_kw) -> dict:
    return ray_object(kind, "ray", cluster_spec([tpu_group(SHAPE)], **spec_kw))


HEAD_IMAGE = "headGroupSpec.template.spec.containers[0].image"
WORKER_IMAGE = "workerGroupSpecs[0].template.spec.containers[0].image"


# ----------------------------------------------------------------------------- pinned Ray

GOOD_IMAGES = [
    ("rayproject", "2.60.0", "rayproject/ray:2.60.0-py311"),
    ("minimum", MINIMUM_RAY_VERSION, f"rayproject/ray:{MINIMUM_RAY_VERSION}"),
    ("registry", "2.60.0", "us-docker.pkg.dev/proj/repo/ray-tpu:2.60.0-tpu"),
    ("registry-port", "2.60.0", "localhost:5000/ray:2.60.0-py311"),
    ("tag-and-digest", "2.60.0", "rayproject/ray:2.60.0-py311@sha256:" + "a" * 64),
]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(
    ("version", "image"), [g[1:] for g in GOOD_IMAGES], ids=[g[0] for g in GOOD_IMAGES]
)
def test_pinned_versions_pass(kind, version, image):
    props = ray(kind, ray_version=version, image=image)
    props = edit(props, f"{CLUSTER_SPEC_PATH[kind]}.{WORKER_IMAGE}", image)
    assert check_ray_version(props) == []


# (id, relative path, value, substrings of one violation)
BAD_VERSIONS = [
    (
        "old-ray",
        "rayVersion",
        "2.52.0",
        [f"rayVersion: 2.52.0 is older than {MINIMUM_RAY_VERSION}"],
    ),
    (
        "untested-newer-ray",
        "rayVersion",
        "2.61.0",
        ["rayVersion: 2.61.0 is newer than 2.60.0, the newest Ray the upgrade matrix passed"],
    ),
    ("no-ray-version", "rayVersion", DELETE, ["rayVersion: not set"]),
    ("vague-ray-version", "rayVersion", "2.60", ["'2.60' is not an explicit version"]),
    ("latest-ray-version", "rayVersion", "latest", ["'latest' is not an explicit version"]),
    ("latest-image", WORKER_IMAGE, "rayproject/ray:latest", ["tag 'latest'", "names no explicit"]),
    ("nightly-image", HEAD_IMAGE, "rayproject/ray:nightly-py311", ["tag 'nightly-py311'"]),
    ("untagged-image", HEAD_IMAGE, "rayproject/ray", ["has no tag", ":latest"]),
    ("untagged-with-port", WORKER_IMAGE, "localhost:5000/ray", ["has no tag"]),
    ("digest-only", WORKER_IMAGE, "rayproject/ray@sha256:" + "b" * 64, ["digest only"]),
    (
        "template-dollar",
        HEAD_IMAGE,
        "$VLLM_IMAGE",
        ["'$VLLM_IMAGE' is an unrendered template ($VLLM_IMAGE", "render it"],
    ),
    (
        "template-braces",
        WORKER_IMAGE,
        "${IMAGE}",
        ["'${IMAGE}' is an unrendered template (${IMAGE}"],
    ),
    (
        "template-in-tag",
        WORKER_IMAGE,
        "rayproject/ray:${RAY_TAG}",
        ["unrendered template (${RAY_TAG}"],
    ),
    (
        "template-helm",
        WORKER_IMAGE,
        "{{ .Values.image }}",
        ["unrendered template ({{ .Values.image }}"],
    ),
    (
        "image-differs",
        WORKER_IMAGE,
        "rayproject/ray:2.59.0-py311",
        ["runs Ray 2.59.0 but rayVersion is 2.60.0"],
    ),
    ("image-missing", HEAD_IMAGE, DELETE, ["containers[0].image: not set"]),
]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(
    ("path", "value", "expected"), [b[1:] for b in BAD_VERSIONS], ids=[b[0] for b in BAD_VERSIONS]
)
def test_unpinned_ray_fails(kind, path, value, expected):
    base = CLUSTER_SPEC_PATH[kind]
    violations = check_ray_version(edit(ray(kind), f"{base}.{path}", value))
    matching = [v for v in violations if all(t in v for t in expected)]
    assert matching, f"no violation contains {expected}: {violations}"
    assert all(v.startswith(base) for v in violations)


@pytest.mark.parametrize(
    "image", ["$VLLM_IMAGE", "${IMAGE}", "registry/ray:${TAG}"], ids=["dollar", "braces", "tag"]
)
def test_template_image_is_never_called_untagged(image):
    violations = check_ray_version(edit(ray(), f"spec.{HEAD_IMAGE}", image))
    assert violations and not any("has no tag" in v or ":latest" in v for v in violations)


def test_minimum_version_is_configurable():
    assert check_ray_version(ray(), minimum_version="2.61.0") != []
    assert check_ray_version(ray(), minimum_version="2.60.0") == []


def test_maximum_version_is_configurable():
    newer = ray(ray_version="2.61.0", image="rayproject/ray:2.61.0-py311")
    newer = edit(newer, f"spec.{WORKER_IMAGE}", "rayproject/ray:2.61.0-py311")
    assert check_ray_version(newer) != []
    assert check_ray_version(newer, maximum_version="2.61.0") == []


def test_bad_minimum_version_names_the_option():
    with pytest.raises(ValueError, match="minimumVersion: 'two' is not valid"):
        check_ray_version(ray(), minimum_version="two")


@pytest.mark.parametrize(
    ("image", "version"),
    [("rayproject/ray:2.60.0-py311-cu121", "2.60.0"), ("ray:v2.58.1", "2.58.1"), ("ray:2.6", None)],
    ids=["suffixes", "v-prefix", "two-parts"],
)
def test_image_version(image, version):
    assert image_version(image)[0] == version


@pytest.mark.parametrize(
    ("path", "value"),
    [
        ("spec.rayVersion", UNKNOWN_STRING),
        (f"spec.{WORKER_IMAGE}", UNKNOWN_STRING),
        ("spec.headGroupSpec", UNKNOWN_OBJECT),
        ("spec.workerGroupSpecs", None),
    ],
    ids=["version-unknown", "image-unknown", "head-unknown", "groups-none"],
)
def test_unknown_version_fields_do_not_crash(path, value):
    assert check_ray_version(edit(ray(), path, value)) == []


# ----------------------------------------------------------------------------- exposure


def service(type_: str, ports: list[dict]) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "ray-head-lb"},
        "spec": {"type": type_, "selector": {"ray.io/node-type": "head"}, "ports": ports},
    }


SERVICES = [
    ("lb-dashboard", service("LoadBalancer", [{"port": 8265.0}]), ["spec.ports[0].port: 8265"]),
    (
        "lb-client",
        service("LoadBalancer", [{"port": 443.0, "targetPort": 10001.0}]),
        ["targetPort: 10001"],
    ),
    (
        "lb-gcs-by-name",
        service("LoadBalancer", [{"port": 80.0, "targetPort": "gcs-server"}]),
        ["'gcs-server'"],
    ),
    (
        "lb-second-port",
        service("LoadBalancer", [{"port": 8000.0}, {"port": 6379.0}]),
        ["spec.ports[1].port: 6379"],
    ),
]


@pytest.mark.parametrize(
    ("props", "expected"), [s[1:] for s in SERVICES], ids=[s[0] for s in SERVICES]
)
def test_load_balancer_with_ray_port_fails(props, expected):
    violations = check_service(props)
    assert len(violations) == 1
    assert all(t in violations[0] for t in expected), violations
    assert "no authentication" in violations[0]


@pytest.mark.parametrize(
    "props",
    [
        service("LoadBalancer", [{"port": 8000.0, "name": "serve"}]),
        service("ClusterIP", [{"port": 8265.0}, {"port": 10001.0}]),
        service(UNKNOWN_STRING, [{"port": 8265.0}]),
        edit(service("LoadBalancer", []), "spec.ports", UNKNOWN_STRING),
        {"kind": "Service"},
    ],
    ids=["lb-serve-port", "cluster-ip", "type-unknown", "ports-unknown", "empty"],
)
def test_services_that_pass(props):
    assert check_service(props) == []


def ingress(port: dict, **spec) -> dict:
    backend = {"service": {"name": "train-head-svc", "port": port}}
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "Ingress",
        "metadata": {"name": "ray"},
        "spec": {
            "rules": [
                {"http": {"paths": [{"path": "/", "pathType": "Prefix", "backend": backend}]}}
            ],
            **spec,
        },
    }


def test_public_ingress_to_dashboard_fails():
    (violation,) = check_ingress(ingress({"number": 8265.0}))
    assert violation.startswith("spec.rules[0].http.paths[0].backend:")
    assert "train-head-svc" in violation and "8265" in violation


def test_public_ingress_by_port_name_and_default_backend_fail():
    props = ingress({"name": "dashboard"})
    props["spec"]["defaultBackend"] = {"service": {"name": "x", "port": {"number": 10001}}}
    assert len(check_ingress(props)) == 2


@pytest.mark.parametrize(
    "props",
    [
        ingress({"number": 8000.0}),
        ingress({"number": 8265.0}, ingressClassName="gce-internal"),
        edit(ingress({"number": 8265.0}), "spec.rules", UNKNOWN_STRING),
    ],
    ids=["serve-port", "internal", "rules-unknown"],
)
def test_ingresses_that_pass(props):
    assert check_ingress(props) == []


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(
    "field", ["headGroupSpec.serviceType", "headGroupSpec.headService.spec.type"]
)
def test_ray_head_load_balancer_fails(kind, field):
    base = CLUSTER_SPEC_PATH[kind]
    props = ray(kind)
    if field.endswith("spec.type"):
        props = edit(props, f"{base}.headGroupSpec.headService", {"spec": {"type": "LoadBalancer"}})
    else:
        props = edit(props, f"{base}.{field}", "LoadBalancer")
    (violation,) = check_ray_head_service(props)
    assert violation.startswith(f"{base}.{field}: 'LoadBalancer'")


@pytest.mark.parametrize("kind", KINDS)
def test_ray_head_cluster_ip_passes(kind):
    props = edit(ray(kind), f"{CLUSTER_SPEC_PATH[kind]}.headGroupSpec.serviceType", "ClusterIP")
    assert check_ray_head_service(props) == []


@pytest.mark.parametrize(
    ("pool", "expected"),
    [(None, "workloadPool: not set"), ("", "workloadPool: '' is not valid")],
    ids=["absent", "empty"],
)
def test_cluster_without_workload_identity_fails(pool, expected):
    (violation,) = check_workload_identity(gke_cluster_props(workload_pool=pool))
    assert expected in violation and "'proj.svc.id.goog'" in violation


@pytest.mark.parametrize(
    "props",
    [
        gke_cluster_props(),
        gke_cluster_props(workload_pool=UNKNOWN_STRING),
        {"enableAutopilot": True},
        edit(gke_cluster_props(), "workloadIdentityConfig", UNKNOWN_OBJECT),
    ],
    ids=["set", "unknown", "autopilot", "config-unknown"],
)
def test_clusters_that_pass_workload_identity(props):
    assert check_workload_identity(props) == []
