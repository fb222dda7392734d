"""A reserved host that dies: the reservation says so at once instead of letting work wait.

Its own cluster (one v6e 2x4 slice on two 4-chip hosts), since a test kills a host: one cluster
for the module, so the test that kills a host comes last (pytest runs a module's tests in order).
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from raytpu.catalog import shape
from raytpu_cli.common import SliceChoice
from workloads.sim.local_cluster import LocalSliceCluster
from workloads.slices.reservation import HostLostError, reserve_slices

pytestmark = [pytest.mark.ray, pytest.mark.timeout(300)]

V6E_2X4_4T = shape("v6e", "2x4", machine_type="ct6e-standard-4t")
DETECT_BOUND_S = 20.0


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalSliceCluster]:
    with LocalSliceCluster([SliceChoice("train", V6E_2X4_4T, 1)]) as running:
        yield running


def test_get_is_bounded_without_a_loss(cluster: LocalSliceCluster) -> None:
    import ray

    @ray.remote(num_cpus=0, resources={"TPU": 4})
    def hold(seconds: float) -> None:
        import time

        time.sleep(seconds)

    with reserve_slices(V6E_2X4_4T, timeout_s=30) as reservation:
        slow = hold.options(scheduling_strategy=reservation.scheduling_strategy(0)).remote(60)
        began = time.monotonic()
        with pytest.raises(TimeoutError, match="1 of 1 results not ready after 3 s"):
            reservation.get([slow], timeout_s=3)
        assert time.monotonic() - began < 10


def test_host_lost_after_reservation_raises_instead_of_waiting(
    cluster: LocalSliceCluster,
) -> None:
    """Last in the module: it kills a host of the module's cluster."""
    import ray

    @ray.remote(num_cpus=0, resources={"TPU": 4})
    def hold(seconds: float) -> str:
        import os
        import time

        time.sleep(seconds)
        return os.environ["TPU_WORKER_ID"]

    with reserve_slices(V6E_2X4_4T, timeout_s=30) as reservation:
        assert reservation.lost_hosts() == ()
        (host_0,) = [h for h in reservation.hosts if h.worker_id == 0]
        (host_1,) = [h for h in reservation.hosts if h.worker_id == 1]
        quick = hold.options(
            scheduling_strategy=reservation.scheduling_strategy(host_0.bundle_index)
        ).remote(0)
        assert reservation.get([quick], timeout_s=60) == ["0"]
        pinned = hold.options(
            scheduling_strategy=reservation.scheduling_strategy(host_1.bundle_index)
        ).remote(120)
        assert cluster.remove_host(host_1.slice_name, 1) == host_1.node_id
        began = time.monotonic()
        with pytest.raises(HostLostError) as caught:
            reservation.get([pinned], timeout_s=200)
        waited = time.monotonic() - began
        assert waited < DETECT_BOUND_S, waited
        message = str(caught.value)
        assert f"slice {host_1.slice_name} host 1 (bundle {host_1.bundle_index}" in message
        assert "release the reservation and reserve again" in message
        assert caught.value.lost == (host_1,)
        with pytest.raises(HostLostError):
            reservation.scheduling_strategy(host_1.bundle_index)
