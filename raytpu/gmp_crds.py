"""Validate Managed Service for Prometheus objects (PodMonitoring, Rules...) against the GMP CRDs.

The CRDs are the GMP operator's ``charts/operator/crds`` at the pin of :mod:`raytpu.crd_pins`,
read from ``$RAYTPU_GMP_CRDS`` or ``.crds/gmp`` (``raytpu crds fetch``). As the API server does, a ``spec`` is
pruned and defaulted from the schema (``interval: 1m``...) before it is validated
(:class:`raytpu.crds.CrdSet`); a field the schema does not know is reported too (the API server
would drop it silently).
"""

from __future__ import annotations

from raytpu.crd_pins import pin
from raytpu.crds import CrdSet

GMP = CrdSet(
    api_version="monitoring.googleapis.com/v1",
    kinds={
        "PodMonitoring": "podmonitorings",
        "ClusterPodMonitoring": "clusterpodmonitorings",
        "Rules": "rules",
        "ClusterRules": "clusterrules",
        "GlobalRules": "globalrules",
    },
    pin=pin("gmp"),
)

API_VERSION = GMP.api_version
validate_object = GMP.validate_object
