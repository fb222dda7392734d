"""The TPU generations: one row per hardware family, the facts the catalog derives from.

Stdlib only (the policy pack, the Pulumi program and Ray workers import it). To add a
generation, add its row to :data:`GENERATION_ROWS`; :mod:`raytpu.catalog` derives the shapes,
pod types, node labels and machine types from it (docs/contributing.md).

Glossary (Ray's and GKE's words):

- **generation**: TPU hardware family: ``v4``, ``v5e``, ``v5p``, ``v6e``, ``tpu7x`` (Ironwood).
- **accelerator version**: the generation as Ray's ``ray.util.tpu`` spells it (``v5litepod`` for
  v5e, ``v7x`` for tpu7x).
- **Ray accelerator type**: the ``accelerator_type`` Ray schedules on (``TPU-V6E``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from raytpu.errors import invalid


class CatalogError(ValueError):
    """A slice shape that does not exist. Names the field, the bad value and the valid ones."""

    def __init__(self, field: str, value: Any, valid: str, hint: str = "") -> None:
        self.field = field
        self.value = value
        self.valid = valid
        if value is None:
            message = f"{field}: is required; valid: {valid}"
        else:
            message = invalid(field, value, valid)
        if hint:
            message += f" ({hint})"
        super().__init__(message)


@dataclass(frozen=True)
class Generation:
    """One TPU generation and the names each system uses for it."""

    name: str
    """Our name, used in stack config: ``v6e``."""
    accelerator_version: str
    """Ray's ``accelerator_version`` / pod type prefix: ``v6e``, ``v5litepod``, ``v7x``."""
    gke_accelerator: str
    """Value of the ``cloud.google.com/gke-tpu-accelerator`` node label."""
    ray_accelerator_type: str
    """Ray's ``accelerator_type`` resource name: ``TPU-V6E``."""
    dims: int
    """2 for v5e/v6e (``AxB``), 3 for v4/v5p/tpu7x (``AxBxC``)."""
    cores_per_chip: int
    """TensorCores per chip: pod types count cores."""
    machine_types: tuple[tuple[str, int], ...]
    """(GKE machine type, chips per host) pairs."""
    single_host: tuple[tuple[str, int], ...]
    """(topology, chips per host) pairs that fit on one host."""
    multi_host: tuple[str, ...]
    """Explicitly listed multi-host topologies (all on 4-chip hosts)."""
    max_chips: int
    """Largest slice GKE schedules for this generation."""
    peak_bf16_tflops: float
    """Peak dense BF16 TFLOP/s per chip (Google Cloud TPU docs): MFU estimates."""
    hbm_gib: int
    """HBM per chip in GiB: whether a model fits a slice."""
    workload_policy: bool = False
    """Multi-host pools take a ``WORKLOAD_POLICY_TYPE`` workload policy (a
    ``gcp.compute.ResourcePolicy`` named by ``placement_policy.policy_name``) instead of
    COMPACT placement with ``tpu_topology``."""
    min_gke_version: str = ""
    """Oldest GKE version whose TPU node pools run this generation (empty: any the add-on runs)."""
    flex_start: bool = True
    """Whether GKE offers flex-start provisioning for this generation (not for v4)."""
    min_python: tuple[int, int] | None = None
    """Oldest Python of a worker image whose jax[tpu] runs this generation (None: any)."""
    runtime_note: str = ""  # why min_python (the source), for error messages
    cube_rule: bool = False
    """3D generations: beyond ``multi_host``, every ``AxBxC`` with A<=B<=C multiples of 4."""
    aliases: tuple[str, ...] = ()
    common_topologies: tuple[str, ...] = ()
    """Topologies worth listing (``raytpu catalog``), each with every host size it allows."""

    @property
    def chips_per_host_options(self) -> tuple[int, ...]:
        return tuple(chips for _, chips in self.machine_types)

    def machine_type(self, chips_per_host: int) -> str:
        for machine, chips in self.machine_types:
            if chips == chips_per_host:
                return machine
        raise CatalogError(
            "chipsPerHost",
            chips_per_host,
            ", ".join(str(c) for c in self.chips_per_host_options),
            f"{self.name} hosts carry these chip counts",
        )

    def topologies_text(self) -> str:
        listed = list(dict.fromkeys([t for t, _ in self.single_host] + list(self.multi_host)))
        text = ", ".join(listed)
        if self.cube_rule:
            text += f", or AxBxC with A<=B<=C multiples of 4 up to {self.max_chips} chips"
        return text


GENERATION_ROWS: tuple[Generation, ...] = (
    Generation(
        name="v4",
        accelerator_version="v4",
        gke_accelerator="tpu-v4-podslice",
        ray_accelerator_type="TPU-V4",
        dims=3,
        cores_per_chip=2,
        machine_types=(("ct4p-hightpu-4t", 4),),
        single_host=(("2x2x1", 4),),
        multi_host=("2x2x2", "2x2x4", "2x4x4"),
        max_chips=4096,
        peak_bf16_tflops=275,
        hbm_gib=32,
        flex_start=False,
        cube_rule=True,
        common_topologies=("2x2x1", "2x2x2", "2x2x4", "2x4x4", "4x4x4", "4x4x8"),
    ),
    Generation(
        name="v5e",
        accelerator_version="v5litepod",
        gke_accelerator="tpu-v5-lite-podslice",
        ray_accelerator_type="TPU-V5LITEPOD",
        dims=2,
        cores_per_chip=1,
        machine_types=(("ct5lp-hightpu-1t", 1), ("ct5lp-hightpu-4t", 4), ("ct5lp-hightpu-8t", 8)),
        single_host=(("1x1", 1), ("2x2", 4), ("2x4", 8)),
        multi_host=("2x4", "4x4", "4x8", "8x8", "8x16", "16x16"),
        max_chips=256,
        peak_bf16_tflops=197,
        hbm_gib=16,
        aliases=("v5litepod", "v5lite"),
        common_topologies=("1x1", "2x2", "2x4", "4x4", "4x8", "8x8", "8x16", "16x16"),
    ),
    Generation(
        name="v5p",
        accelerator_version="v5p",
        gke_accelerator="tpu-v5p-slice",
        ray_accelerator_type="TPU-V5P",
        dims=3,
        cores_per_chip=2,
        machine_types=(("ct5p-hightpu-4t", 4),),
        single_host=(("2x2x1", 4),),
        multi_host=("2x2x2", "2x2x4", "2x4x4"),
        max_chips=6144,
        peak_bf16_tflops=459,
        hbm_gib=95,
        cube_rule=True,
        common_topologies=("2x2x1", "2x2x2", "2x2x4", "2x4x4", "4x4x4", "4x4x8"),
    ),
    Generation(
        name="v6e",
        accelerator_version="v6e",
        gke_accelerator="tpu-v6e-slice",
        ray_accelerator_type="TPU-V6E",
        dims=2,
        cores_per_chip=1,
        machine_types=(("ct6e-standard-1t", 1), ("ct6e-standard-4t", 4), ("ct6e-standard-8t", 8)),
        single_host=(("1x1", 1), ("2x2", 4), ("2x4", 8)),
        multi_host=("2x4", "4x4", "4x8", "8x8", "8x16", "16x16"),
        max_chips=256,
        peak_bf16_tflops=918,
        hbm_gib=32,
        common_topologies=("1x1", "2x2", "2x4", "4x4", "4x8", "8x8", "8x16", "16x16"),
    ),
    Generation(
        name="tpu7x",
        accelerator_version="v7x",
        gke_accelerator="tpu7x",
        ray_accelerator_type="TPU-V7X",
        dims=3,
        cores_per_chip=2,
        machine_types=(("tpu7x-standard-4t", 4),),
        single_host=(("2x2x1", 4),),
        # The shapes Ray 2.60 and GKE both list for Ironwood; no general cube rule.
        multi_host=(
            "2x2x2",
            "2x2x4",
            "2x4x4",
            "4x4x4",
            "4x4x8",
            "4x8x8",
            "8x8x8",
            "8x8x16",
            "8x16x16",
        ),
        max_chips=2048,
        peak_bf16_tflops=2307,
        hbm_gib=192,
        workload_policy=True,
        min_gke_version="1.34.0-gke.2201000",
        min_python=(3, 12),
        runtime_note="Ironwood needs jax[tpu] >= 0.8.2 on Python 3.12 (ray-project/ray#62402)",
        aliases=("v7x", "ironwood"),
        common_topologies=("2x2x1", "2x2x2", "2x2x4", "2x4x4", "4x4x4"),
    ),
)

GENERATIONS: dict[str, Generation] = {g.name: g for g in GENERATION_ROWS}
"""Generations by our name."""
