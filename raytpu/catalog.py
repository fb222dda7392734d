"""The one TPU catalog: every slice shape that infra, policies and workloads talk about.

Stdlib only, so that the policy pack, the Pulumi program and Ray workers can all import it.

The generations' rows live in :mod:`raytpu.generations`; this module derives from them.

Glossary (Ray's and GKE's words; generation, accelerator version and Ray accelerator type are
in :mod:`raytpu.generations`):

- **topology**: the physical shape of a slice, ``AxB`` (2D) or ``AxBxC`` (3D); chips = product.
- **host**: one TPU VM, i.e. one Kubernetes node, i.e. one Ray worker node.
  ``hosts = chips / chips_per_host``; chips per host is the ``-Nt`` suffix of the machine type.
- **slice**: all hosts of one topology, joined by the inter-chip interconnect. A multi-host slice
  is one GKE node pool and must be reserved whole: a partial slice hangs in its first collective.
- **pod type**: generation plus TensorCore count, the ``TPU_ACCELERATOR_TYPE`` a host sees
  (``v6e-16``; ``v4-32`` is 16 chips since v4 has 2 cores per chip).

A :class:`SliceShape` stores only generation, topology and chips per host; everything else is
derived from them. The v5e/v6e ``2x4`` topology is one host on an 8-chip machine and two hosts
on a 4-chip machine: it is never guessed, the caller must name the machine type.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from raytpu.generations import GENERATION_ROWS, GENERATIONS, CatalogError, Generation

__all__ = [
    "MULTI_HOST_CHIPS_PER_HOST",
    "RAY_TPU_REQUEST_SIZES",
    "WORKLOAD_POLICY_TYPE",
    "SliceShape",
    "common_shapes",
    "generation",
    "parse_topology",
    "shape",
    "shape_from_gke_labels",
    "shape_from_machine_type",
]

TPU_RESOURCE = "google.com/tpu"
"""Kubernetes extended resource a TPU pod requests (chips on its host)."""
GKE_ACCELERATOR_LABEL = "cloud.google.com/gke-tpu-accelerator"
GKE_TOPOLOGY_LABEL = "cloud.google.com/gke-tpu-topology"
GKE_SPOT_LABEL = "cloud.google.com/gke-spot"  # "true" on every Spot VM node
INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"
"""Kubernetes' well-known node label: the machine type (tells 2x4 on -4t from -8t hosts)."""
TPU_TAINT_KEY = "google.com/tpu"
"""GKE taints TPU nodes ``google.com/tpu=present:NoSchedule``."""
MULTI_HOST_CHIPS_PER_HOST = 4
"""Multi-host slices are built from 4-chip hosts only, in every generation."""
WORKLOAD_POLICY_TYPE = "HIGH_THROUGHPUT"
"""The workload-policy type of a multi-host pool on generations with ``workload_policy``."""
RAY_TPU_REQUEST_SIZES = (1, 2, 4, 8)
"""The ``TPU`` amounts a Ray task or actor may request (bundles are not limited)."""


_LOOKUP: dict[str, Generation] = {}
for _g in GENERATION_ROWS:
    for _key in (
        _g.name,
        _g.accelerator_version,
        _g.gke_accelerator,
        _g.ray_accelerator_type,
        *_g.aliases,
    ):
        _LOOKUP[_key.lower()] = _g

_TOPOLOGY_RE = re.compile(r"^[1-9][0-9]*(x[1-9][0-9]*){1,2}$")


def _join(items: Any) -> str:
    return ", ".join(items)


def generation(name: str) -> Generation:
    """The generation for any of its names (``v6e``, ``TPU-V6E``, ``tpu-v6e-slice``, ``v5litepod``)."""
    found = _LOOKUP.get(str(name).strip().lower())
    if found is None:
        raise CatalogError("generation", name, _join(GENERATIONS))
    return found


def parse_topology(topology: str) -> tuple[int, ...]:
    """``"2x2x4"`` -> ``(2, 2, 4)``; raises :class:`CatalogError` on anything else."""
    text = str(topology).strip().lower()
    if not _TOPOLOGY_RE.match(text):
        raise CatalogError("topology", topology, "AxB (v5e, v6e) or AxBxC (v4, v5p, tpu7x)")
    return tuple(int(d) for d in text.split("x"))


@dataclass(frozen=True)
class SliceShape:
    """A TPU slice: generation, topology and chips per host. All else is derived.

    Build one with :func:`shape`, :func:`shape_from_machine_type` or
    :func:`shape_from_gke_labels`; those validate. Constructing it directly skips validation.
    """

    generation: Generation
    topology: str
    chips_per_host: int

    @property
    def dimensions(self) -> tuple[int, ...]:
        return tuple(int(d) for d in self.topology.split("x"))

    @property
    def chips(self) -> int:
        return math.prod(self.dimensions)

    @property
    def hosts(self) -> int:
        """Hosts (TPU VMs, Kubernetes nodes, Ray worker nodes) in one slice."""
        return self.chips // self.chips_per_host

    @property
    def multi_host(self) -> bool:
        return self.hosts > 1

    @property
    def machine_type(self) -> str:
        return self.generation.machine_type(self.chips_per_host)

    @property
    def uses_workload_policy(self) -> bool:
        """Whether this slice's node pool is placed by a workload policy (tpu7x multi-host)."""
        return self.multi_host and self.generation.workload_policy

    def workers(self, tpu_per_worker: int | None = None) -> int:
        """Workers (placement bundles) per slice when each asks for ``tpu_per_worker`` chips.

        Defaults to one worker per host. Ray's own arithmetic (``ray.util.tpu``): chips divided by
        chips per worker, at least one.
        """
        tpu = int(tpu_per_worker or self.chips_per_host)
        if tpu < 1:
            raise CatalogError("tpuPerWorker", tpu_per_worker, "an integer >= 1")
        return max(1, self.chips // tpu)

    @property
    def gke_accelerator(self) -> str:
        return self.generation.gke_accelerator

    @property
    def ray_accelerator_type(self) -> str:
        return self.generation.ray_accelerator_type

    @property
    def accelerator_version(self) -> str:
        return self.generation.accelerator_version

    @property
    def tensorcores(self) -> int:
        return self.chips * self.generation.cores_per_chip

    @property
    def pod_type(self) -> str:
        """``TPU_ACCELERATOR_TYPE`` as a host sees it: ``v6e-16``, ``v4-32``, ``v5litepod-8``."""
        return f"{self.generation.accelerator_version}-{self.tensorcores}"

    @property
    def ray_head_resource(self) -> str:
        """Resource Ray puts on worker 0 of each slice: ``TPU-v6e-16-head``."""
        return f"TPU-{self.pod_type}-head"

    @property
    def node_selector(self) -> dict[str, str]:
        """The two GKE node labels a pod of this slice must select."""
        return {GKE_ACCELERATOR_LABEL: self.gke_accelerator, GKE_TOPOLOGY_LABEL: self.topology}

    def node_labels(self, *, spot: bool) -> dict[str, str]:
        """Labels every host of this slice carries (a Kueue ResourceFlavor's ``nodeLabels``)."""
        labels = {**self.node_selector, INSTANCE_TYPE_LABEL: self.machine_type}
        if spot:
            labels[GKE_SPOT_LABEL] = "true"
        return labels

    @property
    def name(self) -> str:
        """Short human name: ``v6e 2x4 (2 hosts x 4 chips)``."""
        return f"{self.generation.name} {self.topology} ({self.hosts} hosts x {self.chips_per_host} chips)"

    def to_dict(self) -> dict[str, Any]:
        """The catalog record, camelCase like the ``raytpu catalog --json`` output."""
        return {
            "generation": self.generation.name,
            "topology": self.topology,
            "machineType": self.machine_type,
            "chipsPerHost": self.chips_per_host,
            "hosts": self.hosts,
            "chips": self.chips,
            "gkeAccelerator": self.gke_accelerator,
            "rayAcceleratorType": self.ray_accelerator_type,
            "acceleratorVersion": self.accelerator_version,
            "podType": self.pod_type,
            "multiHost": self.multi_host,
        }


def _allowed_chips_per_host(gen: Generation, topology: str) -> tuple[int, ...]:
    """Chips-per-host values with which ``topology`` is a real slice of ``gen`` (may be empty)."""
    dims = parse_topology(topology)
    if len(dims) != gen.dims:
        example = "AxB, e.g. 4x4" if gen.dims == 2 else "AxBxC, e.g. 2x2x4"
        raise CatalogError(
            "topology",
            topology,
            gen.topologies_text(),
            f"{gen.name} topologies are {gen.dims}D: {example}",
        )
    allowed = [chips for topo, chips in gen.single_host if topo == topology]
    multi = topology in gen.multi_host
    if not multi and gen.cube_rule and list(dims) == sorted(dims):
        multi = all(d % 4 == 0 for d in dims) and math.prod(dims) <= gen.max_chips
    if multi:
        allowed.extend(c for c in gen.chips_per_host_options if c == MULTI_HOST_CHIPS_PER_HOST)
    return tuple(dict.fromkeys(allowed))


def shape(
    generation_name: str,
    topology: str,
    *,
    machine_type: str | None = None,
    chips_per_host: int | None = None,
) -> SliceShape:
    """Validate and build a slice shape.

    ``machine_type`` or ``chips_per_host`` pick the host size; when both are omitted the
    topology must fit exactly one host size (v5e/v6e ``2x4`` does not: name the machine type).
    """
    gen = generation(generation_name)
    topology = str(topology).strip().lower()
    allowed = _allowed_chips_per_host(gen, topology)
    if not allowed:
        raise CatalogError("topology", topology, gen.topologies_text(), f"for {gen.name}")
    if machine_type is not None:
        by_machine = dict(gen.machine_types)
        if machine_type not in by_machine:
            raise CatalogError("machineType", machine_type, _join(by_machine), f"for {gen.name}")
        from_machine = by_machine[machine_type]
        if chips_per_host is not None and int(chips_per_host) != from_machine:
            raise CatalogError(
                "chipsPerHost",
                chips_per_host,
                str(from_machine),
                f"{machine_type} has {from_machine} chips per host",
            )
        chips_per_host = from_machine
    if chips_per_host is None:
        if len(allowed) > 1:
            options = _join(f"{gen.machine_type(c)} ({c} chips/host)" for c in allowed)
            raise CatalogError(
                "machineType",
                None,
                options,
                f"{gen.name} {topology} exists on more than one host size; name the machine type",
            )
        chips_per_host = allowed[0]
    chips_per_host = int(chips_per_host)
    if chips_per_host not in allowed:
        options = _join(f"{gen.machine_type(c)} ({c} chips/host)" for c in allowed)
        raise CatalogError(
            "machineType",
            gen.machine_type(chips_per_host)
            if chips_per_host in gen.chips_per_host_options
            else chips_per_host,
            options,
            f"{gen.name} {topology} is not built from {chips_per_host}-chip hosts",
        )
    return SliceShape(gen, topology, chips_per_host)


def shape_from_machine_type(machine_type: str, topology: str | None) -> SliceShape:
    """The shape of a GKE node pool: its machine type plus its ``tpu_topology`` (None: one host)."""
    for gen in GENERATION_ROWS:
        if machine_type in dict(gen.machine_types):
            if topology is None:
                chips = dict(gen.machine_types)[machine_type]
                single = [t for t, c in gen.single_host if c == chips]
                if not single:
                    raise CatalogError(
                        "topology", None, gen.topologies_text(), f"{machine_type} needs a topology"
                    )
                topology = single[0]
            return shape(gen.name, topology, machine_type=machine_type)
    known = _join(m for g in GENERATION_ROWS for m, _ in g.machine_types)
    raise CatalogError("machineType", machine_type, known)


def shape_from_gke_labels(accelerator: str, topology: str, chips_per_host: int) -> SliceShape:
    """The shape a pod asks for: its two GKE node selector labels and its ``google.com/tpu`` count."""
    gens = [g for g in GENERATION_ROWS if g.gke_accelerator == accelerator]
    if not gens:
        raise CatalogError(
            GKE_ACCELERATOR_LABEL, accelerator, _join(g.gke_accelerator for g in GENERATION_ROWS)
        )
    return shape(gens[0].name, topology, chips_per_host=chips_per_host)


def common_shapes() -> list[SliceShape]:
    """Shapes worth listing: every single-host shape and the common multi-host ones."""
    shapes: list[SliceShape] = []
    for gen in GENERATION_ROWS:
        for topology in gen.common_topologies:
            for chips in _allowed_chips_per_host(gen, topology):
                shapes.append(SliceShape(gen, topology, chips))
    return shapes
