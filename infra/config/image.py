"""The worker image: built from ``Dockerfile``, pushed to the stack's Artifact Registry repository.

Its reference is ``REGION-docker.pkg.dev/PROJECT/REPOSITORY/ray:<rayVersion>-py3XX-<imageTag>``:
the tag starts with the Ray version (``ray-tpu:rayVersion``, which the config and the policy pack
check on every image), then the Python of the ``rayproject/ray`` base (``ray-tpu:pythonVersion``),
then the build (``ray-tpu:imageTag``; the deploy workflow sets the git commit). Without
``imageTag`` the tag is the first 12 characters of the checkout's commit, which is what the
deploy workflow builds and pushes for that commit.

``python -m infra.worker_image STACK [--tag TAG]`` prints the reference for the deploy workflow.
"""

from __future__ import annotations

import functools
import re
import subprocess
from pathlib import Path
from typing import Any

from infra.config.reader import Problems, Section
from infra.config.schema import NAMESPACE, PYTHON_VERSIONS, ImageConfig
from raytpu.ray_versions import VLLM_IMAGE_NAME, VLLM_TPU_FOR_RAY, vllm_image_tag

IMAGE_NAME = "ray"
DEFAULT_REPOSITORY = "ray-tpu"
TAG_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$")
REPOSITORY_RE = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
GIT_TAG_LENGTH = 12
REPO_ROOT = Path(__file__).resolve().parents[2]


@functools.cache
def git_image_tag(folder: Path = REPO_ROOT) -> str | None:
    """The first 12 characters of the commit checked out in ``folder`` (None without git)."""
    try:
        done = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=folder,
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    sha = done.stdout.strip()
    return sha[:GIT_TAG_LENGTH] if done.returncode == 0 and sha else None


def worker_image(registry: str, ray_version: str, image: ImageConfig) -> str:
    """``REGISTRY/ray:<rayVersion>-py3XX-<tag>``."""
    return f"{registry}/{IMAGE_NAME}:{ray_version}-{image.python_tag}-{image.tag}"


def vllm_image(registry: str, ray_version: str, image: ImageConfig) -> str | None:
    """``REGISTRY/ray-vllm:<rayVersion>-py312-vllm-tpu<pin>-<tag>`` (``Dockerfile.vllm``), or None
    for a Ray version without a vllm-tpu pin (:data:`raytpu.ray_versions.VLLM_TPU_FOR_RAY`)."""
    if ray_version not in VLLM_TPU_FOR_RAY or not image.tag:
        return None
    return f"{registry}/{VLLM_IMAGE_NAME}:{vllm_image_tag(ray_version, image.tag)}"


class _TopLevel(Section):
    """The stack's top-level ``ray-tpu:`` keys (unknown ones are the stack parser's to report)."""

    def __init__(self, problems: Problems, raw: Any) -> None:
        prefix = f"{NAMESPACE}:"
        top = {k[len(prefix) :]: v for k, v in raw.items() if str(k).startswith(prefix)}
        super().__init__(problems, NAMESPACE, top, tuple(top))

    def sub(self, key: str) -> str:
        return f"{NAMESPACE}:{key}"


TAG_HINT = (
    "the deploy workflow sets it; by hand: pulumi config set ray-tpu:imageTag "
    "$(git rev-parse HEAD | cut -c1-12), after pushing that image (README: Running it for real)"
)


def parse_image(problems: Problems, raw: Any, *, needed: bool) -> ImageConfig | None:
    """``ray-tpu:imageRepository``, ``imageTag``, ``pythonVersion`` (top-level keys).

    ``needed``: ``rayImage`` is unset, so the worker image is the default and needs its tag.
    """
    s = _TopLevel(problems, raw)
    repository = s.get(
        "imageRepository",
        str,
        DEFAULT_REPOSITORY,
        valid="an Artifact Registry repository id: lowercase letters, digits, '-', <= 63 chars",
        check=lambda v: bool(REPOSITORY_RE.match(v)),
    )
    tag = s.get(
        "imageTag",
        str,
        git_image_tag() or "",
        valid="the build part of the worker image tag, e.g. the git commit 0123456789ab "
        "(letters, digits, '_', '.', '-', <= 64 chars)",
        check=lambda v: bool(TAG_RE.match(v)),
        hint=TAG_HINT,
    )
    if tag == "" and needed:
        problems.bad(
            s.sub("imageTag"),
            None,
            "the build part of the worker image tag (no git checkout to take the commit from)",
            TAG_HINT,
        )
        tag = None
    python = s.get(
        "pythonVersion",
        str,
        PYTHON_VERSIONS[0],
        valid=", ".join(PYTHON_VERSIONS) + " (quoted: YAML reads 3.12 as a number)",
        check=lambda v: v in PYTHON_VERSIONS,
    )
    if None in (repository, tag, python):
        return None
    return ImageConfig(repository=repository, tag=tag, python=python)
