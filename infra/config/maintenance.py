"""``ray-tpu:cluster.maintenance``: when GKE may upgrade the cluster, and what it must not upgrade.

GKE upgrades a multi-host TPU node pool by recreating the whole slice, which kills the job on
it. The default keeps node pools (and minor versions) from being upgraded until the end of
support of the cluster's minor version, and lets the control plane take patches in a weekend
window. GKE's rules, checked here before anything is created: at least 48 hours of window in any
32 days, counting contiguous spans of at least 4 hours; an exclusion of every upgrade lasts at
most 30 days; one "until end of support" applies to the minor-version scopes only.
"""

from __future__ import annotations

import datetime as dt
import re
from typing import Any

from infra.config.reader import Problems, Section, list_of, name_check, name_valid
from infra.config.schema import MaintenanceConfig, MaintenanceExclusion, MaintenanceWindow

SCOPES = ("NO_UPGRADES", "NO_MINOR_UPGRADES", "NO_MINOR_OR_NODE_UPGRADES")
UNTIL_END_OF_SUPPORT_SCOPES = ("NO_MINOR_UPGRADES", "NO_MINOR_OR_NODE_UPGRADES")
NO_UPGRADES_MAX = dt.timedelta(days=30)
WINDOW_MIN = dt.timedelta(hours=4)
WINDOW_HOURS_PER_32_DAYS = 48
TIME_VALID = "an RFC 3339 UTC time, e.g. 2026-01-03T00:00:00Z"
RECURRENCE_RE = re.compile(r"^FREQ=(DAILY|WEEKLY;BYDAY=((MO|TU|WE|TH|FR|SA|SU)(,|$))+)$")
RECURRENCE_VALID = "FREQ=DAILY or FREQ=WEEKLY;BYDAY=<days>, e.g. FREQ=WEEKLY;BYDAY=SA,SU"

DEFAULT_WINDOW = MaintenanceWindow(
    start="2026-01-03T00:00:00Z", end="2026-01-03T08:00:00Z", recurrence="FREQ=WEEKLY;BYDAY=SA,SU"
)
"""Saturdays and Sundays 00:00-08:00 UTC (about 73 hours in 32 days)."""
DEFAULT_EXCLUSION = MaintenanceExclusion(
    name="no-node-upgrades-under-jobs",
    start="2026-01-01T00:00:00Z",
    end=None,
    scope="NO_MINOR_OR_NODE_UPGRADES",
)
"""No node pool (so no TPU slice) is upgraded under a job; upgrade them between jobs by hand."""
DEFAULT_MAINTENANCE = MaintenanceConfig(DEFAULT_WINDOW, (DEFAULT_EXCLUSION,))


def _time(value: Any) -> dt.datetime | None:
    """``value`` (text, or the datetime YAML makes of an unquoted time) as an aware UTC time."""
    if isinstance(value, dt.datetime):
        return value if value.tzinfo else None
    if not isinstance(value, str) or not value.endswith("Z"):
        return None
    try:
        return dt.datetime.fromisoformat(value.removesuffix("Z") + "+00:00")
    except ValueError:
        return None


def _text(moment: dt.datetime) -> str:
    return moment.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _get_time(s: Section, key: str, default: Any = None) -> dt.datetime | None:
    raw = s.raw.get(key, default)
    if raw is None:
        if default is None:
            s.problems.bad(s.sub(key), None, TIME_VALID)
        return None
    moment = _time(raw)
    if moment is None:
        s.problems.bad(s.sub(key), raw, TIME_VALID)
    return moment


def _window_hours_per_32_days(length: dt.timedelta, recurrence: str) -> float:
    days_per_week = 7 if recurrence == "FREQ=DAILY" else len(recurrence.split("=")[-1].split(","))
    return length.total_seconds() / 3600 * days_per_week * 32 / 7


def parse_window(problems: Problems, path: str, raw: Any) -> MaintenanceWindow | None:
    s = Section(problems, path, raw, ("start", "end", "recurrence"))
    start, end = _get_time(s, "start"), _get_time(s, "end")
    recurrence = s.get(
        "recurrence", str, valid=RECURRENCE_VALID, check=lambda v: bool(RECURRENCE_RE.match(v))
    )
    if start is None or end is None or recurrence is None:
        return None
    if end - start < WINDOW_MIN or end - start > dt.timedelta(days=1):
        problems.bad(
            f"{path}.end", _text(end), f"4 to 24 hours after start ({_text(start)})", "GKE's rule"
        )
        return None
    hours = _window_hours_per_32_days(end - start, recurrence)
    if hours < WINDOW_HOURS_PER_32_DAYS:
        problems.bad(
            f"{path}.recurrence",
            recurrence,
            f"one giving at least {WINDOW_HOURS_PER_32_DAYS} hours of window in 32 days "
            f"(this gives {hours:.0f}): more days, or a longer window",
        )
        return None
    return MaintenanceWindow(_text(start), _text(end), recurrence)


def parse_exclusion(problems: Problems, path: str, raw: Any) -> MaintenanceExclusion | None:
    s = Section(problems, path, raw, ("name", "start", "end", "scope", "untilEndOfSupport"))
    name = s.get("name", str, valid=name_valid(63), check=name_check(63))
    scope = s.get("scope", str, valid=", ".join(SCOPES), check=lambda v: v in SCOPES)
    until = s.get("untilEndOfSupport", bool, False, valid="true or false")
    start = _get_time(s, "start")
    end = None if until else _get_time(s, "end")
    if None in (name, scope, until, start) or (not until and end is None):
        return None
    assert start is not None
    if until and scope not in UNTIL_END_OF_SUPPORT_SCOPES:
        problems.bad(
            f"{path}.scope", scope, ", ".join(UNTIL_END_OF_SUPPORT_SCOPES), "with untilEndOfSupport"
        )
        return None
    if until and "end" in s.raw:
        problems.bad(f"{path}.end", s.raw["end"], "absent with untilEndOfSupport: true")
        return None
    if end is not None and end <= start:
        problems.bad(f"{path}.end", _text(end), f"a time after start ({_text(start)})")
        return None
    if end is not None and scope == "NO_UPGRADES" and end - start > NO_UPGRADES_MAX:
        problems.bad(f"{path}.end", _text(end), "at most 30 days after start", "scope NO_UPGRADES")
        return None
    return MaintenanceExclusion(name, _text(start), None if end is None else _text(end), scope)


def parse_maintenance(problems: Problems, path: str, raw: Any) -> MaintenanceConfig | None:
    """``maintenance`` (absent: :data:`DEFAULT_MAINTENANCE`); ``window`` and ``exclusions``
    each default on their own (``exclusions: []`` lets GKE upgrade node pools in the window)."""
    if raw is None:
        return DEFAULT_MAINTENANCE
    s = Section(problems, path, raw, ("window", "exclusions"))
    window = DEFAULT_WINDOW
    if s.raw.get("window") is not None:
        window = parse_window(problems, s.sub("window"), s.raw["window"])
    exclusions: tuple[MaintenanceExclusion | None, ...] = DEFAULT_MAINTENANCE.exclusions
    if "exclusions" in s.raw:
        items = list_of(problems, s.sub("exclusions"), s.raw["exclusions"], required=True)
        exclusions = tuple(
            parse_exclusion(problems, f"{s.sub('exclusions')}[{i}]", item)
            for i, item in enumerate(items)
        )
        names = [e.name for e in exclusions if e is not None]
        for name in {n for n in names if names.count(n) > 1}:
            problems.bad(s.sub("exclusions"), name, "exclusion names that differ", "a duplicate")
    if window is None or None in exclusions:
        return None
    return MaintenanceConfig(window, tuple(e for e in exclusions if e is not None))
