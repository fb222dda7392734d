"""Multi-slice claims are gangs: two requests for more slices than exist never each hold some.

Every slice's head is claimed in one placement group (all or none), so of two concurrent
requests for both slices of a two-slice cluster one is granted and the other is refused within
its timeout, having held nothing; and a cluster missing a slice refuses a request for more
slices without holding a single head."""

from __future__ import annotations

import threading
import time

import pytest

from raytpu import errors
from raytpu.catalog import shape
from raytpu_cli.common import SliceChoice

pytestmark = [pytest.mark.ray, pytest.mark.timeout(240)]

V6E_2X4 = shape("v6e", "2x4", machine_type="ct6e-standard-4t")  # 2 hosts x 4 chips
TOTAL_TPU = 2 * 2 * 4.0


@pytest.fixture(scope="module")
def cluster():
    from workloads.sim.local_cluster import LocalSliceCluster

    with LocalSliceCluster([SliceChoice("pair", V6E_2X4, 2)]) as running:
        yield running


def _free(timeout_s: float = 30.0) -> None:
    import ray

    deadline = time.monotonic() + timeout_s
    while ray.available_resources().get("TPU", 0) != TOTAL_TPU:
        assert time.monotonic() < deadline, ray.available_resources()
        time.sleep(0.2)


def _placed_heads() -> int:
    """Head bundles placed right now, over every placement group."""
    from ray.util import placement_group_table

    return sum(
        len(pg["bundles_to_node_id"])
        for pg in placement_group_table().values()
        if pg["state"] == "CREATED"
        and all(V6E_2X4.ray_head_resource in b for b in pg["bundles"].values())
    )


def test_two_requests_for_every_slice_one_is_granted_the_other_refused_holding_nothing(cluster):
    from workloads.slices.reservation import SliceReservationError, reserve_slices

    _free()
    outcomes: dict[str, object] = {}
    heads_seen: list[int] = []
    both_waiting = threading.Barrier(2)

    def claim(who: str) -> None:
        both_waiting.wait(timeout=10)
        try:
            with reserve_slices(V6E_2X4, 2, timeout_s=6) as reservation:
                outcomes[who] = reservation.slice_names
                time.sleep(8)  # hold both slices past the other's timeout
        except SliceReservationError as refused:
            outcomes[who] = refused

    threads = [threading.Thread(target=claim, args=(who,)) for who in ("a", "b")]
    for thread in threads:
        thread.start()
    while any(t.is_alive() for t in threads):
        heads_seen.append(_placed_heads())
        time.sleep(0.2)
    granted = [o for o in outcomes.values() if isinstance(o, tuple)]
    refused = [o for o in outcomes.values() if isinstance(o, SliceReservationError)]
    assert len(granted) == 1 and sorted(granted[0]) == ["pair-0", "pair-1"], outcomes
    assert len(refused) == 1, outcomes
    assert refused[0].error_class is errors.NO_CAPACITY
    assert refused[0].waited_s < 6 + 3
    assert max(heads_seen) == 2  # never a third head placed: the loser held no part
    _free()


def test_a_request_for_more_slices_than_exist_holds_no_head_while_it_waits(cluster):
    from workloads.slices.reservation import SliceReservationError, reserve_slices

    _free()
    seen: list[int] = []
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            seen.append(_placed_heads())
            time.sleep(0.2)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        with (
            pytest.raises(SliceReservationError, match="not claimed together"),
            reserve_slices(V6E_2X4, 3, timeout_s=4),
        ):
            pytest.fail("three slices reserved on a two-slice cluster")
    finally:
        done.set()
        watcher.join(timeout=10)
    assert seen and max(seen) == 0, seen  # Ray placed none of the three heads: all or none
    _free()
