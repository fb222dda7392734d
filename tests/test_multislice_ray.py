"""A preset trained over two slices on the simulated cluster: hybrid mesh, MEGASCALE_*, resume.

One module-scoped cluster: two v4 2x2x2 slices (2 hosts x 4 chips each, 16 CPU devices), and
the GCS emulator for the shared checkpoint. Two runs of the ``tiny`` preset with FSDP over each
slice's 8 chips: the first on one slice (steps 0-4), the second on both slices (dcn_data=2),
restoring the first run's checkpoint onto the 2-slice mesh and continuing to step 8.

And one run of the byte model on one slice whose host 0 turns slow (``slow_policy=restart``):
the spare slice is free, so the run saves a durable checkpoint, the driver holds the slow slice
and the next attempt (Ray's own slice reservation, which can only find the other one) resumes.
"""

from __future__ import annotations

import pytest
from gcs_fixture import gcs_or_skip

from raytpu.catalog import shape
from raytpu.presets import MeshConfig, ScaleConfig
from raytpu_cli.common import SliceChoice
from workloads.sim.local_cluster import LocalSliceCluster

pytestmark = [pytest.mark.ray, pytest.mark.long, pytest.mark.timeout(600)]

V4_2X2X2 = shape("v4", "2x2x2")
BUCKET = "raytpu-multislice"
RUN = f"gs://{BUCKET}/tiny"


@pytest.fixture(scope="module")
def cluster():
    with (
        gcs_or_skip(BUCKET) as gcs,
        LocalSliceCluster([SliceChoice("ms", V4_2X2X2, 2)], env=gcs.env) as cluster,
    ):
        yield cluster


@pytest.fixture(scope="module")
def runs(cluster):
    from workloads.training.config import TrainConfig
    from workloads.training.driver import run_training

    config = TrainConfig(
        checkpoint_dir=RUN, steps=4, global_batch=16, checkpoint_every=4, log_every=4
    )
    one = run_training(
        V4_2X2X2,
        config,
        scale=ScaleConfig("tiny", MeshConfig.fsdp_over(V4_2X2X2.chips, 1)),
        name="one-slice",
    )
    two = run_training(
        V4_2X2X2,
        TrainConfig(**{**config.__dict__, "steps": 8}),
        num_slices=2,
        scale=ScaleConfig("tiny", MeshConfig.fsdp_over(V4_2X2X2.chips, 2)),
        name="two-slices",
    )
    return one, two


def test_two_slices_run_one_process_per_host_on_a_hybrid_mesh(runs):
    _, two = runs
    assert two.process_count == 2 * V4_2X2X2.hosts
    assert two.device_count == 2 * V4_2X2X2.chips
    assert two.scale["mesh"] == {"data": 2, "fsdp": 8, "tensor": 1}
    # The DCN (data) axis: index 0 is slice 0's two processes, index 1 slice 1's.
    assert two.scale["data_axis_processes"] == [[0, 1], [2, 3]]
    assert two.scale["embed_shard_fraction"] == pytest.approx(1 / 8)
    assert len(set(two.slice_names)) == 2


def test_workers_see_the_megascale_env_of_their_slice(runs):
    _, two = runs
    assert two.scale["megascale_slice_ids"] == [0, 0, 1, 1]
    env = two.scale["megascale_rank0"]
    assert env["MEGASCALE_NUM_SLICES"] == "2" and env["MEGASCALE_SLICE_ID"] == "0"
    assert env["MEGASCALE_COORDINATOR_ADDRESS"] and env["MEGASCALE_PORT"]
    by_process = {p.process_index: p.slice_name for p in two.placements}
    for process, slice_id in enumerate(two.scale["megascale_slice_ids"]):
        same = [q for q, s in enumerate(two.scale["megascale_slice_ids"]) if s == slice_id]
        assert {by_process[q] for q in same} == {by_process[process]}


def test_one_slice_checkpoint_restores_onto_two_slices_and_loss_keeps_falling(runs):
    one, two = runs
    assert one.scale["mesh"] == {"data": 1, "fsdp": 8, "tensor": 1}
    assert one.process_count == V4_2X2X2.hosts
    assert one.scale["megascale_slice_ids"] == [0, 0]
    assert (one.resumed_from, one.latest_checkpoint) == (0, 4)
    assert (two.resumed_from, two.final_step, two.latest_checkpoint) == (4, 8, 8)
    assert len(two.losses) == 4
    assert one.last_loss < one.first_loss
    assert two.last_loss < one.first_loss - 0.1
    assert two.first_loss < one.first_loss, "resumed, not started over"


def test_each_run_reports_the_digest_of_its_global_parameters(runs):
    one, two = runs
    for result in runs:
        assert len(result.params_digest) == 64 and int(result.params_digest, 16) >= 0
    assert one.params_digest != two.params_digest, "four more steps changed the parameters"


SLOW_STEPS = 12
SLOW_MODEL = {"d_model": 32, "n_heads": 2, "n_layers": 1, "d_ff": 64, "seq_len": 32}


@pytest.fixture(scope="module")
def moved(cluster, tmp_path_factory):
    from workloads.training.config import TrainConfig
    from workloads.training.driver import run_training
    from workloads.training.goodput import GoodputConfig

    goodput = GoodputConfig(
        fast_every=0, startup_timeout_s=120.0, spike_k=100.0, slow_fraction=0.6, slow_steps=3,
        slow_min_excess_s=0.3, slow_policy="restart", faults=("slow-host@5:0",),
        log_dir=str(tmp_path_factory.mktemp("moved")),
    )  # fmt: skip
    config = TrainConfig(
        checkpoint_dir=f"gs://{BUCKET}/moved", steps=SLOW_STEPS, global_batch=16,
        checkpoint_every=SLOW_STEPS, log_every=100, model=SLOW_MODEL, goodput=goodput,
    )  # fmt: skip
    return run_training(V4_2X2X2, config, name="moved")


def test_a_slow_host_moves_the_run_to_the_spare_slice_and_its_own_is_held(moved):
    from workloads.training.goodput import MOVE_ACTION

    (slow,) = moved.events
    assert slow.kind == "slow_host" and slow.step >= 8, slow  # 3 slow steps from step 5 on
    slow_slice = slow.host.split("/")[0]
    assert slow.action == (
        f"{MOVE_ACTION}, slice {slow_slice} held until the run ends: resumed from the durable "
        f"tier at step {slow.step}"
    )
    assert moved.attempts == 2 and moved.restores == (("none", 0), ("durable", slow.step))
    assert len(moved.slice_names) == 1 and moved.slice_names[0] != slow_slice
    assert moved.final_step == SLOW_STEPS and moved.redone_steps == 0
