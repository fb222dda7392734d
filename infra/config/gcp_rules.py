"""Value rules of GCP, GKE and Ray that the config checks: names, regions, zones, GKE and Ray
versions, images, quantities."""

from __future__ import annotations

import re
from typing import Any

from infra.config.reader import Problems
from infra.config.schema import NAMESPACE
from raytpu import catalog, generations
from raytpu.ray_versions import (
    MINIMUM_RAY_VERSION,
    PINNED_RAY_VERSION,
    image_version,
    parse_version,
)

MIN_RAY_VERSION = parse_version(MINIMUM_RAY_VERSION)
"""The oldest Ray the upgrade matrix passed (the slice API is in 2.55 on)."""
MAX_RAY_VERSION = parse_version(PINNED_RAY_VERSION)
"""The newest Ray the upgrade matrix passed: the pinned one."""
MIN_GKE_VERSION = "1.30.0-gke.1747000"
"""The Ray Operator add-on needs this GKE version or later."""
FLEX_START_TPU_GKE_VERSION = "1.33.0-gke.1712000"
"""Flex-start TPU node pools need this GKE version or later."""
DEFAULT_GKE_VERSION = "1.33"

ZONE_RE = re.compile(r"^([a-z]+-[a-z]+[0-9]+)-[a-z]$")
REGION_RE = re.compile(r"^[a-z]+-[a-z]+[0-9]+$")
PROJECT_RE = re.compile(r"^[a-z][-a-z0-9]{4,28}[a-z0-9]$")
GKE_VERSION_RE = re.compile(r"^([0-9]+)\.([0-9]+)(?:\.([0-9]+)(?:-gke\.([0-9]+))?)?$")
CIDR_RE = re.compile(r"^([0-9]{1,3}\.){3}[0-9]{1,3}/([0-9]|[12][0-9]|3[0-2])$")
IMPORT_PATH_RE = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
RESERVATION_RE = re.compile(
    r"^(projects/[a-z][-a-z0-9]+/reservations/)?[a-z]([-a-z0-9]*[a-z0-9])?$"
)
SLICE_NAME_MAX = 28
"""Node pool names are ``<slice>-<index>`` and GKE allows 40 characters."""
RAY_NAME_MAX = 40
"""KubeRay derives Service and Pod names from the object name; keep room for suffixes."""


def parse_gke_version(text: str) -> tuple[int, int, int, int] | None:
    match = GKE_VERSION_RE.match(text)
    if not match:
        return None
    major, minor, patch, gke = match.groups()
    # "1.31" means the newest 1.31 patch: compare it as the largest.
    big = 10**9
    return (
        int(major),
        int(minor),
        int(patch) if patch is not None else big,
        int(gke) if gke is not None else big,
    )


def gke_version_ok(text: str, minimum_text: str = MIN_GKE_VERSION) -> bool:
    parsed = parse_gke_version(text)
    minimum = parse_gke_version(minimum_text)
    return parsed is not None and minimum is not None and parsed >= minimum


def parse_ray_version(problems: Problems, value: Any) -> str | None:
    path = f"{NAMESPACE}:rayVersion"
    valid = (
        f"an explicit Ray version X.Y.Z from {MINIMUM_RAY_VERSION} to {PINNED_RAY_VERSION} (the "
        f"releases the upgrade matrix passed), quoted (e.g. '{PINNED_RAY_VERSION}'); never 'latest'"
    )
    if value is None:
        problems.bad(path, None, valid)
        return None
    if not isinstance(value, str):
        problems.bad(path, value, valid, "quote it: YAML reads 2.60 as a number")
        return None
    parsed = parse_version(value)
    if parsed is None or not MIN_RAY_VERSION <= parsed <= MAX_RAY_VERSION:
        problems.bad(path, value, valid)
        return None
    return value


def image_check(problems: Problems, path: str, image: Any, ray_version: str | None) -> bool:
    """An image's tag must name the Ray version it runs, the same as ``rayVersion`` (the policy
    pack's ``pinned-ray-version`` judges images with the same :func:`image_version`)."""
    version_text = ray_version or "X.Y.Z"
    valid = (
        f"an image whose tag names Ray {version_text}, e.g. rayproject/ray:{version_text}-py311 "
        f"or REGISTRY/ray:{version_text}-py311-abc123 (a @sha256 digest may follow; never :latest)"
    )
    if not isinstance(image, str) or not image.strip():
        problems.bad(path, image, valid)
        return False
    version, why = image_version(image)
    if version is None:
        problems.bad(path, image, valid, why)
        return False
    if ray_version and version != ray_version:
        problems.bad(
            path, image, valid, f"it runs Ray {version}, KubeRay is told {NAMESPACE}:rayVersion"
        )
        return False
    return True


def catalog_free_machine(machine_type: str) -> bool:
    """True unless ``machine_type`` is a TPU host (those belong in ``ray-tpu:slices``)."""
    try:
        catalog.shape_from_machine_type(machine_type, None)
    except generations.CatalogError as error:
        return error.field == "machineType" and error.value == machine_type
    return False


def zone_region(zone: str) -> str | None:
    match = ZONE_RE.match(zone) if isinstance(zone, str) else None
    return match.group(1) if match else None


def check_zone(problems: Problems, path: str, zone: Any, region: str | None) -> bool:
    valid = (
        f"a zone of gcp:region {region}, e.g. {region}-a" if region else "a zone, e.g. us-east5-b"
    )
    if not isinstance(zone, str) or zone_region(zone) is None:
        problems.bad(path, zone, valid)
        return False
    if region is not None and zone_region(zone) != region:
        problems.bad(path, zone, valid, f"{zone} is in {zone_region(zone)}")
        return False
    return True
