"""Preview a stack offline: run the Pulumi program for Pulumi.STACK.yaml under mocks, list what it
declares, apply the ray-tpu policy pack to exactly the properties the engine would see, and check
every object against its schema (raytpu_cli.schema_check; CRD sets not fetched are skipped and
named in one line).

No cloud credentials, no Pulumi CLI. Prints a table of the declared resources (shape, hosts,
machine type, node pool, Ray worker group), then every policy violation.

Exit codes: 0 clean, 1 a mandatory violation, 2 a configuration error (the stack's config, the
TPU catalog, or --policy-config).

Examples:
  raytpu preview dev
  raytpu preview prod --json
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

COLUMNS = ("type", "name", "shape", "hosts", "machine type", "pool", "Ray group")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("stack", help="stack name: reads Pulumi.STACK.yaml")
    parser.add_argument("--json", action="store_true", help="print a JSON report")
    parser.add_argument(
        "--project-dir",
        type=Path,
        help="folder holding Pulumi.STACK.yaml, taken as is (default: the Pulumi project of "
        "--cwd or the current directory: the nearest folder upwards with Pulumi.yaml)",
    )
    parser.add_argument(
        "--policy-config",
        metavar="FILE",
        help="policy config JSON, as for `pulumi preview --policy-pack-config`",
    )


def _short_type(type_: str) -> str:
    return type_.rsplit(":", 1)[-1]


def describe(resources: Sequence[Any]) -> list[dict[str, Any]]:
    """One row per declared resource (one per TPU worker group for KubeRay objects)."""
    from policies.resources import NODE_POOL, kind_of, node_pool, object_label, worker_groups
    from policies.rules.stack import pool_slices
    from raytpu import catalog, generations

    pools_by_shape: dict[tuple, list[str]] = {}
    groups_by_shape: dict[tuple, list[str]] = {}
    policies = [r for r in resources if r.type.endswith("resourcePolicy:ResourcePolicy")]
    group_rows: list[dict[str, Any]] = []
    for resource in resources:
        kind = (
            kind_of(resource.props, resource.type)
            if resource.type.startswith("kubernetes:")
            else None
        )
        if kind is None:
            continue
        for group in worker_groups(resource.props, kind):
            row = {
                "type": kind,
                "name": resource.name,
                "urn": resource.urn,
                "shape": None,
                "hosts": group.hosts if isinstance(group.hosts, int) else None,
                "machineType": None,
                "pool": None,
                "rayGroup": f"{group.label} x{group.replicas}",
            }
            if group.requests_tpu and isinstance(group.chips_per_host, int):
                try:
                    shape = group.shape()
                except (generations.CatalogError, TypeError, ValueError):
                    shape = None
                if shape is not None:
                    key = (shape.generation.name, shape.topology, shape.chips_per_host)
                    row["shape"] = f"{shape.generation.name} {shape.topology}"
                    row["machineType"] = shape.machine_type
                    row["_key"] = key
                    groups_by_shape.setdefault(key, []).append(
                        f"{object_label(resource)}:{group.label}"
                    )
            group_rows.append(row)
    rows: list[dict[str, Any]] = []
    for resource in resources:
        if getattr(resource, "custom", True) is False or resource.type.startswith("pulumi:"):
            continue
        if resource.type.startswith("kubernetes:ray.io/"):
            rows += [r for r in group_rows if r["urn"] == resource.urn]
            continue
        row = {
            "type": _short_type(resource.type),
            "name": resource.name,
            "urn": resource.urn,
            "shape": None,
            "hosts": None,
            "machineType": None,
            "pool": None,
            "rayGroup": None,
        }
        if resource.type == NODE_POOL:
            pool = node_pool(resource.props)
            row["machineType"] = pool.machine_type if isinstance(pool.machine_type, str) else None
            row["pool"] = pool.name if isinstance(pool.name, str) else resource.name
            found = pool_slices(resource, policies) if pool.is_tpu else None
            if found is not None:
                key, _ = found
                shape = catalog.shape(key[0], key[1], chips_per_host=key[2])
                row["shape"] = f"{shape.generation.name} {shape.topology}"
                row["hosts"] = shape.hosts
                row["_key"] = key
                pools_by_shape.setdefault(key, []).append(row["pool"])
            elif isinstance(pool.count, int):
                row["hosts"] = pool.count
        rows.append(row)
    for row in rows:
        key = row.pop("_key", None)
        if key is None:
            continue
        if row["type"] == "NodePool":
            row["rayGroup"] = ", ".join(groups_by_shape.get(key, [])) or None
        else:
            row["pool"] = ", ".join(pools_by_shape.get(key, [])) or None
    return rows


def _declare(args: argparse.Namespace) -> tuple[list[Any], dict[str, Any], str]:
    """The declared resources, the stack outputs, and the Kubernetes minor the stack runs."""
    from infra import offline
    from raytpu import k8s_schemas
    from raytpu_cli.common import load_stack_config

    config = load_stack_config(args, folder=args.project_dir)
    resources, outputs = offline.run_program(config, stack=args.stack)
    cluster = config.cluster
    minor = k8s_schemas.kubernetes_minor(cluster.release_channel, cluster.min_master_version)
    return resources, outputs, minor


def run(args: argparse.Namespace) -> int:
    from infra.config.schema import ConfigError
    from policies import report
    from policies.evaluation import evaluate
    from policies.pack import PolicyConfigError
    from raytpu import generations
    from raytpu.table import format_table
    from raytpu_cli import schema_check
    from raytpu_cli.common import UsageError

    try:
        config = report.load_policy_config(args.policy_config)
        resources, outputs, minor = _declare(args)
    except (ConfigError, generations.CatalogError, PolicyConfigError, UsageError) as error:
        if args.json:
            print(
                json.dumps({"stack": args.stack, "errors": str(error).splitlines(), "exitCode": 2})
            )
        else:
            print(f"error: {error}", file=sys.stderr)
        return report.EXIT_INPUT
    schemas = schema_check.check(resources, minor)
    violations = evaluate(resources, config) + schemas.violations
    rows = describe(resources)
    code = report.exit_code(violations)
    if args.json:
        result = {
            "stack": args.stack,
            "resources": rows,
            "outputs": sorted(outputs),
            "violations": [report.record(v) for v in violations],
            "schemaChecksSkipped": [s.pin.name for s in schemas.skipped],
            "exitCode": code,
        }
        print(json.dumps(result, indent=2))
        return code
    keys = ("type", "name", "shape", "hosts", "machineType", "pool", "rayGroup")
    print(format_table(COLUMNS, [[row[k] for k in keys] for row in rows]))
    print()
    for violation in violations:
        print(report.format_violation(violation))
    if schemas.skipped_line():
        print(schemas.skipped_line())
    print(
        f"stack {args.stack}: {len(resources)} resource(s) declared, {report.summary(violations)}"
    )
    return code
