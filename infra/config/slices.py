"""``ray-tpu:slices[]``: TPU slices, each a catalog shape in one zone (one node pool per slice)."""

from __future__ import annotations

from typing import Any

from infra.config.gcp_rules import RESERVATION_RE, SLICE_NAME_MAX, check_zone
from infra.config.reader import Problems, Section, int_range, name_check, name_valid
from infra.config.schema import FLEX_START, MAX_SLICE_COUNT, NAMESPACE, PROVISIONING, SliceConfig
from raytpu import catalog, generations


def parse_slice(problems: Problems, index: int, raw: Any, region: str | None) -> SliceConfig | None:
    path = f"{NAMESPACE}:slices[{index}]"
    keys = (
        "name",
        "generation",
        "topology",
        "machineType",
        "zone",
        "count",
        "provisioning",
        "reservation",
        "scaleToZero",
    )
    s = Section(problems, path, raw, keys)
    if not s.ok:
        return None
    name = s.get("name", str, valid=name_valid(SLICE_NAME_MAX), check=name_check(SLICE_NAME_MAX))
    gen = s.get("generation", str, valid=", ".join(generations.GENERATIONS))
    topology = s.get(
        "topology", str, valid="a topology string such as 2x4 or 2x2x4", hint="quote it"
    )
    machine = s.get("machineType", str, None, valid="a TPU machine type, e.g. ct6e-standard-4t")
    shape = None
    if gen is not None and topology is not None:
        try:
            shape = catalog.shape(gen, topology, machine_type=machine)
        except generations.CatalogError as error:
            problems.errors.append(f"{path}.{error}")
    zone = s.get("zone", str, valid=f"a zone of gcp:region {region}")
    if zone is not None and not check_zone(problems, f"{path}.zone", zone, region):
        zone = None
    count = s.get(
        "count",
        int,
        1,
        valid=f"an integer 1..{MAX_SLICE_COUNT} (identical slices)",
        check=int_range(1, MAX_SLICE_COUNT),
    )
    provisioning = s.get(
        "provisioning",
        str,
        "on-demand",
        valid=", ".join(PROVISIONING),
        check=lambda v: v in PROVISIONING,
    )
    reservation = s.get(
        "reservation",
        str,
        None,
        valid="a reservation name or projects/PROJECT/reservations/NAME",
        check=lambda v: bool(RESERVATION_RE.match(v)),
    )
    flex = provisioning in FLEX_START
    scale_to_zero = s.get("scaleToZero", bool, flex, valid="true or false")
    if provisioning == "reservation" and reservation is None and "reservation" not in s.raw:
        problems.bad(
            f"{path}.reservation",
            None,
            "a reservation name or projects/PROJECT/reservations/NAME",
            "provisioning is reservation",
        )
    if provisioning not in (None, "reservation") and reservation is not None:
        problems.bad(
            f"{path}.provisioning",
            provisioning,
            "reservation",
            f"reservation {reservation!r} is set",
        )
    if flex and shape is not None and not shape.generation.flex_start:
        problems.bad(
            f"{path}.provisioning",
            provisioning,
            ", ".join(p for p in PROVISIONING if p not in FLEX_START),
            f"GKE does not offer flex-start for {shape.generation.name} TPUs",
        )
    if flex and scale_to_zero is False:
        problems.bad(
            f"{path}.scaleToZero",
            False,
            "true",
            f"{provisioning} pools start empty and scale whole slices up on demand",
        )
    if None in (name, shape, zone, count, provisioning, scale_to_zero):
        return None
    return SliceConfig(name, shape, zone, count, provisioning, reservation, scale_to_zero)
