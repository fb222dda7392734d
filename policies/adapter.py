"""pulumi_policy objects built from :data:`policies.pack.POLICIES` (imported by ``__main__.py``).

Each validate callback unwraps the engine's props with :func:`policies.props.plain` (unknown
values during preview become UNKNOWN instead of raising) and reports each rule message. The engine
gives a violation the level of the policy that reports it, so a rule's
:class:`~policies.rules.Advisory` messages are reported by a second, advisory policy
(``<name>-advisory``) and the mandatory one reports the rest.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pulumi_policy import (
    EnforcementLevel,
    Policy,
    PolicyConfigSchema,
    ReportViolation,
    ResourceValidationArgs,
    ResourceValidationPolicy,
    StackValidationArgs,
    StackValidationPolicy,
)

from policies.pack import POLICIES, PolicySpec
from policies.props import plain
from policies.resources import Resource
from policies.rules import Advisory


def _wanted(advisory: bool) -> Any:
    """Keeps the messages one policy reports: the Advisory ones, or the others."""
    return lambda message: isinstance(message, Advisory) == advisory


def _options(spec: PolicySpec, config: Mapping[str, Any]) -> dict[str, Any]:
    return {o.key: config[o.key] for o in spec.options if o.key in config}


def _schema(spec: PolicySpec) -> PolicyConfigSchema | None:
    if not spec.options:
        return None
    return PolicyConfigSchema(
        properties={o.key: {**o.schema, "default": o.default} for o in spec.options}
    )


def _resource_policy(spec: PolicySpec, advisory: bool = False) -> ResourceValidationPolicy:
    wanted = _wanted(advisory)

    def validate(args: ResourceValidationArgs, report_violation: ReportViolation) -> None:
        if not spec.applies_to(args.resource_type):
            return
        props = plain(args.props)
        for message in spec.run(props, _options(spec, args.get_config())):
            if wanted(message):
                report_violation(str(message), None)

    return ResourceValidationPolicy(
        name=spec.advisory_name if advisory else spec.name,
        description=spec.description,
        validate=validate,
        enforcement_level=EnforcementLevel.ADVISORY if advisory else EnforcementLevel.MANDATORY,
        config_schema=_schema(spec),
        remediation_steps=spec.remediation or None,
    )


def _stack_policy(spec: PolicySpec, advisory: bool = False) -> StackValidationPolicy:
    wanted = _wanted(advisory)

    def validate(args: StackValidationArgs, report_violation: ReportViolation) -> None:
        resources = [
            Resource(type=r.resource_type, name=r.name, urn=r.urn, props=plain(r.props))
            for r in args.resources
        ]
        for message in spec.run(resources, _options(spec, args.get_config())):
            if wanted(message):
                report_violation(str(message), None)

    return StackValidationPolicy(
        name=spec.advisory_name if advisory else spec.name,
        description=spec.description,
        validate=validate,
        enforcement_level=EnforcementLevel.ADVISORY if advisory else EnforcementLevel.MANDATORY,
        config_schema=_schema(spec),
        remediation_steps=spec.remediation or None,
    )


def build_policies() -> list[Policy]:
    """One mandatory pulumi_policy policy per entry of :data:`policies.pack.POLICIES`, plus an
    advisory companion for each that returns Advisory findings (names: ``pack.policy_names()``)."""
    built: list[Policy] = []
    for spec in POLICIES:
        build = _resource_policy if spec.kind == "resource" else _stack_policy
        built.append(build(spec))
        if spec.advisory_name:
            built.append(build(spec, advisory=True))
    return built
