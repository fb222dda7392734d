"""Workloads on a real local Ray cluster of simulated TPU hosts (one cluster for the module).

The cluster: two v6e 2x4 training slices (2 hosts x 4 chips each), one v6e 2x2 serving host, and
a v4 2x2x2 slice that lost its second host. Each host has its own working directory and TMPDIR;
checkpoints go to ``gs://`` on a real GCS emulator (fake-gcs-server), as on GKE.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import pytest
from gcs_fixture import gcs_or_skip

from raytpu.catalog import shape
from raytpu.ray_names import LABEL_SLICE_NAME, LABEL_WORKER_ID
from raytpu_cli.common import SliceChoice, post_json
from workloads.sim.local_cluster import LocalSliceCluster, free_port
from workloads.slices.reservation import SliceReservationError, reserve_slices

pytestmark = [pytest.mark.ray, pytest.mark.timeout(420)]

V6E_2X4_4T = shape("v6e", "2x4", machine_type="ct6e-standard-4t")
V6E_2X2 = shape("v6e", "2x2")
V4_2X2X2 = shape("v4", "2x2x2")
TOTAL_TPU = 2 * 8 + 4 + 4  # two 2x4 slices, the serving host, the one surviving v4 host
BUCKET = "raytpu-test-checkpoints"
RUN = f"gs://{BUCKET}/run"


@pytest.fixture(scope="module")
def gcs():
    """The stack's checkpoint bucket, as a real GCS emulator (skips only if it cannot start)."""
    with gcs_or_skip(BUCKET) as emulator:
        yield emulator


@pytest.fixture(scope="module")
def cluster(gcs):
    slices = [
        SliceChoice("train", V6E_2X4_4T, 2),
        SliceChoice("serve", V6E_2X2, 1),
        SliceChoice("broken", V4_2X2X2, 1),
    ]
    with LocalSliceCluster(slices, missing_hosts=[("broken-0", 1)], env=gcs.env) as running:
        yield running


def wait_all_released(timeout_s: float = 30.0) -> dict:
    """Until every placement group is REMOVED and all TPU is free again; fails after timeout."""
    import ray
    from ray.util import placement_group_table

    deadline = time.monotonic() + timeout_s
    while True:
        states = {pg["state"] for pg in placement_group_table().values()}
        available = ray.available_resources()
        if states <= {"REMOVED"} and available.get("TPU", 0) == TOTAL_TPU:
            return available
        if time.monotonic() > deadline:
            pytest.fail(f"still reserved after {timeout_s} s: {states}, TPU {available.get('TPU')}")
        time.sleep(0.2)


@pytest.fixture
def released(cluster):
    wait_all_released()
    yield
    wait_all_released()


# ------------------------------------------------------------------------ reservation
def test_two_slices_three_requests_third_fails_within_timeout(released):
    import ray

    @ray.remote(num_cpus=0, resources={"TPU": 4})
    def where() -> tuple[str, str]:
        import os

        return os.environ["TPU_NAME"], os.environ["TPU_WORKER_ID"]

    with (
        reserve_slices(V6E_2X4_4T, timeout_s=20) as first,
        reserve_slices(V6E_2X4_4T, timeout_s=20) as second,
    ):
        assert {first.slice_names, second.slice_names} == {("train-0",), ("train-1",)}
        for reservation in (first, second):
            assert sorted(h.worker_id for h in reservation.hosts) == [0, 1]
            seen = ray.get(
                [
                    where.options(
                        scheduling_strategy=reservation.scheduling_strategy(h.bundle_index)
                    ).remote()
                    for h in reservation.hosts
                ],
                timeout=60,
            )
            assert seen == [(h.slice_name, str(h.worker_id)) for h in reservation.hosts]
        began = time.monotonic()
        with (
            pytest.raises(SliceReservationError) as caught,
            reserve_slices(V6E_2X4_4T, timeout_s=4),
        ):
            pytest.fail("a third v6e 2x4 slice does not exist")
        waited = time.monotonic() - began
    assert waited < 4 + 10
    message = str(caught.value)
    assert "v6e 2x4 (2 hosts x 4 chips, pod type v6e-8)" in message
    assert "after waiting" in message
    assert "no free slice" in message


def test_two_slices_while_one_is_held_fails_and_releases_the_head_it_claimed(released):
    """All or nothing with a gang of heads: the request for two slices, one of them held, times
    out without claiming the free one, and the free slice is reservable right after."""
    with reserve_slices(V6E_2X4_4T, timeout_s=20, name="holder") as held:
        with (
            pytest.raises(SliceReservationError) as caught,
            reserve_slices(V6E_2X4_4T, num_slices=2, timeout_s=3),
        ):
            pytest.fail("only one v6e 2x4 slice is free")
        assert "2 head resources TPU-v6e-8-head not claimed together within 3 s" in str(
            caught.value
        )
        # The reason names the free slice and who holds the other: the holder's two groups.
        assert "too few free slices: 1 of 2 complete slice(s)" in caught.value.reason
        held_by = caught.value.reason.split("(held: ")[1].split(")")[0]
        holders = dict(part.split(" by ") for part in held_by.split("; "))
        (held_name,) = held.slice_names
        assert sorted(holders[held_name].split(", ")) == ["holder", "holder-heads"]
        with reserve_slices(V6E_2X4_4T, timeout_s=5) as other:
            assert other.slice_names != held.slice_names


def test_slice_missing_a_host_fails_clearly(released):
    with pytest.raises(SliceReservationError) as caught, reserve_slices(V4_2X2X2, timeout_s=4):
        pytest.fail("broken-0 has only one of its two hosts")
    assert "v4 2x2x2 (2 hosts x 4 chips" in str(caught.value)
    assert "slice broken-0 has 1 of 2 hosts" in caught.value.reason


def test_release_on_error_inside_block_then_both_slices_at_once(released):
    class Boom(Exception):
        pass

    with pytest.raises(Boom), reserve_slices(V6E_2X4_4T, timeout_s=20):
        raise Boom
    wait_all_released()
    with reserve_slices(V6E_2X4_4T, num_slices=2, timeout_s=20) as both:
        assert sorted(both.slice_names) == ["train-0", "train-1"]
        assert len(both.hosts) == 4


# ------------------------------------------------------------------------ training
def test_training_no_slice_can_hold_fails_in_bounded_time(released, tmp_path):
    from workloads.training.config import TrainConfig
    from workloads.training.driver import TrainingError, run_training

    began = time.monotonic()
    with pytest.raises(TrainingError) as caught:
        run_training(
            V6E_2X4_4T,
            TrainConfig(checkpoint_dir=str(tmp_path / "ck"), steps=2, global_batch=8),
            tpu_per_worker=8,  # Ray's own default for v6e 2x4: one 8-chip host
            reserve_timeout_s=4,
        )
    assert time.monotonic() - began < 4 + 15
    assert "each bundle asks TPU 8 but the largest host has TPU 4" in str(caught.value)


@pytest.fixture(scope="module")
def trained(cluster):
    """Two runs on a 2-host slice, both checkpointing to gs://: the first to step 4, the second
    resumes from it to step 8."""
    from workloads.training.config import TrainConfig
    from workloads.training.driver import run_training

    first_config = TrainConfig(
        checkpoint_dir=RUN, steps=4, global_batch=16, checkpoint_every=4, log_every=4
    )
    first = run_training(V6E_2X4_4T, first_config, name="first")
    second_began = time.time()
    config = replace(first_config, steps=8)
    second = run_training(V6E_2X4_4T, config, name="second")
    return config, first, second, second_began


def test_training_smoke_spmd_over_all_hosts_and_chips(trained):
    _, first, second, _ = trained
    assert second.process_count == V6E_2X4_4T.hosts
    assert second.device_count == V6E_2X4_4T.chips
    assert second.local_device_count == V6E_2X4_4T.chips_per_host
    assert len(first.losses) == 4 and len(second.losses) == 4
    assert second.last_loss < first.first_loss - 0.5
    assert second.latest_checkpoint == 8


def test_second_run_resumes_from_the_gs_checkpoint_at_the_saved_step(trained):
    _, first, second, _ = trained
    assert (first.resumed_from, first.final_step, first.latest_checkpoint) == (0, 4, 4)
    assert (second.resumed_from, second.final_step) == (4, 8)
    # The curve continues where the checkpoint left it instead of starting over at ~ln(256).
    assert second.first_loss < first.first_loss - 0.3


def test_every_host_wrote_its_own_shards_to_the_bucket_and_none_to_disk(trained, gcs, cluster):
    names = gcs.objects(BUCKET, "run/8/")
    assert "run/8/commit_success.txt" in names
    writers = {n.split("/")[3] for n in names if n.startswith("run/8/params/ocdbt.process_")}
    assert writers == {"ocdbt.process_0", "ocdbt.process_1"}, names
    assert gcs.objects(BUCKET, "ray-train/second/"), "Ray Train's storage is on the bucket too"
    for host_dir in cluster.host_dirs.values():
        assert not list(host_dir.rglob("commit_success.txt")), host_dir


def test_reported_placement_is_where_the_workers_ran(trained, cluster):
    import ray
    from ray._private.state import actors  # the GCS actor table (no dashboard here)

    _, _, second, began = trained
    assert [p.rank for p in second.placements] == [0, 1]
    assert len(second.slice_names) == 1 and second.slice_names[0] in ("train-0", "train-1")
    assert sorted(p.tpu_worker_id for p in second.placements) == [0, 1]
    workers = [
        a
        for a in actors().values()
        if a["ActorClassName"] == "RayTrainWorker" and a["StartTime"] / 1000 >= began
    ]
    assert len(workers) == 2, [a["ActorClassName"] for a in actors().values()]
    assert {a["Address"]["NodeID"] for a in workers} == {p.node_id for p in second.placements}
    # The reservation the run reports is the placement group its workers ran in.
    from ray.util import placement_group_table

    (group,) = second.placement_groups
    table = placement_group_table()
    assert group in table, sorted(table)
    nodes = set(table[group]["bundles_to_node_id"].values())
    assert nodes == {p.node_id for p in second.placements}, table[group]
    labels = {n["NodeID"]: n["Labels"] for n in ray.nodes()}
    for placement in second.placements:
        node = labels[placement.node_id]
        assert node[LABEL_SLICE_NAME] == placement.slice_name
        assert node[LABEL_WORKER_ID] == str(placement.tpu_worker_id)


def test_checkpoint_restores_identical_parameters_from_gs(trained):
    from workloads.model.byte_lm import params_digest
    from workloads.model.checkpoint import restore_params

    config, _, second, _ = trained
    params, _, step = restore_params(config.checkpoint_dir)
    assert step == 8
    assert params_digest(params) == second.params_digest


# ------------------------------------------------------------------------ serving
@pytest.fixture(scope="module")
def serving(trained):
    from workloads.serving import app as serving_module
    from workloads.serving.replica import ServeOptions

    config, *_ = trained
    handle = serving_module.deploy(
        serving_module.build_app(
            config.checkpoint_dir,
            V6E_2X2,
            options=ServeOptions(precompile=False),  # short prompts only here
        ),
        port=free_port(),
        timeout_s=180,
    )
    try:
        yield handle
    finally:
        serving_module.shutdown()


def test_http_round_trip_on_the_serving_slice(serving):
    prompts = ["The old teacher", "Where did", "In the morning", "A curious cat"]

    def ask(prompt: str):
        return post_json(serving.url, {"prompt": prompt, "max_new_tokens": 12, "temperature": 0})

    with ThreadPoolExecutor(len(prompts)) as pool:
        replies = list(pool.map(ask, prompts))
    for prompt, reply in zip(prompts, replies, strict=True):
        assert reply.status == 200, reply.body
        assert reply.body["prompt"] == prompt
        assert 1 <= len(reply.body["completion"]) <= 12
        assert reply.body["host"] == "serve-0"
        assert reply.body["checkpoint_step"] == 8
        assert 1 <= reply.body["batch_size"] <= 4


def test_a_replica_computes_on_every_chip_of_its_host(serving):
    from ray import serve

    seen = serve.get_app_handle(serving.name).describe.remote().result(timeout_s=60)
    chips = V6E_2X2.chips_per_host
    assert len(seen["local_devices"]) == chips
    assert seen["param_devices"] == [chips], "every parameter replicated on all chips"
    assert seen["batch_devices"] == chips and seen["batch_axes"] == ["data"]
    assert seen["rows_per_device"] == [seen["batch_rows"] // chips]
    assert seen["logits_devices"] == chips
    assert all(size % chips == 0 for size in seen["buckets"])


@pytest.mark.parametrize(
    ("raw", "status", "fragment"),
    [
        (b"{nope", 400, "not valid JSON"),
        (b'"just a string"', 400, "valid: a JSON object"),
        (b'{"prompt": ""}', 422, "empty prompt"),
        (b'{"prompt": "' + b"a" * 1001 + b'"}', 413, "too long"),
        (b'{"prompt": "hi", "max_new_tokens": -3}', 422, "max_new_tokens: -3"),
        (b'{"prompt": "hi", "temperature": "hot"}', 422, "temperature: 'hot'"),
    ],
    ids=["bad-json", "not-object", "empty-prompt", "too-long", "bad-tokens", "bad-temperature"],
)
def test_bad_requests_get_4xx_over_http(serving, raw, status, fragment):
    reply = post_json(serving.url, None, raw=raw, timeout_s=30)
    assert reply.status == status
    assert fragment in reply.body["error"]
