"""``raytpu doctor`` against recorded Kubernetes API answers (tests/data/doctor/<scenario>): each
fault turns its rows red with a message that says what to do; the healthy cluster is all green.

The recordings are the dev stack's cluster deployed with ray-tpu:imageTag
:data:`tools.doctor_recordings.TAG` (``tools/doctor_recordings.py`` rebuilds them); what the
stack declares comes from the program under mocks, never from a copy in this file."""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import stat
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from raytpu_cli import doctor
from raytpu_cli.doctor_checks import (
    CHECK_AUTH,
    CHECK_IMAGES,
    CHECK_READY,
    CHECK_SLICES,
    CHECK_VERSION,
    CHECK_WEBHOOK,
    ClusterState,
    DeclaredRay,
    check_version,
    declared_objects,
    labels,
)
from raytpu_cli.doctor_slices import slice_problems
from tools.doctor_recordings import TAG

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "tests" / "data" / "doctor"
ALL_CHECKS = {CHECK_VERSION, CHECK_WEBHOOK, CHECK_READY, CHECK_SLICES, CHECK_AUTH, CHECK_IMAGES}

# scenario -> (the rows it turns red, fragments each red row's message must hold)
SCENARIOS: dict[str, dict[str, tuple[str, ...]]] = {
    "healthy": {},
    "duplicate-worker-ids": {
        CHECK_SLICES: ("TPU_WORKER_ID are [0, 0]", "duplicate worker ID", "kubectl delete pod"),
    },
    # An old KubeRay drops authOptions: the CRD lacks the field and Ray really runs open.
    "old-kuberay": {
        CHECK_VERSION: ("lacks spec.authOptions (KubeRay >= v1.5.1)", "Upgrade the cluster"),
        CHECK_AUTH: ("runs without authentication", "KubeRay version row"),
    },
    "stale-image": {
        CHECK_IMAGES: (f"-{TAG}", "does not replace", "kubectl delete pod -n ray -l"),
    },
    # Pods made while the webhook was missing carry none of its variables.
    "missing-webhook": {
        CHECK_WEBHOOK: ("no mutating webhook", "Ray Operator add-on"),
        CHECK_SLICES: ("no TPU_WORKER_ID (created without the TPU webhook)", "ray.io/group="),
    },
}


@pytest.fixture(scope="module")
def declared() -> tuple[DeclaredRay, ...]:
    """The dev stack's Ray objects, deployed with the recordings' image tag."""
    from infra import offline
    from infra.config.stack import load_stack

    resources, _ = offline.run_program(load_stack("dev", image_tag=TAG), stack="dev")
    return declared_objects(resources)


def _state(scenario: str, declared: tuple[DeclaredRay, ...]) -> ClusterState:
    namespaces = sorted({d.namespace for d in declared})
    return doctor.collect(doctor.RecordedReader(DATA / scenario), namespaces)


def test_the_recordings_hold_what_the_dev_stack_declares(
    declared: tuple[DeclaredRay, ...],
) -> None:
    state = _state("healthy", declared)
    live = {
        (kind, o["metadata"]["namespace"], o["metadata"]["name"])
        for kind, objects in state.ray_objects.items()
        for o in objects
    }
    assert live == {(d.kind, d.namespace, d.name) for d in declared}
    images = {image for d in declared for g in d.groups for _, image in g.images}
    running = {c["image"] for pod in state.pods for c in pod["spec"]["containers"]}
    assert running == images and all(i.endswith(f"-{TAG}") for i in images)
    assert {f"{path.stem}" for path in (DATA / "healthy").glob("*.json")} == set(
        doctor.RECORDED_FILES
    )


@pytest.mark.parametrize("scenario", list(SCENARIOS), ids=list(SCENARIOS))
def test_each_scenario_turns_its_rows_red(scenario: str, declared: tuple[DeclaredRay, ...]) -> None:
    rows = doctor.run_checks(declared, _state(scenario, declared))
    assert {r.check for r in rows} == ALL_CHECKS
    red = {r.check: r.message for r in rows if not r.ok}
    assert set(red) == set(SCENARIOS[scenario]), red
    for check, fragments in SCENARIOS[scenario].items():
        for fragment in fragments:
            assert fragment in red[check], (check, fragment, red[check])


OLD_IMAGE_TAG = "0ld1ma9e0000"


def _serve_stale(state: ClusterState, pending: bool) -> ClusterState:
    """The healthy recordings with the RayService's cluster pods on an older image tag and,
    with ``pending``, a blue-green upgrade under way (a pending cluster in its status)."""
    pods = copy.deepcopy(state.pods)
    for pod in pods:
        if pod["metadata"]["labels"].get("ray.io/cluster", "").startswith("serve-"):
            for container in pod["spec"]["containers"]:
                container["image"] = container["image"].replace(TAG, OLD_IMAGE_TAG)
    services = copy.deepcopy(state.ray_objects["RayService"])
    if pending:
        services[0]["status"]["pendingServiceStatus"] = {"rayClusterName": "serve-n3w9q"}
    objects = {**state.ray_objects, "RayService": services}
    return dataclasses.replace(state, pods=pods, ray_objects=objects)


@pytest.mark.parametrize(
    ("pending", "stale"), [(False, True), (True, False)], ids=["in-place", "upgrade-pending"]
)
def test_a_rayservice_upgraded_in_place_that_runs_an_old_image_is_flagged(
    declared: tuple[DeclaredRay, ...], pending: bool, stale: bool
) -> None:
    state = _serve_stale(_state("healthy", declared), pending)
    (row,) = [r for r in doctor.run_checks(declared, state) if r.check == CHECK_IMAGES]
    assert row.ok is not stale, row.message
    if stale:
        assert "RayService ray/serve is stale" in row.message, row.message
        assert f"-{OLD_IMAGE_TAG}, declared " in row.message, row.message
        assert "kubectl delete raycluster -n ray serve-x7k2p" in row.message, row.message
    else:
        assert "RayService ray/serve" in row.message, row.message


def _pod(name: str, worker: str | None, hostname: str, hosts: str, node: str | None) -> dict:
    env = [{"name": "TPU_WORKER_HOSTNAMES", "value": hosts}]
    if worker is not None:
        env.append({"name": "TPU_WORKER_ID", "value": worker})
    spec: dict[str, Any] = {"hostname": hostname, "subdomain": "c-headless-worker-svc"}
    spec["containers"] = [{"name": "ray-worker", "env": env}]
    if node:
        spec["nodeName"] = node
    return {"metadata": {"name": name}, "spec": spec, "status": {"phase": "Running"}}


HOSTS = "g-0-0.c-headless-worker-svc,g-0-1.c-headless-worker-svc"
POOLS = {"n0": "pool-a", "n1": "pool-a", "n2": "pool-b"}
SLICES = [
    ("whole", [("0", "g-0-0", HOSTS, "n0"), ("1", "g-0-1", HOSTS, "n1")], []),
    ("partial", [("0", "g-0-0", HOSTS, "n0")], ["1 of 2 hosts"]),
    (  # the webhook's fault: one ID twice, so one hostname twice and host 0-1 nowhere
        "duplicate-id",
        [("0", "g-0-0", HOSTS, "n0"), ("0", "g-0-0", HOSTS, "n1")],
        ["are [0, 0]", "do not match"],
    ),
    ("no-id", [(None, "g-0-0", HOSTS, "n0"), ("1", "g-0-1", HOSTS, "n1")], ["no TPU_WORKER_ID"]),
    (
        "hostnames-out-of-order",
        [("0", "g-0-1", HOSTS, "n0"), ("1", "g-0-0", HOSTS, "n1")],
        ["do not match the slice's pods' hostnames"],
    ),
    ("two-pools", [("0", "g-0-0", HOSTS, "n0"), ("1", "g-0-1", HOSTS, "n2")], ["pool-a, pool-b"]),
    ("pending", [("0", "g-0-0", HOSTS, "n0"), ("1", "g-0-1", HOSTS, None)], ["not on a node"]),
]


@pytest.mark.parametrize(("pods", "wanted"), [s[1:] for s in SLICES], ids=[s[0] for s in SLICES])
def test_slice_problems(pods: list[tuple], wanted: list[str]) -> None:
    found = slice_problems(
        "slice s", [_pod(f"p{i}", *p) for i, p in enumerate(pods)], hosts=2, pools=POOLS
    )
    assert len(found) == len(wanted), found
    for problem, fragment in zip(found, wanted, strict=True):
        assert fragment in problem


def _real_crds() -> list[dict[str, Any]]:
    from raytpu import crds

    if crds.KUBERAY.missing():
        pytest.skip(f"KubeRay CRDs not in {crds.KUBERAY.crds_dir()} (raytpu crds fetch)")
    folder = crds.KUBERAY.crds_dir()
    return [crds.load_crd_yaml((folder / name).read_text()) for name in crds.KUBERAY.filenames()]


def test_the_version_check_passes_on_the_full_pinned_crds(
    declared: tuple[DeclaredRay, ...],
) -> None:
    """The recordings' CRDs are abridged; the full pinned ones (KubeRay v1.7.0) agree."""
    state = _state("healthy", declared)
    full = ClusterState(tuple(_real_crds()), (), state.ray_objects, (), ())
    row = check_version(declared, full)
    assert row.ok and "KubeRay >= v1.6.0" in row.message, row.message


def _raytpu(*argv: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "raytpu_cli", "doctor", *argv],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize(
    ("scenario", "code"), [("healthy", 0), ("stale-image", 1)], ids=["healthy", "stale-image"]
)
def test_the_cli_end_to_end_on_a_recorded_folder(scenario: str, code: int) -> None:
    done = _raytpu("--stack", "dev", "--recorded", str(DATA / scenario), "--image-tag", TAG)
    assert done.returncode == code, done.stderr
    assert "raytpu doctor --stack dev" in done.stdout
    assert f"6 checks, {code} failed" in done.stdout
    as_json = _raytpu(
        "--stack", "dev", "--recorded", str(DATA / scenario), "--image-tag", TAG, "--json"
    )
    rows = json.loads(as_json.stdout)["rows"]
    assert [r["check"] for r in rows if not r["ok"]] == list(SCENARIOS[scenario])


BAD_INPUT = [
    ("unknown-stack", ["--stack", "nope", "--recorded", str(DATA / "healthy")], "stack: 'nope'"),
    ("missing-folder", ["--stack", "dev", "--recorded", "/nonexistent/doctor"], "--recorded: "),
    (
        "folder-without-answers",
        ["--stack", "dev", "--recorded", str(REPO / "docs")],
        "crds.json' is not valid (missing)",
    ),
]


@pytest.mark.parametrize(
    ("argv", "field"), [b[1:] for b in BAD_INPUT], ids=[b[0] for b in BAD_INPUT]
)
def test_bad_input_exits_2_with_one_line_naming_the_field(argv: list[str], field: str) -> None:
    done = _raytpu(*argv)
    assert done.returncode == 2, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error")]
    assert len(errors) == 1 and field in errors[0], done.stderr
    assert done.stdout == ""


@pytest.fixture
def fake_kubectl(tmp_path: Path) -> Path:
    """A kubectl that answers ``get <kind> ... -o json`` from the healthy recordings and logs
    its arguments; ``get rayjobs.ray.io`` fails as on a cluster without that CRD."""
    script = tmp_path / "kubectl"
    log = tmp_path / "argv.log"
    script.write_text(
        "#!/bin/sh\n"
        f'echo "$*" >> {log}\n'
        'kind="$2"; [ "$kind" = crd ] && kind=crds\n'
        'kind="${kind%.ray.io}"\n'
        'if [ "$kind" = rayjobs ]; then\n'
        "  echo 'error: the server doesn'\"'\"'t have a resource type \"rayjobs\"' >&2; exit 1\n"
        "fi\n"
        'if [ "$kind" = nodes ] && [ -n "$FAIL_NODES" ]; then\n'
        '  echo "Error from server (Forbidden): nodes is forbidden: User cannot list" >&2; exit 1\n'
        "fi\n"
        f'cat "{DATA / "healthy"}/$kind.json"\n'
    )
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return script


def test_the_kubectl_reader_reads_what_the_recordings_hold(
    fake_kubectl: Path, declared: tuple[DeclaredRay, ...]
) -> None:
    state = doctor.collect(doctor.KubectlReader(str(fake_kubectl)), ["ray"])
    assert state.ray_objects["RayJob"] == ()  # no such resource type: empty, not an error
    recorded = _state("healthy", declared)
    assert state.pods == recorded.pods and state.crds == recorded.crds
    logged = (fake_kubectl.parent / "argv.log").read_text().splitlines()
    assert "get pods -o json -l ray.io/is-ray-node=yes -n ray" in logged
    assert any(line.startswith("get crd rayclusters.ray.io") for line in logged)


def test_a_kubectl_failure_is_one_clear_error(fake_kubectl: Path) -> None:
    env = {**os.environ, "FAIL_NODES": "1"}
    reader = doctor.KubectlReader(str(fake_kubectl), env=env)
    with pytest.raises(doctor.ClusterReadError, match=r"nodes is forbidden.*RBAC"):
        doctor.collect(reader, ["ray"])
    with pytest.raises(doctor.ClusterReadError, match="not found on PATH"):
        doctor.KubectlReader("/nonexistent/kubectl").get("nodes", None)


def test_only_declared_ray_objects_are_checked(declared: tuple[DeclaredRay, ...]) -> None:
    """A pod of a RayCluster the stack does not declare is no slice of ours."""
    state = _state("duplicate-worker-ids", declared)
    foreign = [
        {**p, "metadata": {**p["metadata"], "labels": {**labels(p), "ray.io/cluster": "other"}}}
        for p in state.pods
    ]
    rows = doctor.run_checks(declared, ClusterState(**{**_fields(state), "pods": tuple(foreign)}))
    assert {r.check: r.ok for r in rows}[CHECK_SLICES]


def _fields(state: ClusterState) -> Mapping[str, Any]:
    return {name: getattr(state, name) for name in state.__dataclass_fields__}
