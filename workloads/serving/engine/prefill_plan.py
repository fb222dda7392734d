"""How one batch of prompts of different lengths is prefilled (pure: no JAX, no Ray).

Glossary:

- **slot**: a row of the batch's KV cache. A batch of ``size`` slots is split over ``devices``
  devices in contiguous blocks of ``size // devices`` (the mesh's ``data`` axis), so slot ``s``
  lives on device ``s // per`` at local row ``s % per``.
- **width**: a row's prefill length bucket (:func:`workloads.serving.engine.decode.length_bucket` of the prompt
  tokens it computes, those past its prefix-cache hit).
- **joint prefill**: every slot in one program, padded to the widest row: ``size x max(width)``
  token positions. Short prompts pay the longest one's cost.
- **group prefill**: one program per width, each on a sub-batch of only that width's rows, taken
  from and put back into the batch's cache on each row's own device (no collective). A group of
  ``r`` rows on its busiest device runs ``devices x r`` rows (``r`` rounded up to a batch bucket:
  those programs are compiled already), padded with filler rows that are computed and dropped.

:func:`place` puts requests into slots so that each width is spread evenly over the devices
(widest first, round-robin); :func:`plan_prefill` picks group prefill only where it computes fewer
token positions than the joint one. Decode then runs every slot together, whatever its width.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from raytpu.errors import invalid

FILLER = -1
"""A sub-batch row or a slot with no request: computed (or left empty) and dropped."""


@dataclass(frozen=True)
class PrefillGroup:
    width: int
    slots: tuple[int, ...]
    """The sub-batch in order: device ``d``'s rows are ``slots[d * r : (d + 1) * r]``, each a slot
    on device ``d`` or :data:`FILLER`."""

    def local_rows(self, per: int) -> tuple[int, ...]:
        """Each sub-batch row's row on its own device (``per``, past the end, for a filler: the
        take fills it with zeros and the put drops it)."""
        return tuple(per if slot == FILLER else slot % per for slot in self.slots)


@dataclass(frozen=True)
class PrefillPlan:
    groups: tuple[PrefillGroup, ...]
    """Empty for a joint prefill."""
    joint_tokens: int
    """Token positions a joint prefill computes: ``size x max(width)``."""
    group_tokens: int
    """Token positions the groups compute (filler rows included)."""


def _check(size: int, devices: int) -> int:
    if devices < 1 or size < devices or size % devices:
        valid = f"a positive multiple of the device count ({devices})"
        raise ValueError(invalid("batch size", size, valid))
    return size // devices


def place(widths: Sequence[int], size: int, devices: int) -> tuple[int, ...]:
    """Slot -> request index (:data:`FILLER` for an empty slot) for requests of ``widths``.

    One width: in order (request ``i`` in slot ``i``, as a joint prefill always had it). Several:
    widest first, round-robin over the devices, so no device holds more rows of one width than
    it must.
    """
    per = _check(size, devices)
    if len(widths) > size:
        raise ValueError(invalid("requests", len(widths), f"1..{size} (batch size)"))
    slots = [FILLER] * size
    if len(set(widths)) <= 1:
        slots[: len(widths)] = range(len(widths))
        return tuple(slots)
    by_width = sorted(range(len(widths)), key=lambda i: -widths[i])
    round_robin = [d * per + i for i in range(per) for d in range(devices)]
    for slot, request in zip(round_robin, by_width, strict=False):
        slots[slot] = request
    return tuple(slots)


def plan_prefill(
    widths: Sequence[int],
    real: Sequence[bool],
    devices: int,
    buckets: Sequence[int],
) -> PrefillPlan:
    """The prefill of a batch whose slot ``s`` has ``widths[s]`` (``real[s]``: it holds a
    request; empty slots are left out of group prefill). ``buckets``: the batch sizes compiled,
    each a multiple of ``devices``."""
    size = len(widths)
    per = _check(size, devices)
    if len(real) != size:
        raise ValueError(invalid("real", len(real), f"one flag per slot ({size})"))
    joint = size * max(widths)
    by_width: dict[int, list[int]] = {}
    for slot, (width, used) in enumerate(zip(widths, real, strict=True)):
        if used:
            by_width.setdefault(width, []).append(slot)
    if len(by_width) <= 1:
        return PrefillPlan((), joint, joint)
    groups, total = [], 0
    for width in sorted(by_width, reverse=True):
        on_device = [[s for s in by_width[width] if s // per == d] for d in range(devices)]
        busiest = max(len(rows) for rows in on_device)
        rows = next(b for b in sorted(buckets) if b >= busiest * devices) // devices
        slots = [s for d in on_device for s in (*d, *[FILLER] * (rows - len(d)))]
        groups.append(PrefillGroup(width, tuple(slots)))
        total += rows * devices * width
    if total >= joint:
        return PrefillPlan((), joint, total)
    return PrefillPlan(tuple(groups), joint, total)
