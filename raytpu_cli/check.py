"""Check Kubernetes manifests and Pulumi stack files against the ray-tpu policy pack, offline.

Reads multi-document Kubernetes YAML (RayCluster, RayService, RayJob, Service, Ingress, ...),
`pulumi stack export` JSON (deployment.resources[].inputs) and `pulumi preview --json` output
(steps[].newState.inputs), runs the same rules `pulumi preview --policy-pack policies` runs, and
validates KubeRay objects against the KubeRay CRDs (see raytpu.crds). Each violation names the
file, the object and the field.

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
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from raytpu_cli.check_inputs import InputError, read_resources

CRD_POLICY = "kuberay-crd-schema"
KUEUE_CRD_POLICY = "kueue-crd-schema"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("files", nargs="+", metavar="FILE", help="YAML manifest or Pulumi JSON")
    parser.add_argument("--json", action="store_true", help="print a JSON report")
    parser.add_argument(
        "--policy-config",
        metavar="FILE",
        help="policy config JSON, as for `pulumi preview --policy-pack-config`",
    )


def not_checked(resources: list[Any]) -> dict[str, list[str]]:
    """Resource types no policy and no CRD schema reads: type -> names (reported, not failed)."""
    from policies.pack import POLICIES
    from policies.resources import RESOURCE_POLICY, ray_kind
    from raytpu.gke_iap import BACKEND_CONFIG_API

    def checked(type_: str) -> bool:
        return (
            type_ == RESOURCE_POLICY  # read by the stack-wide slice rules
            or type_ == f"kubernetes:{BACKEND_CONFIG_API}:BackendConfig"  # ... and the IAP rule
            or ray_kind(type_) is not None
            or _kueue_kind(type_) is not None
            or any(spec.kind != "stack" and spec.applies_to(type_) for spec in POLICIES)
        )

    found: dict[str, list[str]] = {}
    for resource in resources:
        if not checked(resource.type):
            found.setdefault(resource.type, []).append(resource.name)
    return found


def _kueue_kind(type_: str) -> str | None:
    """The Kueue kind of a ``kubernetes:kueue.x-k8s.io/<version>:<Kind>`` type we validate."""
    from raytpu import kueue

    if not type_.startswith(f"kubernetes:{kueue.KUEUE.group}/"):
        return None
    kind = type_.rsplit(":", 1)[-1]
    return kind if kind in kueue.KUEUE.kinds else None


def crd_violations(resources: list[Any]) -> list[Any]:
    """KubeRay and Kueue objects the API server would reject (schema errors from the CRDs)."""
    from policies.pack import Violation
    from policies.props import plain
    from policies.resources import ray_kind
    from raytpu import crds, kueue

    violations = []
    for resource in resources:
        if ray_kind(resource.type) is not None:
            policy, validate = CRD_POLICY, crds.validate_object
        elif _kueue_kind(resource.type) is not None:
            policy, validate = KUEUE_CRD_POLICY, kueue.validate_object
        else:
            continue
        props = plain(resource.props)
        if _has_unknown(props):
            continue  # a preview's unknown values cannot be schema-checked yet
        for error in validate(dict(props)):
            violations.append(Violation(policy, "mandatory", error, resource))
    return violations


def _has_unknown(value: Any) -> bool:
    from policies.props import is_unknown

    if is_unknown(value):
        return True
    if isinstance(value, Mapping):
        return any(_has_unknown(v) for v in value.values())
    if isinstance(value, list):
        return any(_has_unknown(v) for v in value)
    return False


def run(args: argparse.Namespace) -> int:
    from policies import report
    from policies.pack import PolicyConfigError, evaluate
    from raytpu.crds import CrdsMissingError

    try:
        config = report.load_policy_config(args.policy_config)
    except PolicyConfigError as error:
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
            violations = evaluate(resources, config) + crd_violations(resources)
        except (InputError, CrdsMissingError) as error:
            errors.append(str(error))
            continue
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
