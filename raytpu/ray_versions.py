"""Which Ray a stack runs: the explicit version and the version an image tag names.

Stdlib only: shared by the stack config (``infra.config``) and the policy pack
(``policies.rules.ray_version``), so that both accept and refuse the same images.
"""

from __future__ import annotations

import re

PINNED_RAY_VERSION = "2.60.0"
"""The Ray the project installs (``pyproject.toml``) and the stacks run."""
TESTED_RAY_VERSIONS = ("2.56.1", "2.57.1", "2.58.1", "2.59.0", "2.60.0")
"""The Ray releases the upgrade matrix passed (``tools/ray_matrix.py``; the table in
``docs/delivery.md``), oldest first. The policy pack and the stack config accept ``rayVersion``
from the first to the last (the pinned one). 2.55.0 and 2.55.1 fail the matrix: their JaxTrainer
starts ``jax.distributed`` for TPU and CUDA only, so on the simulation's CPU JAX every worker is
a one-process JAX (on TPU they would start it; the matrix cannot show that)."""
MINIMUM_RAY_VERSION = TESTED_RAY_VERSIONS[0]
"""The oldest Ray the upgrade matrix passed (the TPU slice API, ``ray.util.tpu``, is in 2.55 on,
but 2.55.x cannot be run on the simulated slice, see above)."""

# ASCII digits only: ``\d`` would also match full-width and other Unicode digits (full-width "2.60.0"),
# which int() accepts but no image registry tag or pip version does.
_VERSION = re.compile(r"([0-9]+)\.([0-9]+)\.([0-9]+)")
_TAG_VERSION = re.compile(r"^v?([0-9]+\.[0-9]+\.[0-9]+)(?:\Z|[-_.+])")
_TEMPLATE = re.compile(r"\$\{?[A-Za-z_][A-Za-z0-9_]*\}?|\{\{.*?\}\}")
"""A placeholder a manifest renderer fills in: ``$VLLM_IMAGE``, ``${IMAGE}``, ``{{ .Values.image }}``."""
UNRENDERED = "is an unrendered template"
STOCK_RAY_REPOSITORY = "rayproject/ray"
"""Ray's published images: Ray and its Python only, none of this project's code or packages."""
_DOCKER_HUB = ("docker.io/", "index.docker.io/", "registry-1.docker.io/")
_PYTHON_TAG = re.compile(r"(?:^|[-_.])py3([0-9]{1,2})(?=$|[-_.+])")


def template_placeholder(image: str) -> str | None:
    """The first template placeholder in ``image`` (``$VLLM_IMAGE``), or None for a real image."""
    found = _TEMPLATE.search(image)
    return found.group(0) if found else None


def parse_version(text: str) -> tuple[int, int, int] | None:
    """``"2.60.0"`` -> ``(2, 60, 0)``; None for anything that is not exactly ``X.Y.Z`` in ASCII
    digits (no spaces, no newline: the text becomes an image tag)."""
    found = _VERSION.fullmatch(text)
    return (int(found[1]), int(found[2]), int(found[3])) if found else None


def image_version(image: str) -> tuple[str | None, str]:
    """(Ray version named by the image's tag, or None and why not).

    ``rayproject/ray:2.60.0-py311`` -> ``"2.60.0"``; a custom image is fine when its tag starts
    with the version (``REGISTRY/ray:2.60.0-py311-abc123``, a digest may follow the tag).
    """
    placeholder = template_placeholder(image)
    if placeholder is not None:
        return None, f"{UNRENDERED} ({placeholder} is filled in when the manifest is rendered)"
    name = image.split("@", 1)[0]
    last = name.rsplit("/", 1)[-1]
    if ":" not in last:
        if "@" in image:
            return None, "is pinned by digest only, with no version tag"
        return None, "has no tag (Kubernetes pulls :latest)"
    tag = last.rsplit(":", 1)[1]
    found = _TAG_VERSION.match(tag)
    if not found:
        return None, f"has tag {tag!r}, which names no explicit Ray version"
    return found.group(1), ""


def image_repository(image: str) -> str:
    """The repository of an image reference, without tag, digest and the Docker Hub host:
    ``docker.io/rayproject/ray:2.60.0-py311@sha256:...`` -> ``rayproject/ray``."""
    name = image.strip().split("@", 1)[0]
    head, _, last = name.rpartition("/")
    last = last.split(":", 1)[0]
    name = f"{head}/{last}" if head else last
    for host in _DOCKER_HUB:
        if name.startswith(host):
            name = name[len(host) :]
    return name.removeprefix("library/")


def is_stock_ray_image(image: str) -> bool:
    """True for ``rayproject/ray`` at any tag (and its Docker Hub spellings)."""
    return image_repository(image) == STOCK_RAY_REPOSITORY


def image_python(image: str) -> tuple[int, int] | None:
    """The Python an image's tag names (``...:2.60.0-py312-abc`` -> ``(3, 12)``), else None."""
    name = image.split("@", 1)[0]
    last = name.rsplit("/", 1)[-1]
    if ":" not in last:
        return None
    found = _PYTHON_TAG.search(last.rsplit(":", 1)[1])
    return (3, int(found.group(1))) if found else None


# ------------------------------------------------------------------ the vLLM engine's image
VLLM_TPU_FOR_RAY = {"2.60.0": "0.29.0"}
"""The ``vllm-tpu`` release for each Ray version whose Serve LLM the stacks run: the vLLM version
Ray's own ``llm`` extra pins (Ray 2.60.0's metadata: ``vllm[audio]==0.29.0``), in its TPU build.
vllm-tpu 0.29.0 on PyPI requires ``tpu-inference==0.29.0`` (jax 0.11.0, libtpu 0.0.44) and an
unpinned ``ray``; its wheel is for CPython 3.12 only. ``tests/test_delivery_image.py`` compares
this table with the installed Ray's metadata."""
VLLM_PYTHON = (3, 12)
"""The Python of the vLLM image: vllm-tpu publishes CPython 3.12 wheels only."""
VLLM_IMAGE_NAME = "ray-vllm"
_VLLM_TAG = re.compile(r"(?:^|[-_.])vllm-tpu([0-9]+\.[0-9]+\.[0-9]+)(?=$|[-_.+])")


def image_vllm_tpu(image: str) -> str | None:
    """The vllm-tpu version an image's tag names (``...:2.60.0-py312-vllm-tpu0.29.0-abc`` ->
    ``"0.29.0"``), else None."""
    name = image.split("@", 1)[0]
    last = name.rsplit("/", 1)[-1]
    if ":" not in last:
        return None
    found = _VLLM_TAG.search(last.rsplit(":", 1)[1])
    return found.group(1) if found else None


def vllm_image_problems(image: str, ray_version: str) -> list[str]:
    """Why ``image`` cannot run Ray Serve LLM with vLLM's TPU backend on Ray ``ray_version``
    (each a clause: "names vllm-tpu 0.30.0, not 0.29.0"); none for a good or unrendered image.

    The image must say what it holds in its tag: the Ray version (as every image here), the
    pinned vllm-tpu (``vllm-tpu0.29.0``) and Python 3.12 (``py312``), as ``Dockerfile.vllm``
    tags it. A tag that says less is refused: the pod would fail at import, or load a vLLM that
    Ray's Serve LLM was not released with, after the TPU slice was paid for."""
    if template_placeholder(image) is not None:
        return []
    pinned = VLLM_TPU_FOR_RAY.get(ray_version)
    if pinned is None:
        known = ", ".join(sorted(VLLM_TPU_FOR_RAY))
        return [f"Ray {ray_version} has no vllm-tpu pin here (pinned for Ray {known})"]
    problems = []
    named = image_vllm_tpu(image)
    if named is None:
        problems.append(f"its tag names no vllm-tpu version (wanted vllm-tpu{pinned})")
    elif named != pinned:
        problems.append(f"its tag names vllm-tpu {named}, not the {pinned} Ray {ray_version} pins")
    python = image_python(image)
    if python != VLLM_PYTHON:
        shown = f"py3{python[1]}" if python else "no Python"
        problems.append(f"its tag names {shown}, not py312 (vllm-tpu has 3.12 wheels only)")
    return problems


def vllm_image_tag(ray_version: str, build: str) -> str:
    """The tag ``Dockerfile.vllm``'s image gets: ``2.60.0-py312-vllm-tpu0.29.0-<build>``."""
    pinned = VLLM_TPU_FOR_RAY[ray_version]
    return f"{ray_version}-py3{VLLM_PYTHON[1]}-vllm-tpu{pinned}-{build}"
