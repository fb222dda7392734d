"""Atomic reservation of whole TPU slices (Ray's alpha slice API through :mod:`workloads.ray_compat`).

Glossary (Ray's words):

- **slice**: all TPU hosts of one topology, joined by ICI. A multi-host slice must be reserved
  whole: a partial slice hangs in its first collective.
- **head resource**: ``TPU-<pod type>-head``, carried only by worker 0 of each slice.
  :func:`ray.util.tpu.slice_placement_group` first reserves it (a *head placement group*), which
  claims one free slice and reveals its **slice name** (``ray.io/tpu-slice-name``).
- **placement group**: one **bundle** per host (``{"TPU": chips per host, "CPU": 1}``), each bundle
  constrained by a label selector to the claimed slice, so all bundles land on that slice's hosts.
  Schedule workers into bundle *i* with ``PlacementGroupSchedulingStrategy``.
- **chips per VM**: chips per host. Ray guesses it from the topology (8 for v5e/v6e ``2x4``,
  which is wrong on 4-chip machines); we always pass it from the catalog.

:func:`reserve_slices` reserves ``num_slices`` whole slices, waits for every bundle with a bound,
yields a :class:`SliceReservation`, and removes every placement group on exit or error.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from raytpu import errors
from raytpu.catalog import SliceShape
from raytpu.errors import invalid
from raytpu.ray_names import LABEL_POD_TYPE, LABEL_SLICE_NAME, LABEL_TOPOLOGY, LABEL_WORKER_ID
from workloads import ray_compat, telemetry
from workloads.slices.diagnosis import describe_missing
from workloads.slices.preflight import preflight
from workloads.slices.release import remove_placement_groups

logger = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 30.0


class SliceReservationError(RuntimeError):
    """A slice reservation that did not happen; by the time it is raised nothing is held.

    Names the shape (generation, topology, hosts x chips), how long it waited, and why;
    ``error_class`` says which scheduling failure it is (:mod:`raytpu.errors`).
    """

    def __init__(
        self,
        shape: SliceShape,
        num_slices: int,
        waited_s: float,
        reason: str,
        error_class: errors.ErrorClass = errors.NO_CAPACITY,
    ) -> None:
        self.error_class = error_class
        self.shape = shape
        self.num_slices = num_slices
        self.waited_s = waited_s
        self.reason = reason
        super().__init__(
            f"could not reserve {num_slices} x {shape.generation.name} {shape.topology} "
            f"({shape.hosts} hosts x {shape.chips_per_host} chips, pod type {shape.pod_type}) "
            f"after waiting {waited_s:.1f} s: {reason}"
        )


class HostLostError(RuntimeError):
    """A host of a reserved slice died after the reservation: the slice is no longer whole.

    Work pinned to that host's bundle would wait forever (Ray keeps the placement group and
    reschedules the bundle when a node with the slice's label comes back, which never happens
    for a lost TPU host). Release the reservation and reserve again.
    """

    def __init__(self, lost: tuple[ReservedHost, ...]) -> None:
        self.lost = lost
        names = ", ".join(
            f"slice {h.slice_name} host {h.worker_id} (bundle {h.bundle_index}, node "
            f"{h.node_id[:12]})"
            for h in lost
        )
        super().__init__(
            f"host lost: {names} is no longer alive; the reserved slice is not whole and work "
            "pinned to it would wait forever; release the reservation and reserve again"
        )


@dataclass(frozen=True)
class ReservedHost:
    """One bundle of the placement group and the TPU host it landed on."""

    bundle_index: int
    slice_name: str
    worker_id: int
    node_id: str


@dataclass(frozen=True)
class SliceReservation:
    """What workers need to run on reserved slices. Valid only inside ``reserve_slices``."""

    shape: SliceShape
    num_slices: int
    placement_group: Any
    """The :class:`ray.util.placement_group.PlacementGroup` holding one bundle per host."""
    hosts: tuple[ReservedHost, ...]
    """One per bundle, ordered by bundle index."""
    slice_names: tuple[str, ...]
    wait_s: float
    """Seconds from the request until every bundle was placed."""
    bundle_resources: dict[str, float]

    def lost_hosts(self) -> tuple[ReservedHost, ...]:
        """Reserved hosts whose Ray node is no longer alive."""
        import ray

        alive = {n["NodeID"] for n in ray.nodes() if n.get("Alive")}
        return tuple(h for h in self.hosts if h.node_id not in alive)

    def check_hosts(self) -> None:
        """Raise :class:`HostLostError` if any reserved host died."""
        lost = self.lost_hosts()
        if lost:
            raise HostLostError(lost)

    def get(self, refs: list[Any], *, timeout_s: float, poll_s: float = 1.0) -> list[Any]:
        """``ray.get`` of work running on this reservation, bounded by ``timeout_s``, that
        raises :class:`HostLostError` as soon as a reserved host dies instead of waiting."""
        import ray

        deadline = time.monotonic() + timeout_s
        pending = list(refs)
        while pending:
            self.check_hosts()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(
                    f"{len(pending)} of {len(refs)} results not ready after {timeout_s:.0f} s"
                )
            _, pending = ray.wait(pending, num_returns=len(pending), timeout=min(poll_s, remaining))
        return ray.get(list(refs))

    def scheduling_strategy(self, bundle_index: int) -> Any:
        """The strategy that pins a task or actor to bundle ``bundle_index``; raises
        :class:`HostLostError` if that bundle's host died."""
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        if not 0 <= bundle_index < len(self.hosts):
            raise ValueError(invalid("bundle_index", bundle_index, f"0..{len(self.hosts) - 1}"))
        lost = [h for h in self.lost_hosts() if h.bundle_index == bundle_index]
        if lost:
            raise HostLostError(tuple(lost))
        return PlacementGroupSchedulingStrategy(
            placement_group=self.placement_group,
            placement_group_bundle_index=bundle_index,
        )


def _hosts_of(pg: Any, num_bundles: int) -> tuple[ReservedHost, ...]:
    import ray

    landed = ray_compat.bundle_nodes(pg)
    labels_by_node = {n["NodeID"]: (n.get("Labels") or {}) for n in ray.nodes()}
    hosts = []
    for index in range(num_bundles):
        node_id = landed.get(index, "")
        labels = labels_by_node.get(node_id, {})
        hosts.append(
            ReservedHost(
                bundle_index=index,
                slice_name=labels.get(LABEL_SLICE_NAME, ""),
                worker_id=int(labels.get(LABEL_WORKER_ID, -1)),
                node_id=node_id,
            )
        )
    return tuple(hosts)


@contextlib.contextmanager
def reserve_slices(
    shape: SliceShape,
    num_slices: int = 1,
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    tpu_per_bundle: int | None = None,
    cpus_per_bundle: float = 1.0,
    name: str = "",
    only: Sequence[str] = (),
) -> Iterator[SliceReservation]:
    """Reserve ``num_slices`` whole slices of ``shape`` atomically; release them on exit.

    The same two steps as :func:`ray.util.tpu.slice_placement_group`, done as gangs: every
    slice's head in one placement group (all or none), each slice's name read from the label of
    the node its head bundle landed on (no task); then one placement group with a label-pinned
    bundle per host. Ray's own call claims heads one after another and runs a task in each new
    head placement group to read the name (``bench.reservation`` measures both).

    ``tpu_per_bundle`` defaults to the shape's chips per host (one bundle per host); a larger
    value models workers sized for bigger hosts and fails with a reason. ``only``: slice names
    (``TPU_NAME``) to choose among, e.g. to hold (cordon) one named slice. Waits at most about
    ``timeout_s`` in all. Raises :class:`SliceReservationError` (holding nothing) when no free
    slice exists, a slice lacks a host, or the bundles cannot be placed in time.
    """
    request = _request(shape, num_slices, timeout_s, tpu_per_bundle, cpus_per_bundle, name, only)
    held: list[Any] = []
    try:
        reservation = _reserve(request, held)
    except SliceReservationError as error:
        _log_failure(request, error)
        remove_placement_groups(held)
        telemetry.reservation(shape, request.num_slices, error.waited_s, error)
        raise
    except BaseException:
        remove_placement_groups(held)
        raise
    _log_success(reservation)
    telemetry.reservation(shape, request.num_slices, reservation.wait_s)
    try:
        yield reservation
    finally:
        remove_placement_groups(held)
        logger.info("slice reservation released: %s", ", ".join(reservation.slice_names))


@dataclass(frozen=True)
class _Request:
    """One call's arguments, checked, with the clock started."""

    shape: SliceShape
    num_slices: int
    timeout_s: float
    tpu: int
    bundle: dict[str, float]
    name: str
    among: dict[str, str]
    """A label selector on the slice name, from ``only`` (empty: any slice)."""
    began: float

    def remaining_s(self) -> float:
        return max(0.5, self.timeout_s - (time.monotonic() - self.began))

    def refused(self, reason: str, error_class: errors.ErrorClass) -> SliceReservationError:
        waited = time.monotonic() - self.began
        return SliceReservationError(self.shape, self.num_slices, waited, reason, error_class)


def _request(
    shape: SliceShape,
    num_slices: int,
    timeout_s: float,
    tpu_per_bundle: int | None,
    cpus_per_bundle: float,
    name: str,
    only: Sequence[str],
) -> _Request:
    """Check the arguments (``ValueError`` naming the bad one) before anything is held."""
    if int(num_slices) < 1:
        raise ValueError(invalid("num_slices", num_slices, "an integer >= 1"))
    if timeout_s <= 0:
        raise ValueError(invalid("timeout_s", timeout_s, "a number > 0"))
    tpu = int(tpu_per_bundle or shape.chips_per_host)
    return _Request(
        shape=shape,
        num_slices=int(num_slices),
        timeout_s=timeout_s,
        tpu=tpu,
        bundle={"TPU": float(tpu), "CPU": float(cpus_per_bundle)},
        name=name,
        among={LABEL_SLICE_NAME: f"in({','.join(only)})"} if only else {},
        began=time.monotonic(),
    )


def _reserve(request: _Request, held: list[Any]) -> SliceReservation:
    """Claim the slices' heads (multi-host), then place one bundle per host; every placement
    group goes into ``held`` as soon as it exists, for the caller to release on error."""
    import ray

    shape = request.shape
    if request.tpu < 1 or shape.chips % request.tpu:
        reason = invalid(
            "tpu_per_bundle",
            request.tpu,
            f"a divisor of the slice's {shape.chips} chips",
        )
        raise request.refused(reason, errors.MISSIZED_REQUEST)
    names: tuple[str, ...] = ()
    if shape.multi_host:
        names = _claim_heads(
            shape,
            request.num_slices,
            request.timeout_s,
            request.began,
            request.name,
            held,
            request.among,
        )
    selectors = _bundle_selectors(request, names)
    pg = ray_compat.labeled_placement_group(
        [request.bundle for _ in selectors], selectors, strategy="SPREAD", name=request.name
    )
    held.append(pg)
    ready, _ = ray.wait([pg.ready()], timeout=request.remaining_s())
    if not ready:
        missing = describe_missing(shape, request.tpu, held)
        reason = f"bundles not placed within {request.timeout_s:.0f} s: {missing.reason}"
        raise request.refused(reason, missing.error_class)
    # The head placement groups stay until the reservation ends: released early, a slice
    # whose hosts are all held looks free by its head resource, and the next reservation
    # claims that head and waits on bundles that never place (Ray's sharp edge, seen here as
    # a flaky "no free slice" while one slice was still free).
    hosts = _hosts_of(pg, len(selectors))
    faults = preflight(shape, hosts)
    if faults:
        # Before JAX starts: on such a slice jax.distributed.initialize hangs until its timeout.
        raise request.refused("pre-flight check: " + "; ".join(faults), errors.PARTIAL_SLICE)
    return SliceReservation(
        shape=shape,
        num_slices=request.num_slices,
        placement_group=pg,
        hosts=hosts,
        slice_names=tuple(dict.fromkeys(h.slice_name for h in hosts)),
        wait_s=time.monotonic() - request.began,
        bundle_resources=request.bundle,
    )


def _bundle_selectors(request: _Request, names: tuple[str, ...]) -> list[dict[str, str]]:
    """One label selector per host bundle, slice after slice: the shape's pod type and
    topology, and the claimed slice's name where heads were claimed."""
    shape = request.shape
    selectors = []
    for index in range(request.num_slices):
        selector = {LABEL_POD_TYPE: shape.pod_type, LABEL_TOPOLOGY: shape.topology}
        selector.update(request.among)
        if names:
            selector[LABEL_SLICE_NAME] = names[index]
        selectors += [dict(selector) for _ in range(shape.workers(request.tpu))]
    return selectors


def _log_failure(request: _Request, error: SliceReservationError) -> None:
    logger.warning(
        "slice reservation failed: shape=%s generation=%s hosts=%d slices=%d wait=%.1fs reason=%s",
        request.shape.topology,
        request.shape.generation.name,
        request.shape.hosts,
        request.num_slices,
        error.waited_s,
        error.reason,
    )


def _log_success(reservation: SliceReservation) -> None:
    logger.info(
        "slice reservation ok: shape=%s generation=%s hosts=%d slices=%d (%s) wait=%.1fs",
        reservation.shape.topology,
        reservation.shape.generation.name,
        reservation.shape.hosts,
        reservation.num_slices,
        ", ".join(reservation.slice_names),
        reservation.wait_s,
    )


def _claim_heads(
    shape: SliceShape,
    num_slices: int,
    timeout_s: float,
    began: float,
    name: str,
    held: list[Any],
    among: dict[str, str],
) -> tuple[str, ...]:
    """Claim ``num_slices`` head resources as one gang (on slices matching ``among``, a label
    selector); return the claimed slices' names.

    One placement group with a head bundle per slice, ``STRICT_SPREAD``: Ray places all of its
    bundles or none, so two requests for more slices than are free never each hold some heads
    and wait on the other until both time out; one is granted, the other waits for whole slices.
    The group goes into ``held`` as soon as it exists, for the caller to release on any error.
    """
    import ray

    heads = ray_compat.labeled_placement_group(
        [{shape.ray_head_resource: 1.0} for _ in range(num_slices)],
        [{LABEL_WORKER_ID: "0", LABEL_POD_TYPE: shape.pod_type, **among}] * num_slices,
        strategy="STRICT_SPREAD",
        name=f"{name}-heads" if name else "",
    )
    held.append(heads)
    ready, _ = ray.wait([heads.ready()], timeout=timeout_s)
    if not ready:
        missing = describe_missing(shape, shape.chips_per_host, held)
        raise SliceReservationError(
            shape,
            num_slices,
            time.monotonic() - began,
            f"{missing.reason}; {num_slices} head resources {shape.ray_head_resource} "
            f"not claimed together within {timeout_s:.0f} s",
            missing.error_class,
        )
    return _head_slice_names(heads, num_slices)


def _head_slice_names(heads: Any, num_slices: int) -> tuple[str, ...]:
    """The slice name of each claimed head bundle: its node, looked up in the node table."""
    import ray

    labels_by_node = {n["NodeID"]: (n.get("Labels") or {}) for n in ray.nodes()}
    landed = ray_compat.bundle_nodes(heads)
    names = []
    for index in range(num_slices):
        node_id = landed.get(index, "")
        slice_name = labels_by_node.get(node_id, {}).get(LABEL_SLICE_NAME)
        if not slice_name:
            raise RuntimeError(
                f"head bundle {index} of placement group {heads.id.hex()} landed on node "
                f"{node_id[:12] or '?'} which has no {LABEL_SLICE_NAME} label; the TPU host's "
                "labels are missing"
            )
        names.append(slice_name)
    return tuple(names)


@contextlib.contextmanager
def ray_native_reservation(
    shape: SliceShape, num_slices: int, *, timeout_s: float = DEFAULT_TIMEOUT_S
) -> Iterator[Any]:
    """Ray's own :func:`ray.util.tpu.slice_placement_group` for ``num_slices`` slices of
    ``shape``, awaited until ready and removed on exit: the baseline ``bench.reservation``
    compares :func:`reserve_slices` with. Raises ``TimeoutError`` if not ready in time."""
    import ray

    spg = ray_compat.slice_placement_group(
        shape.topology, shape.accelerator_version, shape.chips_per_host, num_slices, timeout_s
    )
    try:
        ready, _ = ray.wait([spg.placement_group.ready()], timeout=timeout_s)
        if not ready:
            raise TimeoutError(f"slice_placement_group not ready within {timeout_s:.0f} s")
        yield spg
    finally:
        spg.shutdown()


SPARE_CHECK_TIMEOUT_S = 10.0
"""The bound on :func:`spare_slice_exists`'s placement groups' creation. It was 2 s, and once on
CI's loaded 2 cores the check answered "no spare" where the test had left a slice free."""


def spare_slice_exists(shape: SliceShape, timeout_s: float = SPARE_CHECK_TIMEOUT_S) -> bool:
    """Whether one more whole slice of ``shape`` is free right now: reserved for an instant
    (:func:`reserve_slices`) and released. Not Ray's ``get_num_ready_tpu_slices``: on the
    simulated cluster it counted a free slice while a run held the only one.

    ``timeout_s`` bounds the two placement groups' creation, not a wait for capacity; with no
    spare slice the answer takes all of it, and its release up to
    :data:`workloads.slices.release.SETTLE_S` more."""
    try:
        with reserve_slices(shape, 1, timeout_s=timeout_s, name="raytpu-spare-check"):
            return True
    except SliceReservationError:
        return False


def ray_splits_slice(shape: SliceShape) -> bool:
    """Whether Ray's own slice reservation (``SlicePlacementGroup``, which ``JaxTrainer`` uses
    without a ``chips_per_vm``) would NOT keep the hosts of one slice of ``shape`` together.

    Ray takes a v5e/v6e ``2x4`` for one 8-chip host, so on 4-chip machines (2 hosts) it reserves
    no slice name and spreads the workers over any hosts with free TPU (seen with Ray 2.60: one
    worker of a 2x4 run on a serving host). Every other shape it reserves whole by slice name.
    """
    if not shape.multi_host:
        return False
    return ray_compat.ray_guesses_one_host(shape.topology, shape.accelerator_version)
