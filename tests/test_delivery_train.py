"""``raytpu submit train`` for real: the training workload, through the Job Submission API, on a
local Ray cluster shaped like the dev stack's ``train`` slice (v6e 2x4 on 4-chip hosts: two
simulated TPU hosts, each a Ray worker node with ``TPU: 4`` and the slice's labels).

The same CLI and client code as against GKE; only the head address differs (no port-forward), and
the stack's checkpoint bucket is a GCS emulator: with no ``--checkpoint-dir``, training writes to
``gs://BUCKET/train`` (the bucket from the stack outputs, the run named after the RayCluster) and
Serve loads from there. Each simulated host has its own folder (working dir, TMPDIR, Ray temp).
Slow (a Ray head, two hosts and a JaxTrainer run): marked ``ray``.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests
from delivery_ray_nodes import LocalRay, free_ports, local_ray
from gcs_fixture import gcs_or_skip

from raytpu import catalog
from raytpu_cli import main as cli
from workloads.sim.gcs_emulator import GcsEmulator
from workloads.sim.local_cluster import host_specs

SHAPE = catalog.shape("v6e", "2x4", machine_type="ct6e-standard-4t")
JOB_TIMEOUT_S = 420.0
BUCKET = "ray-tpu-dev-ckpt"
CHECKPOINTS = f"gs://{BUCKET}/train"


class _Slice:
    """What ``host_specs`` needs from a slice config."""

    def __init__(self, name: str, shape: catalog.SliceShape, count: int) -> None:
        self.name, self.shape, self.count = name, shape, count


@pytest.fixture(scope="module")
def gcs() -> Iterator[GcsEmulator]:
    """The stack's checkpoint bucket, as a real GCS emulator (skips only if it cannot start)."""
    with gcs_or_skip(BUCKET) as emulator:
        yield emulator


@pytest.fixture(scope="module")
def slice_cluster(gcs: GcsEmulator) -> Iterator[LocalRay]:
    with local_ray() as cluster:
        # One host at a time: Ray gives a joining node 30 s to register, and this machine is
        # shared; two raylets starting together on 2 busy cores can miss that.
        for host in host_specs([_Slice("train", SHAPE, 1)]):
            cluster.add_host(resources=host.resources, labels=host.labels, env=host.env)
        yield cluster


@pytest.fixture(scope="module")
def dev_outputs(tmp_path_factory: pytest.TempPathFactory) -> Path:
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
        "checkpointBucket": BUCKET,
    }
    path = tmp_path_factory.mktemp("outputs") / "dev-outputs.json"
    path.write_text(json.dumps(outputs))
    return path


@dataclass(frozen=True)
class CliRun:
    code: int
    out: str
    err: str


def _raytpu(*argv: str) -> CliRun:
    """``raytpu ARGV`` in this process, its stdout and stderr captured."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(list(argv))
    return CliRun(code, out.getvalue(), err.getvalue())


@pytest.fixture(scope="module")
def trained(slice_cluster: LocalRay, dev_outputs: Path) -> CliRun:
    """One ``raytpu submit train`` run on the simulated slice (shared by the tests below); no
    ``--checkpoint-dir``: the stack's bucket is the default."""
    return _raytpu(
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
    )


@pytest.mark.ray
@pytest.mark.timeout(900)
def test_submit_train_runs_the_training_workload_on_the_slice(
    trained: CliRun, gcs: GcsEmulator
) -> None:
    assert trained.code == 0, trained.err[-4000:] + trained.out[-4000:]
    # Two host processes joined into one mesh over the slice's 8 chips, and a checkpoint in the
    # stack's bucket, with both hosts' shards.
    assert "2 processes / 8 devices" in trained.out
    assert "INFO job_manager" not in trained.out  # Ray's own lines: in the job's log file only
    assert re.search(rf"^checkpoint +{re.escape(CHECKPOINTS)} @ 4$", trained.out, re.M)
    assert "SUCCEEDED" in trained.err
    shards = {n.split("/")[3] for n in gcs.objects(BUCKET, "train/4/params/ocdbt.process_")}
    assert shards == {"ocdbt.process_0", "ocdbt.process_1"}


@pytest.mark.ray
@pytest.mark.timeout(900)
def test_submit_serve_deploys_the_app_on_the_cluster_and_it_answers(
    slice_cluster: LocalRay, dev_outputs: Path, trained: CliRun
) -> None:
    """``raytpu submit serve``: a job runs ``serve run --non-blocking workloads.serve:app``;
    the app stays up after the job and generates from the checkpoint training wrote."""
    assert trained.code == 0, "needs the checkpoint of the training run"
    (http_port,) = free_ports(1)
    common = ["submit", "--stack", "dev", "--outputs", str(dev_outputs)]
    common += ["--address", slice_cluster.address, "--timeout", str(JOB_TIMEOUT_S)]
    # Serve's HTTP proxy on a free port (8000 may be taken on this shared machine); on GKE the
    # default 8000 is what the head Service exposes, and `submit serve` needs no such step.
    started = _raytpu(
        *common,
        "--",
        "serve",
        "start",
        "--http-host",
        "127.0.0.1",
        "--http-port",
        str(http_port),
        "--proxy-location",
        "HeadOnly",
    )
    assert started.code == 0, started.err[-3000:]
    deployed = _raytpu(*common, "--env", f"RAYTPU_CHECKPOINT_DIR={CHECKPOINTS}", "serve")
    assert deployed.code == 0, deployed.err[-4000:] + deployed.out[-4000:]
    assert "serve run --non-blocking workloads.serve:app" in deployed.err
    reply = requests.post(
        f"http://127.0.0.1:{http_port}/",
        json={"prompt": "The TPU", "max_new_tokens": 4, "temperature": 0.0},
        timeout=120,
    )
    assert reply.status_code == 200, reply.text
    body = reply.json()
    assert body["checkpoint_step"] == 4
    assert body["host"] == "train-0"  # a replica on a simulated TPU host of the slice
