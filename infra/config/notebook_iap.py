"""``ray-tpu:notebooks.iap``: every notebook on ``<notebook name>.<domain>`` behind IAP, for whom."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from infra.config.dashboard_iap import MEMBER_VALID, iam_members, oauth_secret
from infra.config.notebook_schema import NotebookConfig, NotebookIapConfig
from infra.config.reader import Problems, Section
from raytpu.gke_iap import HOST_RE

_KEYS = ("domain", "members", "teamMembers", "oauthSecret")


def _team_members(
    s: Section, notebooks: Sequence[NotebookConfig]
) -> tuple[tuple[str, tuple[str, ...]], ...] | None:
    raw = s.raw.get("teamMembers")
    if raw is None:
        return ()
    teams = [nb.team for nb in notebooks if nb.team]
    valid = ", ".join(teams) or "(none: the stack's notebooks belong to no team)"
    if not isinstance(raw, dict):
        s.problems.bad(s.sub("teamMembers"), raw, f"a mapping of team -> principals: {valid}")
        return None
    found, ok = [], True
    for team, members in raw.items():
        if team not in teams:
            s.problems.bad(f"{s.sub('teamMembers')}.{team}", team, valid)
            ok = False
            continue
        parsed = iam_members(s.problems, f"{s.sub('teamMembers')}.{team}", members)
        ok = ok and parsed is not None
        found.append((team, parsed or ()))
    return tuple(found) if ok else None


def parse_notebook_iap(
    problems: Problems, path: str, raw: Any, notebooks: Sequence[NotebookConfig]
) -> NotebookIapConfig | None:
    """None when absent or invalid (reported in ``problems``)."""
    if raw is None:
        return None
    s = Section(problems, path, raw, _KEYS)
    if not s.ok:
        return None
    before = len(problems.errors)
    domain = s.get(
        "domain",
        str,
        valid="a lowercase DNS domain without a wildcard, e.g. notebooks.example.com",
        check=lambda v: bool(HOST_RE.match(f"x.{v}")) and len(v) <= 200,
        hint="each notebook is served on <notebook name>.<domain> (its ManagedCertificate's "
        "domain; point its DNS A record at the stack output notebooks.<name>.iapAddress)",
    )
    members = (
        iam_members(problems, s.sub("members"), s.raw["members"]) if "members" in s.raw else ()
    )
    team_members = _team_members(s, notebooks)
    secret = oauth_secret(s)
    if len(problems.errors) > before or domain is None or members is None or team_members is None:
        return None
    iap = NotebookIapConfig(domain, members, team_members, secret)
    for nb in notebooks:
        if not iap.members_of(nb):
            problems.bad(
                s.sub("members"),
                None,
                f"a non-empty list of IAM principals: {MEMBER_VALID}",
                f"no one would pass IAP to notebook {nb.name!r}: give members, or "
                f"teamMembers.{nb.team}"
                if nb.team
                else f"no one would pass IAP to {nb.name!r}",
            )
            return None
    return iap
