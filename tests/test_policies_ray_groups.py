"""Rule 2, Ray TPU worker groups in RayCluster, RayService and RayJob; never looser than the webhook."""

from __future__ import annotations

import math

import pytest
from policies_factories import DELETE, cluster_spec, edit, ray_object, tpu_group

from policies.resources import CLUSTER_SPEC_PATH
from policies.rules import Advisory
from policies.rules.ray_groups import WEBHOOK_ERROR, check_worker_groups
from raytpu import catalog, generations

KINDS = ["RayCluster", "RayService", "RayJob"]
UNKNOWN_STRING = "04da6b54-80e4-46f7-96ec-b56ff0331ba9"
UNKNOWN_NUMBER = "3eeb2bf0-c639-47a8-9e75-3b44932eb421"
UNKNOWN_ARRAY = "6a19a0b0-7e62-4c92-b797-7f8e31da9cc2"
UNKNOWN_OBJECT = "dd056dcd-154b-4c76-9bd3-c8f88648b5ff"
ACCEL = "template.spec.nodeSelector/cloud.google.com/gke-tpu-accelerator"
TOPO = "template.spec.nodeSelector/cloud.google.com/gke-tpu-topology"


def obj(kind: str, shape: catalog.SliceShape, **group_kw) -> dict:
    return ray_object(kind, "ray", cluster_spec([tpu_group(shape, **group_kw)]))


def group_path(kind: str) -> str:
    return f"{CLUSTER_SPEC_PATH[kind]}.workerGroupSpecs[0]"


SHAPES = catalog.common_shapes()


@pytest.mark.parametrize(
    "shape", SHAPES, ids=[f"{s.generation.name}-{s.topology}-{s.chips_per_host}t" for s in SHAPES]
)
def test_every_catalog_shape_passes_as_a_raycluster_group(shape):
    assert check_worker_groups(obj("RayCluster", shape)) == []


@pytest.mark.parametrize("kind", KINDS)
def test_good_groups_pass_in_every_kind(kind):
    shape = catalog.shape("v6e", "2x4", machine_type="ct6e-standard-4t")
    assert check_worker_groups(obj(kind, shape, replicas=2)) == []


V6E_4X4 = catalog.shape("v6e", "4x4")
V4_2X2X4 = catalog.shape("v4", "2x2x4")
V5E_2X4_8T = catalog.shape("v5e", "2x4", machine_type="ct5lp-hightpu-8t")
V6E_2X4_8T = catalog.shape("v6e", "2x4", machine_type="ct6e-standard-8t")
V6E_2X2 = catalog.shape("v6e", "2x2")
TPU7X = catalog.shape("tpu7x", "2x2x4")


# (id, shape, relative path under the group, new value, substrings expected in one violation)
BAD = [
    ("v6e-4x4-hosts-minus-one", V6E_4X4, "numOfHosts", 3, ["numOfHosts: 3", "set numOfHosts: 4"]),
    ("v6e-4x4-hosts-plus-one", V6E_4X4, "numOfHosts", 5, ["numOfHosts: 5", WEBHOOK_ERROR]),
    ("v4-2x2x4-hosts-minus-one", V4_2X2X4, "numOfHosts", 3, ["numOfHosts: 3", "= 16 chips"]),
    ("tpu7x-2x2x4-hosts-plus-one", TPU7X, "numOfHosts", 5, ["numOfHosts: 5", "set numOfHosts: 4"]),
    (
        "webhook-example-v6e-2x4-8-chips-2-hosts",
        V6E_2X4_8T,
        "numOfHosts",
        2,
        ["numOfHosts: 2", "1 host(s) x 8 chips", "set numOfHosts: 1", WEBHOOK_ERROR],
    ),
    ("v5e-2x4-8t-two-hosts", V5E_2X4_8T, "numOfHosts", 2, ["set numOfHosts: 1"]),
    ("multi-host-numOfHosts-absent", V6E_4X4, "numOfHosts", DELETE, ["absent (KubeRay uses 1)"]),
    (
        "wrong-chips-per-host-v6e-4x4-with-8",
        V6E_4X4,
        "template.spec.containers[0].resources",
        {"requests": {"google.com/tpu": "8"}, "limits": {"google.com/tpu": "8"}},
        ["tpu-v6e-slice 4x4", "google.com/tpu 8 per host", "not a TPU slice"],
    ),
    (
        "wrong-chips-per-host-v4-with-8",
        V4_2X2X4,
        "template.spec.containers[0].resources",
        {"requests": {"google.com/tpu": 8}, "limits": {"google.com/tpu": 8}},
        ["google.com/tpu 8 per host", "ct4p-hightpu-4t (4 chips/host)"],
    ),
    (
        "chips-not-dividing-topology",
        V6E_4X4,
        "template.spec.containers[0].resources",
        {"requests": {"google.com/tpu": "3"}, "limits": {"google.com/tpu": "3"}},
        ["google.com/tpu 3 per host", "not a TPU slice"],
    ),
    (
        "requests-differ-from-limits",
        V6E_4X4,
        "template.spec.containers[0].resources.limits",
        {"google.com/tpu": "8"},
        ["requests 4 != limits 8"],
    ),
    (
        "limits-missing",
        V6E_4X4,
        "template.spec.containers[0].resources.limits",
        {"cpu": "8"},
        ["limits.google.com/tpu: not set", "set both requests and limits to 4"],
    ),
    (
        "not-a-whole-number",
        V6E_4X4,
        "template.spec.containers[0].resources.limits",
        {"google.com/tpu": "four"},
        ["'four' is not a whole number"],
    ),
    (
        "missing-accelerator-selector",
        V6E_4X4,
        ACCEL,
        DELETE,
        ["missing cloud.google.com/gke-tpu-accelerator", "tpu-v6e-slice"],
    ),
    (
        "missing-topology-selector",
        V6E_4X4,
        TOPO,
        DELETE,
        ["missing cloud.google.com/gke-tpu-topology"],
    ),
    (
        "missing-both-selectors",
        V6E_4X4,
        "template.spec.nodeSelector",
        DELETE,
        ["gke-tpu-accelerator", "gke-tpu-topology", "both"],
    ),
    ("accelerator-3d-topology-2d", V4_2X2X4, TOPO, "4x4", ["tpu-v4-podslice 4x4", "3D"]),
    ("accelerator-2d-topology-3d", V6E_4X4, TOPO, "2x2x4", ["tpu-v6e-slice 2x2x4", "2D"]),
    ("unknown-accelerator", V6E_4X4, ACCEL, "tpu-v9-slice", ["'tpu-v9-slice' is not valid"]),
    (
        "tpu-selector-without-tpu-request",
        V6E_4X4,
        "template.spec.containers[0].resources",
        {"requests": {"cpu": "1"}, "limits": {"cpu": "1"}},
        ["no container requests google.com/tpu"],
    ),
]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(
    ("shape", "path", "value", "expected"), [b[1:] for b in BAD], ids=[b[0] for b in BAD]
)
def test_broken_groups_fail_with_field_and_numbers(kind, shape, path, value, expected):
    props = edit(obj(kind, shape), f"{group_path(kind)}.{path}", value)
    violations = check_worker_groups(props)
    matching = [v for v in violations if all(text in v for text in expected)]
    assert matching, f"no violation contains {expected}: {violations}"
    assert all(v.startswith(group_path(kind)) for v in violations), violations


# (id, resources of the TPU container, advisory?, text of the one finding; None: clean)
TPU_RESOURCES = [
    ("requests-and-limits", {"requests": {"google.com/tpu": "4"}, "limits": {"google.com/tpu": "4"}}, None, None),
    ("limits-only", {"limits": {"google.com/tpu": "4"}}, True, "Kubernetes defaults requests to limits"),
    ("limits-only-wrong-chips", {"limits": {"google.com/tpu": "8"}}, False, "google.com/tpu 8 per host"),
    ("requests-only", {"requests": {"google.com/tpu": "4"}}, False, "requires a limit for an extended resource"),
]  # fmt: skip


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(
    ("resources", "advisory", "text"),
    [c[1:] for c in TPU_RESOURCES],
    ids=[c[0] for c in TPU_RESOURCES],
)
def test_tpu_only_in_limits_is_advisory_only_in_requests_is_not(kind, resources, advisory, text):
    props = edit(
        obj(kind, V6E_4X4), f"{group_path(kind)}.template.spec.containers[0].resources", resources
    )
    findings = check_worker_groups(props)
    if text is None:
        assert findings == []
        return
    matching = [f for f in findings if text in f]
    assert matching, findings
    assert isinstance(matching[0], Advisory) is advisory
    if advisory:
        assert all(isinstance(f, Advisory) for f in findings), findings


def test_each_group_is_judged_and_named():
    good = tpu_group(V6E_4X4, name="good")
    bad = edit(tpu_group(V6E_4X4, name="bad"), "numOfHosts", 2)
    violations = check_worker_groups(ray_object("RayCluster", "c", cluster_spec([good, bad])))
    assert len(violations) == 1
    assert violations[0].startswith("spec.workerGroupSpecs[1] (group 'bad')")


def test_cpu_groups_are_not_tpu_groups():
    cpu = {"groupName": "cpu", "replicas": 2, "template": {"spec": {"containers": [{"name": "w"}]}}}
    assert check_worker_groups(ray_object("RayCluster", "c", cluster_spec([cpu]))) == []


def _webhook_rejects(topology: str, tpu: int, hosts: int) -> bool:
    """The GKE TPU webhook's rule, written out independently: hosts == max(chips // tpu, 1)."""
    chips = math.prod(int(d) for d in topology.split("x"))
    return hosts != max(chips // tpu, 1)


def test_never_looser_than_the_webhook():
    """Every (accelerator, topology, chips per host, numOfHosts) the webhook rejects, we reject."""
    topologies = [
        "1x1",
        "2x2",
        "2x4",
        "4x4",
        "4x8",
        "8x8",
        "2x2x1",
        "2x2x2",
        "2x2x4",
        "2x4x4",
        "4x4x4",
        "3x3",
        "2x3",
    ]
    accelerators = [g.gke_accelerator for g in generations.GENERATIONS.values()]
    webhook_rejected = accepted = 0
    for accelerator in accelerators:
        for topology in topologies:
            for tpu in (1, 2, 4, 8):
                for hosts in (1, 2, 3, 4, 5, 8, 16):
                    group = tpu_group(V6E_4X4)
                    group = edit(group, ACCEL, accelerator)
                    group = edit(group, TOPO, topology)
                    resources = {
                        "requests": {"google.com/tpu": tpu},
                        "limits": {"google.com/tpu": tpu},
                    }
                    group = edit(group, "template.spec.containers[0].resources", resources)
                    group = edit(group, "numOfHosts", hosts)
                    violations = check_worker_groups(
                        ray_object("RayCluster", "c", cluster_spec([group]))
                    )
                    if _webhook_rejects(topology, tpu, hosts):
                        webhook_rejected += 1
                        assert violations, (accelerator, topology, tpu, hosts)
                    if not violations:
                        accepted += 1
    assert webhook_rejected > 1000
    assert accepted > 20  # the good shapes in the grid do pass


UNKNOWN_CASES = [
    ("numOfHosts-unknown", "numOfHosts", UNKNOWN_NUMBER),
    ("selector-unknown", "template.spec.nodeSelector", UNKNOWN_OBJECT),
    ("topology-unknown", TOPO, UNKNOWN_STRING),
    ("accelerator-unknown", ACCEL, UNKNOWN_STRING),
    ("containers-unknown", "template.spec.containers", UNKNOWN_ARRAY),
    (
        "tpu-limit-unknown",
        "template.spec.containers[0].resources.limits",
        {"google.com/tpu": UNKNOWN_NUMBER},
    ),
    ("resources-unknown", "template.spec.containers[0].resources", UNKNOWN_OBJECT),
    ("template-none", "template", None),
]


@pytest.mark.parametrize(
    ("path", "value"), [c[1:] for c in UNKNOWN_CASES], ids=[c[0] for c in UNKNOWN_CASES]
)
def test_unknown_values_in_a_group_do_not_crash(path, value):
    props = edit(obj("RayCluster", V6E_4X4), f"spec.workerGroupSpecs[0].{path}", value)
    assert check_worker_groups(props) == []


@pytest.mark.parametrize(
    "props",
    [
        {},
        {"kind": "RayCluster"},
        {"kind": "RayCluster", "spec": None},
        {"kind": "RayCluster", "spec": UNKNOWN_OBJECT},
        {"kind": "RayCluster", "spec": {"workerGroupSpecs": UNKNOWN_ARRAY}},
        {"kind": "RayCluster", "spec": {"workerGroupSpecs": {"a": 1}}},
        {"kind": "RayCluster", "spec": {"workerGroupSpecs": ["not a group", None]}},
        {"kind": "RayService", "spec": {"rayClusterConfig": UNKNOWN_OBJECT}},
        {"kind": "RayJob", "spec": []},
    ],
    ids=[
        "empty",
        "no-spec",
        "spec-none",
        "spec-unknown",
        "groups-unknown",
        "groups-dict",
        "groups-junk",
        "service-config-unknown",
        "job-spec-list",
    ],
)
def test_odd_objects_do_not_crash(props):
    assert check_worker_groups(props) == []


def test_malformed_containers_are_reported_not_crashed_on():
    props = edit(
        obj("RayCluster", V6E_4X4), "spec.workerGroupSpecs[0].template.spec.containers", {}
    )
    (violation,) = check_worker_groups(props)
    assert "no container requests google.com/tpu" in violation
