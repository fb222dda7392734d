"""The training run as a KubeRay RayJob from the stack: config, spec, CRD schema, program."""

from __future__ import annotations

import copy
import re
import shlex
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from infra.config.schema import ConfigError
from infra.config.stack import parse_config
from infra.manifests import kuberay
from infra.manifests import rayjob as rayjob_spec
from infra.offline import run_program
from raytpu import crds
from raytpu.stack_outputs import parse_outputs

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def rayjob_crd() -> Callable[[dict[str, Any]], list[str]]:
    """Validator of RayJob specs against the KubeRay CRD; skips, saying so, when it is absent."""
    try:
        crds.validate_spec("RayJob", {})
    except crds.CrdsMissingError as missing:
        pytest.skip(f"KubeRay CRDs absent, RayJob CRD validation NOT run: {missing}")
    return lambda spec: crds.validate_spec("RayJob", spec)


@pytest.fixture
def dev_raw() -> dict[str, Any]:
    """The dev stack's config with a RayJob on a second ``train`` slice (count 1 -> 2)."""
    raw = yaml.safe_load((REPO / "Pulumi.dev.yaml").read_text())["config"]
    raw = copy.deepcopy(raw)
    for item in raw["ray-tpu:slices"]:
        if item["name"] == "train":
            item["count"] = 2
    raw["ray-tpu:rayJobs"] = [
        {
            "name": "train-run",
            "slice": "train",
            "replicas": 1,
            "args": ["--steps", "200"],
            "runtimeEnv": {"env_vars": {"XLA_FLAGS": "--xla_dump_to=/tmp/xla"}},
            "ttlSecondsAfterFinished": 120,
            "activeDeadlineSeconds": 7200,
        }
    ]
    return raw


def test_ray_job_spec_validates_against_the_crd(
    dev_raw: dict[str, Any], rayjob_crd: Callable[[dict[str, Any]], list[str]]
) -> None:
    stack = parse_config(dev_raw)
    (job,) = stack.ray_jobs
    obj = rayjob_spec.ray_job_object(stack, job, stack_name="dev")
    assert (obj["apiVersion"], obj["kind"]) == ("ray.io/v1", "RayJob")
    assert rayjob_crd(obj["spec"]) == []
    broken = copy.deepcopy(obj["spec"])
    broken["shutdownAfterJobFinishes"] = "yes"
    broken["rayClusterSpec"]["workerGroupSpecs"][0]["numOfHosts"] = "2"
    assert len(rayjob_crd(broken)) == 2  # the schema check can fail


def test_ray_job_spec_fields(dev_raw: dict[str, Any]) -> None:
    stack = parse_config(dev_raw)
    (job,) = stack.ray_jobs
    spec = rayjob_spec.ray_job_spec(stack, job, stack_name="dev")
    assert spec["submissionMode"] == "K8sJobMode"
    assert spec["shutdownAfterJobFinishes"] is True
    assert spec["ttlSecondsAfterFinished"] == 120
    assert spec["activeDeadlineSeconds"] == 7200
    # The RayJob's cluster is the same spec a RayCluster on that slice gets, from the catalog.
    assert spec["rayClusterSpec"] == kuberay.ray_cluster_spec(
        stack, job.cluster, "RayJob", stack_name="dev"
    )
    (group,) = spec["rayClusterSpec"]["workerGroupSpecs"]
    assert (group["numOfHosts"], group["replicas"]) == (2, 1)  # v6e 2x4 on 4-chip hosts
    limits = group["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert limits["google.com/tpu"] == "4"
    argv = shlex.split(spec["entrypoint"])
    assert argv[:4] == ["python", "-m", "raytpu_cli", "train"]
    assert argv[argv.index("--topology") + 1] == "2x4"
    assert argv[argv.index("--machine-type") + 1] == "ct6e-standard-4t"
    assert argv[argv.index("--num-slices") + 1] == "1"
    assert argv[-2:] == ["--steps", "200"]
    env = yaml.safe_load(spec["runtimeEnvYAML"])
    assert env["env_vars"]["RAYTPU_TOPOLOGY"] == "2x4"
    assert env["env_vars"]["RAYTPU_CHIPS_PER_HOST"] == "4"
    assert env["env_vars"]["XLA_FLAGS"] == "--xla_dump_to=/tmp/xla"
    # Training run <job name> keeps its checkpoints in the stack's bucket.
    assert env["env_vars"]["RAYTPU_CHECKPOINT_DIR"] == f"gs://ray-tpu-dev-ckpt/{job.name}"


def test_an_explicit_entrypoint_is_kept(
    dev_raw: dict[str, Any], rayjob_crd: Callable[[dict[str, Any]], list[str]]
) -> None:
    job = dev_raw["ray-tpu:rayJobs"][0]
    del job["args"]
    job["entrypoint"] = "python -m raytpu_cli catalog v6e 2x4 --machine-type ct6e-standard-4t"
    stack = parse_config(dev_raw)
    spec = rayjob_spec.ray_job_spec(stack, stack.ray_jobs[0])
    assert spec["entrypoint"] == job["entrypoint"]
    assert rayjob_crd(spec) == []


BAD_JOBS = [
    ("entrypoint-and-args", {"entrypoint": "python x.py"}, "ray-tpu:rayJobs[0].args: ['--steps', '200'] is not valid; valid: [] when entrypoint is set"),
    ("negative-ttl", {"ttlSecondsAfterFinished": -1}, "ray-tpu:rayJobs[0].ttlSecondsAfterFinished: -1 is not valid; valid: an integer >= 0"),
    ("unknown-key", {"shutdown": False}, "ray-tpu:rayJobs[0].shutdown: 'shutdown' is not valid"),
    ("unknown-slice", {"slice": "gpu"}, "ray-tpu:rayJobs[0].slice: 'gpu' is not valid; valid: train, serve"),
    ("args-not-strings", {"args": ["--steps", 200]}, "ray-tpu:rayJobs[0].args: ['--steps', 200] is not valid"),
    ("too-many-replicas", {"replicas": 3}, "ray-tpu:rayJobs[0].replicas: 3 is not valid; valid: an integer 0..2"),
    ("name-clash", {"name": "train"}, "ray-tpu:rayJobs[0].name: 'train' is not valid"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("change", "message"), [b[1:] for b in BAD_JOBS], ids=[b[0] for b in BAD_JOBS]
)
def test_bad_ray_job_config_is_a_clear_error(
    dev_raw: dict[str, Any], change: dict[str, Any], message: str
) -> None:
    dev_raw["ray-tpu:rayJobs"][0].update(change)
    with pytest.raises(ConfigError) as error:
        parse_config(dev_raw)
    assert message in str(error.value)


def test_a_ray_job_needs_a_free_slice(dev_raw: dict[str, Any]) -> None:
    """The RayCluster ``train`` holds the one dev slice: a RayJob there could never start."""
    for item in dev_raw["ray-tpu:slices"]:
        if item["name"] == "train":
            item["count"] = 1
    with pytest.raises(ConfigError) as error:
        parse_config(dev_raw)
    assert "ray-tpu:slices[0].count: 1 is not valid; valid: an integer >= 2" in str(error.value)


def test_stacks_without_ray_jobs_still_parse(dev_raw: dict[str, Any]) -> None:
    del dev_raw["ray-tpu:rayJobs"]
    assert parse_config(dev_raw).ray_jobs == ()


@pytest.mark.timeout(120)
def test_the_program_declares_the_ray_job_and_its_outputs_feed_submit(
    dev_raw: dict[str, Any],
) -> None:
    resources, outputs = run_program(parse_config(dev_raw), stack="dev")
    (job,) = [r for r in resources if r.type == "kubernetes:ray.io/v1:RayJob"]
    run = job.props["metadata"]["name"]
    assert re.fullmatch(r"train-run-[0-9a-f]{6}", run), run  # a digest of what it runs
    assert job.props["spec"]["submissionMode"] == "K8sJobMode"
    # A running job is never patched nor deleted by a later deploy (tests/test_infra_deploys.py).
    assert (job.ignore_changes, job.retain_on_delete) == (("spec",), True)
    assert outputs["rayJobs"]["train-run"]["slice"] == "train"
    assert outputs["rayJobs"]["train-run"]["run"] == run
    # The stack outputs the program exports are exactly what `raytpu submit` reads.
    parsed = parse_outputs(outputs, "dev")
    assert parsed.ray_cluster("train").port_forward_command() == (
        "kubectl port-forward svc/train-head-svc 8265:8265 -n ray"
    )
    assert parsed.slice("train").count == 2
    assert parsed.ray_service("serve").serve_service == "serve-serve-svc"


@pytest.mark.timeout(120)
def test_the_declared_ray_job_validates_as_the_engine_sends_it(
    dev_raw: dict[str, Any], rayjob_crd: Callable[[dict[str, Any]], list[str]]
) -> None:
    resources, _ = run_program(parse_config(dev_raw), stack="dev")
    (job,) = [r for r in resources if r.type == "kubernetes:ray.io/v1:RayJob"]
    assert rayjob_crd(_ints(job.props["spec"])) == []


def _ints(value: Any) -> Any:
    """The engine hands numbers back as floats; the API server would receive integers."""
    if isinstance(value, dict):
        return {k: _ints(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_ints(v) for v in value]
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value
