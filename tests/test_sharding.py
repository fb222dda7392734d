"""FSDP and tensor sharding of the tiny preset on 8 host CPU devices (pure JAX, no Ray).

One subprocess (``tests/sharding_run.py``, ``--xla_force_host_platform_device_count=8``) trains
the same seed and batches on a data-parallel mesh and on an FSDP x tensor mesh; the tests read
its JSON.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def run():
    env = {
        **os.environ,
        "XLA_FLAGS": "--xla_force_host_platform_device_count=8",
        "JAX_PLATFORMS": "cpu",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    done = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "sharding_run.py")],
        env=env,
        capture_output=True,
        text=True,
        timeout=280,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout)


def shards_over(entry, mesh):
    return math.prod(mesh[a] for a in entry["spec"] if a in mesh)


def test_fsdp_each_device_holds_one_nth_of_each_sharded_parameter(run):
    mesh = run["fsdp"]["mesh"]
    assert run["devices"] == 8
    assert mesh == {"data": 1, "fsdp": 4, "tensor": 2}
    for name, entry in run["fsdp"]["params"].items():
        parts = 8 if len(entry["spec"]) >= 2 else 4  # matrices: fsdp x tensor; norms: fsdp
        assert shards_over(entry, mesh) == parts, name
        assert entry["shard_sizes"] == [entry["size"] // parts], name
        assert "fsdp" in entry["spec"], name
        assert entry["dtype"] == "float32", f"{name}: master weights are fp32"


def test_fsdp_shards_both_adamw_moments_like_their_parameter(run):
    params = run["fsdp"]["params"]
    moments = run["fsdp"]["moments"]
    for which in ("mu", "nu"):
        for name, entry in params.items():
            moment = moments[f"[1][0].{which}{name}"]
            assert moment["shard_sizes"] == entry["shard_sizes"], f"{which}{name}"
            assert moment["spec"] == entry["spec"], f"{which}{name}"


def test_data_parallel_replicates_every_parameter(run):
    assert run["dp"]["mesh"] == {"data": 8, "fsdp": 1, "tensor": 1}
    for name, entry in run["dp"]["params"].items():
        assert entry["shard_sizes"] == [entry["size"]], name


def test_same_loss_trajectory_as_data_parallel_and_it_falls(run):
    dp, fsdp = run["dp"]["losses"], run["fsdp"]["losses"]
    assert fsdp == pytest.approx(dp, rel=1e-3)
    assert dp[-1] < dp[0] - 0.05


def test_params_digest_is_the_global_value_whatever_the_mesh(run):
    """Same seed, same parameters: one digest on the replicated mesh, the sharded one and the
    host copy (the digest of a sharded array is of the whole array, not its first shard)."""
    dp, fsdp = run["dp"]["digests"], run["fsdp"]["digests"]
    assert fsdp["init"] == fsdp["init_on_host"] == dp["init"] == dp["init_on_host"]
    assert len(dp["init"]) == 64


def test_matmuls_run_in_bf16(run):
    assert run["matmul_dtypes"] == ["bfloat16"]
