"""Pre-flight check of reserved slices: what would make JAX hang on them, found before it starts.

``jax.distributed.initialize`` waits for every process id of the slice; with a duplicate
``TPU_WORKER_ID`` (the TPU webhook's known fault) or a missing one it hangs until its start-up
timeout, on every restart. :func:`workloads.slices.reservation.reserve_slices` refuses such a
slice at once instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from raytpu.catalog import SliceShape


class Host(Protocol):
    """A reserved host (:class:`workloads.slices.reservation.ReservedHost`)."""

    slice_name: str
    worker_id: int
    node_id: str


def preflight(shape: SliceShape, hosts: Sequence[Host]) -> list[str]:
    """What is wrong with the reserved slices, before JAX starts on them: each slice's hosts
    (its distinct nodes) must have worker ids 0..hosts-1 once each (``TPU_WORKER_ID``, as the
    webhook injects it). Empty when every slice is sound. (One slice name per slice: the bundles'
    label selectors pin it.)"""
    faults = []
    nodes: dict[str, dict[str, int]] = {}  # slice -> node -> worker id (bundles may share a node)
    for host in hosts:
        nodes.setdefault(host.slice_name, {})[host.node_id] = host.worker_id
    for name, by_node in nodes.items():
        ids = list(by_node.values())
        expected = list(range(shape.hosts))
        if sorted(ids) != expected:
            twice = sorted({i for i in ids if ids.count(i) > 1})
            absent = sorted(set(expected) - set(ids))
            faults.append(
                f"slice {name}: worker ids {sorted(ids)}, valid: each of 0..{shape.hosts - 1} "
                f"once (duplicated: {twice or 'none'}, missing: {absent or 'none'}; the TPU "
                "webhook's known fault: recreate the slice's pods)"
            )
    return faults
