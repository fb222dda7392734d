"""The simulated slice cluster runs with Ray's token authentication on, as Ray 2.59+ local
clusters do: a driver without the cluster's token is refused, one with it connects."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from raytpu.catalog import shape
from raytpu_cli.common import SliceChoice
from workloads.sim.local_cluster import LocalSliceCluster

pytestmark = [pytest.mark.ray, pytest.mark.timeout(300)]

CONNECT = (
    "import ray; ray.init(address='{address}'); print('connected', ray.cluster_resources()['TPU'])"
)


def _driver(address: str, token: str | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_AUTH_TOKEN", "RAY_ADDRESS")}
    env["RAY_AUTH_MODE"] = "token"
    env["RAY_AUTH_TOKEN_PATH"] = "/nonexistent/raytpu-no-token"  # never fall back to ~/.ray
    if token is not None:
        env["RAY_AUTH_TOKEN"] = token
    return subprocess.run(
        [sys.executable, "-c", CONNECT.format(address=address)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


def test_local_cluster_requires_the_token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    monkeypatch.delenv("RAY_AUTH_TOKEN", raising=False)
    with LocalSliceCluster([SliceChoice("serve", shape("v6e", "2x2"), 1)]) as cluster:
        assert os.environ["RAY_AUTH_MODE"] == "token"
        token = os.environ["RAY_AUTH_TOKEN"]
        good = _driver(cluster.address, token)
        assert good.returncode == 0 and "connected 4.0" in good.stdout, good.stderr[-2000:]
        wrong = _driver(cluster.address, "not-" + token)
        assert wrong.returncode != 0
        assert "connected" not in wrong.stdout
    # Taken back afterwards: later Ray use in this process is as before.
    assert "RAY_AUTH_MODE" not in os.environ and "RAY_AUTH_TOKEN" not in os.environ
