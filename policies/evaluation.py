"""The offline runner: every enabled policy of :data:`policies.pack.POLICIES` on a list of
resources, as the Pulumi engine would run them (``raytpu preview``, ``raytpu check``, tests)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from policies.pack import POLICIES, PolicySpec, Settings, settings
from policies.props import plain
from policies.resources import ResourceLike
from policies.rules import Advisory


@dataclass(frozen=True)
class Violation:
    """One violation: the policy, its enforcement, the resource (None: the stack) and message."""

    policy: str
    enforcement: str
    message: str
    resource: ResourceLike | None = None

    @property
    def mandatory(self) -> bool:
        return self.enforcement == "mandatory"


def evaluate(
    resources: Sequence[ResourceLike], config: Mapping[str, Any] | None = None
) -> list[Violation]:
    """Runs every enabled policy on ``resources`` exactly as given (props as the engine has them)."""
    current = settings(config)
    plain_resources = [_Plain(r.type, r.name, r.urn, plain(r.props), r) for r in resources]
    violations: list[Violation] = []
    for spec in POLICIES:
        level = current.levels[spec.name]
        if level == "disabled":
            continue
        opts = current.options[spec.name]
        if spec.kind == "stack":
            for message in spec.run(plain_resources, opts):
                violations += _violation(spec, current, message)
            continue
        for resource in plain_resources:
            if not spec.applies_to(resource.type):
                continue
            for message in spec.run(resource.props, opts):
                violations += _violation(spec, current, message, resource.original)
    return violations


def _violation(
    spec: PolicySpec, current: Settings, message: str, resource: ResourceLike | None = None
) -> list[Violation]:
    """The violation of one message: an :class:`Advisory` one under the spec's companion."""
    name, level = spec.name, current.levels[spec.name]
    if isinstance(message, Advisory):
        name = spec.advisory_name or spec.name
        companion = current.levels[name] if spec.advisory_name else "advisory"
        level = "advisory" if level == "advisory" and companion != "disabled" else companion
    if level == "disabled":
        return []
    return [Violation(name, level, str(message), resource)]


@dataclass(frozen=True)
class _Plain:
    type: str
    name: str
    urn: str
    props: Mapping[str, Any]
    original: ResourceLike
