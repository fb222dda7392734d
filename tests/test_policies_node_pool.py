"""Rule 1, TPU node pool shape: good pools of every generation pass, each way to break one fails."""

from __future__ import annotations

import pytest
from policies_factories import DELETE, edit, node_pool_props

from policies.props import UNKNOWN_SENTINELS
from policies.rules import Advisory
from policies.rules.node_pool import check_node_pool

UNKNOWN_STRING = "04da6b54-80e4-46f7-96ec-b56ff0331ba9"
UNKNOWN_NUMBER = "3eeb2bf0-c639-47a8-9e75-3b44932eb421"
UNKNOWN_ARRAY = "6a19a0b0-7e62-4c92-b797-7f8e31da9cc2"
UNKNOWN_OBJECT = "dd056dcd-154b-4c76-9bd3-c8f88648b5ff"

# (generation, topology, machine type or None)
GOOD = [
    ("v4", "2x2x1", None),
    ("v4", "2x2x4", None),
    ("v4", "4x4x8", None),
    ("v5e", "1x1", "ct5lp-hightpu-1t"),
    ("v5e", "2x4", "ct5lp-hightpu-8t"),
    ("v5e", "2x4", "ct5lp-hightpu-4t"),
    ("v5e", "16x16", None),
    ("v5p", "2x2x1", None),
    ("v5p", "4x4x8", None),
    ("v6e", "2x2", None),
    ("v6e", "2x4", "ct6e-standard-8t"),
    ("v6e", "2x4", "ct6e-standard-4t"),
    ("v6e", "4x4", None),
    ("v6e", "16x16", None),
    ("tpu7x", "2x2x1", None),
    ("tpu7x", "4x4x4", None),
]


@pytest.mark.parametrize(
    ("gen", "topology", "machine"), GOOD, ids=[f"{g}-{t}-{m or 'default'}" for g, t, m in GOOD]
)
def test_good_pools_pass(gen, topology, machine):
    assert check_node_pool(node_pool_props(gen, topology, machine)) == []


def test_whole_slice_autoscaling_passes():
    base = edit(node_pool_props("v6e", "4x4"), "nodeCount", DELETE)
    for low in (0.0, 4.0):
        props = edit(base, "autoscaling", {"minNodeCount": low, "maxNodeCount": 4.0})
        assert check_node_pool(edit(props, "initialNodeCount", 0.0)) == []


def test_cpu_pool_is_not_judged():
    props = {"nodeConfig": {"machineType": "e2-standard-8"}, "nodeCount": 3.0}
    assert check_node_pool(props) == []


V6E_4X4 = node_pool_props("v6e", "4x4")
V4_2X2X4 = node_pool_props("v4", "2x2x4")
V5P = node_pool_props("v5p", "2x4x4")
V6E_2X2 = node_pool_props("v6e", "2x2")
V6E_2X4_8T = node_pool_props("v6e", "2x4", "ct6e-standard-8t")
V6E_2X4_4T = node_pool_props("v6e", "2x4", "ct6e-standard-4t")

# (id, props, substrings the single violation must contain)
BAD = [
    ("v6e-4x4-hosts-minus-one", edit(V6E_4X4, "nodeCount", 3.0), ["nodeCount: 3", "= 4", "16"]),
    ("v6e-4x4-hosts-plus-one", edit(V6E_4X4, "nodeCount", 5.0), ["nodeCount: 5", "= 4"]),
    ("v4-2x2x4-hosts-plus-one", edit(V4_2X2X4, "nodeCount", 5.0), ["nodeCount: 5", "= 4"]),
    ("v5p-2x4x4-hosts-minus-one", edit(V5P, "nodeCount", 7.0), ["nodeCount: 7", "= 8"]),
    (
        "v6e-2x4-4t-initial-count-one",
        edit(edit(V6E_2X4_4T, "nodeCount", DELETE), "initialNodeCount", 1.0),
        ["initialNodeCount: 1", "= 2"],
    ),
    (
        "wrong-chips-per-host-v6e-4x4-on-8t",
        edit(V6E_4X4, "nodeConfig.machineType", "ct6e-standard-8t"),
        ["ct6e-standard-8t", "4x4", "not built from 8-chip hosts", "ct6e-standard-4t"],
    ),
    (
        "wrong-chips-per-host-v5e-4x4-on-1t",
        edit(node_pool_props("v5e", "4x4"), "nodeConfig.machineType", "ct5lp-hightpu-1t"),
        ["ct5lp-hightpu-1t", "not built from 1-chip hosts"],
    ),
    (
        "single-host-v6e-2x2-with-topology",
        edit(V6E_2X2, "placementPolicy", {"type": "COMPACT", "tpuTopology": "2x2"}),
        ["placementPolicy.tpuTopology", "single-host", "remove placementPolicy"],
    ),
    (
        "single-host-v6e-2x4-8t-with-topology",
        edit(V6E_2X4_8T, "placementPolicy", {"tpuTopology": "2x4"}),
        ["single-host", "8 chips on 1 host", "ct6e-standard-4t"],
    ),
    (
        "single-host-v4-2x2x1-with-topology",
        edit(node_pool_props("v4", "2x2x1"), "placementPolicy", {"tpuTopology": "2x2x1"}),
        ["single-host", "ct4p-hightpu-4t"],
    ),
    (
        "2x4-on-1-chip-machine",
        edit(V6E_2X4_4T, "nodeConfig.machineType", "ct6e-standard-1t"),
        ["ct6e-standard-1t", "2x4", "not built from 1-chip hosts"],
    ),
    (
        "2x4-on-3d-generation-machine",
        edit(V6E_2X4_4T, "nodeConfig.machineType", "ct5p-hightpu-4t"),
        ["ct5p-hightpu-4t", "'2x4'", "3D"],
    ),
    (
        "unknown-tpu-machine-type",
        edit(V6E_4X4, "nodeConfig.machineType", "ct6e-standard-2t"),
        ["'ct6e-standard-2t' is not a known TPU machine type", "ct6e-standard-4t"],
    ),
    (
        "illegal-topology",
        edit(V6E_4X4, "placementPolicy.tpuTopology", "4x5"),
        ["'4x5'", "16x16"],
    ),
    (
        "multi-host-not-compact",
        edit(V6E_4X4, "placementPolicy.type", "SPREAD"),
        ["placementPolicy.type: 'SPREAD'", "valid: COMPACT"],
    ),
    (
        "multi-host-no-placement-type",
        edit(V6E_4X4, "placementPolicy.type", DELETE),
        ["placementPolicy.type: not set", "COMPACT"],
    ),
    (
        "multi-host-no-zone",
        edit(V6E_4X4, "nodeLocations", DELETE),
        ["nodeLocations: not set", "one zone"],
    ),
    (
        "multi-host-two-zones",
        edit(V6E_4X4, "nodeLocations", ["us-east5-a", "us-east5-b"]),
        ["2 zones", "exactly one zone"],
    ),
    (
        "multi-host-no-node-count",
        edit(V6E_4X4, "nodeCount", DELETE),
        ["nodeCount: not set", "= 4"],
    ),
    (
        "autoscaling-min-partial",
        edit(V6E_4X4, "autoscaling", {"minNodeCount": 1.0, "maxNodeCount": 4.0}),
        ["autoscaling.minNodeCount: 1.0", "valid: 0, 4"],
    ),
    (
        "autoscaling-max-two-slices",
        edit(V6E_4X4, "autoscaling", {"minNodeCount": 0.0, "maxNodeCount": 8.0}),
        ["autoscaling.maxNodeCount: 8.0", "valid: 4"],
    ),
    (
        "autoscaling-total-counts",
        edit(
            edit(V6E_4X4, "autoscaling", {"totalMinNodeCount": 0.0, "totalMaxNodeCount": 4.0}),
            "nodeCount",
            DELETE,
        ),
        ["autoscaling.totalM", "per zone"],
    ),
    (
        "tpu7x-multi-host-without-workload-policy",
        edit(node_pool_props("tpu7x", "4x4x4"), "placementPolicy", {"tpuTopology": "4x4x4"}),
        ["placementPolicy.policyName: not set", "HIGH_THROUGHPUT", "'4x4x4'"],
    ),
    (
        "topology-on-cpu-machine",
        {"nodeConfig": {"machineType": "n2-standard-8"}, "placementPolicy": {"tpuTopology": "2x2"}},
        ["not a TPU host"],
    ),
]


@pytest.mark.parametrize(("props", "expected"), [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_broken_pools_fail_with_the_numbers(props, expected):
    violations = check_node_pool(props)
    matching = [v for v in violations if all(text in v for text in expected)]
    assert matching, f"no violation contains {expected}: {violations}"


FIXED = edit(V6E_4X4, "nodeCount", 4.0)
SCALED = edit(
    edit(V6E_4X4, "nodeCount", DELETE), "autoscaling", {"minNodeCount": 0.0, "maxNodeCount": 4.0}
)

# Node count forms of a v6e 4x4 pool (4 hosts), as the program declares them and as hands write
# them: (id, props, None when clean / True advisory / False mandatory, text of the finding)
NODE_COUNTS = [
    ("fixed-nodeCount", FIXED, None, ""),
    ("fixed-initialNodeCount", edit(edit(FIXED, "nodeCount", DELETE), "initialNodeCount", 4.0), None, ""),
    ("scale-to-zero-initial-hosts", edit(SCALED, "initialNodeCount", 4.0), None, ""),
    ("scale-to-zero-initial-zero", edit(SCALED, "initialNodeCount", 0.0), None, ""),
    ("scale-to-zero-no-count", SCALED, None, ""),
    ("autoscaled-whole-slice-min", edit(edit(SCALED, "autoscaling.minNodeCount", 4.0), "initialNodeCount", 4.0), None, ""),
    ("nodeCount-beside-autoscaling", edit(SCALED, "nodeCount", 4.0), True, "should not be used alongside autoscaling"),
    ("nodeCount-zero-beside-autoscaling", edit(SCALED, "nodeCount", 0.0), True, "set initialNodeCount = 0"),
    ("nodeCount-partial-beside-autoscaling", edit(SCALED, "nodeCount", 2.0), False, "nodeCount: 2 nodes does not make whole slices"),
    ("initialNodeCount-partial-autoscaled", edit(SCALED, "initialNodeCount", 3.0), False, "initialNodeCount: 3 nodes"),
    ("fixed-initialNodeCount-zero", edit(edit(FIXED, "nodeCount", DELETE), "initialNodeCount", 0.0), False, "set initialNodeCount = 4"),
    ("fixed-no-count", edit(FIXED, "nodeCount", DELETE), False, "nodeCount: not set"),
    ("fixed-both-counts-one-wrong", edit(FIXED, "initialNodeCount", 2.0), False, "initialNodeCount: 2 nodes"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("props", "advisory", "text"), [c[1:] for c in NODE_COUNTS], ids=[c[0] for c in NODE_COUNTS]
)
def test_node_count_forms(props, advisory, text):
    findings = check_node_pool(props)
    if advisory is None:
        assert findings == []
        return
    (finding,) = [f for f in findings if text in f] or [findings]
    assert isinstance(finding, Advisory) is advisory, findings
    assert all(isinstance(f, Advisory) == advisory for f in findings), findings


TPU7X = node_pool_props("tpu7x", "4x4x4")

# placementPolicy of a tpu7x 4x4x4 pool: (id, placementPolicy, as in NODE_COUNTS, text)
TPU7X_PLACEMENTS = [
    ("as-gke-stores-it", {"type": "", "policyName": "wp", "tpuTopology": "4x4x4"}, None, ""),
    ("no-type-key", {"policyName": "wp", "tpuTopology": "4x4x4"}, None, ""),
    ("topology-in-policy-only", {"type": "", "policyName": "wp"}, None, ""),
    ("compact-beside-policyName", {"type": "COMPACT", "policyName": "wp", "tpuTopology": "4x4x4"}, True, "likely diffs"),
    ("compact-without-topology", {"type": "COMPACT", "policyName": "wp"}, None, ""),
    ("compact-placement-only", {"type": "COMPACT", "tpuTopology": "4x4x4"}, False, "policyName: not set"),
    ("wrong-topology", {"type": "", "policyName": "wp", "tpuTopology": "4x4x8"}, False, "nodeCount: 16 nodes"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("placement", "advisory", "text"),
    [c[1:] for c in TPU7X_PLACEMENTS],
    ids=[c[0] for c in TPU7X_PLACEMENTS],
)
def test_tpu7x_placement_forms(placement, advisory, text):
    findings = check_node_pool(edit(TPU7X, "placementPolicy", placement))
    if advisory is None:
        assert findings == []
        return
    matching = [f for f in findings if text in f]
    assert matching, findings
    assert isinstance(matching[0], Advisory) is advisory


def test_autoscaling_total_counts_reports_both_keys():
    props = edit(
        edit(V6E_4X4, "autoscaling", {"totalMinNodeCount": 0.0, "totalMaxNodeCount": 4.0}),
        "nodeCount",
        DELETE,
    )
    text = "\n".join(check_node_pool(props))
    assert "totalMinNodeCount" in text and "totalMaxNodeCount" in text


# Props as a preview may hand them: unknown sentinels, None, absent and oddly typed fields.
UNKNOWN_CASES = [
    ("machine-type-unknown", edit(V6E_4X4, "nodeConfig.machineType", UNKNOWN_STRING)),
    ("topology-unknown", edit(V6E_4X4, "placementPolicy.tpuTopology", UNKNOWN_STRING)),
    ("node-count-unknown", edit(V6E_4X4, "nodeCount", UNKNOWN_NUMBER)),
    ("locations-unknown", edit(V6E_4X4, "nodeLocations", UNKNOWN_ARRAY)),
    ("zone-unknown", edit(V6E_4X4, "nodeLocations", [UNKNOWN_STRING])),
    ("autoscaling-unknown", edit(V6E_4X4, "autoscaling", UNKNOWN_OBJECT)),
    ("placement-unknown", edit(V6E_4X4, "placementPolicy", UNKNOWN_OBJECT)),
    ("node-config-unknown", edit(V6E_4X4, "nodeConfig", UNKNOWN_OBJECT)),
    ("node-config-none", edit(V6E_4X4, "nodeConfig", None)),
    ("empty", {}),
    ("node-config-list", {"nodeConfig": ["ct6e-standard-4t"]}),
    ("machine-type-number", {"nodeConfig": {"machineType": 4.0}}),
    ("count-as-string", edit(V6E_4X4, "nodeCount", "4")),
]


@pytest.mark.parametrize("props", [c[1] for c in UNKNOWN_CASES], ids=[c[0] for c in UNKNOWN_CASES])
def test_unknown_and_odd_values_do_not_crash_or_invent_violations(props):
    assert check_node_pool(props) == []


def test_sentinels_are_the_engines():
    from pulumi_policy import proxy

    engine = {
        v for k, v in vars(proxy).items() if k.startswith("UNKNOWN_") and k.endswith("_VALUE")
    }
    assert engine == set(UNKNOWN_SENTINELS)
