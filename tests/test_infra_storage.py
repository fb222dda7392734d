"""Issue 12, the stack as deployed: the checkpoint bucket and the Ray pods' identity, the worker
image and its registry, Serve autoscaling, scale-to-zero and the tpu7x runtime rule; all under
Pulumi mocks (inputs as the engine sees them: camelCase, numbers as floats)."""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from infra.config.image import git_image_tag
from infra.config.schema import ConfigError
from infra.config.stack import load_stack, parse_config
from infra.manifests import kuberay
from infra.offline import MOCK_PROJECT_NUMBER, ProgramRun, run_program_detailed
from raytpu import entrypoints
from raytpu.stack_outputs import parse_outputs
from raytpu_cli import jobs

REPO = Path(__file__).resolve().parents[1]
BUCKET = "gcp:storage/bucket:Bucket"
BUCKET_MEMBER = "gcp:storage/bucketIAMMember:BucketIAMMember"
KSA = "kubernetes:core/v1:ServiceAccount"
REPOSITORY = "gcp:artifactregistry/repository:Repository"
REPOSITORY_MEMBER = "gcp:artifactregistry/repositoryIamMember:RepositoryIamMember"
RAY_TYPES = ("kubernetes:ray.io/v1:RayCluster", "kubernetes:ray.io/v1:RayService")
STACKS = ["dev", "prod"]


@pytest.fixture(scope="module")
def runs() -> dict[str, ProgramRun]:
    return {s: run_program_detailed(load_stack(s), stack=s) for s in STACKS}


def _raw() -> dict[str, Any]:
    return copy.deepcopy(yaml.safe_load((REPO / "Pulumi.dev.yaml").read_text())["config"])


# ---------------------------------------------------------------------------- storage, identity

BUCKETS = {"dev": ("ray-tpu-dev-ckpt", 14.0, True), "prod": ("ray-tpu-prod-ckpt", 90.0, False)}


@pytest.mark.parametrize("stack", STACKS)
def test_checkpoint_bucket(runs: dict[str, ProgramRun], stack: str) -> None:
    name, days, force = BUCKETS[stack]
    (bucket,) = runs[stack].of_type(BUCKET)
    props = bucket.props
    assert props["name"] == name
    assert props["location"] == "US-EAST5"
    assert props["uniformBucketLevelAccess"] is True
    assert props["publicAccessPrevention"] == "enforced"
    assert props["softDeletePolicy"] == {"retentionDurationSeconds": 7 * 86400.0}
    assert props["lifecycleRules"] == [{"action": {"type": "Delete"}, "condition": {"age": days}}]
    assert props["forceDestroy"] is force
    assert runs[stack].outputs["checkpointBucket"] == name


@pytest.mark.parametrize("stack", STACKS)
def test_ray_pods_reach_only_that_bucket_as_their_service_account(
    runs: dict[str, ProgramRun], stack: str
) -> None:
    run = runs[stack]
    (ksa,) = run.of_type(KSA)
    assert ksa.props["metadata"]["name"] == "ray-tpu"
    assert ksa.props["metadata"]["namespace"] == "ray"
    assert "annotations" not in ksa.props["metadata"]  # no Google service account to impersonate
    (member,) = run.of_type(BUCKET_MEMBER)
    assert member.props == {
        "bucket": BUCKETS[stack][0],
        "role": "roles/storage.objectUser",
        "member": f"principal://iam.googleapis.com/projects/{MOCK_PROJECT_NUMBER}/locations/"
        f"global/workloadIdentityPools/ray-tpu-{stack}.svc.id.goog/subject/ns/ray/sa/ray-tpu",
    }
    (cluster,) = run.of_type("gcp:container/cluster:Cluster")
    assert cluster.props["workloadIdentityConfig"] == {
        "workloadPool": f"ray-tpu-{stack}.svc.id.goog"
    }
    for pool in run.of_type("gcp:container/nodePool:NodePool"):
        assert pool.props["nodeConfig"]["workloadMetadataConfig"] == {"mode": "GKE_METADATA"}
    # Each Ray object waits for its pods' ServiceAccount and its grant.
    for resource in run.resources:
        if resource.type in RAY_TYPES:
            assert {ksa.urn, member.urn} <= set(resource.dependencies), resource.name


def _pods(spec: dict[str, Any]) -> list[dict[str, Any]]:
    cluster = spec.get("rayClusterConfig") or spec.get("rayClusterSpec") or spec
    groups = [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]
    return [g["template"]["spec"] for g in groups]


@pytest.mark.parametrize("stack", STACKS)
def test_every_ray_pod_has_the_service_account_the_slice_env_and_the_compile_cache(
    runs: dict[str, ProgramRun], stack: str
) -> None:
    objects = [r for r in runs[stack].resources if r.type in RAY_TYPES]
    assert objects
    for resource in objects:
        for pod in _pods(resource.props["spec"]):
            assert pod["serviceAccountName"] == "ray-tpu"
            for container in pod["containers"]:
                env = {e["name"]: e["value"] for e in container["env"]}
                assert env["RAYTPU_STACK"] == stack
                assert env["RAYTPU_SLICE"] == resource.props["metadata"]["labels"]["ray-tpu/slice"]
                # JAX's compilations on the stack's bucket: a restart or a new replica loads them.
                cache = f"gs://{BUCKETS[stack][0]}/jax-compilation-cache"
                assert env[entrypoints.COMPILATION_CACHE_ENV] == cache


def test_rayjob_pods_too() -> None:
    raw = _raw()
    raw["ray-tpu:slices"][0]["count"] = 2
    raw["ray-tpu:rayJobs"] = [{"name": "run", "slice": "train", "replicas": 1}]
    run = run_program_detailed(parse_config(raw), stack="dev")
    (job,) = run.of_type("kubernetes:ray.io/v1:RayJob")
    for pod in _pods(job.props["spec"]):
        assert pod["serviceAccountName"] == "ray-tpu"
        env = {e["name"]: e["value"] for e in pod["containers"][0]["env"]}
        assert (env["RAYTPU_STACK"], env["RAYTPU_SLICE"]) == ("dev", "train")
        assert env["RAYTPU_COMPILATION_CACHE_DIR"] == "gs://ray-tpu-dev-ckpt/jax-compilation-cache"
    runtime_env = yaml.safe_load(job.props["spec"]["runtimeEnvYAML"])
    assert runtime_env["env_vars"]["RAYTPU_CHECKPOINT_DIR"] == "gs://ray-tpu-dev-ckpt/run"


def test_kubernetes_rbac_binds_ray_write_to_the_pods_service_account(
    runs: dict[str, ProgramRun],
) -> None:
    (binding,) = runs["dev"].of_type("kubernetes:rbac.authorization.k8s.io/v1:RoleBinding")
    assert binding.props["subjects"][0]["name"] == "ray-tpu"


# ---------------------------------------------------------------------------- the worker image


@pytest.mark.parametrize("stack", STACKS)
def test_registry_and_default_image(runs: dict[str, ProgramRun], stack: str) -> None:
    run = runs[stack]
    (repo,) = run.of_type(REPOSITORY)
    assert (repo.props["format"], repo.props["repositoryId"]) == ("DOCKER", "ray-tpu")
    assert repo.props["location"] == "us-east5"
    (reader,) = run.of_type(REPOSITORY_MEMBER)
    assert reader.props["role"] == "roles/artifactregistry.reader"
    assert reader.props["member"] == (
        f"serviceAccount:{MOCK_PROJECT_NUMBER}-compute@developer.gserviceaccount.com"
    )
    registry = f"us-east5-docker.pkg.dev/ray-tpu-{stack}/ray-tpu"
    image = f"{registry}/ray:2.60.0-py311-{git_image_tag()}"
    assert run.outputs["imageRepository"] == registry
    assert run.outputs["workerImage"] == image
    for resource in run.resources:
        if resource.type in RAY_TYPES:
            for pod in _pods(resource.props["spec"]):
                assert {c["image"] for c in pod["containers"]} == {image}


def test_a_named_node_service_account_reads_the_registry() -> None:
    raw = _raw()
    raw["ray-tpu:cluster"]["nodeServiceAccount"] = "nodes@ray-tpu-dev.iam.gserviceaccount.com"
    run = run_program_detailed(parse_config(raw), stack="dev")
    (reader,) = run.of_type(REPOSITORY_MEMBER)
    assert reader.props["member"] == "serviceAccount:nodes@ray-tpu-dev.iam.gserviceaccount.com"


IMAGES = [
    # (id, config changes, expected image)
    ("tag", {"ray-tpu:imageTag": "abc123"}, "ray-tpu/ray:2.60.0-py311-abc123"),
    (
        "python-3.12",
        {"ray-tpu:imageTag": "abc123", "ray-tpu:pythonVersion": "3.12"},
        "ray-tpu/ray:2.60.0-py312-abc123",
    ),
    (
        "repository",
        {"ray-tpu:imageTag": "t", "ray-tpu:imageRepository": "ml"},
        "ml/ray:2.60.0-py311-t",
    ),
]


@pytest.mark.parametrize(("changes", "tail"), [c[1:] for c in IMAGES], ids=[c[0] for c in IMAGES])
def test_default_image_from_config(changes: dict[str, Any], tail: str) -> None:
    raw = {**_raw(), **changes}
    assert parse_config(raw).ray_image == f"us-east5-docker.pkg.dev/ray-tpu-dev/{tail}"


def test_image_reference_for_the_deploy_workflow() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "infra.worker_image", "dev", "--tag", "0123456789ab"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    lines = dict(line.split("=", 1) for line in done.stdout.splitlines())
    assert lines == {
        "image": "us-east5-docker.pkg.dev/ray-tpu-dev/ray-tpu/ray:2.60.0-py311-0123456789ab",
        "registry": "us-east5-docker.pkg.dev/ray-tpu-dev/ray-tpu",
        "host": "us-east5-docker.pkg.dev",
        "tag": "0123456789ab",
        "rayVersion": "2.60.0",
        "pythonTag": "py311",
    }


# ---------------------------------------------------------------------------- config errors


def _tpu7x(raw: dict[str, Any]) -> None:
    raw["ray-tpu:cluster"]["minMasterVersion"] = "1.35"
    raw["ray-tpu:slices"][1].pop("machineType", None)
    raw["ray-tpu:slices"][1].update(generation="tpu7x", topology="2x2x1")


def _edit(**items: Any) -> Any:
    def mutate(raw: dict[str, Any]) -> None:
        for path, value in items.items():
            *keys, last = path.split("/")
            target: Any = raw
            for key in keys:
                target = target[int(key) if key.isdigit() else key]
            target[last] = value

    return mutate


# (id, mutation, the error's start, a piece of its reason)
ERRORS = [
    ("bucket-name", _edit(**{"ray-tpu:storage/bucket": "My_Bucket"}), "ray-tpu:storage.bucket: 'My_Bucket' is not valid", "bucket names are global"),
    ("bucket-goog", _edit(**{"ray-tpu:storage/bucket": "googly-ckpt"}), "ray-tpu:storage.bucket: 'googly-ckpt'", "without 'goog'"),
    ("soft-delete-3-days", _edit(**{"ray-tpu:storage/softDeleteDays": 3}), "ray-tpu:storage.softDeleteDays: 3 is not valid", "0 (off) or an integer 7..90"),
    ("delete-after-0", _edit(**{"ray-tpu:storage/deleteAfterDays": 0}), "ray-tpu:storage.deleteAfterDays: 0 is not valid", "1..3650"),
    ("unknown-storage-key", _edit(**{"ray-tpu:storage/versioning": True}), "ray-tpu:storage.versioning: 'versioning' is not valid", "unknown key"),
    ("service-account", _edit(**{"ray-tpu:storage/serviceAccount": "Ray"}), "ray-tpu:storage.serviceAccount: 'Ray' is not valid", "Kubernetes ServiceAccount"),
    ("python-3.10", _edit(**{"ray-tpu:pythonVersion": "3.10"}), "ray-tpu:pythonVersion: '3.10' is not valid", "3.11, 3.12"),
    ("image-tag", _edit(**{"ray-tpu:imageTag": "a b"}), "ray-tpu:imageTag: 'a b' is not valid", "git commit"),
    ("scale-to-zero-pinned", _edit(**{"ray-tpu:rayClusters/0/minReplicas": 1, "ray-tpu:rayClusters/0/replicas": 1}), "ray-tpu:rayClusters[0].minReplicas: 1 is not valid; valid: 0", "the pool never reaches zero"),
    ("tpu7x-python-3.11", _tpu7x, "ray-tpu:pythonVersion: '3.11' is not valid", "jax[tpu] >= 0.8.2 on Python 3.12 (ray-project/ray#62402)"),
    ("tpu7x-stock-image", lambda r: (_tpu7x(r), r.update({"ray-tpu:rayImage": "rayproject/ray:2.60.0-py311"})), "ray-tpu:rayImage: 'rayproject/ray:2.60.0-py311' is not valid", "--build-arg PYTHON_TAG=py312"),
    ("tpu7x-object-image", lambda r: (_tpu7x(r), r["ray-tpu:rayServices"][0].update(image="x/ray:2.60.0-py311"), r.update({"ray-tpu:pythonVersion": "3.12"})), "ray-tpu:rayServices[0].image: 'x/ray:2.60.0-py311' is not valid", "Python 3.12"),
    ("checkpoint-run", _edit(**{"ray-tpu:rayServices/0/checkpointRun": "a/b"}), "ray-tpu:rayServices[0].checkpointRun: 'a/b' is not valid", ""),
    ("target-ongoing", _edit(**{"ray-tpu:rayServices/0/targetOngoingRequests": 0}), "ray-tpu:rayServices[0].targetOngoingRequests: 0 is not valid", "max_ongoing_requests"),
    ("upgrade-strategy", _edit(**{"ray-tpu:rayServices/0/upgradeStrategy": "BlueGreen"}), "ray-tpu:rayServices[0].upgradeStrategy: 'BlueGreen' is not valid; valid: None, NewCluster", "a second set of slices"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("mutate", "start", "reason"), [e[1:] for e in ERRORS], ids=[e[0] for e in ERRORS]
)
def test_config_errors(mutate: Any, start: str, reason: str) -> None:
    raw = _raw()
    mutate(raw)
    with pytest.raises(ConfigError) as caught:
        parse_config(raw)
    matching = [e for e in caught.value.errors if e.startswith(start)]
    assert matching, caught.value.errors
    assert reason in matching[0]


ACCEPTED = [
    ("no-storage-section", lambda r: r.pop("ray-tpu:storage")),
    ("tpu7x-on-3.12", lambda r: (_tpu7x(r), r.update({"ray-tpu:pythonVersion": "3.12"}))),
    ("tpu7x-unknown-python", lambda r: (_tpu7x(r), r.update({"ray-tpu:rayImage": "x/ray:2.60.0"}))),
    ("rayjob-on-scale-to-zero", lambda r: r.update({"ray-tpu:rayJobs": [{"name": "j", "slice": "train", "replicas": 1, "minReplicas": 1}]})),
]  # fmt: skip


@pytest.mark.parametrize("mutate", [a[1] for a in ACCEPTED], ids=[a[0] for a in ACCEPTED])
def test_config_accepted(mutate: Any) -> None:
    raw = _raw()
    raw["ray-tpu:slices"][0]["count"] = 2
    mutate(raw)
    config = parse_config(raw)
    assert config.storage is not None


def test_storage_defaults_without_the_section() -> None:
    raw = _raw()
    raw.pop("ray-tpu:storage")
    raw["gcp:project"] = "my-project"
    storage = parse_config(raw).storage
    assert storage is not None
    assert (storage.bucket, storage.delete_after_days, storage.soft_delete_days) == (
        "my-project-ray-tpu-dev-ckpt",
        30,
        7,
    )
    assert (storage.force_destroy, storage.service_account) == (False, "ray-tpu")


# ---------------------------------------------------------------------------- Serve autoscaling


def _serve(min_replicas: int, replicas: int, max_replicas: int, **extra: Any) -> dict[str, Any]:
    raw = _raw()
    raw["ray-tpu:slices"][1]["count"] = 3
    raw["ray-tpu:rayServices"][0].update(
        minReplicas=min_replicas, replicas=replicas, maxReplicas=max_replicas, **extra
    )
    stack = parse_config(raw)
    return yaml.safe_load(kuberay.serve_config_v2(stack, stack.ray_services[0]))


SERVE = [
    # (id, (min, replicas, max), extra service keys, expected TextGenerator entry)
    ("fixed", (1, 1, 1), {}, {"name": "TextGenerator", "num_replicas": 1}),
    ("fixed-3", (3, 3, 3), {}, {"name": "TextGenerator", "num_replicas": 3}),
    (
        "autoscaled",
        (1, 1, 3),
        {},
        {
            "name": "TextGenerator",
            "num_replicas": "auto",
            "autoscaling_config": {
                "min_replicas": 1,
                "initial_replicas": 1,
                "max_replicas": 3,
                "target_ongoing_requests": 8.0,
            },
        },
    ),
    (
        "autoscaled-from-zero",
        (0, 1, 2),
        {"targetOngoingRequests": 4},
        {
            "name": "TextGenerator",
            "num_replicas": "auto",
            "autoscaling_config": {
                "min_replicas": 0,
                "initial_replicas": 1,
                "max_replicas": 2,
                "target_ongoing_requests": 4.0,
            },
        },
    ),
]


@pytest.mark.parametrize(
    ("bounds", "extra", "expected"), [s[1:] for s in SERVE], ids=[s[0] for s in SERVE]
)
def test_serve_deployment_follows_the_replica_bounds(
    bounds: tuple[int, int, int], extra: dict[str, Any], expected: dict[str, Any]
) -> None:
    from ray.serve.schema import ServeDeploySchema

    config = _serve(*bounds, **extra)
    (app,) = config["applications"]
    assert app["deployments"] == [expected]
    parsed = ServeDeploySchema(**config)  # what KubeRay hands to Serve
    (deployment,) = parsed.applications[0].deployments
    assert deployment.name == entrypoints.SERVE_DEPLOYMENT


def test_the_deployment_name_is_workloads_serve_s() -> None:
    from workloads.serving.replica import TextGenerator

    assert TextGenerator.name == entrypoints.SERVE_DEPLOYMENT


def test_other_apps_get_no_deployment_override() -> None:
    config = _serve(1, 1, 2, importPath="my_app.serve:app", checkpointRun="exp2")
    (app,) = config["applications"]
    assert "deployments" not in app
    assert app["runtime_env"]["env_vars"]["RAYTPU_CHECKPOINT_DIR"] == "gs://ray-tpu-dev-ckpt/exp2"


def test_the_stack_s_env_vars_win() -> None:
    env = {"env_vars": {"RAYTPU_CHECKPOINT_DIR": "gs://elsewhere/x"}}
    (app,) = _serve(1, 1, 1, runtimeEnv=env)["applications"]
    assert app["runtime_env"]["env_vars"]["RAYTPU_CHECKPOINT_DIR"] == "gs://elsewhere/x"


# ---------------------------------------------------------------------------- submit


def _outputs(runs: dict[str, ProgramRun], stack: str, drop: str = "") -> Any:
    raw = {k: v for k, v in runs[stack].outputs.items() if k != drop}
    return parse_outputs(raw, stack)


SUBMITS = [
    # (id, job argv, --run, --env, expected RAYTPU_CHECKPOINT_DIR or None)
    ("default-run", ["train"], None, {}, "gs://ray-tpu-dev-ckpt/train"),
    ("named-run", ["train"], "exp2", {}, "gs://ray-tpu-dev-ckpt/exp2"),
    ("explicit-dir", ["train", "--checkpoint-dir", "gs://x/y"], None, {}, None),
    ("env-wins", ["train"], None, {"RAYTPU_CHECKPOINT_DIR": "gs://z"}, "gs://z"),
    ("not-for-commands", ["python", "x.py"], None, {}, None),
]


@pytest.mark.parametrize(
    ("job", "run", "env", "expected"), [s[1:] for s in SUBMITS], ids=[s[0] for s in SUBMITS]
)
def test_submit_train_defaults_to_the_bucket(
    runs: dict[str, ProgramRun],
    tmp_path: Path,
    job: list[str],
    run: str | None,
    env: dict[str, str],
    expected: str | None,
) -> None:
    outputs = _outputs(runs, "dev")
    assert outputs.checkpoint_bucket == "ray-tpu-dev-ckpt"
    head = outputs.ray_cluster("train")
    request = jobs.build_request(job, outputs, head, tmp_path, env=env, run=run)
    assert request.runtime_env["env_vars"].get("RAYTPU_CHECKPOINT_DIR") == expected


def test_outputs_without_a_bucket_still_parse(runs: dict[str, ProgramRun], tmp_path: Path) -> None:
    outputs = _outputs(runs, "dev", drop="checkpointBucket")
    assert outputs.checkpoint_bucket is None
    request = jobs.build_request(["train"], outputs, outputs.ray_cluster("train"), tmp_path)
    assert "RAYTPU_CHECKPOINT_DIR" not in request.runtime_env["env_vars"]
