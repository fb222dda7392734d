"""Stack outputs as ``raytpu submit`` reads them: good, missing and malformed; head choice."""

from __future__ import annotations

import copy
import json
import stat
from pathlib import Path
from typing import Any

import pytest

from raytpu import entrypoints
from raytpu.stack_outputs import (
    StackNotDeployedError,
    StackOutputsError,
    fetch_outputs,
    parse_outputs,
    read_outputs_file,
)
from raytpu_cli import jobs
from raytpu_cli import main as cli


@pytest.fixture
def good() -> dict[str, Any]:
    return {
        "clusterName": "raytpu-prod",
        "clusterEndpoint": "10.0.0.2",
        "kubeconfig": "[secret]",
        "slices": {
            "train-a": {
                "generation": "v6e",
                "topology": "4x4",
                "machineType": "ct6e-standard-4t",
                "chipsPerHost": 4,
                "hosts": 4,
                "chips": 16,
                "count": 2,
                "nodePools": ["train-a-0", "train-a-1"],
            },
            "big": {
                "generation": "v5p",
                "topology": "2x2x4",
                "machineType": "ct5p-hightpu-4t",
                "chipsPerHost": 4.0,  # numbers as floats, as Pulumi mocks hand them back
                "hosts": 4.0,
                "chips": 16.0,
                "count": 1.0,
                "nodePools": ["big-0"],
            },
            "serve": {"generation": "v6e", "topology": "2x2", "machineType": "ct6e-standard-4t"},
        },
        "rayClusters": {
            "train": {
                "namespace": "ray",
                "slice": "train-a",
                "headService": "train-head-svc",
                "dashboardPort": 8265,
            },
            "big": {"namespace": "research", "slice": "big", "headService": "big-head-svc"},
        },
        "rayServices": {
            "serve": {
                "namespace": "ray",
                "slice": "serve",
                "headService": "serve-head-svc",
                "serveService": "serve-serve-svc",
                "dashboardPort": 8265,
            }
        },
    }


def test_good_outputs_parse_into_catalog_shapes(good: dict[str, Any]) -> None:
    outputs = parse_outputs(good, "prod")
    assert outputs.cluster_name == "raytpu-prod"
    assert outputs.slice("train-a").shape.pod_type == "v6e-16"
    assert (outputs.slice("train-a").hosts, outputs.slice("train-a").count) == (4, 2)
    assert outputs.slice("big").shape.pod_type == "v5p-32"
    assert outputs.slice("big").count == 1
    assert outputs.slice("serve").count == 1
    big = outputs.ray_cluster("big")
    assert (big.namespace, big.dashboard_port) == ("research", 8265)
    assert (
        big.port_forward_command() == "kubectl port-forward svc/big-head-svc 8265:8265 -n research"
    )
    service = outputs.ray_service("serve")
    assert service.serve_port_forward_command() == (
        "kubectl port-forward svc/serve-serve-svc 8000:8000 -n ray"
    )


def _without(raw: dict[str, Any], *path: str) -> dict[str, Any]:
    raw = copy.deepcopy(raw)
    node = raw
    for key in path[:-1]:
        node = node[key]
    del node[path[-1]]
    return raw


def _with(raw: dict[str, Any], value: Any, *path: str) -> dict[str, Any]:
    raw = copy.deepcopy(raw)
    node = raw
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return raw


BAD = [
    ("no-slices", lambda g: _without(g, "slices"), "outputs.slices: is required"),
    ("no-ray-clusters", lambda g: _without(g, "rayClusters"), "outputs.rayClusters: is required"),
    ("no-cluster-name", lambda g: _without(g, "clusterName"), "outputs.clusterName: is required"),
    (
        "slices-not-object",
        lambda g: _with(g, ["train-a"], "slices"),
        "outputs.slices: ['train-a'] is not valid; valid: a JSON object",
    ),
    (
        "bad-topology",
        lambda g: _with(g, "4x5", "slices", "train-a", "topology"),
        "outputs.slices.train-a.topology: '4x5' is not valid",
    ),
    (
        "hosts-disagree-with-catalog",
        lambda g: _with(g, 2, "slices", "train-a", "hosts"),
        "outputs.slices.train-a.hosts: 2 is not valid; valid: 4",
    ),
    (
        "missing-machine-type",
        lambda g: _without(g, "slices", "train-a", "machineType"),
        "outputs.slices.train-a.machineType: is required",
    ),
    (
        "fractional-count",
        lambda g: _with(g, 1.5, "slices", "train-a", "count"),
        "outputs.slices.train-a.count: 1.5 is not valid; valid: an integer >= 0",
    ),
    (
        "cluster-on-unknown-slice",
        lambda g: _with(g, "nope", "rayClusters", "train", "slice"),
        "outputs.rayClusters.train.slice: 'nope' is not valid; valid: big, serve, train-a",
    ),
    (
        "cluster-without-head-service",
        lambda g: _without(g, "rayClusters", "train", "headService"),
        "outputs.rayClusters.train.headService: is required",
    ),
    (
        "port-is-text",
        lambda g: _with(g, "8265", "rayClusters", "train", "dashboardPort"),
        "outputs.rayClusters.train.dashboardPort: '8265' is not valid",
    ),
    (
        "service-without-serve-service",
        lambda g: _without(g, "rayServices", "serve", "serveService"),
        "outputs.rayServices.serve.serveService: is required",
    ),
    ("not-an-object", lambda g: [g], "outputs: 'list' is not valid; valid: a JSON object"),
]


@pytest.mark.parametrize(("mutate", "message"), [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_malformed_outputs_name_the_key(good: dict[str, Any], mutate: Any, message: str) -> None:
    with pytest.raises(StackOutputsError) as error:
        parse_outputs(mutate(good), "prod")
    assert message in str(error.value)


def test_empty_outputs_mean_not_deployed() -> None:
    with pytest.raises(StackNotDeployedError, match=r"Run `pulumi up --stack dev` first"):
        parse_outputs({}, "dev")


LOOKUPS = [
    ("slice", lambda o: o.slice("gpu"), "slice: 'gpu' is not in stack 'prod'; valid: big, serve, train-a"),
    ("cluster", lambda o: o.ray_cluster("x"), "cluster: 'x' is not a RayCluster of stack 'prod'; valid: big, train"),
    ("service", lambda o: o.ray_service("x"), "service: 'x' is not a RayService of stack 'prod'; valid: serve"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("lookup", "message"), [x[1:] for x in LOOKUPS], ids=[x[0] for x in LOOKUPS]
)
def test_unknown_names_list_the_valid_ones(good: dict[str, Any], lookup: Any, message: str) -> None:
    with pytest.raises(StackOutputsError) as error:
        lookup(parse_outputs(good, "prod"))
    assert str(error.value) == message


CHOICES = [
    ("by-cluster", {"workload": "train", "cluster": "big"}, "big"),
    ("by-slice", {"workload": "train", "slice_name": "big"}, "big"),
    ("named-like-workload", {"workload": "train"}, "train"),
]


@pytest.mark.parametrize(
    ("kwargs", "expected"), [c[1:] for c in CHOICES], ids=[c[0] for c in CHOICES]
)
def test_choose_head(good: dict[str, Any], kwargs: dict[str, Any], expected: str) -> None:
    assert jobs.choose_head(parse_outputs(good, "prod"), **kwargs).name == expected


CHOICE_ERRORS = [
    ("ambiguous", {"workload": "command"}, "several RayClusters; name one with --cluster; valid: big, train"),
    ("slice-without-cluster", {"workload": "train", "slice_name": "serve"}, "slice: 'serve' has no RayCluster in stack 'prod'; valid: big, train-a"),
    ("unknown-slice", {"workload": "train", "slice_name": "gpu"}, "slice: 'gpu' is not in stack 'prod'"),
    ("cluster-slice-mismatch", {"workload": "train", "cluster": "big", "slice_name": "train-a"}, "valid: big"),
    ("unknown-cluster", {"workload": "train", "cluster": "nope"}, "valid: big, train"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("kwargs", "message"), [c[1:] for c in CHOICE_ERRORS], ids=[c[0] for c in CHOICE_ERRORS]
)
def test_choose_head_errors(good: dict[str, Any], kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(StackOutputsError) as error:
        jobs.choose_head(parse_outputs(good, "prod"), **kwargs)
    assert message in str(error.value)


HEADS = [
    ("first-raycluster", None, ("RayCluster", "train")),
    ("a-raycluster", "big", ("RayCluster", "big")),
    ("a-rayservice", "serve", ("RayService", "serve")),
]


@pytest.mark.parametrize(("name", "expected"), [h[1:] for h in HEADS], ids=[h[0] for h in HEADS])
def test_head_opened_by_dashboard_and_status(
    good: dict[str, Any], name: str | None, expected: tuple[str, str]
) -> None:
    head = parse_outputs(good, "prod").head(name)
    assert (head.kind, head.name) == expected


def test_head_lists_every_head_when_unknown(good: dict[str, Any]) -> None:
    with pytest.raises(StackOutputsError) as error:
        parse_outputs(good, "prod").head("nope")
    assert str(error.value) == "--cluster: 'nope' is not valid; valid: big, serve, train"


def test_services_only_stack_opens_its_rayservice(good: dict[str, Any]) -> None:
    good["rayClusters"] = {}
    assert parse_outputs(good, "prod").head().name == "serve"


def test_serve_points_at_the_rayservice(
    good: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "outputs.json"
    path.write_text(json.dumps(good))
    code = cli.main(["submit", "--stack", "prod", "--outputs", str(path), "serve"])
    out = capsys.readouterr().out
    assert code == 0
    assert "kubectl port-forward svc/serve-serve-svc 8000:8000 -n ray" in out
    assert "pulumi up --stack prod" in out


FILES = [
    ("missing-file", None, "does not exist; save it with `pulumi stack output --json --stack dev"),
    ("not-json", "{not json", "line 1, column 2: not valid JSON"),
    ("empty-object", "{}", "Run `pulumi up --stack dev` first"),
]


@pytest.mark.parametrize(("text", "message"), [f[1:] for f in FILES], ids=[f[0] for f in FILES])
def test_outputs_file_errors(tmp_path: Path, text: str | None, message: str) -> None:
    path = tmp_path / "outputs.json"
    if text is not None:
        path.write_text(text)
    with pytest.raises(StackOutputsError) as error:
        read_outputs_file(path, "dev")
    assert message in str(error.value)


def _fake_pulumi(tmp_path: Path, script: str) -> str:
    """A stand-in ``pulumi`` executable for the subprocess path (no Pulumi CLI here)."""
    path = tmp_path / "pulumi"
    path.write_text("#!/bin/sh\n" + script)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


PULUMI = [
    ("stack-missing", "echo \"error: no stack named 'qa' found\" >&2; exit 255", StackNotDeployedError, "Run `pulumi up --stack qa` first"),
    ("never-deployed", "echo '{}'", StackNotDeployedError, "Run `pulumi up --stack qa` first"),
    ("backend-error", "echo 'error: PULUMI_ACCESS_TOKEN must be set' >&2; exit 1", StackOutputsError, "failed (exit 1): error: PULUMI_ACCESS_TOKEN must be set"),
    ("hangs", "sleep 30", StackOutputsError, "did not answer within 1 s"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("script", "error_type", "message"), [p[1:] for p in PULUMI], ids=[p[0] for p in PULUMI]
)
def test_pulumi_subprocess_errors(
    tmp_path: Path, script: str, error_type: type[Exception], message: str
) -> None:
    with pytest.raises(error_type) as error:
        fetch_outputs("qa", pulumi=_fake_pulumi(tmp_path, script), timeout_s=1)
    assert message in str(error.value)


def test_pulumi_subprocess_good(tmp_path: Path, good: dict[str, Any]) -> None:
    (tmp_path / "out.json").write_text(json.dumps(good))
    pulumi = _fake_pulumi(
        tmp_path,
        f'[ "$*" = "stack output --json --stack prod" ] || exit 3\ncat {tmp_path / "out.json"}\n',
    )
    assert set(fetch_outputs("prod", pulumi=pulumi).ray_clusters) == {"big", "train"}


def test_pulumi_not_installed() -> None:
    with pytest.raises(
        StackOutputsError, match="is not on PATH; install the Pulumi CLI, or pass --outputs"
    ):
        fetch_outputs("dev", pulumi="/nonexistent/pulumi")


def test_train_entrypoint_is_sized_from_the_catalog(good: dict[str, Any], tmp_path: Path) -> None:
    outputs = parse_outputs(good, "prod")
    request = jobs.build_request(
        ["train", "--steps", "5"], outputs, outputs.ray_cluster("train"), tmp_path
    )
    assert request.entrypoint.startswith("python -m raytpu_cli train")
    assert "--topology 4x4" in request.entrypoint
    assert "--machine-type ct6e-standard-4t" in request.entrypoint
    assert "--num-slices 2" in request.entrypoint
    assert request.entrypoint.endswith("--steps 5")
    assert request.runtime_env["env_vars"]["RAYTPU_ACCELERATOR_TYPE"] == "TPU-V6E"
    assert "pip" not in request.runtime_env


def test_train_uses_the_cluster_replicas_when_the_stack_exports_them(
    good: dict[str, Any], tmp_path: Path
) -> None:
    good["rayClusters"]["train"]["replicas"] = 1.0  # one of the two train-a slices
    outputs = parse_outputs(good, "prod")
    head = outputs.ray_cluster("train")
    request = jobs.build_request(["train"], outputs, head, tmp_path)
    assert head.replicas == 1
    assert "--num-slices 1" in request.entrypoint


def test_pip_runtime_env_pins_jax_tpu_and_leaves_out_ray_and_pulumi() -> None:
    packages = entrypoints.worker_requirements()
    assert any(p.startswith("jax[tpu]") for p in packages)
    assert not any(p.startswith(("ray", "pulumi")) for p in packages)
    assert all(any(op in p for op in ("==", ">=", "<")) for p in packages), packages


CLI_ERRORS = [
    ("no-job", [], "job: is required; valid: train [ARGS], serve [ARGS], or -- COMMAND [ARGS]"),
    ("bad-env", ["--env", "NOEQUALS", "train"], "--env: 'NOEQUALS' is not valid; valid: KEY=VALUE"),
    ("unknown-slice", ["--slice", "gpu", "train"], "slice: 'gpu' is not in stack 'prod'; valid: big, serve, train-a"),
    ("unknown-cluster", ["--cluster", "nope", "train"], "cluster: 'nope' is not a RayCluster of stack 'prod'; valid: big, train"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("argv", "message"), [c[1:] for c in CLI_ERRORS], ids=[c[0] for c in CLI_ERRORS]
)
def test_bad_input_exits_2_before_contacting_anything(
    good: dict[str, Any],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    message: str,
) -> None:
    path = tmp_path / "outputs.json"
    path.write_text(json.dumps(good))
    # The address is a closed port: reaching it would be a different error (exit 1).
    base = ["submit", "--stack", "prod", "--outputs", str(path), "--address", "http://127.0.0.1:9"]
    assert cli.main([*base, *argv]) == 2
    assert message in capsys.readouterr().err


def test_env_and_serve_variables(good: dict[str, Any], tmp_path: Path) -> None:
    outputs = parse_outputs(good, "prod")
    request = jobs.build_request(
        ["serve"],
        outputs,
        outputs.ray_cluster("big"),
        tmp_path,
        env={"RAYTPU_CHECKPOINT_DIR": "gs://b/ckpt", "RAYTPU_SLICE": "override"},
    )
    assert request.entrypoint == "serve run --non-blocking workloads.serve:app"
    env = request.runtime_env["env_vars"]
    assert env["RAYTPU_SERVE_TPU_PER_REPLICA"] == "4"
    assert env["RAYTPU_CHECKPOINT_DIR"] == "gs://b/ckpt"
    assert env["RAYTPU_SLICE"] == "override"


@pytest.mark.parametrize(
    ("job", "raw", "workload", "entrypoint"),
    [
        (["train", "--steps", "3"], False, "train", "python -m raytpu_cli train --generation v6e"),
        (["serve"], False, "serve", "serve run --non-blocking workloads.serve:app"),
        (
            ["serve", "start", "--http-port", "8001"],
            True,
            "command",
            "serve start --http-port 8001",
        ),
        (["train.sh", "a b"], False, "command", "train.sh 'a b'"),
    ],
    ids=["train", "serve", "after-dashdash-is-a-command", "other-command-quoted"],
)
def test_job_words_become_the_entrypoint(
    good: dict[str, Any], tmp_path: Path, job: list[str], raw: bool, workload: str, entrypoint: str
) -> None:
    outputs = parse_outputs(good, "prod")
    request = jobs.build_request(job, outputs, outputs.ray_cluster("train"), tmp_path, raw=raw)
    assert request.workload == workload
    assert request.entrypoint.startswith(entrypoint)
