"""Validate Managed Service for Prometheus objects (PodMonitoring, Rules...) against the GMP CRDs.

The CRDs are read from ``$RAYTPU_GMP_CRDS`` or, by default, ``../shared/gmp/crds`` beside the
repository (the GMP operator's ``charts/operator/crds``). Like the API server, a ``spec`` is
first defaulted from the schema (``interval: 1m``...); a field the schema does not know is
reported (the API server would prune it silently), then the schema is applied.
"""

from __future__ import annotations

import copy
import functools
import os
from pathlib import Path
from typing import Any

import yaml
from jsonschema import Draft202012Validator

GMP_CRDS_ENV = "RAYTPU_GMP_CRDS"
DEFAULT_GMP_CRDS_DIR = Path(__file__).resolve().parents[1].parent / "shared" / "gmp" / "crds"
API_VERSION = "monitoring.googleapis.com/v1"
KINDS = {
    "PodMonitoring": "podmonitorings",
    "ClusterPodMonitoring": "clusterpodmonitorings",
    "Rules": "rules",
    "ClusterRules": "clusterrules",
    "GlobalRules": "globalrules",
}


class GmpCrdsMissingError(FileNotFoundError):
    """The GMP CRD files are not where we look for them."""


def crds_dir() -> Path:
    return Path(os.environ.get(GMP_CRDS_ENV) or DEFAULT_GMP_CRDS_DIR)


@functools.cache
def _schema(kind: str, directory: str) -> dict[str, Any]:
    if kind not in KINDS:
        raise ValueError(f"kind: {kind!r} is not a GMP kind; valid: {', '.join(KINDS)}")
    path = Path(directory) / f"monitoring.googleapis.com_{KINDS[kind]}.yaml"
    if not path.is_file():
        raise GmpCrdsMissingError(
            f"GMP CRD for {kind} not found at {path}; set {GMP_CRDS_ENV} to a folder holding "
            f"monitoring.googleapis.com_{KINDS[kind]}.yaml"
        )
    crd = yaml.safe_load(path.read_text())
    versions = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    if not versions:
        raise GmpCrdsMissingError(f"{path} has no v1 version")
    return versions[0]["schema"]["openAPIV3Schema"]["properties"]["spec"]


def _default_and_find_unknown(value: Any, schema: dict[str, Any], path: str) -> list[str]:
    """Fill schema defaults into ``value`` in place; return fields the schema does not know."""
    unknown: list[str] = []
    if isinstance(value, dict) and "properties" in schema:
        props = schema["properties"]
        for key, sub in props.items():
            if key not in value and "default" in sub:
                value[key] = copy.deepcopy(sub["default"])
        preserve = schema.get("x-kubernetes-preserve-unknown-fields", False)
        for key, item in value.items():
            if key in props:
                unknown += _default_and_find_unknown(item, props[key], f"{path}.{key}")
            elif not preserve and "additionalProperties" not in schema:
                unknown.append(f"{path}.{key}: unknown field (the API server would drop it)")
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for index, item in enumerate(value):
            unknown += _default_and_find_unknown(item, schema["items"], f"{path}[{index}]")
    return unknown


def validate_object(obj: dict[str, Any]) -> list[str]:
    """Problems of a whole GMP object (empty when the API server would accept it as written)."""
    problems = []
    if obj.get("apiVersion") != API_VERSION:
        problems.append(f"apiVersion: {obj.get('apiVersion')!r} is not valid; valid: {API_VERSION}")
    kind = obj.get("kind")
    if kind not in KINDS:
        return [*problems, f"kind: {kind!r} is not valid; valid: {', '.join(KINDS)}"]
    schema = _schema(kind, str(crds_dir()))
    spec = copy.deepcopy(obj.get("spec"))
    problems += _default_and_find_unknown(spec, schema, "spec")
    validator = Draft202012Validator(schema)
    for error in sorted(validator.iter_errors(spec), key=lambda e: list(e.absolute_path)):
        where = ".".join(str(p) for p in ("spec", *error.absolute_path))
        problems.append(f"{where}: {error.message}")
    return problems
