"""The commands a Ray job runs for this project's workloads: one place for ``raytpu submit`` and
the KubeRay RayJob (``infra.rayjob_spec``). Stdlib and the catalog only.

Glossary (Ray's words): the **entrypoint** is the shell command of a Ray job's driver; it runs
on the head and starts the work on the TPU worker hosts (Ray Train's JaxTrainer for training).
"""

from __future__ import annotations

from collections.abc import Sequence

from raytpu.catalog import SliceShape

TRAIN_MODULE = "workloads.train"
SERVE_IMPORT_PATH = "workloads.serve:app"
SERVE_TPU_ENV = "RAYTPU_SERVE_TPU_PER_REPLICA"
"""TPU chips each Serve replica of ``workloads.serve:app`` requests: the serving host's chips."""
CHECKPOINT_ENV = "RAYTPU_CHECKPOINT_DIR"
"""Where ``workloads.serve:app`` finds the training checkpoints (``gs://...`` on GKE)."""


def train_command(shape: SliceShape, num_slices: int, extra: Sequence[str] = ()) -> list[str]:
    """``python -m workloads.train`` sized to ``num_slices`` slices of ``shape`` (argv list)."""
    return [
        "python",
        "-m",
        TRAIN_MODULE,
        "--generation",
        shape.generation.name,
        "--topology",
        shape.topology,
        "--machine-type",
        shape.machine_type,
        "--num-slices",
        str(num_slices),
        *extra,
    ]


def serve_command(extra: Sequence[str] = ()) -> list[str]:
    """Deploy the Serve app on a RayCluster from a job; Serve keeps it after the job ends."""
    return ["serve", "run", "--non-blocking", SERVE_IMPORT_PATH, *extra]


def slice_env(stack: str, cluster: str, slice_name: str, shape: SliceShape) -> dict[str, str]:
    """Environment variables a job gets, naming where it runs (for logs and workloads)."""
    return {
        "RAYTPU_STACK": stack,
        "RAYTPU_CLUSTER": cluster,
        "RAYTPU_SLICE": slice_name,
        "RAYTPU_TOPOLOGY": shape.topology,
        "RAYTPU_ACCELERATOR_TYPE": shape.ray_accelerator_type,
        "RAYTPU_CHIPS_PER_HOST": str(shape.chips_per_host),
    }


def serve_env(shape: SliceShape) -> dict[str, str]:
    """Environment ``workloads.serve:app`` needs on a slice of ``shape``: one replica per host,
    requesting all of that host's chips."""
    return {SERVE_TPU_ENV: str(shape.chips_per_host)}
