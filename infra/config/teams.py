"""``ray-tpu:priorityClasses[]`` and ``ray-tpu:teams[]``: who shares the slices, and how.

A team gets a Kueue ClusterQueue with a quota per slice shape in whole slices, a LocalQueue in
its namespace, a default priority class, and maybe a cohort to lend and borrow idle slices in.
Ray objects belong to a team by their namespace or by an explicit ``team`` key; every rule that
spans teams and Ray objects is checked here, before anything is declared."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from infra.config.reader import (
    Problems,
    Section,
    check_unique,
    int_range,
    list_of,
    name_check,
    name_valid,
)
from infra.config.schema import NAMESPACE, RayClusterConfig, SliceConfig
from infra.config.team_schema import (
    RECLAIM_WITHIN_COHORT,
    WITHIN_CLUSTER_QUEUE,
    PriorityClassConfig,
    TeamConfig,
    TeamQuota,
)

TEAM_NAME_MAX = 40
MAX_PRIORITY = 1_000_000_000
"""Kueue priorities are int32; Kubernetes reserves values above one billion for the system."""


def parse_priority_classes(problems: Problems, raw: Any) -> tuple[PriorityClassConfig, ...]:
    path = f"{NAMESPACE}:priorityClasses"
    items = list_of(problems, path, raw, required=False)
    found = []
    for index, item in enumerate(items):
        s = Section(problems, f"{path}[{index}]", item, ("name", "value", "description"))
        if not s.ok:
            continue
        name = s.get("name", str, valid=name_valid(63), check=name_check(63))
        value = s.get(
            "value",
            int,
            valid=f"an integer -{MAX_PRIORITY}..{MAX_PRIORITY} (higher is admitted first)",
            check=int_range(-MAX_PRIORITY, MAX_PRIORITY),
        )
        description = s.get(
            "description",
            str,
            "",
            valid="text of at most 2048 chars",
            check=lambda v: len(v) <= 2048,
        )
        if None not in (name, value, description):
            found.append(PriorityClassConfig(name, value, description))
    check_unique(problems, path, _names(items), "priority class names")
    return tuple(found)


def _names(items: Sequence[Any]) -> list[tuple[int, Any]]:
    return [(i, item.get("name")) for i, item in enumerate(items) if isinstance(item, Mapping)]


def _limit(s: Section, key: str, high: int | None, what: str) -> int | None:
    top = 10**4 if high is None else high
    return s.get(
        key, int, None, valid=f"an integer 0..{top} ({what}, whole slices)", check=int_range(0, top)
    )


def _parse_quota(
    problems: Problems, path: str, raw: Any, slices: Mapping[str, SliceConfig | None]
) -> TeamQuota | None:
    before = len(problems.errors)
    s = Section(problems, path, raw, ("slice", "slices", "borrowingLimit", "lendingLimit"))
    if not s.ok:
        return None
    name = s.get(
        "slice",
        str,
        valid=", ".join(slices) or "(no slices configured)",
        check=lambda v: v in slices,
        hint="a ray-tpu:slices name: its shape and provisioning make the flavor",
    )
    count = s.get(
        "slices", int, valid="an integer 0..10000 (whole slices)", check=int_range(0, 10**4)
    )
    borrowing = _limit(s, "borrowingLimit", None, "slices it may borrow from its cohort")
    lending = _limit(s, "lendingLimit", count, "slices of its quota it may lend, <= slices")
    known = slices.get(name) if name is not None else None
    if known is None or count is None or len(problems.errors) > before:
        return None
    spot = known.provisioning == "spot"
    return TeamQuota(name, known.shape, spot, count, borrowing, lending, queued=known.queued)


def _parse_team(
    problems: Problems,
    index: int,
    raw: Any,
    slices: Mapping[str, SliceConfig | None],
    priorities: Sequence[PriorityClassConfig],
) -> TeamConfig | None:
    path = f"{NAMESPACE}:teams[{index}]"
    keys = ("name", "namespace", "cohort", "priority", "quotas", "preemption")
    s = Section(problems, path, raw, keys)
    if not s.ok:
        return None
    name = s.get("name", str, valid=name_valid(TEAM_NAME_MAX), check=name_check(TEAM_NAME_MAX))
    namespace = s.get("namespace", str, name, valid=name_valid(63), check=name_check(63))
    cohort = s.get("cohort", str, None, valid=name_valid(63), check=name_check(63))
    names = [p.name for p in priorities]
    priority = s.get(
        "priority",
        str,
        valid=", ".join(names) or "a ray-tpu:priorityClasses name (none declared)",
        check=lambda v: v in names,
        hint="the team's default priority class",
    )
    quotas: list[TeamQuota] = []
    raw_quotas = s.get("quotas", list, valid="a non-empty list of {slice, slices}", check=bool)
    for q_index, item in enumerate(raw_quotas or []):
        quota = _parse_quota(problems, f"{path}.quotas[{q_index}]", item, slices)
        if quota is None:
            continue
        clash = next((q for q in quotas if q.flavor == quota.flavor), None)
        if clash is not None:
            problems.bad(
                f"{path}.quotas[{q_index}].slice",
                quota.slice,
                "one quota per flavor",
                f"slices {clash.slice!r} and {quota.slice!r} are both flavor {quota.flavor}: "
                "add the slices up in one entry",
            )
            continue
        if cohort is None and (quota.borrowing_limit or quota.lending_limit is not None):
            problems.bad(
                f"{path}.cohort", None, "a cohort name", "borrowing and lending need a cohort"
            )
        quotas.append(quota)
    preemption = Section(
        problems,
        s.sub("preemption"),
        s.raw.get("preemption") or {},
        ("withinClusterQueue", "reclaimWithinCohort"),
    )
    within = preemption.get(
        "withinClusterQueue",
        str,
        "LowerPriority",
        valid=", ".join(WITHIN_CLUSTER_QUEUE),
        check=lambda v: v in WITHIN_CLUSTER_QUEUE,
    )
    reclaim = preemption.get(
        "reclaimWithinCohort",
        str,
        "Any",
        valid=", ".join(RECLAIM_WITHIN_COHORT),
        check=lambda v: v in RECLAIM_WITHIN_COHORT,
    )
    if None in (name, namespace, priority, raw_quotas, within, reclaim):
        return None
    return TeamConfig(name, namespace, priority, tuple(quotas), cohort, within, reclaim)


def parse_teams(
    problems: Problems,
    raw: Any,
    slices: Mapping[str, SliceConfig | None],
    priorities: Sequence[PriorityClassConfig],
) -> tuple[TeamConfig, ...]:
    path = f"{NAMESPACE}:teams"
    items = list_of(problems, path, raw, required=False)
    teams = []
    for index, item in enumerate(items):
        team = _parse_team(problems, index, item, slices, priorities)
        if team is not None:
            teams.append(team)
    check_unique(problems, path, _names(items), "team names")
    seen: dict[str, str] = {}
    for index, team in enumerate(teams):
        if team.namespace in seen:
            problems.bad(
                f"{path}[{index}].namespace",
                team.namespace,
                "a namespace of one team only",
                f"team {seen[team.namespace]!r} has it: Ray objects there would be ambiguous",
            )
        seen.setdefault(team.namespace, team.name)
    return tuple(teams)


def team_of(teams: Sequence[TeamConfig], obj: RayClusterConfig) -> TeamConfig | None:
    """The team of a Ray object: its ``team`` key, else the team of its namespace."""
    for team in teams:
        if team.name == obj.team or (obj.team is None and team.namespace == obj.namespace):
            return team
    return None


def check_team_objects(
    problems: Problems,
    teams: Sequence[TeamConfig],
    priorities: Sequence[PriorityClassConfig],
    slices: Mapping[str, SliceConfig | None],
    objects: Sequence[tuple[str, RayClusterConfig]],
) -> None:
    """Rules across teams and the Ray objects (``objects``: (key path, object))."""
    team_names = ", ".join(t.name for t in teams) or "(no ray-tpu:teams declared)"
    priority_names = [p.name for p in priorities]
    for path, obj in objects:
        if obj.team is not None and obj.team not in [t.name for t in teams]:
            problems.bad(f"{path}.team", obj.team, team_names)
            continue
        team = team_of(teams, obj)
        if obj.priority is not None and obj.priority not in priority_names:
            problems.bad(
                f"{path}.priority",
                obj.priority,
                ", ".join(priority_names) or "a ray-tpu:priorityClasses name (none declared)",
            )
        if team is None:
            if obj.priority is not None:
                problems.bad(f"{path}.team", None, team_names, "a priority needs a team's queue")
            queued = slices.get(obj.slice)
            if queued is not None and queued.queued:
                problems.bad(
                    f"{path}.team",
                    None,
                    team_names,
                    f"slice {obj.slice!r} is provisioned queued: its pools grow only through "
                    "the ProvisioningRequest of a team's Kueue queue",
                )
            continue
        if obj.min_replicas != obj.max_replicas:
            problems.bad(
                f"{path}.maxReplicas",
                obj.max_replicas,
                f"{obj.min_replicas} (= minReplicas)",
                f"team {team.name}'s objects are admitted by Kueue, which refuses in-tree "
                "autoscaling: a queued object holds a fixed number of slices",
            )
        known = slices.get(obj.slice)
        flavors = [q.flavor for q in team.quotas]
        if known is not None:
            quota = TeamQuota(
                obj.slice, known.shape, known.provisioning == "spot", 0, queued=known.queued
            )
            if quota.flavor not in flavors:
                problems.bad(
                    f"{path}.slice",
                    obj.slice,
                    ", ".join(q.slice for q in team.quotas),
                    f"team {team.name} has no quota of flavor {quota.flavor}: Kueue would never "
                    f"admit it; add a quotas entry for slice {obj.slice!r} to team {team.name}",
                )
