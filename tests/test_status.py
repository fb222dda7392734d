"""``raytpu status`` on a real local Ray head (token auth on) with simulated TPU hosts: a slice a
job holds, a slice that lost a host, a failed job with its error class.

One head for the module (``token_head``): the tests that need a token-auth head only read from it
or add to it (hosts, jobs), so they share it instead of starting one each."""

from __future__ import annotations

import json
import os
import secrets
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
from delivery_ray_nodes import LocalRay, fake_kubectl, local_ray

from raytpu_cli import main as cli
from raytpu_cli.status import app_states, holder_names, slice_states

STACK = {
    "clusterName": "raytpu-dev",
    "slices": {
        "train": {
            "generation": "v6e",
            "topology": "2x4",
            "machineType": "ct6e-standard-4t",
            "count": 1,
        }
    },
}

HOLD = (
    "import ray, time; ray.init(); "
    "from ray.util.placement_group import placement_group; "
    "pg = placement_group([{'TPU': 4}, {'TPU': 4}], strategy='STRICT_SPREAD'); "
    "ray.get(pg.ready(), timeout=120); print('held', flush=True); time.sleep(300)"
)
FAIL = (
    "import sys; from raytpu import errors; from raytpu_cli import failure; "
    "sys.exit(failure.report(errors.NetworkTimeoutError('upstream did not answer')))"
)


@pytest.fixture(scope="module")
def token_head() -> Iterator[LocalRay]:
    """A local Ray head with token authentication on (``token_head.token``)."""
    with local_ray(token=secrets.token_hex(16)) as cluster:
        yield cluster


def _host(slice_name: str, worker: int) -> dict:
    return {
        "resources": {"TPU": 4},
        "labels": {
            "ray.io/tpu-slice-name": slice_name,
            "ray.io/tpu-worker-id": str(worker),
            "ray.io/tpu-pod-type": "v6e-8",
            "ray.io/tpu-topology": "2x4",
        },
        "env": {"TPU_NAME": slice_name, "TPU_WORKER_ID": str(worker)},
    }


def _wait(check, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while True:
        found = check()
        if found:
            return found
        assert time.monotonic() < deadline, f"{what}: not after {timeout_s} s"
        time.sleep(1)


@pytest.mark.ray
@pytest.mark.timeout(500)
def test_status_shows_slices_jobs_and_error_classes(
    token_head: LocalRay, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    cluster, token = token_head, token_head.token
    assert token
    headers = token_head.headers
    for slice_name, worker in (("train-0", 0), ("train-0", 1), ("broken-0", 0)):
        cluster.add_host(**_host(slice_name, worker))
    jobs = f"{cluster.address}/api/jobs/"
    held = requests.post(
        jobs, json={"entrypoint": f'python -c "{HOLD}"'}, headers=headers, timeout=30
    )
    failed = requests.post(
        jobs, json={"entrypoint": f'python -c "{FAIL}"'}, headers=headers, timeout=30
    )
    held_id, failed_id = held.json()["submission_id"], failed.json()["submission_id"]

    def logs(job: str) -> str:
        return requests.get(f"{jobs}{job}/logs", headers=headers, timeout=30).json()["logs"]

    def status(job: str) -> str:
        return requests.get(f"{jobs}{job}", headers=headers, timeout=30).json()["status"]

    _wait(lambda: "held" in logs(held_id), 180, "placement group held")
    _wait(lambda: status(failed_id) == "FAILED", 120, "failed job")

    outputs = tmp_path / "outputs.json"
    outputs.write_text(
        json.dumps(
            {
                **STACK,
                "rayClusters": {
                    "train": {
                        "namespace": "ray",
                        "slice": "train",
                        "headService": "train-head-svc",
                        "auth": "secret",
                        "authSecret": "train-ray-auth",
                    }
                },
            }
        )
    )
    bin_dir = fake_kubectl(tmp_path / "bin", "train-ray-auth", token)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    argv = ["status", "--stack", "dev", "--outputs", str(outputs), "--address", cluster.address]
    assert cli.main([*argv, "--json"]) == 0
    found = json.loads(capsys.readouterr().out)
    assert cli.main(argv) == 0
    tables = capsys.readouterr().out

    slices = {s["name"]: s for s in found["slices"]}
    assert slices["train-0"]["state"] == "reserved"
    assert (slices["train-0"]["hosts_alive"], slices["train-0"]["hosts"]) == (2, 2)
    groups = f"{cluster.address}/api/v0/placement_groups?detail=true"
    assert slices["train-0"]["held_by"] == held_id, (  # on failure: who holds it, and the jobs
        found["jobs"],
        requests.get(groups, headers=headers, timeout=30).json()["data"]["result"]["result"],
    )
    assert slices["broken-0"]["state"] == "partial"
    assert (slices["broken-0"]["hosts_alive"], slices["broken-0"]["hosts"]) == (1, 2)
    by_id = {j["submission_id"]: j for j in found["jobs"]}
    assert by_id[failed_id]["status"] == "FAILED"
    assert by_id[failed_id]["error_class"] == "network_timeout"
    assert by_id[held_id]["status"] == "RUNNING" and by_id[held_id]["error_class"] == ""
    assert "train-0" in tables and "reserved" in tables and "network_timeout" in tables


@pytest.mark.ray
@pytest.mark.timeout(500)
def test_status_without_the_token_is_refused(token_head: LocalRay, tmp_path: Path, capsys) -> None:
    cluster = token_head
    outputs = tmp_path / "outputs.json"
    outputs.write_text(
        json.dumps(
            {
                **STACK,
                "rayClusters": {
                    "train": {"namespace": "ray", "slice": "train", "headService": "h"}
                },
            }
        )
    )
    code = cli.main(
        ["status", "--stack", "dev", "--outputs", str(outputs), "--address", cluster.address]
    )
    assert code != 0
    assert "refused the credential" in capsys.readouterr().err


def test_slices_from_state_records() -> None:
    """The pure part: labels, placement groups and shapes to slice states."""

    def node(node_id: str, slice_name: str, state: str = "ALIVE") -> dict:
        return {
            "node_id": node_id,
            "state": state,
            "labels": {
                "ray.io/tpu-slice-name": slice_name,
                "ray.io/tpu-pod-type": "v6e-16",
                "ray.io/tpu-topology": "4x4",
            },
            "resources_total": {"TPU": 4.0},
        }

    nodes = [node(f"a{i}", "a-0") for i in range(4)] + [
        node("b0", "b-0"),
        node("b1", "b-0", "DEAD"),
    ]
    groups = [{"state": "CREATED", "creator_job_id": "02000000", "bundles": [{"node_id": "a0"}]}]
    states = {s.name: s for s in slice_states(nodes, groups, {"02000000": "raysubmit_x"})}
    assert (states["a-0"].state, states["a-0"].held_by, states["a-0"].hosts) == (
        "reserved",
        "raysubmit_x",
        4,
    )
    assert (states["b-0"].state, states["b-0"].hosts_alive) == ("partial", 1)


class _Head:
    """A head's ``GET /api/jobs/<id>`` answers: a job record, or an error for an unknown id."""

    def __init__(self, by_id: dict[str, dict]) -> None:
        self.by_id, self.asked = by_id, []

    def get(self, path: str) -> dict:
        job_id = path.removeprefix("/api/jobs/")
        self.asked.append(job_id)
        if job_id not in self.by_id:
            raise requests.HTTPError(f"404 for {path}")
        return self.by_id[job_id]


@pytest.mark.parametrize(
    ("listed", "by_id", "holder", "asked"),
    [
        ([{"job_id": "02000000", "submission_id": "raysubmit_a"}], {}, "raysubmit_a", []),
        (
            [],
            {"02000000": {"job_id": "02000000", "submission_id": "raysubmit_b"}},
            "raysubmit_b",
            ["02000000"],
        ),
        ([{"job_id": None, "submission_id": "raysubmit_c"}], {}, "02000000", ["02000000"]),
        ([], {"02000000": {"job_id": "02000000", "submission_id": None}}, "02000000", ["02000000"]),
    ],
    ids=[
        "listed-with-its-submission",
        "missing-asked-by-id",
        "unknown-shows-job-id",
        "plain-driver",
    ],
)
def test_a_group_creator_is_named_by_its_submission(
    listed: list[dict], by_id: dict[str, dict], holder: str, asked: list[str]
) -> None:
    head = _Head(by_id)
    groups = [{"state": "CREATED", "creator_job_id": "02000000", "bundles": [{"node_id": "a0"}]}]
    names = holder_names(head, listed, groups)
    assert names.get("02000000", "02000000") == holder
    assert head.asked == asked


def test_serve_apps_from_serve_api() -> None:
    serve = {
        "applications": {
            "generate": {
                "status": "RUNNING",
                "deployments": {
                    "TextGenerator": {"replicas": [{"state": "RUNNING"}], "target_num_replicas": 1}
                },
            },
            "broken": {
                "status": "DEPLOY_FAILED",
                "message": "error [RTPU-I01 bad_input]: x",
                "deployments": {},
            },
        }
    }
    apps = {a.name: a for a in app_states(serve)}
    assert apps["generate"].deployments == "TextGenerator 1/1"
    assert (apps["broken"].status, apps["broken"].error_class) == ("DEPLOY_FAILED", "bad_input")


@pytest.mark.ray
@pytest.mark.timeout(500)
def test_dashboard_proxy_adds_the_credential(token_head: LocalRay) -> None:
    """``raytpu dashboard``'s local proxy: the browser's requests reach a token-auth head."""
    from raytpu_cli.dashboard import auth_proxy
    from workloads.sim.local_cluster import free_port

    cluster, token = token_head, token_head.token
    assert requests.get(f"{cluster.address}/api/version", timeout=30).status_code in (401, 403)
    headers = {"Authorization": f"Bearer {token}"}
    with auth_proxy(cluster.address, headers, free_port()) as url:
        version = requests.get(f"{url}/api/version", timeout=30)
        assert version.status_code == 200 and "ray_version" in version.json()
        page = requests.get(f"{url}/", timeout=30)
        assert page.status_code == 200
    with pytest.raises(requests.exceptions.ConnectionError):
        requests.get(f"{url}/api/version", timeout=5)  # the proxy is gone
