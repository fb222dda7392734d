"""Schema checks of declared objects, as the API server would run them: one row per schema set.

``raytpu preview`` and ``raytpu check`` run every row on what a stack declares (or a file holds):

=======================  ============================================  ===========================
Check (policy name)      Objects                                       Schemas
=======================  ============================================  ===========================
``kuberay-crd-schema``   RayCluster, RayService, RayJob                KubeRay CRDs (``.crds/``)
``kueue-crd-schema``     ResourceFlavor, ClusterQueue, LocalQueue...   Kueue CRDs (``.crds/``)
``gmp-crd-schema``       PodMonitoring, Rules...                       GMP CRDs (``.crds/``)
``kubernetes-schema``    Namespace, ServiceAccount, Role, Service...   kubernetes-validate (pip)
=======================  ============================================  ===========================

A CRD set that is not on disk is skipped, and said once (:meth:`SchemaReport.skipped_line`), with
how to enable it (``raytpu crds fetch``). Every violation is mandatory: the API server would refuse
the object, or silently drop the unknown field.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from raytpu import crds, gmp_crds, k8s_schemas, kueue
from raytpu.crds import CrdSet

DEFAULT_KUBERNETES_MINOR = k8s_schemas.CHANNEL_MINORS["REGULAR"]


@dataclass(frozen=True)
class SchemaCheck:
    """One row: the policy name a violation carries, which objects, and their schemas."""

    policy: str
    crd_set: CrdSet | None
    """``None``: core Kubernetes objects (:mod:`raytpu.k8s_schemas`)."""

    def matches(self, type_token: str) -> bool:
        if self.crd_set is None:
            return k8s_schemas.is_core(type_token)
        prefix = f"kubernetes:{self.crd_set.api_version}:"
        return type_token.startswith(prefix) and type_token[len(prefix) :] in self.crd_set.kinds

    def available(self) -> bool:
        return self.crd_set is None or not self.crd_set.missing()

    def validator(self, minor: str) -> Callable[[dict[str, Any]], list[str]]:
        if self.crd_set is None:
            return lambda obj: k8s_schemas.validate_object(obj, minor)
        return self.crd_set.validate_object


CHECKS = (
    SchemaCheck("kuberay-crd-schema", crds.KUBERAY),
    SchemaCheck("kueue-crd-schema", kueue.KUEUE),
    SchemaCheck("gmp-crd-schema", gmp_crds.GMP),
    SchemaCheck("kubernetes-schema", None),
)


@dataclass(frozen=True)
class SchemaReport:
    """What the schema checks found, and the CRD sets they could not run."""

    violations: list[Any] = field(default_factory=list)
    skipped: tuple[CrdSet, ...] = ()

    def skipped_line(self) -> str | None:
        """One line naming every skipped set and how to enable it (``None``: nothing skipped)."""
        if not self.skipped:
            return None
        names = ", ".join(f"{s.pin.title} ({s.api_version})" for s in self.skipped)
        folders = ", ".join(f"{s.env_var}" for s in self.skipped)
        return (
            f"schema checks skipped: {names}: no CRDs on disk; run `raytpu crds fetch` "
            f"(pinned in raytpu/crd_pins.py) or set {folders}"
        )


def check(resources: Sequence[Any], minor: str = DEFAULT_KUBERNETES_MINOR) -> SchemaReport:
    """Run every row of :data:`CHECKS` on ``resources`` (``DeclaredResource`` or alike)."""
    from policies.evaluation import Violation
    from policies.props import plain

    violations, skipped = [], []
    for row in CHECKS:
        matching = [r for r in resources if row.matches(r.type)]
        if not row.available():
            skipped += [row.crd_set] if matching else []
            continue
        validate = row.validator(minor)
        for resource in matching:
            props = plain(resource.props)
            if _has_unknown(props):
                continue  # a preview's unknown values cannot be schema-checked yet
            for error in validate(dict(props)):
                violations.append(Violation(row.policy, "mandatory", error, resource))
    return SchemaReport(violations, tuple(skipped))


def _has_unknown(value: Any) -> bool:
    from policies.props import is_unknown

    if is_unknown(value):
        return True
    if isinstance(value, Mapping):
        return any(_has_unknown(v) for v in value.values())
    if isinstance(value, list):
        return any(_has_unknown(v) for v in value)
    return False
