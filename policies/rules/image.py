"""Rule: a RayService or RayJob runs in an image that holds the code it starts.

The stock ``rayproject/ray`` image (any tag) has Ray and Python only: a Serve ``import_path`` of
this project (``workloads.serve:app``) or an entrypoint that runs it (``python -m raytpu_cli
train``, ``raytpu ...``) fails there at import, after the slice was paid for. Such an object needs
the worker image built from ``Dockerfile`` (``ray-tpu:imageTag`` / ``ray-tpu:rayImage``), unless
its runtime env brings both the code (``working_dir`` / ``py_modules``) and the packages
(``pip`` / ``uv`` / ``conda``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import yaml

from policies.props import as_list, get, is_unknown
from policies.resources import kind_of, pod_templates
from raytpu.entrypoints import WORKER_PACKAGES
from raytpu.ray_versions import STOCK_RAY_REPOSITORY, is_stock_ray_image

__all__ = ["check_image_has_code", "imports_project"]

_PROJECT = re.compile(
    r"(?<![\w.-])(?:" + "|".join(re.escape(p) for p in WORKER_PACKAGES) + r")(?=$|[\s.:;&|)'\"])"
)
"""A word that names one of this project's packages (``raytpu_cli``, ``workloads.serving.app``) or its
``raytpu`` command."""
_CODE_KEYS = ("working_dir", "py_modules")
_PACKAGE_KEYS = ("pip", "uv", "conda")
FIX = (
    f"build the worker image from Dockerfile (it installs {', '.join(WORKER_PACKAGES)} and "
    "jax[tpu]), push it, and run it: leave ray-tpu:rayImage unset and set ray-tpu:imageTag to "
    "the pushed tag (the deploy workflow does both), or point rayImage at that image"
)


def imports_project(text: str) -> bool:
    """Whether an import path or a shell command names this project's code."""
    return bool(_PROJECT.search(text))


def _brings_code(runtime_env: Any) -> bool:
    if not isinstance(runtime_env, Mapping):
        return False
    return any(runtime_env.get(k) for k in _CODE_KEYS) and any(
        runtime_env.get(k) for k in _PACKAGE_KEYS
    )


def _yaml(text: Any) -> Any:
    if not isinstance(text, str):
        return None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return None


def _needs(props: Mapping[str, Any], kind: str) -> list[tuple[str, str]]:
    """(field, what it starts) for every import path / entrypoint of this project's code."""
    found: list[tuple[str, str]] = []
    if kind == "RayService":
        config = _yaml(get(props, "spec.serveConfigV2"))
        apps = as_list(get(config, "applications")) if isinstance(config, Mapping) else []
        for i, app in enumerate(apps if isinstance(apps, list) else []):
            path = get(app, "import_path")
            if (
                isinstance(path, str)
                and imports_project(path.split(":")[0])
                and not _brings_code(get(app, "runtime_env"))
            ):
                found.append((f"spec.serveConfigV2.applications[{i}].import_path", path))
    elif kind == "RayJob":
        entrypoint = get(props, "spec.entrypoint")
        runtime_env = _yaml(get(props, "spec.runtimeEnvYAML"))
        if (
            isinstance(entrypoint, str)
            and imports_project(entrypoint)
            and not _brings_code(runtime_env)
        ):
            found.append(("spec.entrypoint", entrypoint))
    return found


def check_image_has_code(props: Mapping[str, Any], kind: str | None = None) -> list[str]:
    """Violations: a RayService/RayJob starting this project's code in the stock Ray image."""
    kind = kind or kind_of(props)
    if kind not in ("RayService", "RayJob"):
        return []
    needs = _needs(props, kind)
    if not needs:
        return []
    stock: list[tuple[str, str]] = []
    for template_path, pod in pod_templates(props, kind):
        containers = as_list(get(pod, "containers"))
        if is_unknown(containers) or not isinstance(containers, list) or not containers:
            continue
        image = get(containers[0], "image")
        if isinstance(image, str) and is_stock_ray_image(image):
            stock.append((f"{template_path}.containers[0].image", image))
    violations = []
    for field, image in stock:
        starts = "; ".join(f"{where} = {what!r}" for where, what in needs)
        violations.append(
            f"{field}: {image!r} is the stock {STOCK_RAY_REPOSITORY} image, which has none of "
            f"this project's code or packages, but {starts} needs them (it fails at import, "
            f"after the TPU slice starts); {FIX}"
        )
    return violations
