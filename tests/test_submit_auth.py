"""``raytpu submit`` against Ray heads that require a token, with the user's own credentials.

The credential comes through the Kubernetes side (``kubectl get secret`` under the user's RBAC, or
the user's Google token for Kubernetes-RBAC heads); a stand-in ``kubectl`` / ``gcloud`` on PATH
answers as the real ones would. The end-to-end test runs a real local Ray head with
``RAY_AUTH_MODE=token``.
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import subprocess
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
import requests
from delivery_ray_nodes import fake_kubectl, local_ray

from raytpu.stack_outputs import RayHead
from raytpu_cli import main as cli
from raytpu_cli.ray_credentials import CredentialError, auth_headers

HEAD = RayHead(
    "RayService",
    "serve",
    "ray",
    "serve",
    "serve-head-svc",
    auth="secret",
    auth_secret="serve-ray-auth",
)


def _runner(code: int, out: str = "", err: str = ""):
    seen: list[list[str]] = []

    def run(argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
        seen.append(list(argv))
        return subprocess.CompletedProcess(list(argv), code, out, err)

    run.seen = seen  # type: ignore[attr-defined]
    return run


def test_secret_token_is_read_through_kubectl() -> None:
    run = _runner(0, base64.b64encode(b"s3cret").decode())
    assert auth_headers(HEAD, run) == {"Authorization": "Bearer s3cret"}
    assert run.seen == [  # type: ignore[attr-defined]
        [
            "kubectl",
            "get",
            "secret",
            "serve-ray-auth",
            "-n",
            "ray",
            "-o",
            "jsonpath={.data.auth_token}",
        ]
    ]


def test_kubernetes_heads_take_the_users_google_token() -> None:
    head = RayHead("RayCluster", "train", "ray", "train", "train-head-svc", auth="kubernetes")
    run = _runner(0, "ya29.user-token\n")
    assert auth_headers(head, run) == {"Authorization": "Bearer ya29.user-token"}
    assert run.seen == [["gcloud", "auth", "print-access-token"]]  # type: ignore[attr-defined]


def test_no_auth_no_header() -> None:
    head = RayHead("RayCluster", "train", "ray", "train", "train-head-svc")
    assert auth_headers(head, _runner(1)) == {}


@pytest.mark.parametrize(
    ("code", "out", "err", "message"),
    [
        (
            1,
            "",
            'Error from server (Forbidden): secrets "serve-ray-auth" is forbidden: User "ann" cannot get resource "secrets"',
            "Kubernetes RBAC denies get on secret 'serve-ray-auth' in namespace 'ray'",
        ),
        (
            1,
            "",
            'Error from server (NotFound): secrets "serve-ray-auth" not found',
            "not found in namespace 'ray'",
        ),
        (0, "not base64!", "", "auth_token is not base64 text"),
    ],
    ids=["forbidden", "not-found", "garbled"],
)
def test_secret_failures_say_what_to_do(code: int, out: str, err: str, message: str) -> None:
    with pytest.raises(CredentialError, match=message):
        auth_headers(HEAD, _runner(code, out, err))


def test_gcloud_not_logged_in() -> None:
    head = RayHead("RayCluster", "train", "ray", "train", "train-head-svc", auth="kubernetes")
    with pytest.raises(CredentialError, match="gcloud auth login"):
        auth_headers(head, _runner(1, "", "ERROR: no credentialed accounts"))


# ------------------------------------------------------------------- a real head with auth
@pytest.fixture(scope="module")
def auth_head() -> Iterator[tuple[str, str]]:
    token = secrets.token_hex(24)
    with local_ray(token=token) as cluster:
        yield cluster.address, token


@pytest.mark.ray
@pytest.mark.timeout(400)
def test_jobs_api_refuses_no_token_and_submit_succeeds(
    auth_head: tuple[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    address, token = auth_head
    bare = requests.get(f"{address}/api/jobs/", timeout=30)
    assert bare.status_code in (401, 403), bare.text
    wrong = requests.get(
        f"{address}/api/jobs/", timeout=30, headers={"Authorization": "Bearer nope"}
    )
    assert wrong.status_code in (401, 403)
    ok = requests.get(
        f"{address}/api/jobs/", timeout=30, headers={"Authorization": f"Bearer {token}"}
    )
    assert ok.status_code == 200

    outputs = {
        "clusterName": "raytpu-dev",
        "slices": {
            "train": {
                "generation": "v6e",
                "topology": "2x4",
                "machineType": "ct6e-standard-4t",
                "count": 1,
            }
        },
        "rayClusters": {
            "train": {
                "namespace": "ray",
                "slice": "train",
                "headService": "train-head-svc",
                "dashboardPort": 8265,
                "auth": "secret",
                "authSecret": "train-ray-auth",
            }
        },
    }
    path = tmp_path / "outputs.json"
    path.write_text(json.dumps(outputs))
    bin_dir = fake_kubectl(tmp_path / "bin", "train-ray-auth", token)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    argv = [
        "submit",
        "--stack",
        "dev",
        "--outputs",
        str(path),
        "--address",
        address,
        "--timeout",
        "240",
    ]
    code = cli.main([*argv, "--", "python", "-c", "print('authenticated job ran')"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "authenticated job ran" in captured.out
    assert "SUCCEEDED" in captured.err

    # The same submission with a token the head does not know is refused with the reason.
    fake_kubectl(bin_dir, "train-ray-auth", "not-the-token")
    code = cli.main([*argv, "--", "python", "-c", "print('never')"])
    captured = capsys.readouterr()
    assert code == 1
    assert "refused the credential" in captured.err
