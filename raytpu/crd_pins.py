"""Where each set of CustomResourceDefinitions comes from, pinned: one row per API group.

The schema checks (:class:`raytpu.crds.CrdSet`) validate custom resources against the CRDs the
cluster's operators install. Those files are not part of this repository: ``raytpu crds fetch``
downloads each set at its pin into ``.crds/<name>/`` (git-ignored), the CI workflow does the same,
and ``$RAYTPU_<NAME>_CRDS`` points a set at another folder (a development copy, or CRDs exported
from a live cluster with ``kubectl get crd <plural>.<group> -o yaml``). Declaring resources never
needs them: ``pulumi preview`` and ``pulumi up`` run without; the offline checks say which sets they
skipped.

Pins (bump a row, then run ``raytpu crds fetch`` and the CRD tests):

- **kuberay**: the KubeRay release whose CRDs the GKE Ray Operator add-on serves (ray.io/v1).
- **kueue**: the Kueue release the program installs (:data:`raytpu.kueue.KUEUE_VERSION`).
- **gmp**: the GKE managed-Prometheus operator (monitoring.googleapis.com/v1), by commit.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from raytpu.errors import invalid

REPO = Path(__file__).resolve().parents[1]
LOCAL_HOME = (REPO if (REPO / "pyproject.toml").is_file() else Path.cwd()) / ".crds"
"""Where ``raytpu crds fetch`` puts each set by default: ``.crds/`` of the checkout (git-ignored),
or of the current folder when ray-tpu is installed from a wheel."""
RAW_BASE = "https://raw.githubusercontent.com"


@dataclass(frozen=True)
class CrdPin:
    """One CRD set at one pinned ref of its upstream repository."""

    name: str
    title: str
    repository: str
    """GitHub ``owner/name``."""
    ref: str
    """A release tag or a full commit SHA, never a branch."""
    path: str
    """The folder of ``<group>_<plural>.yaml`` files in the repository."""

    @property
    def env_var(self) -> str:
        return f"RAYTPU_{self.name.upper()}_CRDS"

    def local_dir(self) -> Path:
        """``$RAYTPU_<NAME>_CRDS`` when set, else ``.crds/<name>`` in the repository."""
        return Path(os.environ.get(self.env_var) or LOCAL_HOME / self.name)

    def url(self, filename: str, base: str = RAW_BASE) -> str:
        return f"{base.rstrip('/')}/{self.repository}/{self.ref}/{self.path}/{filename}"


PINS = (
    CrdPin("kuberay", "KubeRay", "ray-project/kuberay", "v1.7.0", "ray-operator/config/crd/bases"),
    CrdPin("kueue", "Kueue", "kubernetes-sigs/kueue", "v0.19.2", "config/components/crd/bases"),
    CrdPin(
        "gmp",
        "GKE managed Prometheus",
        "GoogleCloudPlatform/prometheus-engine",
        "2ffde4ec7b7e4ca1da4e32f36b692945b78a60e4",
        "charts/operator/crds",
    ),
)


def pin(name: str) -> CrdPin:
    """The pin called ``name`` (``kuberay``, ``kueue``, ``gmp``)."""
    for row in PINS:
        if row.name == name:
            return row
    raise ValueError(invalid("crd set", name, [row.name for row in PINS]))
