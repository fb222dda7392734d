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
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml

CRD_POLICY = "kuberay-crd-schema"


class InputError(ValueError):
    """A file that is not readable as one of the supported formats."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("files", nargs="+", metavar="FILE", help="YAML manifest or Pulumi JSON")
    parser.add_argument("--json", action="store_true", help="print a JSON report")
    parser.add_argument(
        "--policy-config",
        metavar="FILE",
        help="policy config JSON, as for `pulumi preview --policy-pack-config`",
    )


def kubernetes_type(obj: Mapping[str, Any]) -> str:
    """Pulumi's type token for a Kubernetes object: ``kubernetes:ray.io/v1:RayCluster``."""
    api_version = str(obj.get("apiVersion", ""))
    group_version = "core/v1" if api_version == "v1" else api_version
    return f"kubernetes:{group_version}:{obj.get('kind')}"


def _name_from_urn(urn: str) -> str:
    return urn.rsplit("::", 1)[-1] if "::" in urn else urn


def _kubernetes_objects(documents: list[Any], path: Path) -> Iterator[Any]:
    from policies.model import Resource

    for index, document in enumerate(documents):
        if document is None:
            continue
        items = [document]
        if isinstance(document, Mapping) and document.get("kind") == "List":
            items = list(document.get("items") or [])
        for item in items:
            if not isinstance(item, Mapping) or not item.get("kind") or not item.get("apiVersion"):
                raise InputError(
                    f"{path}: document {index + 1} is not a Kubernetes object (no apiVersion/kind)"
                    f"; valid: Kubernetes YAML, `pulumi stack export` or `pulumi preview --json`"
                )
            name = (item.get("metadata") or {}).get("name") or f"document-{index + 1}"
            yield Resource(
                type=kubernetes_type(item),
                name=str(name),
                urn=f"{path}#{index + 1}",
                props=item,
                source=f"{path}#{index + 1}",
            )


def _pulumi_resources(document: Mapping[str, Any], path: Path) -> Iterator[Any]:
    from policies.model import Resource

    if "deployment" in document:
        entries = (document.get("deployment") or {}).get("resources") or []
        states = [(e, e) for e in entries if isinstance(e, Mapping)]
    else:
        steps = document.get("steps") or []
        states = [
            (step, step.get("newState"))
            for step in steps
            if isinstance(step, Mapping) and isinstance(step.get("newState"), Mapping)
        ]
    for _, state in states:
        type_ = str(state.get("type", ""))
        if type_ == "pulumi:pulumi:Stack" or type_.startswith("pulumi:providers:"):
            continue
        urn = str(state.get("urn", ""))
        inputs = state.get("inputs")
        yield Resource(
            type=type_,
            name=_name_from_urn(urn),
            urn=urn,
            props=inputs if isinstance(inputs, Mapping) else {},
            source=str(path),
        )


def read_resources(path: Path) -> list[Any]:
    """Every resource of one file, in the form the policies read. Raises InputError."""
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as error:
        raise InputError(f"{path}: cannot read: {error}") from None
    stripped = text.lstrip()
    if path.suffix == ".json" or stripped.startswith("{"):
        try:
            documents = [json.loads(text)]
        except ValueError as error:
            raise InputError(f"{path}: not valid JSON: {error}") from None
    else:
        loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
        try:
            documents = list(yaml.load_all(text, Loader=loader))
        except yaml.YAMLError as error:
            raise InputError(f"{path}: not valid YAML: {error}") from None
    if len(documents) == 1 and isinstance(documents[0], Mapping):
        document = documents[0]
        if "deployment" in document or "steps" in document:
            return list(_pulumi_resources(document, path))
    resources = list(_kubernetes_objects(documents, path))
    if not resources:
        raise InputError(f"{path}: holds no Kubernetes object or Pulumi resource")
    return resources


def crd_violations(resources: list[Any]) -> list[Any]:
    """KubeRay objects the API server would reject (schema errors from the CRDs)."""
    from policies.model import ray_kind
    from policies.pack import Violation
    from policies.values import plain
    from raytpu import crds

    violations = []
    for resource in resources:
        if ray_kind(resource.type) is None:
            continue
        props = plain(resource.props)
        if _has_unknown(props):
            continue  # a preview's unknown values cannot be schema-checked yet
        for error in crds.validate_object(dict(props)):
            violations.append(Violation(CRD_POLICY, "mandatory", error, resource))
    return violations


def _has_unknown(value: Any) -> bool:
    from policies.values import is_unknown

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
    violations_all = []
    for name in args.files:
        path = Path(name)
        try:
            resources = read_resources(path)
            violations = evaluate(resources, config) + crd_violations(resources)
        except (InputError, CrdsMissingError) as error:
            errors.append(str(error))
            continue
        files.append({"file": str(path), "resources": len(resources)})
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
        for error in errors:
            print(f"error: {error}", file=sys.stderr)
        checked = sum(f["resources"] for f in files)
        print(
            f"checked {checked} object(s) in {len(files)} file(s): {report.summary(violations_all)}"
        )
    return code
