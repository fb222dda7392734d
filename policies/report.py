"""Printing and exit codes shared by ``raytpu preview`` and ``raytpu check``.

Exit codes: 0 no mandatory violation, 1 a mandatory violation, 2 bad input or configuration.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from policies.evaluation import Violation
from policies.pack import PolicyConfigError, settings
from policies.resources import object_label
from raytpu import inputs
from raytpu.errors import invalid

EXIT_CLEAN = 0
EXIT_VIOLATION = 1
EXIT_INPUT = 2


def load_policy_config(path: str | None) -> dict[str, Any] | None:
    """Policy config from a JSON file in Pulumi's ``--policy-pack-config`` format (validated)."""
    if path is None:
        return None
    try:
        config = inputs.load_json(Path(path))
    except inputs.InputError as error:
        raise PolicyConfigError(f"--policy-config: {error}") from None
    if not isinstance(config, dict):
        raise PolicyConfigError(
            invalid(
                "--policy-config",
                type(config).__name__,
                "a JSON object of policy name -> enforcement level or options",
            )
        )
    settings(config)
    return config


def object_of(violation: Violation) -> str:
    """``RayCluster/train`` for a resource violation, ``stack`` for a stack-level one."""
    return "stack" if violation.resource is None else object_label(violation.resource)


def format_violation(violation: Violation, prefix: str = "") -> str:
    return (
        f"{prefix}{object_of(violation)}: {violation.message} "
        f"[{violation.policy}, {violation.enforcement}]"
    )


def record(violation: Violation, **extra: Any) -> dict[str, Any]:
    resource = violation.resource
    return {
        **extra,
        "policy": violation.policy,
        "enforcement": violation.enforcement,
        "object": object_of(violation),
        "urn": None if resource is None else resource.urn,
        "message": violation.message,
    }


def exit_code(violations: Sequence[Violation]) -> int:
    return EXIT_VIOLATION if any(v.mandatory for v in violations) else EXIT_CLEAN


def summary(violations: Sequence[Violation]) -> str:
    mandatory = sum(v.mandatory for v in violations)
    advisory = len(violations) - mandatory
    if not violations:
        return "no policy violations"
    return f"{mandatory} mandatory and {advisory} advisory policy violation(s)"
