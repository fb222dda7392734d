"""The pre-flight check of every reserved slice: worker ids 0..n-1 once each, before JAX starts.

The TPU webhook's known fault (duplicate ``TPU_WORKER_ID``) makes ``jax.distributed.initialize``
hang until its start-up timeout; a reservation on such a slice is refused within seconds, with
its error class, and holds nothing afterwards."""

from __future__ import annotations

import time

import pytest

from raytpu import errors
from raytpu.catalog import shape
from raytpu_cli.common import SliceChoice
from workloads.slices.preflight import preflight
from workloads.slices.reservation import ReservedHost, SliceReservationError

V6E_4X4 = shape("v6e", "4x4")  # 4 hosts x 4 chips


def _hosts(*worker_ids: int, slice_name: str = "s-0", per_node: int = 1) -> list[ReservedHost]:
    return [
        ReservedHost(index, slice_name, worker, f"node-{slice_name}-{index // per_node}")
        for index, worker in enumerate(w for w in worker_ids for _ in range(per_node))
    ]


CASES = [
    ("sound", _hosts(0, 1, 2, 3), []),
    ("sound-two-bundles-a-host", _hosts(0, 1, 2, 3, per_node=2), []),
    ("duplicate", _hosts(0, 0, 2, 3), ["slice s-0: worker ids [0, 0, 2, 3], valid: each of 0..3 once (duplicated: [0], missing: [1]"]),
    ("out-of-range", _hosts(0, 1, 2, 7), ["missing: [3]"]),
    ("second-slice-only", [*_hosts(0, 1, 2, 3), *_hosts(3, 1, 2, 3, slice_name="s-1")], ["slice s-1:"]),
]  # fmt: skip


@pytest.mark.parametrize(("hosts", "fragments"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_preflight_names_each_unsound_slice(
    hosts: list[ReservedHost], fragments: list[str]
) -> None:
    faults = preflight(V6E_4X4, hosts)
    assert len(faults) == len(fragments), faults
    for fault, fragment in zip(faults, fragments, strict=True):
        assert fragment in fault


@pytest.mark.ray
@pytest.mark.timeout(180)
def test_a_slice_with_a_duplicate_worker_id_is_refused_within_10_s() -> None:
    import ray

    from workloads.sim.local_cluster import LocalSliceCluster
    from workloads.slices.reservation import reserve_slices

    v6e_2x4 = shape("v6e", "2x4", machine_type="ct6e-standard-4t")  # 2 hosts x 4 chips
    slices = [SliceChoice("bad", v6e_2x4, 1)]
    with LocalSliceCluster(slices, duplicate_worker_ids=[("bad-0", 1)]):
        began = time.monotonic()
        with pytest.raises(SliceReservationError) as refused, reserve_slices(v6e_2x4, 1):
            pytest.fail("a slice with two worker 0s was reserved")
        assert time.monotonic() - began < 10
        assert refused.value.error_class is errors.PARTIAL_SLICE
        message = str(refused.value)
        assert "pre-flight check: slice bad-0: worker ids [0, 0]" in message
        assert "TPU webhook's known fault" in message
        deadline = time.monotonic() + 30  # and it holds nothing afterwards
        while ray.available_resources().get("TPU", 0) != 8.0:
            assert time.monotonic() < deadline, ray.available_resources()
            time.sleep(0.2)
