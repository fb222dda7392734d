"""``raytpu check``: KubeRay samples, broken manifests, stack export and preview JSON; exit codes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from policies_factories import cluster_spec, edit, node_pool_props, ray_object, tpu_group

from raytpu import catalog, crds
from raytpu_cli.main import main

SAMPLES = sorted((crds.crds_dir().parent / "samples").glob("*.yaml"))
UNKNOWN_NUMBER = "3eeb2bf0-c639-47a8-9e75-3b44932eb421"
V6E_4X4 = catalog.shape("v6e", "4x4")
V6E_2X4_8T = catalog.shape("v6e", "2x4", machine_type="ct6e-standard-8t")


def check_json(capsys, *argv: str) -> tuple[int, dict]:
    code = main(["check", *argv, "--json"])
    return code, json.loads(capsys.readouterr().out)


def write_yaml(path: Path, *documents: dict) -> Path:
    path.write_text(yaml.safe_dump_all(list(documents), sort_keys=False))
    return path


def _bump_ray(value, old: str, new: str):
    """A copy of a manifest with every rayVersion / image tag ``old`` replaced by ``new``."""
    if isinstance(value, dict):
        return {k: _bump_ray(v, old, new) for k, v in value.items()}
    if isinstance(value, list):
        return [_bump_ray(v, old, new) for v in value]
    if isinstance(value, str) and (value == old or value.startswith("rayproject/ray:")):
        return value.replace(old, new)
    return value


def test_samples_are_present():
    assert len(SAMPLES) >= 8


@pytest.mark.parametrize("sample", SAMPLES, ids=[p.stem for p in SAMPLES])
def test_kuberay_samples_fail_only_on_their_old_ray(capsys, sample):
    code, result = check_json(capsys, str(sample))
    assert code == 1
    assert result["errors"] == []
    policies = {v["policy"] for v in result["violations"]}
    assert policies == {"pinned-ray-version"}, result["violations"]
    assert all("2.52.0" in v["message"] and v["file"] == str(sample) for v in result["violations"])


@pytest.mark.parametrize("sample", SAMPLES, ids=[p.stem for p in SAMPLES])
def test_kuberay_samples_pass_once_ray_is_pinned_to_2_60(capsys, tmp_path, sample):
    documents = [_bump_ray(d, "2.52.0", "2.60.0") for d in yaml.safe_load_all(sample.read_text())]
    code, result = check_json(capsys, str(write_yaml(tmp_path / sample.name, *documents)))
    assert (code, result["violations"]) == (0, [])


def test_all_samples_in_one_call_name_each_file(capsys):
    code = main(["check", *map(str, SAMPLES)])
    out = capsys.readouterr().out
    assert code == 1
    for sample in SAMPLES:
        assert f"{sample}: Ray" in out
    assert f"checked {len(SAMPLES)} object(s) in {len(SAMPLES)} file(s)" in out


def good_cluster(name: str = "train") -> dict:
    return ray_object("RayCluster", name, cluster_spec([tpu_group(V6E_4X4)]))


# (id, documents, policy, object, text in the message)
BROKEN = [
    (
        "hosts-off-by-one",
        [edit(good_cluster(), "spec.workerGroupSpecs[0].numOfHosts", 3)],
        "ray-tpu-worker-groups",
        "RayCluster/train",
        "spec.workerGroupSpecs[0] (group 'tpu').numOfHosts: 3",
    ),
    (
        "webhook-example",
        [
            ray_object(
                "RayJob",
                "job",
                cluster_spec([edit(tpu_group(V6E_2X4_8T), "numOfHosts", 2)]),
            )
        ],
        "ray-tpu-worker-groups",
        "RayJob/job",
        "set numOfHosts: 1",
    ),
    (
        "missing-node-selector",
        [
            edit(
                good_cluster(),
                "spec.workerGroupSpecs[0].template.spec.nodeSelector",
                {"cloud.google.com/gke-tpu-topology": "4x4"},
            )
        ],
        "ray-tpu-worker-groups",
        "RayCluster/train",
        "missing cloud.google.com/gke-tpu-accelerator",
    ),
    (
        "second-document-lb-service",
        [
            good_cluster(),
            {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {"name": "dash"},
                "spec": {"type": "LoadBalancer", "ports": [{"port": 8265}]},
            },
        ],
        "no-public-ray-head",
        "Service/dash",
        "spec.ports[0].port: 8265",
    ),
    (
        "crd-schema",
        [edit(good_cluster(), "spec.workerGroupSpecs[0].replicas", "one")],
        "kuberay-crd-schema",
        "RayCluster/train",
        "spec.workerGroupSpecs.0.replicas",
    ),
]


@pytest.mark.parametrize(
    ("documents", "policy", "obj", "text"), [b[1:] for b in BROKEN], ids=[b[0] for b in BROKEN]
)
def test_broken_manifests_fail_naming_file_object_and_field(
    capsys, tmp_path, documents, policy, obj, text
):
    path = write_yaml(tmp_path / "k8s.yaml", *documents)
    code, result = check_json(capsys, str(path))
    assert code == 1
    matching = [
        v
        for v in result["violations"]
        if v["policy"] == policy and v["object"] == obj and text in v["message"]
    ]
    assert matching and matching[0]["file"] == str(path), result["violations"]


def test_text_output_names_file_object_and_field(capsys, tmp_path):
    path = write_yaml(
        tmp_path / "k8s.yaml", edit(good_cluster(), "spec.workerGroupSpecs[0].numOfHosts", 3)
    )
    assert main(["check", str(path)]) == 1
    out = capsys.readouterr().out
    assert f"{path}: RayCluster/train: spec.workerGroupSpecs[0] (group 'tpu').numOfHosts: 3" in out


def test_good_manifests_and_a_kind_list_pass(capsys, tmp_path):
    listed = {"apiVersion": "v1", "kind": "List", "items": [good_cluster("a"), good_cluster("b")]}
    path = write_yaml(tmp_path / "k8s.yaml", good_cluster(), listed)
    code, result = check_json(capsys, str(path))
    assert (code, result["violations"], result["files"][0]["resources"]) == (0, [], 3)


def test_advisory_config_reports_but_exits_zero(capsys, tmp_path):
    path = write_yaml(
        tmp_path / "k8s.yaml", edit(good_cluster(), "spec.workerGroupSpecs[0].numOfHosts", 3)
    )
    config = tmp_path / "policy.json"
    config.write_text(json.dumps({"all": "advisory"}))
    code, result = check_json(capsys, str(path), "--policy-config", str(config))
    assert code == 0
    assert {v["enforcement"] for v in result["violations"]} == {"advisory"}


# ----------------------------------------------------------------------------- Pulumi files


def stack_export(resources: list[tuple[str, str, dict]]) -> dict:
    entries = [
        {
            "urn": "urn:pulumi:dev::ray-tpu::pulumi:pulumi:Stack::ray-tpu-dev",
            "type": "pulumi:pulumi:Stack",
        },
        {
            "urn": "urn:pulumi:dev::ray-tpu::pulumi:providers:gcp::default",
            "type": "pulumi:providers:gcp",
            "inputs": {},
        },
    ]
    for type_, name, inputs in resources:
        urn = f"urn:pulumi:dev::ray-tpu::{type_}::{name}"
        entries.append(
            {"urn": urn, "custom": True, "type": type_, "inputs": inputs, "outputs": inputs}
        )
    return {"version": 3, "deployment": {"manifest": {}, "resources": entries}}


def tpu_stack(node_count: float = 4.0) -> list[tuple[str, str, dict]]:
    cluster = {
        "name": "ray-tpu",
        "addonsConfig": {"rayOperatorConfigs": [{"enabled": True}]},
        "workloadIdentityConfig": {"workloadPool": "p.svc.id.goog"},
    }
    pool = edit(node_pool_props("v6e", "4x4", name="train-0"), "nodeCount", node_count)
    return [
        ("gcp:container/cluster:Cluster", "gke", cluster),
        ("gcp:container/nodePool:NodePool", "slice-train-0", pool),
        ("kubernetes:ray.io/v1:RayCluster", "raycluster-train", good_cluster()),
    ]


def test_stack_export_passes_and_fails(capsys, tmp_path):
    good = tmp_path / "good.json"
    good.write_text(json.dumps(stack_export(tpu_stack())))
    code, result = check_json(capsys, str(good))
    assert (code, result["violations"], result["files"][0]["resources"]) == (0, [], 3)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(stack_export(tpu_stack(node_count=3.0))))
    code, result = check_json(capsys, str(bad))
    assert code == 1
    (violation,) = result["violations"]
    assert violation["object"] == "NodePool/slice-train-0"
    assert violation["message"].startswith("nodeCount: 3")
    assert violation["urn"].endswith("::slice-train-0")


def preview_json(resources: list[tuple[str, str, dict]]) -> dict:
    steps = [
        {
            "op": "create",
            "urn": f"urn:pulumi:dev::ray-tpu::{t}::{n}",
            "newState": {"urn": f"urn:pulumi:dev::ray-tpu::{t}::{n}", "type": t, "inputs": i},
        }
        for t, n, i in resources
    ]
    steps.append(
        {
            "op": "delete",
            "urn": "urn:pulumi:dev::ray-tpu::gcp:container/nodePool:NodePool::old",
            "oldState": {},
        }
    )
    return {
        "config": {},
        "steps": steps,
        "diagnostics": [],
        "changeSummary": {"create": len(steps)},
    }


def test_preview_json_with_unknowns_passes_and_a_mismatch_fails(capsys, tmp_path):
    unknown = tmp_path / "preview.json"
    unknown.write_text(json.dumps(preview_json(tpu_stack(node_count=UNKNOWN_NUMBER))))
    code, result = check_json(capsys, str(unknown))
    assert (code, result["violations"], result["files"][0]["resources"]) == (0, [], 3)
    broken = edit(good_cluster(), "spec.workerGroupSpecs[0].numOfHosts", 5)
    resources = [*tpu_stack()[:2], ("kubernetes:ray.io/v1:RayCluster", "raycluster-train", broken)]
    bad = tmp_path / "preview-bad.json"
    bad.write_text(json.dumps(preview_json(resources)))
    code, result = check_json(capsys, str(bad))
    assert code == 1
    assert [v["policy"] for v in result["violations"]] == ["ray-tpu-worker-groups"]


def test_stack_export_of_a_shipped_stack_passes(capsys, tmp_path):
    from infra.offline import run_stack

    resources, _ = run_stack("dev")
    declared = [(r.type, r.name, r.props) for r in resources if r.custom]
    path = tmp_path / "dev.json"
    path.write_text(json.dumps(stack_export(declared)))
    code, result = check_json(capsys, str(path))
    assert (code, result["violations"]) == (0, [])


# ----------------------------------------------------------------------------- input errors


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("bad.yaml", "kind: RayCluster\n  spec: [\n", "not valid YAML"),
        ("bad.json", '{"steps": [', "not valid JSON"),
        ("notk8s.yaml", "just: a mapping\n", "document 1 is not a Kubernetes object"),
        ("empty.yaml", "", "holds no Kubernetes object"),
    ],
    ids=["bad-yaml", "bad-json", "not-kubernetes", "empty"],
)
def test_unreadable_inputs_exit_2(capsys, tmp_path, name, content, message):
    path = tmp_path / name
    path.write_text(content)
    code, result = check_json(capsys, str(path))
    assert code == 2
    assert any(message in e and str(path) in e for e in result["errors"]), result["errors"]


def test_missing_file_exits_2_and_other_files_are_still_checked(capsys, tmp_path):
    good = write_yaml(tmp_path / "good.yaml", good_cluster())
    code = main(["check", str(tmp_path / "missing.yaml"), str(good)])
    captured = capsys.readouterr()
    assert code == 2
    assert "missing.yaml: cannot read" in captured.err
    assert "checked 1 object(s) in 1 file(s)" in captured.out


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ('{"nope": "advisory"}', "'nope' is not a policy"),
        ("[1]", "list is not valid"),
        ("{", "line 1, column 2: not valid JSON"),
    ],
    ids=["unknown-policy", "not-an-object", "bad-json"],
)
def test_bad_policy_config_exits_2(capsys, tmp_path, config, message):
    path = tmp_path / "policy.json"
    path.write_text(config)
    manifest = write_yaml(tmp_path / "k8s.yaml", good_cluster())
    assert main(["check", str(manifest), "--policy-config", str(path)]) == 2
    assert message in capsys.readouterr().err


def test_100_slice_stack_export_checks_in_seconds(capsys, tmp_path):
    import time

    resources = []
    for i in range(100):
        pool = node_pool_props("v6e", "4x4", name=f"s-{i}")
        resources.append(("gcp:container/nodePool:NodePool", f"slice-s-{i}", pool))
    groups = [tpu_group(V6E_4X4, name=f"g{i}", replicas=25) for i in range(4)]
    cluster = ray_object("RayCluster", "big", cluster_spec(groups))
    resources = [*tpu_stack()[:1], *resources, ("kubernetes:ray.io/v1:RayCluster", "big", cluster)]
    path = tmp_path / "big.json"
    path.write_text(json.dumps(stack_export(resources)))
    start = time.perf_counter()
    code, result = check_json(capsys, str(path))
    elapsed = time.perf_counter() - start
    assert (code, result["violations"], result["files"][0]["resources"]) == (0, [], 102)
    assert elapsed < 30, f"check of 100 slices took {elapsed:.1f}s"
