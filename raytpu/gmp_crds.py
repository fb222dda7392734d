"""Validate Managed Service for Prometheus objects (PodMonitoring, Rules...) against the GMP CRDs.

The CRDs are read from ``$RAYTPU_GMP_CRDS`` or, by default, ``../shared/gmp/crds`` beside the
repository (the GMP operator's ``charts/operator/crds``). As the API server does, a ``spec`` is
pruned and defaulted from the schema (``interval: 1m``...) before it is validated
(:class:`raytpu.crds.CrdSet`); a field the schema does not know is reported too (the API server
would drop it silently).
"""

from __future__ import annotations

from raytpu.crds import SHARED, CrdSet

GMP = CrdSet(
    api_version="monitoring.googleapis.com/v1",
    kinds={
        "PodMonitoring": "podmonitorings",
        "ClusterPodMonitoring": "clusterpodmonitorings",
        "Rules": "rules",
        "ClusterRules": "clusterrules",
        "GlobalRules": "globalrules",
    },
    env_var="RAYTPU_GMP_CRDS",
    default_dir=SHARED / "gmp" / "crds",
    report_unknown=True,
)

API_VERSION = GMP.api_version
validate_object = GMP.validate_object
