"""The commands a Ray job runs for this project's workloads: one place for ``raytpu submit`` and
the KubeRay RayJob (``infra.manifests.rayjob``). Stdlib and the catalog only.

Glossary (Ray's words): the **entrypoint** is the shell command of a Ray job's driver; it runs
on the head and starts the work on the TPU worker hosts (Ray Train's JaxTrainer for training).
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Sequence
from pathlib import Path

from raytpu.catalog import MULTI_HOST_CHIPS_PER_HOST, SliceShape

_REPO_ROOT = Path(__file__).resolve().parents[1]
WORKER_EXCLUDED_DEPENDENCIES = ("ray", "pulumi", "fake-gcs-server")
"""Requirements never put in a worker image or runtime env: Ray is the image's own, Pulumi runs
on your laptop, and the GCS emulator stands in for the bucket only on your laptop."""

TRAIN_COMMAND = ("python", "-m", "raytpu_cli", "train")
"""The training driver: ``raytpu train`` (:mod:`raytpu_cli.train`), which the worker image ships."""
SERVE_IMPORT_PATH = "workloads.serve:app"
SERVE_TPU_ENV = "RAYTPU_SERVE_TPU_PER_REPLICA"
"""TPU chips each Serve replica of ``workloads.serve:app`` requests: the serving host's chips."""
SERVE_TPU_DEFAULT = MULTI_HOST_CHIPS_PER_HOST
"""Chips per replica when :data:`SERVE_TPU_ENV` is unset: a 4-chip host, which every generation has."""
CHECKPOINT_ENV = "RAYTPU_CHECKPOINT_DIR"
"""Where ``workloads.serve:app`` finds the training checkpoints (``gs://...`` on GKE)."""
SERVE_FALLBACK_ENV = "RAYTPU_SERVE_FALLBACK"
"""JSON of ``workloads.serving.fallback.FallbackConfig`` (no key in it): where requests go when the TPU
deployment has no capacity."""
FALLBACK_KEY_ENV = "RAYTPU_FALLBACK_API_KEY"
"""The external fallback's API key, filled on every Ray pod from a Kubernetes secret."""
COMPILATION_CACHE_ENV = "RAYTPU_COMPILATION_CACHE_DIR"
"""JAX's persistent compilation cache of a training worker or a Serve replica
(:func:`workloads.model.compile_cache.from_env`); unset or empty: no cache. The stack sets it on
every Ray pod to :func:`compilation_cache_uri` of its bucket."""
COMPILATION_CACHE_FOLDER = "jax-compilation-cache"
"""The cache's folder in the stack's bucket, beside the runs' checkpoint folders."""


def compilation_cache_uri(bucket: str) -> str:
    """``gs://BUCKET/jax-compilation-cache``: where the stack's pods keep JAX's compilations."""
    return f"gs://{bucket}/{COMPILATION_CACHE_FOLDER}"


LLM_IMPORT_PATH = "ray.serve.llm:build_openai_app"
"""The production engine path: Ray Serve LLM's OpenAI app (vLLM; on TPU, vLLM's TPU backend)."""
SERVE_DEPLOYMENT = "TextGenerator"
"""The deployment of ``workloads.serve:app`` (its class name): what a Serve config overrides."""
DEFAULT_RUN = "train"
"""The training run a RayService serves by default: the checkpoints of ``gs://BUCKET/train``,
where ``raytpu submit train`` on the RayCluster ``train`` writes."""
WORKER_PACKAGES = ("workloads", "raytpu", "raytpu_cli")
"""This project's packages that run on Ray: the worker image (``Dockerfile``) installs them, and
a stock ``rayproject/ray`` image has none of them."""


def checkpoint_uri(bucket: str, run: str) -> str:
    """Where training run ``run`` keeps its checkpoints in the stack's bucket: ``gs://BUCKET/RUN``."""
    return f"gs://{bucket}/{run}"


def train_command(shape: SliceShape, num_slices: int, extra: Sequence[str] = ()) -> list[str]:
    """``raytpu train`` sized to ``num_slices`` slices of ``shape`` (argv list)."""
    return [
        *TRAIN_COMMAND,
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


def _project(pyproject: Path) -> dict:
    with pyproject.open("rb") as handle:
        return tomllib.load(handle)["project"]


def worker_requirements(pyproject: Path = _REPO_ROOT / "pyproject.toml") -> list[str]:
    """Pinned packages for a stock Ray image: the project's dependencies and its ``tpu`` extra
    (``jax[tpu]``), without Ray itself and Pulumi."""
    project = _project(pyproject)
    wanted = [*project["dependencies"], *project["optional-dependencies"]["tpu"]]

    return [
        r
        for r in wanted
        if not any(
            _requirement_name(r) == x or _requirement_name(r).startswith(x + "-")
            for x in WORKER_EXCLUDED_DEPENDENCIES
        )
    ]


def image_requirements(pyproject: Path = _REPO_ROOT / "pyproject.toml") -> list[str]:
    """What the project's Ray image installs: :func:`worker_requirements` and the ``notebook``
    extra (``ray-tpu:notebooks`` runs JupyterLab in this image unless ``image`` names another).
    Jobs on a stock image get :func:`worker_requirements` only."""
    notebook = _project(pyproject)["optional-dependencies"]["notebook"]
    return [*worker_requirements(pyproject), *notebook]


VLLM_EXCLUDED_FROM_RAY_LLM = ("vllm", "nixl", "nixl-cu13")
"""Requirements of Ray's ``llm`` extra that the vLLM image leaves to ``vllm-tpu``: ``vllm`` is the
CUDA build (both install the ``vllm`` package), and Ray 2.60's ``nixl==1.3.2`` / ``nixl-cu13``
clash with vllm-tpu 0.29.0's ``nixl==0.3.0``."""
_LLM_EXTRA = re.compile(r"""\s*(?:\band\s+)?extra\s*==\s*["']llm["']\s*(?:and\b)?""")


def vllm_requirements(ray_requires: Sequence[str], vllm_tpu: str) -> list[str]:
    """What ``Dockerfile.vllm`` installs on a stock Ray image: Ray Serve LLM's own dependencies
    (the ``llm`` extra of the image's Ray, from ``importlib.metadata.requires("ray")``, markers
    kept, the extra's clause dropped) without :data:`VLLM_EXCLUDED_FROM_RAY_LLM`, and
    ``vllm-tpu==<vllm_tpu>``."""
    wanted = []
    for requirement in ray_requires:
        spec, _, marker = requirement.partition(";")
        if not _LLM_EXTRA.search(marker):
            continue
        if _requirement_name(spec) in VLLM_EXCLUDED_FROM_RAY_LLM:
            continue
        rest = _LLM_EXTRA.sub(" ", marker).strip()
        wanted.append(f"{spec.strip()}; {rest}" if rest else spec.strip())
    return [*wanted, f"vllm-tpu=={vllm_tpu}"]


def _requirement_name(requirement: str) -> str:
    for stop in "[<>=!~ ;":
        requirement = requirement.split(stop, 1)[0]
    return requirement.strip().lower().replace("_", "-")
