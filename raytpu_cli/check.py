"""Check Kubernetes manifests and Pulumi stack files against the ray-tpu policy pack, offline.

Reads multi-document Kubernetes YAML (RayCluster, RayService, RayJob, Service, Ingress, ...),
`pulumi stack export` JSON (deployment.resources[].inputs) and `pulumi preview --json` output
(steps[].newState.inputs), runs the same rules `pulumi preview --policy-pack policies` runs, and
checks every object against its schema (raytpu_cli.schema_check: the KubeRay, Kueue and GMP
CRDs when fetched, Kubernetes' OpenAPI schemas for core objects). Each violation names the file,
the object and the field.

Exit codes: 0 clean, 1 a mandatory violation, 2 unreadable input or bad policy config.

Examples:
  raytpu check k8s/raycluster.yaml
  pulumi stack export > state.json && raytpu check state.json --json
  pulumi preview --json > preview.json && raytpu check preview.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from raytpu import k8s_schemas
from raytpu_cli import schema_check
from raytpu_cli.check_inputs import InputError, read_resources


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("files", nargs="+", metavar="FILE", help="YAML manifest or Pulumi JSON")
    parser.add_argument("--json", action="store_true", help="print a JSON report")
    parser.add_argument(
        "--policy-config",
        metavar="FILE",
        help="policy config JSON, as for `pulumi preview --policy-pack-config`",
    )
    parser.add_argument(
        "--kubernetes-version",
        default=schema_check.DEFAULT_KUBERNETES_MINOR,
        metavar="MINOR",
        help="Kubernetes minor whose schemas core objects are checked against "
        f"(default: {schema_check.DEFAULT_KUBERNETES_MINOR}, GKE's REGULAR channel)",
    )


def not_checked(resources: list[Any]) -> dict[str, list[str]]:
    """Resource types no policy and no schema reads: type -> names (reported, not failed)."""
    from policies.pack import POLICIES
    from policies.resources import RESOURCE_POLICY
    from raytpu.gke_iap import BACKEND_CONFIG_API

    def checked(type_: str) -> bool:
        return (
            type_ == RESOURCE_POLICY  # read by the stack-wide slice rules
            or type_ == f"kubernetes:{BACKEND_CONFIG_API}:BackendConfig"  # ... and the IAP rule
            or any(row.matches(type_) for row in schema_check.CHECKS)
            or any(spec.kind != "stack" and spec.applies_to(type_) for spec in POLICIES)
        )

    found: dict[str, list[str]] = {}
    for resource in resources:
        if not checked(resource.type):
            found.setdefault(resource.type, []).append(resource.name)
    return found


def run(args: argparse.Namespace) -> int:
    from policies import report
    from policies.evaluation import evaluate
    from policies.pack import PolicyConfigError
    from raytpu.crds import CrdsMissingError

    try:
        config = report.load_policy_config(args.policy_config)
        k8s_schemas.supported_minor(args.kubernetes_version)
    except (PolicyConfigError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return report.EXIT_INPUT
    errors: list[str] = []
    files: list[dict[str, Any]] = []
    records: list[dict[str, Any]] = []
    lines: list[str] = []
    notes: list[str] = []
    violations_all = []
    for name in args.files:
        path = Path(name)
        try:
            resources = read_resources(path)
            schemas = schema_check.check(resources, args.kubernetes_version)
            violations = evaluate(resources, config) + schemas.violations
        except (InputError, CrdsMissingError) as error:
            errors.append(str(error))
            continue
        if schemas.skipped_line() and schemas.skipped_line() not in notes:
            notes.append(schemas.skipped_line())
        skipped = not_checked(resources)
        files.append({"file": str(path), "resources": len(resources), "notChecked": skipped})
        for type_, names in skipped.items():
            shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
            notes.append(f"{path}: not checked (no policy reads {type_}): {shown}")
        violations_all += violations
        for violation in violations:
            records.append(report.record(violation, file=str(path)))
            lines.append(report.format_violation(violation, prefix=f"{path}: "))
    code = report.EXIT_INPUT if errors else report.exit_code(violations_all)
    if args.json:
        result = {"files": files, "violations": records, "errors": errors, "exitCode": code}
        print(json.dumps(result, indent=2))
    else:
        for line in lines:
            print(line)
        for note in notes:
            print(note)
        for error in errors:
            print(f"error: {error}", file=sys.stderr)
        checked = sum(f["resources"] for f in files)
        print(
            f"checked {checked} object(s) in {len(files)} file(s): {report.summary(violations_all)}"
        )
    return code
