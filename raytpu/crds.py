"""Validate custom resources (KubeRay, managed Prometheus) against their real CRD schemas, as the
API server does.

The Kubernetes API server does not validate the object it receives as it stands: for a custom
resource with a structural schema it first drops every ``null`` on a field that is not
``nullable`` and has no default (``command:`` with nothing after it), then applies the schema's
``default`` values (a worker group without ``minReplicas`` gets 0, without ``maxReplicas``
2147483647), and only then validates (Kubernetes docs, "Defaulting and Nullable"; KEP-575).
:func:`admitted` does those two steps in that order on a copy, :func:`validate_spec` validates
the result; a wrong type or a missing required field without a default stays an error.

A :class:`CrdSet` is one API group's CRDs in one folder, fetched at the pin of
:mod:`raytpu.crd_pins` (``raytpu crds fetch``; :mod:`raytpu.gmp_crds` and :mod:`raytpu.kueue` hold
the other two sets). Point ``$RAYTPU_KUBERAY_CRDS`` at CRDs exported from a live cluster
(``kubectl get crd rayclusters.ray.io -o yaml > crds/ray.io_rayclusters.yaml``) to check against
exactly the operator version GKE runs. These checks are offline checks (``raytpu check``,
``raytpu preview``, the tests): declaring resources never reads a CRD.
"""

from __future__ import annotations

import copy
import functools
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from jsonschema import Draft202012Validator

from raytpu.crd_pins import CrdPin, pin
from raytpu.errors import invalid


class CrdsMissingError(FileNotFoundError):
    """The CRD files are not where we look for them."""


@dataclass(frozen=True)
class CrdSet:
    """The CRDs of one API group (``ray.io/v1``...) in one folder, and how to check objects."""

    api_version: str
    kinds: dict[str, str] = field(hash=False)
    """kind -> plural (the CRD file is ``<group>_<plural>.yaml``)."""
    pin: CrdPin
    """Where the files come from and which folder holds them."""
    report_unknown: bool = True
    """Report fields the schema does not know (the API server would drop them silently)."""
    body_kinds: frozenset[str] = frozenset()
    """Kinds without a ``spec`` (Kueue's WorkloadPriorityClass: ``value``, ``description``):
    their own fields, less apiVersion/kind/metadata, are validated instead."""

    @property
    def group(self) -> str:
        return self.api_version.split("/")[0]

    @property
    def version(self) -> str:
        return self.api_version.split("/")[1]

    @property
    def env_var(self) -> str:
        return self.pin.env_var

    def crds_dir(self) -> Path:
        return self.pin.local_dir()

    def filenames(self) -> list[str]:
        """The CRD files of this set: ``<group>_<plural>.yaml`` per kind."""
        return [f"{self.group}_{plural}.yaml" for plural in self.kinds.values()]

    def missing(self) -> list[str]:
        """The CRD files not in :meth:`crds_dir` (empty when the set can be checked)."""
        return [name for name in self.filenames() if not (self.crds_dir() / name).is_file()]

    def spec_schema(self, kind: str) -> dict[str, Any]:
        return _spec_schema(self, kind, str(self.crds_dir()))

    def admitted(self, kind: str, spec: Any) -> Any:
        """A copy of ``spec`` as the API server validates it: non-nullable nulls pruned,
        defaults set."""
        schema = self.spec_schema(kind)
        result = copy.deepcopy(spec)
        _prune_nulls(result, schema)
        _apply_defaults(result, schema)
        return result

    def validate_spec(self, kind: str, spec: Any) -> list[str]:
        """Schema errors of a ``spec`` of ``kind`` (empty when the API server would accept it).

        Validates :meth:`admitted` (pruned and defaulted), as the API server does. Each error is
        ``"spec.path.to.field: message"``.
        """
        admitted = self.admitted(kind, spec)
        errors = (
            _unknown_fields(admitted, self.spec_schema(kind), "spec") if self.report_unknown else []
        )
        validator = _validator(self, kind, str(self.crds_dir()))
        for error in sorted(validator.iter_errors(admitted), key=lambda e: list(e.absolute_path)):
            path = ".".join(str(p) for p in ("spec", *error.absolute_path))
            errors.append(f"{path}: {error.message}")
        return errors

    def validate_object(self, obj: dict[str, Any]) -> list[str]:
        """Schema errors of a whole object of this group."""
        errors = []
        if obj.get("apiVersion") != self.api_version:
            errors.append(invalid("apiVersion", obj.get("apiVersion"), [self.api_version]))
        kind = obj.get("kind")
        if not isinstance(kind, str) or kind not in self.kinds:
            return [*errors, invalid("kind", kind, self.kinds)]
        if kind in self.body_kinds:
            body = {k: v for k, v in obj.items() if k not in _OBJECT_KEYS}
            return errors + [e.removeprefix("spec.") for e in self.validate_spec(kind, body)]
        return errors + self.validate_spec(kind, obj.get("spec"))


_OBJECT_KEYS = ("apiVersion", "kind", "metadata")


def load_crd_yaml(source: Any) -> Any:
    """One CRD's YAML (a string, bytes or an open file; KubeRay's are over 1 MB each), with
    libyaml's C loader where PyYAML was built with it (about 10x faster), else the Python one."""
    return yaml.load(source, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


@functools.cache
def _spec_schema(crds: CrdSet, kind: str, directory: str) -> dict[str, Any]:
    if kind not in crds.kinds:
        raise ValueError(
            f"kind: {kind!r} is not a {crds.group} kind; valid: {', '.join(crds.kinds)}"
        )
    plural = crds.kinds[kind]
    path = Path(directory) / f"{crds.group}_{plural}.yaml"
    if not path.is_file():
        raise CrdsMissingError(
            f"CRD for {kind} not found at {path}; run `raytpu crds fetch` (the "
            f"{crds.pin.title} CRDs at {crds.pin.ref}) or set {crds.env_var} to a folder holding "
            f"{crds.group}_{plural}.yaml (e.g. from `kubectl get crd {plural}.{crds.group} -o yaml`)"
        )
    with path.open() as handle:
        crd = load_crd_yaml(handle)
    found = object_schema(crd, crds.version)
    if found is None:
        raise CrdsMissingError(f"{path} has no {crds.version} version")
    schema = _python_patterns(found)
    if kind in crds.body_kinds:
        properties = {k: v for k, v in schema["properties"].items() if k not in _OBJECT_KEYS}
        return {**schema, "properties": properties}
    return schema["properties"]["spec"]


def object_schema(crd: Any, version: str) -> dict[str, Any] | None:
    """The ``openAPIV3Schema`` of ``version`` in a CRD object (a file's, or a live one as
    ``kubectl get crd NAME -o json`` prints it); None when the CRD serves no such version."""
    versions = (crd.get("spec") or {}).get("versions") if isinstance(crd, dict) else None
    for entry in versions or []:
        if isinstance(entry, dict) and entry.get("name") == version:
            schema = (entry.get("schema") or {}).get("openAPIV3Schema")
            return schema if isinstance(schema, dict) else None
    return None


def unknown_field_paths(value: Any, schema: Any, path: str = "spec") -> list[str]:
    """The paths of the fields of ``value`` that ``schema`` does not know: what an API server
    serving that schema drops without a word (``spec.authOptions`` on a CRD older than it)."""
    return [message.split(": ", 1)[0] for message in _unknown_fields(value, schema, path)]


_GO_LEADING_FLAGS = re.compile(r"^\^\(\?([a-zA-Z]+)\)")


def _python_patterns(schema: Any) -> Any:
    """``schema`` with its ``pattern``s in Python's dialect: the API server's Go regexps may
    set flags after ``^`` (Kueue's AdmissionCheck: ``^(?i)[a-z]...``), Python's only first."""
    if isinstance(schema, list):
        return [_python_patterns(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    found = {key: _python_patterns(value) for key, value in schema.items()}
    if isinstance(found.get("pattern"), str):
        found["pattern"] = _GO_LEADING_FLAGS.sub(r"(?\1)^", found["pattern"])
    return found


@functools.cache
def _validator(crds: CrdSet, kind: str, directory: str) -> Draft202012Validator:
    return Draft202012Validator(_spec_schema(crds, kind, directory))


def _field_schema(schema: Any, key: str) -> Any:
    """The schema of ``key`` in an object of ``schema`` (properties, else additionalProperties)."""
    if not isinstance(schema, dict):
        return None
    properties = schema.get("properties") or {}
    if key in properties:
        return properties[key]
    extra = schema.get("additionalProperties")
    return extra if isinstance(extra, dict) else None


def _prune_nulls(value: Any, schema: Any) -> None:
    """Step 1: drop nulls of fields that are neither ``nullable`` nor defaulted (in place)."""
    if isinstance(value, dict):
        for key in list(value):
            sub = _field_schema(schema, key)
            droppable = isinstance(sub, dict) and not sub.get("nullable") and "default" not in sub
            if value[key] is None and droppable:
                del value[key]
                continue
            _prune_nulls(value[key], sub)
    elif isinstance(value, list):
        items = schema.get("items") if isinstance(schema, dict) else None
        for item in value:
            _prune_nulls(item, items)


def _apply_defaults(value: Any, schema: Any) -> None:
    """Step 2: fill absent fields (and non-nullable nulls) with the schema's defaults (in place)."""
    if not isinstance(schema, dict):
        return
    if isinstance(value, dict):
        for key, sub in (schema.get("properties") or {}).items():
            if not isinstance(sub, dict) or "default" not in sub:
                continue
            if key not in value or (value[key] is None and not sub.get("nullable", False)):
                value[key] = copy.deepcopy(sub["default"])
        for key, item in value.items():
            _apply_defaults(item, _field_schema(schema, key))
    elif isinstance(value, list):
        for item in value:
            _apply_defaults(item, schema.get("items"))


def _unknown_fields(value: Any, schema: Any, path: str) -> list[str]:
    """Fields of ``value`` its schema does not know (and does not preserve)."""
    unknown: list[str] = []
    if not isinstance(schema, dict):
        return unknown
    if isinstance(value, dict) and "properties" in schema:
        preserve = schema.get("x-kubernetes-preserve-unknown-fields", False)
        for key, item in value.items():
            if key in schema["properties"]:
                unknown += _unknown_fields(item, schema["properties"][key], f"{path}.{key}")
            elif not preserve and "additionalProperties" not in schema:
                unknown.append(f"{path}.{key}: unknown field (the API server would drop it)")
    elif isinstance(value, list):
        for index, item in enumerate(value):
            unknown += _unknown_fields(item, schema.get("items"), f"{path}[{index}]")
    return unknown


KUBERAY = CrdSet(
    api_version="ray.io/v1",
    kinds={"RayCluster": "rayclusters", "RayJob": "rayjobs", "RayService": "rayservices"},
    pin=pin("kuberay"),
)
"""KubeRay's RayCluster, RayJob and RayService."""

KINDS = KUBERAY.kinds
crds_dir = KUBERAY.crds_dir
admitted = KUBERAY.admitted
validate_spec = KUBERAY.validate_spec
validate_object = KUBERAY.validate_object
