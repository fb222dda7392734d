"""``ray-tpu:teams[]`` and ``ray-tpu:priorityClasses[]`` as frozen dataclasses: who shares the
TPU slices, with which quota and priority (Kueue, docs/governance.md). Built only by
:mod:`infra.config.teams`."""

from __future__ import annotations

from dataclasses import dataclass

from raytpu.catalog import SliceShape
from raytpu.kueue import flavor_name

WITHIN_CLUSTER_QUEUE = ("Never", "LowerPriority", "LowerOrNewerEqualPriority")
"""Kueue's ``preemption.withinClusterQueue``: may a pending workload preempt its own team's?"""
RECLAIM_WITHIN_COHORT = ("Never", "LowerPriority", "Any")
"""Kueue's ``preemption.reclaimWithinCohort``: may it take back quota lent to the cohort?"""


@dataclass(frozen=True)
class PriorityClassConfig:
    """A Kueue WorkloadPriorityClass: higher ``value`` is admitted first and may preempt."""

    name: str
    value: int
    description: str = ""


@dataclass(frozen=True)
class TeamQuota:
    """A team's quota of one slice shape, in whole slices (the ClusterQueue holds chips)."""

    slice: str
    """The ``ray-tpu:slices`` entry whose shape and provisioning make the flavor."""
    shape: SliceShape
    spot: bool
    slices: int
    """Nominal quota: slices the team is guaranteed (when the pools hold them)."""
    borrowing_limit: int | None = None
    """Slices it may borrow from its cohort beyond ``slices`` (None: no limit)."""
    lending_limit: int | None = None
    """Slices of its own it may lend to the cohort (None: all of them)."""
    queued: bool = False
    """The slice is provisioned ``queued``: its own flavor, admitted through a ProvisioningRequest."""

    @property
    def flavor(self) -> str:
        return flavor_name(self.shape, spot=self.spot, queued=self.queued)

    @property
    def chips_per_slice(self) -> int:
        return self.shape.chips


@dataclass(frozen=True)
class TeamConfig:
    """One team: a ClusterQueue (its quotas), a LocalQueue in each namespace it uses."""

    name: str
    namespace: str
    priority: str
    """Default WorkloadPriorityClass of the team's Ray objects."""
    quotas: tuple[TeamQuota, ...]
    cohort: str | None = None
    """Teams of one cohort lend idle quota to each other; None: the team never borrows."""
    within_cluster_queue: str = "LowerPriority"
    reclaim_within_cohort: str = "Any"

    def quota(self, flavor: str) -> TeamQuota | None:
        for quota in self.quotas:
            if quota.flavor == flavor:
                return quota
        return None
