"""Rule 4: a KubeRay object pins one explicit Ray version, the same in ``rayVersion`` and images.

Ray's TPU slice API (``ray.util.tpu``, JaxTrainer ``use_tpu``) is alpha, so a Ray release is
used only once the upgrade matrix passed it (:data:`raytpu.ray_versions.TESTED_RAY_VERSIONS`);
a cluster whose head and workers run different Ray versions fails at ``ray start``. So
``rayVersion`` is an explicit ``X.Y.Z`` from the oldest tested release to the newest (options
``minimumVersion``, ``maximumVersion``), and the Ray container (the first container
of the head and of every worker group, as KubeRay reads it) names the same version in its image
tag (``rayproject/ray:2.60.0-py311``); no ``latest``, no untagged image.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from policies.props import as_list, get, is_unknown
from policies.resources import cluster_spec, pod_templates
from raytpu.errors import invalid
from raytpu.ray_versions import (
    MINIMUM_RAY_VERSION,
    PINNED_RAY_VERSION,
    UNRENDERED,
    image_version,
    parse_version,
)

DEFAULT_MINIMUM_VERSION = MINIMUM_RAY_VERSION
DEFAULT_MAXIMUM_VERSION = PINNED_RAY_VERSION
"""The newest Ray the upgrade matrix passed (``tools/ray_matrix.py``)."""


def check_ray_version(
    props: Mapping[str, Any],
    kind: str | None = None,
    minimum_version: str = DEFAULT_MINIMUM_VERSION,
    maximum_version: str = DEFAULT_MAXIMUM_VERSION,
) -> list[str]:
    """Violations of the pinned-Ray rule for one RayCluster / RayService / RayJob."""
    found = cluster_spec(props, kind)
    if found is None:
        return []
    path, spec = found
    minimum, maximum = parse_version(minimum_version), parse_version(maximum_version)
    if minimum is None:
        raise ValueError(invalid("minimumVersion", minimum_version, "X.Y.Z, e.g. 2.55.0"))
    if maximum is None:
        raise ValueError(invalid("maximumVersion", maximum_version, "X.Y.Z, e.g. 2.60.0"))
    violations: list[str] = []
    ray_version = get(spec, "rayVersion")
    pinned: str | None = None
    if is_unknown(ray_version):
        pass
    elif not isinstance(ray_version, str) or not ray_version.strip():
        violations.append(
            f"{path}.rayVersion: not set; set it to the Ray version of the images "
            f"(an explicit X.Y.Z >= {minimum_version})"
        )
    else:
        parsed = parse_version(ray_version)
        if parsed is None:
            violations.append(
                f"{path}.rayVersion: {ray_version!r} is not an explicit version; valid: X.Y.Z "
                f">= {minimum_version}, e.g. 2.60.0"
            )
        else:
            pinned = ray_version.strip()
            if parsed < minimum:
                violations.append(
                    f"{path}.rayVersion: {ray_version} is older than {minimum_version}, the "
                    f"oldest Ray the upgrade matrix passed; pin Ray >= {minimum_version} in "
                    f"rayVersion and images"
                )
            elif parsed > maximum:
                violations.append(
                    f"{path}.rayVersion: {ray_version} is newer than {maximum_version}, the "
                    f"newest Ray the upgrade matrix passed; run tools/ray_matrix.py --versions "
                    f"{ray_version} and add it to raytpu/ray_versions.py TESTED_RAY_VERSIONS, or "
                    f"pin Ray <= {maximum_version} in rayVersion and images"
                )
    for template_path, pod in pod_templates(props, kind):
        containers = as_list(get(pod, "containers"))
        if is_unknown(containers) or not containers:
            continue
        image = get(containers[0], "image")
        field = f"{template_path}.containers[0].image"
        if is_unknown(image):
            continue
        if not isinstance(image, str) or not image.strip():
            violations.append(f"{field}: not set; name a Ray image tagged with {pinned or 'X.Y.Z'}")
            continue
        version, why = image_version(image.strip())
        if version is None:
            fix = (
                "render it to an image tagged with" if why.startswith(UNRENDERED) else "tag it with"
            )
            violations.append(
                f"{field}: {image!r} {why}; {fix} the Ray version, e.g. "
                f"rayproject/ray:{pinned or '2.60.0'}-py311"
            )
        elif pinned is not None and version != pinned:
            violations.append(
                f"{field}: {image!r} runs Ray {version} but rayVersion is {pinned}; head, workers "
                f"and rayVersion must name the same Ray version"
            )
        elif pinned is None:
            parsed = parse_version(version)
            if parsed is not None and not minimum <= parsed <= maximum:
                violations.append(
                    f"{field}: {image!r} runs Ray {version}, outside the releases the upgrade "
                    f"matrix passed ({minimum_version} to {maximum_version}); use one of them"
                )
    return violations


__all__ = ["DEFAULT_MAXIMUM_VERSION", "DEFAULT_MINIMUM_VERSION", "check_ray_version"]
