"""Where a run's files live: ``gs://`` through one native client, or a local folder.

Glossary:

- **checkpoint directory**: the Orbax ``CheckpointManager`` root of a run (``gs://BUCKET/RUN`` on
  GKE: the stack's checkpoint bucket, ``checkpointBucket`` in its outputs).
- **Ray Train storage**: ``RunConfig(storage_path=...)``, where Ray Train keeps the run's state
  and its reported checkpoints; here a ``ray-train`` folder beside the checkpoint directory
  (``gs://BUCKET/ray-train``), on the same bucket and outside Orbax's folder of steps.

Why a native client and not a GCS FUSE mount: Orbax already writes ``gs://`` natively (its array
shards through tensorstore's GCS driver with conditional writes, its small files through
``etils.epath``/gcsfs) and marks a finished step with a ``commit_success.txt`` object instead of
an atomic rename, which a FUSE mount cannot give (a rename there is copy-then-delete, not
atomic, and slow for folders). GCS objects are strongly consistent for read-after-write and
list-after-write, so host B sees what host A finished; a FUSE mount adds a metadata cache that
must be tuned off for that. Both clients stream each host's own shards in parallel, with no
per-pod sidecar to size. Ray Train gets the same gcsfs client, wrapped as a pyarrow filesystem,
instead of pyarrow's own GCS client, so that one client, one set of credentials (the pod's
Workload Identity) and one emulator switch cover everything. docs/workloads/training.md ("Checkpoint storage") has the details.

A local folder is a valid checkpoint directory only for a run in one process: on GKE each TPU
host is its own VM with its own disk, so a multi-host run cannot write one checkpoint to a local
path (:func:`require_shared`).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from raytpu.errors import invalid
from raytpu.gcs_names import check_gs_path

REMOTE_SCHEMES = ("gs://",)
RAY_TRAIN_FOLDER = "ray-train"


def is_remote(directory: str) -> bool:
    """Whether every host of a slice reaches ``directory`` (an object store URL)."""
    return directory.startswith(REMOTE_SCHEMES)


def join(directory: str, *names: str) -> str:
    """``directory/names...`` for a URL or a local path."""
    if is_remote(directory):
        return "/".join([directory.rstrip("/"), *names])
    return str(Path(directory, *names))


def require_shared(field: str, directory: str, processes: int) -> None:
    """Refuse a local ``directory`` for a run of more than one process (one per TPU host), and a
    ``gs://`` one whose bucket is not a GCS bucket name."""
    check_gs_path(field, directory)
    if processes > 1 and not is_remote(directory):
        raise ValueError(
            invalid(
                field,
                directory,
                "gs://BUCKET/PATH (the stack's checkpoint bucket, output checkpointBucket)",
                reason=f"{processes} processes on {processes} TPU hosts: each host has its own "
                "disk, so no host would see the others' shards",
            )
        )


def ray_train_storage(checkpoint_dir: str) -> tuple[str, Any]:
    """``(storage_path, storage_filesystem)`` for Ray Train's ``RunConfig``, beside the
    checkpoint directory. For ``gs://`` the filesystem is gcsfs wrapped for pyarrow and the path has no
    scheme (Ray Train's rule when a filesystem is given); locally it is ``None``."""
    if not is_remote(checkpoint_dir):
        return str(Path(checkpoint_dir).absolute().parent / RAY_TRAIN_FOLDER), None
    bucket_path = checkpoint_dir.removeprefix("gs://").rstrip("/")
    import gcsfs
    import pyarrow.fs

    quiet_clients()
    filesystem = pyarrow.fs.PyFileSystem(pyarrow.fs.FSSpecHandler(gcsfs.GCSFileSystem()))
    parent = bucket_path.rsplit("/", 1)[0] if "/" in bucket_path else bucket_path
    return f"{parent}/{RAY_TRAIN_FOLDER}", filesystem


def quiet_clients() -> None:
    """gcsfs warns on every bucket it cannot classify (hierarchical or flat) without the
    Storage Control API, which the emulator lacks and the objects API does not need."""
    logging.getLogger("gcsfs").setLevel(logging.ERROR)
