"""The admission model (raytpu.admission) on hand-written scenarios whose outcomes follow Kueue's
documented classical preemption: whole-slice quotas, borrowing from a cohort, reclaim, priority
preemption within a queue. A planning aid: Kueue is what admits on the cluster."""

from __future__ import annotations

from pathlib import Path

import pytest

from infra.config.stack import load_stack_file
from infra.manifests.kueue import admission_queues
from raytpu.admission import Cluster, ClusterQueue, Quota, Workload

F = "v6e-4x4-4t"
LOW, NORMAL, HIGH = 100, 500, 1000
A_QUOTA, B_QUOTA = Quota(2), Quota(1)


def two_teams(
    *,
    reclaim: str = "Any",
    within: str = "LowerPriority",
    cohort: str | None = "tpu",
    a: Quota = A_QUOTA,
    b: Quota = B_QUOTA,
) -> Cluster:
    """Team A owns 2 slices, team B 1, in one cohort (3 slices in all)."""
    return Cluster.of(
        [
            ClusterQueue("a", {F: a}, cohort=cohort, within=within, reclaim=reclaim),
            ClusterQueue("b", {F: b}, cohort=cohort, within=within, reclaim=reclaim),
        ]
    )


def kinds(events) -> list[tuple[str, str]]:
    return [(e.kind, e.workload) for e in events if e.kind != "pending"]


def test_within_quota_is_admitted() -> None:
    cluster = two_teams()
    assert kinds(cluster.submit(Workload("a1", "a", F, 2, NORMAL))) == [("admitted", "a1")]


def test_b_borrows_idle_slices_of_a() -> None:
    cluster = two_teams()
    events = cluster.submit(Workload("b1", "b", F, 3, LOW))
    assert kinds(events) == [("admitted", "b1")]
    assert "borrowing 2 slice(s)" in events[0].detail


def test_a_reclaims_and_b_is_preempted_whole() -> None:
    """A submits a higher-priority job for 1 of its 2 idle slices that B borrowed: B's workload
    (3 slices) is evicted whole, never 1 slice of it, and waits for quota again."""
    cluster = two_teams()
    cluster.submit(Workload("b1", "b", F, 3, LOW))
    events = cluster.submit(Workload("a1", "a", F, 1, HIGH))
    assert kinds(events) == [("preempted", "b1"), ("admitted", "a1")]
    assert "all 3 slice(s)" in events[0].detail
    assert set(cluster.admitted) == {"a1"} and set(cluster.pending) == {"b1"}
    assert cluster.usage("b", F) == 0  # nothing of b1 stays running on a partial slice


def test_b_fits_again_once_a_finishes() -> None:
    cluster = two_teams()
    cluster.submit(Workload("b1", "b", F, 3, LOW))
    cluster.submit(Workload("a1", "a", F, 1, HIGH))
    assert kinds(cluster.finish("a1")) == [("finished", "a1"), ("admitted", "b1")]


def test_reclaim_any_ignores_priority() -> None:
    """reclaimWithinCohort: Any: quota is taken back even from a higher-priority borrower."""
    cluster = two_teams(reclaim="Any")
    cluster.submit(Workload("b1", "b", F, 3, HIGH))
    assert kinds(cluster.submit(Workload("a1", "a", F, 2, LOW))) == [
        ("preempted", "b1"),
        ("admitted", "a1"),
    ]


def test_reclaim_lower_priority_waits_for_a_higher_borrower() -> None:
    cluster = two_teams(reclaim="LowerPriority")
    cluster.submit(Workload("b1", "b", F, 3, HIGH))
    events = cluster.submit(Workload("a1", "a", F, 2, LOW))
    assert kinds(events) == [] and set(cluster.pending) == {"a1"}


def test_no_cohort_no_borrowing() -> None:
    cluster = two_teams(cohort=None)
    assert kinds(cluster.submit(Workload("b1", "b", F, 2, HIGH))) == []
    assert set(cluster.pending) == {"b1"}


@pytest.mark.parametrize(
    ("b_quota", "a_quota", "slices", "admitted"),
    [
        (Quota(1, borrowing_limit=1), Quota(2), 2, True),
        (Quota(1, borrowing_limit=1), Quota(2), 3, False),  # would borrow 2 > limit 1
        (Quota(1), Quota(2, lending_limit=1), 2, True),
        (Quota(1), Quota(2, lending_limit=1), 3, False),  # A lends only 1 slice
    ],
    ids=["within-borrowing-limit", "over-borrowing-limit", "within-lending", "over-lending"],
)
def test_borrowing_and_lending_limits(
    b_quota: Quota, a_quota: Quota, slices: int, admitted: bool
) -> None:
    cluster = two_teams(a=a_quota, b=b_quota)
    cluster.submit(Workload("b1", "b", F, slices, LOW))
    assert ("b1" in cluster.admitted) is admitted


@pytest.mark.parametrize(
    ("within", "first", "second", "preempted"),
    [
        ("LowerPriority", LOW, HIGH, True),
        ("LowerPriority", NORMAL, NORMAL, False),
        ("LowerOrNewerEqualPriority", NORMAL, NORMAL, False),  # the first is older: kept
        ("Never", LOW, HIGH, False),
    ],
    ids=["lower-priority", "equal-priority", "equal-but-older", "never"],
)
def test_priority_preemption_within_a_team(
    within: str, first: int, second: int, preempted: bool
) -> None:
    cluster = two_teams(within=within, cohort=None)
    cluster.submit(Workload("a1", "a", F, 2, first))
    events = cluster.submit(Workload("a2", "a", F, 1, second))
    assert (("preempted", "a1") in kinds(events)) is preempted
    assert ("a2" in cluster.admitted) is preempted


def test_a_borrower_never_preempts_other_teams() -> None:
    """borrowWithinCohort: Never: B, past its own quota, waits rather than preempt A's jobs."""
    cluster = two_teams()
    cluster.submit(Workload("a1", "a", F, 2, LOW))
    assert kinds(cluster.submit(Workload("b1", "b", F, 2, HIGH))) == []
    assert set(cluster.pending) == {"b1"}


def test_preemption_takes_the_fewest_workloads() -> None:
    """Kueue removes candidates until the job fits, then puts back the ones not needed."""
    cluster = two_teams(a=Quota(3), b=Quota(0))
    cluster.submit(Workload("b1", "b", F, 1, LOW))
    cluster.submit(Workload("b2", "b", F, 1, LOW))
    cluster.submit(Workload("b3", "b", F, 1, LOW))
    events = cluster.submit(Workload("a1", "a", F, 1, HIGH))
    assert kinds(events) == [("preempted", "b3"), ("admitted", "a1")]  # the newest goes


def test_workloads_are_whole_slices() -> None:
    with pytest.raises(ValueError, match=r"slices: 0\.5 is not valid; valid: a whole number"):
        Workload("half", "a", F, 0.5)  # type: ignore[arg-type]


def test_the_teams_stack_plays_out() -> None:
    """The three teams of tests/data/Pulumi.teams.yaml: batch borrows research's idle v6e 4x4
    slices overnight; research's high-priority paper run takes its quota back."""
    stack = load_stack_file(Path(__file__).parent / "data" / "Pulumi.teams.yaml")
    cluster = Cluster.of(admission_queues(stack))
    # batch: 1 slice nominal, may borrow 2; research lends at most 1 of its 2; serving lends 1.
    assert kinds(cluster.submit(Workload("nightly", "batch", F, 3, LOW))) == [
        ("admitted", "nightly")
    ]
    events = cluster.submit(Workload("paper-run", "research", F, 2, HIGH))
    assert kinds(events) == [("preempted", "nightly"), ("admitted", "paper-run")]
    assert kinds(cluster.submit(Workload("small", "batch", F, 1, LOW))) == [("admitted", "small")]
    with pytest.raises(
        ValueError, match=r"flavor: 'v5p-2x2x4-4t' is not valid \(queue batch does not list it\)"
    ):
        cluster.submit(Workload("v5p", "batch", "v5p-2x2x4-4t", 1, LOW))
