"""Rule 3 (stack level), the pack as data, policy config, and the pulumi_policy adapter."""

from __future__ import annotations

import pytest
from policies_factories import (
    DELETE,
    cluster_spec,
    edit,
    gke_cluster_props,
    node_pool_props,
    ray_object,
    resource,
    tpu_group,
)

from policies.evaluation import evaluate
from policies.pack import POLICIES, PolicyConfigError, policy_names, settings
from policies.resources import CLUSTER, NODE_POOL, RESOURCE_POLICY
from policies.rules.stack import (
    check_ray_operator_addon,
    check_slices_for_groups,
    check_upgrade_capacity,
    check_workload_policies,
)
from raytpu import catalog, ray_versions

V6E_4X4 = catalog.shape("v6e", "4x4")
V6E_2X4_4T = catalog.shape("v6e", "2x4", machine_type="ct6e-standard-4t")
V6E_2X2 = catalog.shape("v6e", "2x2")
TPU7X = catalog.shape("tpu7x", "4x4x4")
UNKNOWN_STRING = "04da6b54-80e4-46f7-96ec-b56ff0331ba9"
UNKNOWN_BOOL = "1c4a061d-8072-4f0a-a4cb-0ff528b18fe7"


def cluster(**kw):
    return resource(CLUSTER, "gke", gke_cluster_props(**kw))


def pool(name: str, gen: str, topology: str, machine: str | None = None, **edits):
    props = node_pool_props(gen, topology, machine, name=name)
    for path, value in edits.items():
        props = edit(props, path, value)
    return resource(NODE_POOL, f"slice-{name}", props)


def ray(kind: str, name: str, *groups):
    obj = ray_object(kind, name, cluster_spec(list(groups)))
    return resource(f"kubernetes:ray.io/v1:{kind}", name, obj)


def workload_policy(name: str, topology: str):
    props = {
        "name": name,
        "region": "us-east5",
        "workloadPolicy": {"type": "HIGH_THROUGHPUT", "acceleratorTopology": topology},
    }
    return resource(RESOURCE_POLICY, name, props)


def good_stack():
    return [
        cluster(),
        pool("train-0", "v6e", "4x4"),
        pool("train-1", "v6e", "4x4"),
        pool("serve-0", "v6e", "2x2"),
        ray("RayCluster", "train", tpu_group(V6E_4X4, replicas=2)),
        ray("RayService", "serve", tpu_group(V6E_2X2)),
    ]


def test_good_stack_passes_every_policy():
    assert evaluate(good_stack()) == []


# (id, resources, substrings of one violation)
SHORT = [
    (
        "replicas-exceed-slices",
        [
            cluster(),
            pool("a-0", "v6e", "4x4"),
            ray("RayCluster", "train", tpu_group(V6E_4X4, replicas=2)),
        ],
        ["RayCluster/train group 'tpu'", "2 slice(s) of v6e 4x4", "offer 1", "pools: a-0"],
    ),
    (
        "no-pool-of-that-shape",
        [cluster(), pool("a-0", "v6e", "4x4"), ray("RayJob", "job", tpu_group(V6E_2X4_4T))],
        ["RayJob/job", "v6e 2x4 (2 hosts x 4 chips) on ct6e-standard-4t", "offer 0", "pools: none"],
    ),
    (
        "same-topology-other-host-size",
        [
            cluster(),
            pool("a-0", "v6e", "2x4", "ct6e-standard-8t"),
            ray("RayCluster", "c", tpu_group(V6E_2X4_4T)),
        ],
        ["offer 0", "other TPU pool shapes: v6e 2x4 (1 hosts x 8 chips)"],
    ),
    (
        "two-groups-share-one-slice",
        [
            cluster(),
            pool("a-0", "v6e", "4x4"),
            ray("RayCluster", "c1", tpu_group(V6E_4X4)),
            ray("RayService", "c2", tpu_group(V6E_4X4)),
        ],
        ["RayCluster/c1", "RayService/c2", "2 slice(s)", "offer 1"],
    ),
    (
        "single-host-pool-too-small",
        [
            cluster(),
            pool("s-0", "v6e", "2x2", nodeCount=2.0),
            ray("RayCluster", "c", tpu_group(V6E_2X2, replicas=3)),
        ],
        ["3 slice(s) of v6e 2x2", "offer 2"],
    ),
]


@pytest.mark.parametrize(
    ("resources", "expected"), [s[1:] for s in SHORT], ids=[s[0] for s in SHORT]
)
def test_groups_without_enough_slices_fail(resources, expected):
    violations = check_slices_for_groups(resources)
    assert len(violations) == 1, violations
    assert all(t in violations[0] for t in expected), violations[0]


@pytest.mark.parametrize(
    "resources",
    [
        [
            cluster(),
            pool("s-0", "v6e", "2x2", nodeCount=3.0),
            ray("RayCluster", "c", tpu_group(V6E_2X2, replicas=3)),
        ],
        [
            cluster(),
            pool("s-0", "v6e", "2x2", autoscaling={"minNodeCount": 0.0, "maxNodeCount": 3.0}),
            ray("RayCluster", "c", tpu_group(V6E_2X2, replicas=3)),
        ],
        [
            cluster(),
            pool("a-0", "v6e", "4x4"),
            ray("RayCluster", "c", tpu_group(V6E_4X4, replicas=0)),
        ],
        [
            ray("RayCluster", "c", tpu_group(V6E_4X4, replicas=5))
        ],  # bare manifests: no pools to compare
        [
            cluster(),
            pool("a-0", "v6e", "4x4", **{"placementPolicy.tpuTopology": UNKNOWN_STRING}),
            ray("RayCluster", "c", tpu_group(V6E_4X4)),
        ],
        [
            cluster(),
            pool("a-0", "v6e", "4x4", **{"nodeConfig.machineType": UNKNOWN_STRING}),
            ray("RayCluster", "c", tpu_group(V6E_4X4)),
        ],
        [
            cluster(),
            pool("a-0", "v6e", "4x4"),
            ray(
                "RayCluster", "c", edit(tpu_group(V6E_4X4, replicas=2), "replicas", UNKNOWN_STRING)
            ),
        ],
    ],
    ids=[
        "single-host-nodes",
        "single-host-autoscaling-max",
        "zero-replicas",
        "manifests-only",
        "pool-topology-unknown",
        "pool-machine-unknown",
        "replicas-unknown",
    ],
)
def test_enough_or_unknown_slices_pass(resources):
    assert check_slices_for_groups(resources) == []


def _service(strategy, replicas=1):
    """RayService/serve on ``replicas`` v6e 2x2 slices with ``upgradeStrategy.type`` (DELETE: unset)."""
    obj = ray_object("RayService", "serve", cluster_spec([tpu_group(V6E_2X2, replicas=replicas)]))
    obj = edit(obj, "spec.upgradeStrategy.type", strategy)
    return resource("kubernetes:ray.io/v1:RayService", "serve", obj)


UPGRADES = [
    ("unset-is-kuberay-new-cluster", DELETE, 1, 1, "is not set (KubeRay's default: NewCluster)"),
    ("new-cluster-without-spare", "NewCluster", 1, 1, "1 more slice(s) of v6e 2x2"),
    ("incremental-counts-too", "NewClusterWithIncrementalUpgrade", 1, 1, "offer 1"),
    ("new-cluster-two-replicas", "NewCluster", 2, 3, "add 1 slice(s) of that shape"),
    ("in-place", "None", 1, 1, None),
    ("new-cluster-with-spare", "NewCluster", 1, 2, None),
    ("unknown-at-preview", UNKNOWN_STRING, 1, 1, None),
]


@pytest.mark.parametrize(
    ("strategy", "replicas", "nodes", "fragment"),
    [u[1:] for u in UPGRADES],
    ids=[u[0] for u in UPGRADES],
)
def test_a_blue_green_rayservice_needs_its_slices_twice(strategy, replicas, nodes, fragment):
    stack = [
        cluster(),
        pool("s-0", "v6e", "2x2", nodeCount=float(nodes)),
        _service(strategy, replicas),
    ]
    found = check_upgrade_capacity(stack)
    if fragment is None:
        assert found == []
    else:
        (message,) = found
        assert message.startswith("RayService/serve: spec.upgradeStrategy.type is ")
        assert fragment in message and "set upgradeStrategy.type None" in message


def test_the_upgrade_rule_counts_the_other_groups_of_the_shape():
    """Two slices, one for a RayCluster, one for the RayService: no room for a second cluster."""
    stack = [
        cluster(),
        pool("s-0", "v6e", "2x2", nodeCount=2.0),
        ray("RayCluster", "dev", tpu_group(V6E_2X2)),
        _service("NewCluster"),
    ]
    (message,) = check_upgrade_capacity(stack)
    assert "beside the 2 the stack's groups hold, but its node pools offer 2" in message


def test_ray_operator_addon_required_with_kuberay_objects():
    ray_obj = ray("RayCluster", "c", tpu_group(V6E_4X4))
    (violation,) = check_ray_operator_addon([cluster(ray_operator=False), ray_obj])
    assert "Cluster/gke: addonsConfig.rayOperatorConfigs[0].enabled is False" in violation
    assert "RayCluster/c" in violation
    absent = resource(CLUSTER, "gke", edit(gke_cluster_props(), "addonsConfig", DELETE))
    assert "is not set" in check_ray_operator_addon([absent, ray_obj])[0]


@pytest.mark.parametrize(
    "resources",
    [
        [cluster(ray_operator=False)],
        [cluster(), ray("RayCluster", "c", tpu_group(V6E_4X4))],
        [
            resource(
                CLUSTER,
                "gke",
                edit(
                    gke_cluster_props(), "addonsConfig.rayOperatorConfigs[0].enabled", UNKNOWN_BOOL
                ),
            ),
            ray("RayCluster", "c", tpu_group(V6E_4X4)),
        ],
    ],
    ids=["no-kuberay-objects", "enabled", "unknown"],
)
def test_ray_operator_addon_passes(resources):
    assert check_ray_operator_addon(resources) == []


def tpu7x_stack(policy_topology: str, node_count: float):
    return [
        cluster(),
        workload_policy("wp-0", policy_topology),
        pool(
            "iw-0",
            "tpu7x",
            "4x4x4",
            nodeCount=node_count,
            placementPolicy={"type": "", "policyName": "wp-0"},
        ),
        ray("RayCluster", "c", tpu_group(TPU7X)),
    ]


def test_tpu7x_workload_policy_pool_passes_and_serves_its_group():
    assert evaluate(tpu7x_stack("4x4x4", 16.0)) == []


@pytest.mark.parametrize(
    ("topology", "count", "expected"),
    [
        ("4x4x4", 15.0, "nodeCount: 15"),
        ("4x4x8", 16.0, "nodeCount: 16"),
        ("4x4x5", 16.0, "'4x4x5'"),
    ],
    ids=["count-off-by-one", "policy-topology-bigger", "policy-topology-illegal"],
)
def test_tpu7x_workload_policy_mismatch_fails(topology, count, expected):
    violations = check_workload_policies(tpu7x_stack(topology, count))
    assert violations and all(v.startswith("NodePool/iw-0: ") for v in violations)
    assert any(expected in v for v in violations), violations


def test_tpu7x_pool_naming_a_missing_policy_fails():
    resources = [r for r in tpu7x_stack("4x4x4", 16.0) if r.type != RESOURCE_POLICY]
    (violation,) = check_workload_policies(resources)
    assert "'wp-0' names no declared ResourcePolicy" in violation


# ----------------------------------------------------------------------------- pack and config


def test_pack_table_is_complete():
    names = [p.name for p in POLICIES]
    assert len(names) == len(set(names)) >= 8
    assert {p.kind for p in POLICIES} == {"resource", "stack"}
    assert all(p.description and p.remediation for p in POLICIES)


def broken_stack():
    return [
        cluster(),
        pool("a-0", "v6e", "4x4", nodeCount=3.0),
        ray("RayCluster", "c", edit(tpu_group(V6E_4X4), "numOfHosts", 2)),
    ]


def test_broken_stack_reports_each_policy_with_its_resource():
    violations = evaluate(broken_stack())
    by_policy = {v.policy: v for v in violations}
    assert set(by_policy) == {"tpu-node-pool-shape", "ray-tpu-worker-groups"}
    assert by_policy["tpu-node-pool-shape"].resource.name == "slice-a-0"
    assert "numOfHosts: 2" in by_policy["ray-tpu-worker-groups"].message
    assert all(v.mandatory for v in violations)


@pytest.mark.parametrize(
    ("config", "levels"),
    [
        (
            {"all": "advisory"},
            {"tpu-node-pool-shape": "advisory", "ray-tpu-worker-groups": "advisory"},
        ),
        ({"tpu-node-pool-shape": "disabled"}, {"ray-tpu-worker-groups": "mandatory"}),
        (
            {"all": "advisory", "ray-tpu-worker-groups": {"enforcementLevel": "mandatory"}},
            {"tpu-node-pool-shape": "advisory", "ray-tpu-worker-groups": "mandatory"},
        ),
    ],
    ids=["all-advisory", "one-disabled", "all-then-one"],
)
def test_enforcement_is_configurable_per_policy(config, levels):
    found = {v.policy: v.enforcement for v in evaluate(broken_stack(), config)}
    assert found == levels


def limits_only_stack():
    group = edit(tpu_group(V6E_4X4), "template.spec.containers[0].resources.requests", DELETE)
    return [cluster(), pool("a-0", "v6e", "4x4"), ray("RayCluster", "c", group)]


# (id, policy config, {policy: level} of the limits-only finding; {} when none is reported)
ADVISORY_LEVELS = [
    ("default", None, {"ray-tpu-worker-groups-advisory": "advisory"}),
    ("all-advisory", {"all": "advisory"}, {"ray-tpu-worker-groups-advisory": "advisory"}),
    ("policy-advisory", {"ray-tpu-worker-groups": "advisory"}, {"ray-tpu-worker-groups-advisory": "advisory"}),
    ("companion-mandatory", {"ray-tpu-worker-groups-advisory": "mandatory"}, {"ray-tpu-worker-groups-advisory": "mandatory"}),
    ("companion-disabled", {"ray-tpu-worker-groups-advisory": "disabled"}, {}),
    ("policy-disabled", {"ray-tpu-worker-groups": "disabled"}, {}),
]  # fmt: skip


@pytest.mark.parametrize(
    ("config", "levels"), [c[1:] for c in ADVISORY_LEVELS], ids=[c[0] for c in ADVISORY_LEVELS]
)
def test_advisory_findings_report_under_the_companion_policy(config, levels):
    found = {v.policy: v.enforcement for v in evaluate(limits_only_stack(), config)}
    assert found == levels


def test_adapter_splits_advisory_findings_to_the_companion(pulumi_policies):
    res = limits_only_stack()[2]
    reported: dict[str, list[str]] = {}
    for name in ("ray-tpu-worker-groups", "ray-tpu-worker-groups-advisory"):
        pulumi_policies[name].validate(
            _resource_args(res), lambda m, urn=None, n=name: reported.setdefault(n, []).append(m)
        )
    assert list(reported) == ["ray-tpu-worker-groups-advisory"]
    assert "Kubernetes defaults requests to limits" in reported["ray-tpu-worker-groups-advisory"][0]


def test_minimum_version_option_reaches_the_rule():
    stack = good_stack()
    assert evaluate(stack, {"pinned-ray-version": {"minimumVersion": "2.60.0"}}) == []
    raised = evaluate(stack, {"pinned-ray-version": {"minimumVersion": "2.61.0"}})
    assert {v.policy for v in raised} == {"pinned-ray-version"}


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (
            {"no-such-policy": "advisory"},
            "no-such-policy: 'no-such-policy' is not a policy; valid: all, tpu-node-pool-shape",
        ),
        ({"all": "warn"}, "all: 'warn' is not valid; valid: mandatory, advisory, disabled"),
        (
            {"pinned-ray-version": {"minimumVersion": "2.6"}},
            "pinned-ray-version.minimumVersion: '2.6' is not valid",
        ),
        (
            {"tpu-node-pool-shape": {"strict": True}},
            "tpu-node-pool-shape.strict: 'strict' is not an option; valid: enforcementLevel",
        ),
        ({"tpu-node-pool-shape": 3}, "tpu-node-pool-shape: 3 is not valid"),
    ],
    ids=["unknown-policy", "bad-level", "bad-version", "unknown-option", "bad-type"],
)
def test_bad_policy_config_names_key_value_and_valid_values(config, message):
    with pytest.raises(PolicyConfigError) as caught:
        settings(config)
    assert message in str(caught.value)


# ----------------------------------------------------------------------------- pulumi_policy adapter


@pytest.fixture
def pulumi_policies():
    from policies.adapter import build_policies

    return {p.name: p for p in build_policies()}


def _resource_args(res, config=None):
    from pulumi_policy.policy import (
        PolicyCustomTimeouts,
        PolicyResourceOptions,
        ResourceValidationArgs,
    )
    from pulumi_policy.proxy import unknown_checking_proxy

    opts = PolicyResourceOptions(False, [], None, [], PolicyCustomTimeouts(0, 0, 0), [])
    return ResourceValidationArgs(
        res.type, unknown_checking_proxy(dict(res.props)), res.urn, res.name, opts, None, config
    )


def test_adapter_builds_mandatory_policies_of_both_kinds(pulumi_policies):
    from pulumi_policy import EnforcementLevel, ResourceValidationPolicy, StackValidationPolicy

    assert list(pulumi_policies) == policy_names()
    for spec in POLICIES:
        policy = pulumi_policies[spec.name]
        assert policy.enforcement_level == EnforcementLevel.MANDATORY
        kind = ResourceValidationPolicy if spec.kind == "resource" else StackValidationPolicy
        assert isinstance(policy, kind)
        if spec.advisory_name:
            companion = pulumi_policies[spec.advisory_name]
            assert companion.enforcement_level == EnforcementLevel.ADVISORY
            assert isinstance(companion, kind)
    assert {p.advisory_name for p in POLICIES if p.advisories} == {
        "tpu-node-pool-shape-advisory",
        "ray-tpu-worker-groups-advisory",
        "tpu7x-workload-policy-advisory",
    }
    schema = pulumi_policies["pinned-ray-version"].config_schema
    assert schema.properties["minimumVersion"]["default"] == ray_versions.MINIMUM_RAY_VERSION
    assert schema.properties["maximumVersion"]["default"] == ray_versions.PINNED_RAY_VERSION


def test_adapter_reports_through_the_engine_proxy(pulumi_policies):
    reported = []
    res = pool("a-0", "v6e", "4x4", nodeCount=3.0)
    pulumi_policies["tpu-node-pool-shape"].validate(
        _resource_args(res), lambda message, urn=None: reported.append(message)
    )
    assert len(reported) == 1 and "nodeCount: 3" in reported[0]


def test_adapter_survives_unknown_values_behind_the_engine_proxy(pulumi_policies):
    """pulumi_policy's proxy raises on reading an unknown; the adapter never trips it."""
    unknown = pool(
        "a-0",
        "v6e",
        "4x4",
        nodeCount="3eeb2bf0-c639-47a8-9e75-3b44932eb421",
        **{"placementPolicy.tpuTopology": UNKNOWN_STRING},
    )
    reported = []
    pulumi_policies["tpu-node-pool-shape"].validate(
        _resource_args(unknown), lambda message, urn=None: reported.append(message)
    )
    assert reported == []


def test_adapter_passes_policy_config_options(pulumi_policies):
    res = ray("RayCluster", "c", tpu_group(V6E_4X4))
    reported = []
    pulumi_policies["pinned-ray-version"].validate(
        _resource_args(res, {"minimumVersion": "2.61.0"}), lambda m, urn=None: reported.append(m)
    )
    assert reported and "older than 2.61.0" in reported[0]


def test_adapter_stack_policy_reads_policy_resources(pulumi_policies):
    from pulumi_policy.policy import (
        PolicyCustomTimeouts,
        PolicyResource,
        PolicyResourceOptions,
        StackValidationArgs,
    )
    from pulumi_policy.proxy import unknown_checking_proxy

    opts = PolicyResourceOptions(False, [], None, [], PolicyCustomTimeouts(0, 0, 0), [])
    stack = [
        PolicyResource(
            r.type, unknown_checking_proxy(dict(r.props)), r.urn, r.name, opts, None, None, [], {}
        )
        for r in [
            cluster(),
            pool("a-0", "v6e", "4x4"),
            ray("RayCluster", "c", tpu_group(V6E_4X4, replicas=2)),
        ]
    ]
    reported = []
    pulumi_policies["tpu-slices-for-ray-groups"].validate(
        StackValidationArgs(stack), lambda m, urn=None: reported.append(m)
    )
    assert len(reported) == 1 and "offer 1" in reported[0]


@pytest.mark.parametrize(
    ("type_", "props", "policy"),
    [
        (
            "kubernetes:core/v1:Service",
            {"spec": {"type": "LoadBalancer", "ports": [{"port": 8265.0}]}},
            "no-public-ray-head",
        ),
        (
            "kubernetes:networking.k8s.io/v1:Ingress",
            {"spec": {"defaultBackend": {"service": {"name": "h", "port": {"number": 10001.0}}}}},
            "no-public-ray-head",
        ),
        (
            "kubernetes:ray.io/v1:RayService",
            {
                "spec": {
                    "rayClusterConfig": cluster_spec([edit(tpu_group(V6E_4X4), "numOfHosts", 2)])
                }
            },
            "ray-tpu-worker-groups",
        ),
    ],
    ids=["service", "ingress", "rayservice"],
)
def test_objects_without_kind_are_still_judged(type_, props, policy):
    violations = evaluate([resource(type_, "x", props)])
    assert policy in {v.policy for v in violations}


def test_autoscaled_groups_need_slices_for_max_replicas():
    group = edit(tpu_group(V6E_4X4, replicas=1), "maxReplicas", 2)
    obj = ray_object("RayCluster", "c", cluster_spec([group]))
    fixed = [
        cluster(),
        pool("a-0", "v6e", "4x4"),
        resource("kubernetes:ray.io/v1:RayCluster", "c", obj),
    ]
    assert check_slices_for_groups(fixed) == []
    scaled = edit(obj, "spec.enableInTreeAutoscaling", True)
    autoscaled = [*fixed[:2], resource("kubernetes:ray.io/v1:RayCluster", "c", scaled)]
    (violation,) = check_slices_for_groups(autoscaled)
    assert "2 slice(s) of v6e 4x4" in violation
