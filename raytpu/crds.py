"""Validate KubeRay objects against the real CustomResourceDefinition schemas.

The schemas are read from ``$RAYTPU_KUBERAY_CRDS`` or, by default, ``../shared/kuberay/crds``
beside the repository. Point the variable at CRDs exported from a live cluster
(``kubectl get crd rayclusters.ray.io -o yaml > crds/ray.io_rayclusters.yaml``) to check against
exactly the operator version GKE runs.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any

import yaml
from jsonschema import Draft202012Validator

CRDS_ENV = "RAYTPU_KUBERAY_CRDS"
DEFAULT_CRDS_DIR = Path(__file__).resolve().parents[1].parent / "shared" / "kuberay" / "crds"
KINDS = {"RayCluster": "rayclusters", "RayJob": "rayjobs", "RayService": "rayservices"}


class CrdsMissingError(FileNotFoundError):
    """The CRD files are not where we look for them."""


def crds_dir() -> Path:
    return Path(os.environ.get(CRDS_ENV) or DEFAULT_CRDS_DIR)


@functools.cache
def _validator(kind: str, directory: str) -> Draft202012Validator:
    if kind not in KINDS:
        raise ValueError(f"kind: {kind!r} is not a KubeRay kind; valid: {', '.join(KINDS)}")
    path = Path(directory) / f"ray.io_{KINDS[kind]}.yaml"
    if not path.is_file():
        raise CrdsMissingError(
            f"KubeRay CRD for {kind} not found at {path}; set {CRDS_ENV} to a folder holding "
            f"ray.io_{KINDS[kind]}.yaml (e.g. from `kubectl get crd {KINDS[kind]}.ray.io -o yaml`)"
        )
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # the C loader is 10x faster on 1 MB
    with path.open() as handle:
        crd = yaml.load(handle, Loader=loader)
    versions = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    if not versions:
        raise CrdsMissingError(f"{path} has no v1 version")
    spec_schema = versions[0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    return Draft202012Validator(spec_schema)


def validate_spec(kind: str, spec: Any) -> list[str]:
    """Schema errors of a ``spec`` of ``kind`` (empty when the API server would accept it).

    Each error is ``"spec.path.to.field: message"``.
    """
    validator = _validator(kind, str(crds_dir()))
    errors = []
    for error in sorted(validator.iter_errors(spec), key=lambda e: list(e.absolute_path)):
        path = ".".join(str(p) for p in ("spec", *error.absolute_path))
        errors.append(f"{path}: {error.message}")
    return errors


def validate_object(obj: dict[str, Any]) -> list[str]:
    """Schema errors of a whole KubeRay object (apiVersion ray.io/v1)."""
    errors = []
    if obj.get("apiVersion") != "ray.io/v1":
        errors.append(f"apiVersion: {obj.get('apiVersion')!r} is not valid; valid: ray.io/v1")
    kind = obj.get("kind")
    if not isinstance(kind, str) or kind not in KINDS:
        return [*errors, f"kind: {kind!r} is not valid; valid: {', '.join(KINDS)}"]
    return errors + validate_spec(kind, obj.get("spec"))
