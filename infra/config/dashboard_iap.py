"""``ray-tpu:security.dashboardIap``: which Ray object's dashboard goes behind IAP, on which
host, for whom."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from infra.config.reader import Problems, Section, name_check, name_valid
from infra.config.schema import DashboardIapConfig
from raytpu.gke_iap import HOST_RE

_KEYS = ("rayObject", "host", "members", "oauthSecret")
DASHBOARD_KINDS = ("RayCluster", "RayService")
"""Kinds whose head (and dashboard) lives as long as the object. A RayJob's cluster is created
and deleted by KubeRay per run, under a generated name: nothing stable to put a host on."""

_EMAIL = r"[A-Za-z0-9._%+'-]+@[A-Za-z0-9-]+(\.[A-Za-z0-9-]+)+"
MEMBER_RE = re.compile(
    rf"^(user:{_EMAIL}|group:{_EMAIL}|serviceAccount:{_EMAIL}"
    r"|domain:([a-z0-9]([-a-z0-9]*[a-z0-9])?\.)+[a-z]{2,63})$"
)
MEMBER_VALID = (
    "user:EMAIL, group:EMAIL, serviceAccount:EMAIL or domain:DOMAIN (never allUsers or "
    "allAuthenticatedUsers: that is a public dashboard)"
)


def iam_members(problems: Problems, path: str, raw: Any) -> tuple[str, ...] | None:
    """The IAM principals at ``path`` (a non-empty list), each checked, without repeats; None
    (each bad one reported) when any is not a principal."""
    if not isinstance(raw, list) or not raw:
        problems.bad(path, raw, f"a non-empty list of IAM principals: {MEMBER_VALID}")
        return None
    bad = [(i, m) for i, m in enumerate(raw) if not isinstance(m, str) or not MEMBER_RE.match(m)]
    for index, member in bad:
        problems.bad(f"{path}[{index}]", member, MEMBER_VALID)
    return None if bad else tuple(dict.fromkeys(raw))


def oauth_secret(section: Section) -> str | None:
    """``oauthSecret``: the Kubernetes Secret holding the IAP OAuth client; None when not set."""
    return section.get(
        "oauthSecret",
        str,
        None,
        valid=f"a Kubernetes Secret name ({name_valid(63)}) holding client_id and client_secret",
        check=name_check(63),
    )


def _ray_object(section: Section, objects: Mapping[str, Sequence[Any]]) -> tuple[str, Any] | None:
    """(kind, object config) named by ``rayObject``: ``Kind/name`` or a bare ``name``."""
    raw = section.get("rayObject", str, valid="Kind/name or name of a RayCluster or RayService")
    if raw is None:
        return None
    kind, _, name = raw.rpartition("/")
    candidates = [
        (k, obj)
        for k in DASHBOARD_KINDS
        for obj in objects.get(k, ())
        if obj.name == name and kind in ("", k)
    ]
    if candidates:
        return candidates[0]
    valid = ", ".join(f"{k}/{o.name}" for k in DASHBOARD_KINDS for o in objects.get(k, ()))
    jobs = [o.name for o in objects.get("RayJob", ())]
    hint = ""
    if name in jobs or kind == "RayJob":
        hint = "a RayJob's Ray cluster lives only while its job runs: there is no lasting head"
    elif kind and kind not in DASHBOARD_KINDS:
        hint = f"unknown kind {kind!r}"
    section.problems.bad(
        section.sub("rayObject"), raw, valid or "(no RayCluster or RayService)", hint
    )
    return None


def parse_dashboard_iap(
    problems: Problems, path: str, raw: Any, objects: Mapping[str, Sequence[Any]]
) -> DashboardIapConfig | None:
    """Read the section at ``path``; ``objects``: the stack's parsed Ray objects by kind."""
    s = Section(problems, path, raw, _KEYS)
    if not s.ok:
        return None
    found = _ray_object(s, objects)
    host = s.get(
        "host",
        str,
        valid="a lowercase fully qualified DNS name without a wildcard, e.g. ray-dev.example.com",
        check=lambda v: bool(HOST_RE.match(v)),
        hint="its ManagedCertificate's domain; point its DNS A record at the stack output "
        "dashboardIap.address",
    )
    members = s.get(
        "members",
        list,
        valid=f"a non-empty list of IAM principals: {MEMBER_VALID}",
        check=bool,
    )
    members = None if members is None else iam_members(problems, s.sub("members"), members)
    secret = oauth_secret(s)
    if found is None or host is None or members is None:
        return None
    kind, obj = found
    return DashboardIapConfig(
        kind=kind,
        name=obj.name,
        namespace=obj.namespace,
        host=host,
        members=members,
        oauth_secret=secret,
    )
