"""``raytpu check``: KubeRay samples, broken manifests, stack export and preview JSON; exit codes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from policies_factories import cluster_spec, edit, node_pool_props, ray_object, tpu_group

from policies.resources import CLUSTER_SPEC_PATH
from raytpu import catalog, crds
from raytpu.ray_versions import MINIMUM_RAY_VERSION, parse_version
from raytpu_cli.main import main

SAMPLE_DIRS = [
    folder
    for folder in (crds.crds_dir().parent / name for name in ("samples", "samples-v1.7.0"))
    if folder.is_dir()
]
"""KubeRay TPU samples: ``samples/`` (what CI fetches at KUBERAY_REF), and locally also the
KubeRay v1.7.0 release's (``../shared/kuberay/samples-v1.7.0``)."""
SAMPLES = sorted(path for folder in SAMPLE_DIRS for path in folder.rglob("*.yaml"))
SAMPLE_IDS = [f"{p.parent.name}/{p.stem}" for p in SAMPLES]
UNKNOWN_NUMBER = "3eeb2bf0-c639-47a8-9e75-3b44932eb421"
V6E_4X4 = catalog.shape("v6e", "4x4")
V6E_2X4_8T = catalog.shape("v6e", "2x4", machine_type="ct6e-standard-8t")


def check_json(capsys, *argv: str) -> tuple[int, dict]:
    code = main(["check", *argv, "--json"])
    return code, json.loads(capsys.readouterr().out)


def write_yaml(path: Path, *documents: dict) -> Path:
    path.write_text(yaml.safe_dump_all(list(documents), sort_keys=False))
    return path


def _ray_versions(sample: Path) -> list[str | None]:
    """The ``rayVersion`` each KubeRay object of a sample states (None: not set)."""
    versions = []
    for document in yaml.safe_load_all(sample.read_text()):
        if isinstance(document, dict) and document.get("kind") in CLUSTER_SPEC_PATH:
            spec: object = document
            for key in CLUSTER_SPEC_PATH[document["kind"]].split("."):
                spec = spec.get(key, {}) if isinstance(spec, dict) else {}
            versions.append(spec.get("rayVersion") if isinstance(spec, dict) else None)
    return versions


def _expected_clean(sample: Path) -> bool:
    """Judged by its own rayVersion: clean iff every object pins Ray >= MINIMUM_RAY_VERSION."""
    versions = _ray_versions(sample)
    return bool(versions) and all(
        isinstance(v, str) and (parse_version(v) or (0,)) >= parse_version(MINIMUM_RAY_VERSION)
        for v in versions
    )


def _is_template(value: str) -> bool:
    return "$" in value or "{{" in value


@pytest.fixture
def samples() -> list[Path]:
    if not SAMPLE_DIRS:
        pytest.skip(f"no KubeRay samples beside the CRDs ({crds.crds_dir().parent}/samples)")
    return SAMPLES


def test_samples_are_present(samples: list[Path]):
    assert len(samples) >= 8


def test_samples_hold_both_verdicts_where_v1_7_0_is_present():
    """The v1.7.0 samples are the case CI met: most pin Ray 2.52.0, ray-job.tpu-jax.yaml 2.57.0."""
    if not any(folder.name == "samples-v1.7.0" for folder in SAMPLE_DIRS):
        pytest.skip("no samples-v1.7.0 folder beside the CRDs: mixed-verdict check NOT run")
    verdicts = {p.name: _expected_clean(p) for p in SAMPLES if p.parent.name == "samples-v1.7.0"}
    assert verdicts["ray-job.tpu-jax.yaml"] is True
    assert verdicts["ray-cluster.tpu-v4-multihost.yaml"] is False
    assert verdicts["ray-service.vllm-tpu-v6e-singlehost.yaml"] is False  # no rayVersion


@pytest.mark.parametrize("sample", SAMPLES, ids=SAMPLE_IDS)
def test_kuberay_samples_are_judged_by_their_own_ray_version(capsys, sample):
    code, result = check_json(capsys, str(sample))
    assert result["errors"] == []
    # No KubeRay TPU sample turns on Ray's token authentication (authOptions).
    auth = [v for v in result["violations"] if v["policy"] == "ray-token-auth"]
    assert auth and all("authOptions.mode: not set" in v["message"] for v in auth)
    assert code == 1
    if _expected_clean(sample):  # a recent enough Ray: nothing else to say
        assert {v["policy"] for v in result["violations"]} == {"ray-token-auth"}, result
        return
    assert {v["policy"] for v in result["violations"]} == {
        "pinned-ray-version",
        "ray-token-auth",
    }, result
    pinned = [v for v in result["violations"] if v["policy"] == "pinned-ray-version"]
    assert all(v["file"] == str(sample) for v in result["violations"])
    for version in _ray_versions(sample):
        stated = f"rayVersion: {version} is older" if version else "rayVersion: not set"
        assert any(stated in v["message"] for v in pinned), result["violations"]
    for violation in pinned:
        assert "has no tag" not in violation["message"] or "$" not in violation["message"]


def _pin_ray(value, version: str = "2.60.0"):
    """A copy of a manifest rendered and pinned to Ray ``version``: rayVersion set, every Ray
    image (and every unrendered template image) replaced by ``rayproject/ray:<version>-py311``."""
    if isinstance(value, dict):
        pinned = {k: _pin_ray(v, version) for k, v in value.items()}
        if "headGroupSpec" in pinned:
            pinned["rayVersion"] = version
        if isinstance(pinned.get("image"), str):
            image = pinned["image"]
            if image.startswith("rayproject/ray") or _is_template(image):
                pinned["image"] = f"rayproject/ray:{version}-py311"
        return pinned
    if isinstance(value, list):
        return [_pin_ray(v, version) for v in value]
    return value


@pytest.mark.parametrize("sample", SAMPLES, ids=SAMPLE_IDS)
def test_kuberay_samples_pass_once_ray_is_pinned_to_2_60(capsys, tmp_path, sample):
    documents = [_with_token_auth(_pin_ray(d)) for d in yaml.safe_load_all(sample.read_text())]
    code, result = check_json(capsys, str(write_yaml(tmp_path / sample.name, *documents)))
    assert (code, result["violations"]) == (0, [])


def _with_token_auth(document: dict) -> dict:
    """``authOptions: {mode: token}`` on the Ray cluster spec of a KubeRay object."""
    spec = document["spec"]
    cluster = spec.get("rayClusterConfig") or spec.get("rayClusterSpec") or spec
    cluster["authOptions"] = {"mode": "token"}
    return document


def _lines_of(out: str, sample: Path) -> str:
    return "\n".join(line for line in out.splitlines() if line.startswith(f"{sample}:"))


def test_all_samples_in_one_call_name_each_file(capsys, samples: list[Path]):
    code = main(["check", *map(str, samples)])
    out = capsys.readouterr().out
    assert code == 1  # every sample runs Ray without token authentication
    for sample in SAMPLES:
        assert f"{sample}: Ray" in out, sample  # each file is named with its objects
        assert ("[pinned-ray-version" in _lines_of(out, sample)) is not _expected_clean(sample)
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


NEEDS_CRDS = {"crd-schema": "kuberay"}
"""The cases of :data:`BROKEN` that need a CRD set, by name."""


@pytest.mark.parametrize(
    ("documents", "policy", "obj", "text"),
    [
        pytest.param(
            *b[1:],
            id=b[0],
            marks=[pytest.mark.crds(NEEDS_CRDS[b[0]])] if b[0] in NEEDS_CRDS else [],
        )
        for b in BROKEN
    ],
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


def test_tpu_only_in_limits_is_an_advisory_finding_and_exits_zero(capsys, tmp_path):
    limits_only = edit(
        good_cluster(),
        "spec.workerGroupSpecs[0].template.spec.containers[0].resources.requests",
        {},
    )
    code, result = check_json(capsys, str(write_yaml(tmp_path / "k8s.yaml", limits_only)))
    assert code == 0
    (finding,) = result["violations"]
    assert (finding["policy"], finding["enforcement"]) == (
        "ray-tpu-worker-groups-advisory",
        "advisory",
    )
    assert "Kubernetes defaults requests to limits" in finding["message"]


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
        ("[1]", "'list' is not valid"),
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
