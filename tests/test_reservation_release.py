"""Releasing placement groups around Ray's in-flight removal leak (ray-project/ray#64693).

Ray 2.60 keeps the resources of a placement group removed while its creation is in flight: here,
200 single-bundle groups created and removed at once with ``remove_placement_group`` left 22 of
their bundles held for good. :func:`workloads.slices.release.remove_placement_groups` (what every
reservation releases with) lets such a group land first. Its own small Ray, with a resource no
other test uses."""

from __future__ import annotations

import time

import pytest

pytestmark = [pytest.mark.ray, pytest.mark.timeout(180)]

UNITS = 1000.0


@pytest.fixture(scope="module")
def local_ray():
    import ray

    ray.init(
        address="local",
        num_cpus=1,
        resources={"probe": UNITS},
        include_dashboard=False,
        logging_level="ERROR",
    )
    try:
        yield ray
    finally:
        ray.shutdown()


def _available(ray, timeout_s: float = 10.0) -> float:
    """The probe resource once the removals have settled (removal is asynchronous)."""
    deadline = time.monotonic() + timeout_s
    while True:
        available = ray.available_resources().get("probe", 0.0)
        if available == UNITS or time.monotonic() > deadline:
            return available
        time.sleep(0.2)


@pytest.mark.parametrize("bundles", [1, 3], ids=["one-bundle", "three-bundles"])
def test_groups_removed_right_after_creation_leave_nothing_held(local_ray, bundles):
    from ray.util.placement_group import placement_group

    from workloads.slices.release import remove_placement_groups

    for _ in range(200):
        remove_placement_groups([placement_group([{"probe": 1.0}] * bundles)])
    assert _available(local_ray) == UNITS


def test_a_pending_group_is_removed_after_the_ready_one_it_waited_for(local_ray):
    """The ready group goes first; the pending one then lands on what it freed, and goes too."""
    from ray.util.placement_group import placement_group, placement_group_table

    from workloads.slices.release import remove_placement_groups

    holder = placement_group([{"probe": UNITS}])
    local_ray.get(holder.ready(), timeout=30)
    waiting = placement_group([{"probe": UNITS}])
    held = [waiting, holder]
    began = time.monotonic()
    remove_placement_groups(held, settle_s=10.0)
    assert held == [] and time.monotonic() - began < 10.0, "the pending one landed and went"
    assert {placement_group_table(g)["state"] for g in (holder, waiting)} == {"REMOVED"}
    assert _available(local_ray) == UNITS
