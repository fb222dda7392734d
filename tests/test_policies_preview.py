"""``raytpu preview``: the shipped stacks pass under mocks, a broken stack fails, bad config exits 2.

Also the policies on every shape the program can declare, and a 100-slice stack in seconds.
"""

from __future__ import annotations

import copy
import json
import time
from pathlib import Path

import pytest
import yaml

from infra import offline
from infra.config.stack import parse_config, project_root
from policies.evaluation import evaluate
from raytpu_cli.main import main

STACKS = ["dev", "prod"]


@pytest.fixture(scope="module")
def declared() -> dict[str, list]:
    return {stack: offline.run_stack(stack)[0] for stack in STACKS}


@pytest.mark.parametrize("stack", STACKS)
def test_shipped_stacks_pass_every_policy(declared, stack):
    assert evaluate(declared[stack]) == []


@pytest.mark.parametrize("stack", STACKS)
def test_preview_cli_passes_shipped_stacks(capsys, stack):
    assert main(["preview", stack, "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["violations"] == []
    pools = [r for r in result["resources"] if r["type"] == "NodePool" and r["shape"]]
    groups = [r for r in result["resources"] if r["type"] in ("RayCluster", "RayService")]
    assert pools and groups
    for group in groups:  # every Ray group is matched to pools of its shape
        assert group["pool"] and group["shape"] and group["hosts"] >= 1
    assert {"clusterName", "slices", "rayClusters"} <= set(result["outputs"])


def test_preview_table_shows_the_dev_slices(capsys):
    assert main(["preview", "dev"]) == 0
    out = capsys.readouterr().out
    header = out.splitlines()[0].split()
    assert header[:3] == ["type", "name", "shape"]
    rows = [line.split() for line in out.splitlines()]
    assert ["NodePool", "slice-train-0", "v6e", "2x4", "2", "ct6e-standard-4t", "train-0"] in [
        r[:7] for r in rows
    ]
    assert "stack dev: " in out and "no policy violations" in out


# ----------------------------------------------------------------------------- broken stacks


def _mutated(resources, type_suffix: str, name: str, path: list, value):
    """Copies of ``resources`` with one declared prop of one resource replaced."""
    result = []
    for r in resources:
        if r.custom and r.type.endswith(type_suffix) and r.name == name:
            props = copy.deepcopy(r.props)
            target = props
            for step in path[:-1]:
                target = target[step]
            target[path[-1]] = value
            r = offline.DeclaredResource(r.type, r.name, r.urn, props, r.parent, r.custom)
        result.append(r)
    return result


BROKEN = [
    (
        "pool-hosts-off-by-one",
        ("NodePool", "slice-train-0", ["nodeCount"], 3.0),
        "tpu-node-pool-shape",
        "nodeCount: 3 nodes does not make whole slices of v6e 2x4 (2 hosts x 4 chips)",
    ),
    (
        "group-hosts-off-by-one",
        ("RayCluster", "raycluster-train", ["spec", "workerGroupSpecs", 0, "numOfHosts"], 1.0),
        "ray-tpu-worker-groups",
        "numOfHosts: 1, but v6e 2x4 with 4 chips per host",
    ),
    (
        "group-replicas-beyond-slices",
        # dev's train group autoscales (0..1 slices): the slices it may take are its maxReplicas.
        ("RayCluster", "raycluster-train", ["spec", "workerGroupSpecs", 0, "maxReplicas"], 2.0),
        "tpu-slices-for-ray-groups",
        "2 slice(s) of v6e 2x4 (2 hosts x 4 chips) on ct6e-standard-4t needed",
    ),
    (
        "pool-on-wrong-machine",
        ("NodePool", "slice-serve-0", ["nodeConfig", "machineType"], "ct6e-standard-8t"),
        "tpu-slices-for-ray-groups",
        "RayService/serve group 'tpu-group'",
    ),
    (
        "no-ray-operator",
        ("Cluster", "gke", ["addonsConfig"], {}),
        "ray-operator-addon",
        "addonsConfig.rayOperatorConfigs[0].enabled is not set",
    ),
]


@pytest.mark.parametrize(
    ("mutation", "policy", "text"), [b[1:] for b in BROKEN], ids=[b[0] for b in BROKEN]
)
def test_broken_dev_stack_fails_with_the_right_message(declared, mutation, policy, text):
    violations = evaluate(_mutated(declared["dev"], *mutation))
    assert any(v.policy == policy and text in v.message for v in violations), [
        (v.policy, v.message) for v in violations
    ]


@pytest.fixture
def broken_dev(monkeypatch):
    """``offline.run_program`` declaring the real dev stack with slice-train-0 one host short."""
    real = offline.run_program

    def run_program(config, *, stack: str = "dev"):
        resources, outputs = real(config, stack=stack)
        return _mutated(resources, "NodePool", "slice-train-0", ["nodeCount"], 1.0), outputs

    monkeypatch.setattr(offline, "run_program", run_program)


def test_preview_cli_exits_1_on_a_broken_stack(capsys, broken_dev):
    assert main(["preview", "dev"]) == 1
    out = capsys.readouterr().out
    assert "NodePool/slice-train-0: nodeCount: 1 nodes" in out
    assert "[tpu-node-pool-shape, mandatory]" in out


def test_preview_cli_advisory_config_exits_0(capsys, tmp_path, broken_dev):
    config = tmp_path / "policy.json"
    config.write_text(json.dumps({"tpu-node-pool-shape": "advisory"}))
    assert main(["preview", "dev", "--policy-config", str(config), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert [v["enforcement"] for v in result["violations"]] == ["advisory"]


# ----------------------------------------------------------------------------- config errors


def _dev_raw() -> dict:
    with (project_root() / "Pulumi.dev.yaml").open() as handle:
        return copy.deepcopy(yaml.safe_load(handle)["config"])


def _write_stack(folder: Path, name: str, raw: dict) -> None:
    (folder / f"Pulumi.{name}.yaml").write_text(yaml.safe_dump({"config": raw}, sort_keys=False))


def test_unknown_stack_exits_2(capsys):
    assert main(["preview", "no-such-stack"]) == 2
    err = capsys.readouterr().err
    assert "'no-such-stack' is not valid" in err and "dev" in err and "prod" in err


def test_bad_topology_in_config_exits_2_naming_the_key(capsys, tmp_path):
    raw = _dev_raw()
    raw["ray-tpu:slices"][0]["topology"] = "4x5"
    _write_stack(tmp_path, "bad", raw)
    assert main(["preview", "bad", "--project-dir", str(tmp_path), "--json"]) == 2
    result = json.loads(capsys.readouterr().out)
    assert any("ray-tpu:slices[0].topology" in e and "'4x5'" in e for e in result["errors"])


# ----------------------------------------------------------------------------- other shapes, scale


def _slice(name: str, generation: str, topology: str, **extra) -> dict:
    return {
        "name": name,
        "generation": generation,
        "topology": topology,
        "zone": "us-east5-b",
        **extra,
    }


SHAPES = [
    _slice("iw", "tpu7x", "2x2x2"),
    _slice("iw", "tpu7x", "4x4x4"),
    _slice("iw", "tpu7x", "2x2x1"),
    _slice("flex", "v6e", "4x4", provisioning="flex-start"),
    _slice("v4", "v4", "2x2x4", provisioning="spot"),
    _slice("v5e", "v5e", "2x4", machineType="ct5lp-hightpu-4t"),
    _slice("v5p", "v5p", "4x4x4"),
    _slice("many", "v6e", "2x2", count=8),
]


@pytest.mark.parametrize(
    "slice_", SHAPES, ids=[f"{s['generation']}-{s['topology']}-{s['name']}" for s in SHAPES]
)
def test_every_shape_the_program_declares_passes(slice_):
    raw = _dev_raw()
    raw["ray-tpu:slices"] = [slice_]
    raw["ray-tpu:cluster"]["minMasterVersion"] = "1.34"  # tpu7x needs 1.34.0-gke.2201000
    raw["ray-tpu:pythonVersion"] = "3.12"  # tpu7x needs jax[tpu] >= 0.8.2 on Python 3.12
    to_zero = slice_.get("scaleToZero") or slice_.get("provisioning") == "flex-start"
    # A worker group on a scale-to-zero slice keeps no replica (the pool must reach zero).
    counts = {"replicas": 0, "minReplicas": 0, "maxReplicas": 1} if to_zero else {"replicas": 1}
    raw["ray-tpu:rayClusters"] = [{"name": "work", "slice": slice_["name"], **counts}]
    raw["ray-tpu:rayServices"] = []
    resources, _ = offline.run_program(parse_config(raw), stack="shape")
    assert [v.message for v in evaluate(resources)] == []


def test_tpu7x_workload_policy_is_resolved_not_skipped():
    raw = _dev_raw()
    raw["ray-tpu:slices"] = [_slice("iw", "tpu7x", "4x4x4")]
    raw["ray-tpu:cluster"]["minMasterVersion"] = "1.34"
    raw["ray-tpu:pythonVersion"] = "3.12"
    raw["ray-tpu:rayClusters"] = [{"name": "work", "slice": "iw", "replicas": 1}]
    raw["ray-tpu:rayServices"] = []
    resources, _ = offline.run_program(parse_config(raw), stack="shape")
    policy = next(r for r in resources if r.type.endswith("ResourcePolicy"))
    broken = _mutated(
        resources, "ResourcePolicy", policy.name, ["workloadPolicy", "acceleratorTopology"], "4x4x8"
    )
    messages = [v.message for v in evaluate(broken) if v.policy == "tpu7x-workload-policy"]
    (message,) = messages
    assert "tpuTopology '4x4x4' differs from workloadPolicy.acceleratorTopology '4x4x8'" in message


def test_100_slice_stack_previews_in_seconds(capsys, tmp_path):
    raw = _dev_raw()
    raw["ray-tpu:slices"] = [
        _slice(f"s{i}", "v6e", "4x4", count=25, provisioning="spot") for i in range(4)
    ]
    raw["ray-tpu:rayClusters"] = [
        {"name": f"c{i}", "slice": f"s{i}", "replicas": 25} for i in range(4)
    ]
    raw["ray-tpu:rayServices"] = []
    _write_stack(tmp_path, "big", raw)
    start = time.perf_counter()
    code = main(["preview", "big", "--project-dir", str(tmp_path), "--json"])
    elapsed = time.perf_counter() - start
    result = json.loads(capsys.readouterr().out)
    assert code == 0, result["violations"]
    tpu_pools = [r for r in result["resources"] if r["type"] == "NodePool" and r["shape"]]
    assert len(tpu_pools) == 100
    assert elapsed < 30, f"preview of 100 slices took {elapsed:.1f}s"


def test_rayjob_sharing_a_slice_pool_passes_and_one_slice_short_fails():
    raw = _dev_raw()
    raw["ray-tpu:rayJobs"] = [{"name": "job", "slice": "train", "replicas": 1}]
    raw["ray-tpu:slices"][0]["count"] = 2
    resources, _ = offline.run_program(parse_config(raw), stack="jobs")
    assert any(r.type == "kubernetes:ray.io/v1:RayJob" for r in resources)
    assert evaluate(resources) == []
    short = [r for r in resources if not r.name.endswith("slice-train-1")]
    messages = [v.message for v in evaluate(short) if v.policy == "tpu-slices-for-ray-groups"]
    assert messages and "RayCluster/train" in messages[0] and "RayJob/job" in messages[0]


def _upgrade_types(resources) -> dict[str, str]:
    return {
        r.name: r.props["spec"]["upgradeStrategy"]["type"]
        for r in resources
        if r.type == "kubernetes:ray.io/v1:RayService"
    }


@pytest.mark.parametrize("stack", STACKS)
def test_shipped_rayservices_upgrade_in_place(declared, stack):
    """No spare serving slice in dev or prod: KubeRay's blue-green default would wait Pending."""
    assert set(_upgrade_types(declared[stack]).values()) == {"None"}


@pytest.mark.parametrize(
    ("serve_slices", "given", "expected", "violates"),
    [
        (1, "NewCluster", "NewCluster", True),
        (2, None, "NewCluster", False),
        (2, "None", "None", False),
    ],
    ids=["blue-green-without-spare", "spare-slice-default-blue-green", "in-place-by-choice"],
)
def test_upgrade_strategy_from_stack_config(serve_slices, given, expected, violates):
    raw = _dev_raw()
    raw["ray-tpu:slices"][1]["count"] = serve_slices
    if given is not None:
        raw["ray-tpu:rayServices"][0]["upgradeStrategy"] = given
    resources, _ = offline.run_program(parse_config(raw), stack="upgrades")
    assert set(_upgrade_types(resources).values()) == {expected}
    found = [v for v in evaluate(resources) if v.policy == "rayservice-upgrade-capacity"]
    assert bool(found) is violates, found
    if violates:
        assert "more slice(s) of v6e 2x2" in found[0].message
