"""Which Ray a stack runs: the explicit version and the version an image tag names.

Stdlib only: shared by the stack config (``infra.config``) and the policy pack
(``policies.rules.ray_version``), so that both accept and refuse the same images.
"""

from __future__ import annotations

import re

MINIMUM_RAY_VERSION = "2.55.0"
"""The first Ray with the TPU slice API (``ray.util.tpu.slice_placement_group``)."""

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
