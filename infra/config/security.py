"""``ray-tpu:security``: Ray's authentication mode and who may reach Ray's ports."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from infra.config.dashboard_iap import parse_dashboard_iap
from infra.config.reader import Problems, Section, name_check, name_valid
from infra.config.schema import NAMESPACE, RAY_AUTH_MODES, SecurityConfig

_KEYS = ("rayAuth", "disabledReason", "operatorNamespaces", "scraperNamespaces", "dashboardIap")


def _namespaces(section: Section, key: str, default: tuple[str, ...]) -> tuple[str, ...] | None:
    value = section.get(
        key,
        list,
        list(default),
        valid="a list of Kubernetes namespace names",
        check=lambda v: all(isinstance(n, str) and name_check(63)(n) for n in v),
        hint=name_valid(63),
    )
    return None if value is None else tuple(value)


def parse_security(
    problems: Problems, raw: Any, ray_objects: Mapping[str, Sequence[Any]] | None = None
) -> SecurityConfig | None:
    """Token authentication is on unless ``rayAuth: disabled`` comes with a ``disabledReason``.
    ``ray_objects`` (parsed Ray objects by kind) are what ``dashboardIap.rayObject`` may name."""
    s = Section(problems, f"{NAMESPACE}:security", raw if raw is not None else {}, _KEYS)
    default = SecurityConfig()
    mode = s.get(
        "rayAuth",
        str,
        default.ray_auth,
        valid=", ".join(RAY_AUTH_MODES),
        check=lambda v: v in RAY_AUTH_MODES,
    )
    reason = s.get("disabledReason", str, None, valid="a non-empty reason", check=bool)
    if mode == "disabled" and reason is None:
        problems.bad(
            s.sub("disabledReason"),
            None,
            "why Ray may run without authentication here (it is remote code execution for "
            "anyone who reaches its ports)",
            "rayAuth is disabled",
        )
    if mode not in (None, "disabled") and reason is not None:
        problems.bad(s.sub("disabledReason"), reason, "unset unless rayAuth is disabled")
    operators = _namespaces(s, "operatorNamespaces", default.operator_namespaces)
    scrapers = _namespaces(s, "scraperNamespaces", default.scraper_namespaces)
    iap = None
    if s.raw.get("dashboardIap") is not None:
        iap = parse_dashboard_iap(
            problems, s.sub("dashboardIap"), s.raw["dashboardIap"], ray_objects or {}
        )
        if iap is None:
            return None
    if None in (mode, operators, scrapers) or (mode == "disabled") != (reason is not None):
        return None
    return SecurityConfig(mode, reason, operators, scrapers, iap)
