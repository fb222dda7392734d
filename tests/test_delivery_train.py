"""``raytpu submit train`` for real: the training workload, through the Job Submission API, on a
local Ray cluster shaped like the dev stack's ``train`` slice (v6e 2x4 on 4-chip hosts: two
simulated TPU hosts, each a Ray worker node with ``TPU: 4`` and the slice's labels).

The same CLI and client code as against GKE; only the head address differs (no port-forward).
Slow (a Ray head, two hosts and a JaxTrainer run): marked ``ray``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from delivery_ray_nodes import LocalRay, local_ray

from raytpu import catalog, cli
from workloads.local_cluster import host_specs

SHAPE = catalog.shape("v6e", "2x4", machine_type="ct6e-standard-4t")
JOB_TIMEOUT_S = 420.0


class _Slice:
    """What ``host_specs`` needs from a slice config."""

    def __init__(self, name: str, shape: catalog.SliceShape, count: int) -> None:
        self.name, self.shape, self.count = name, shape, count


@pytest.fixture(scope="module")
def slice_cluster() -> Iterator[LocalRay]:
    with local_ray() as cluster:
        # One host at a time: Ray gives a joining node 30 s to register, and this machine is
        # shared; two raylets starting together on 2 busy cores can miss that.
        for count, host in enumerate(host_specs([_Slice("train", SHAPE, 1)]), start=2):
            cluster.add_host(resources=host.resources, labels=host.labels, env=host.env)
            cluster.wait_for_nodes(count)
        yield cluster


@pytest.fixture
def dev_outputs(tmp_path: Path) -> Path:
    """The outputs `pulumi up` of the dev stack exports for its train slice and RayCluster."""
    record = SHAPE.to_dict()
    outputs = {
        "clusterName": "ray-tpu-dev",
        "slices": {
            "train": {
                **{k: record[k] for k in ("generation", "topology", "machineType")},
                **{k: record[k] for k in ("chipsPerHost", "hosts", "chips")},
                "count": 1,
                "nodePools": ["train-0"],
            }
        },
        "rayClusters": {
            "train": {"namespace": "ray", "slice": "train", "headService": "train-head-svc"}
        },
    }
    path = tmp_path / "dev-outputs.json"
    path.write_text(json.dumps(outputs))
    return path


@pytest.mark.ray
@pytest.mark.timeout(900)
def test_submit_train_runs_the_training_workload_on_the_slice(
    slice_cluster: LocalRay,
    dev_outputs: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    checkpoints = tmp_path / "checkpoints"
    code = cli.main(
        [
            "submit",
            "--stack",
            "dev",
            "--outputs",
            str(dev_outputs),
            "--address",
            slice_cluster.address,
            "--timeout",
            str(JOB_TIMEOUT_S),
            "train",
            "--steps",
            "4",
            "--global-batch",
            "8",
            "--checkpoint-every",
            "2",
            "--checkpoint-dir",
            str(checkpoints),
        ]
    )
    captured = capsys.readouterr()
    assert code == 0, captured.err[-4000:] + captured.out[-4000:]
    # Two host processes joined into one mesh over the slice's 8 chips, and a checkpoint.
    assert "2 processes / 8 devices" in captured.out
    assert f"checkpoint {checkpoints} @ 4" in captured.out
    assert "SUCCEEDED" in captured.err
