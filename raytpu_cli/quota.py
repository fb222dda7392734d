"""Show a stack's TPU quotas per team: what Kueue is told, and what the node pools hold.

Reads Pulumi.STACK.yaml (ray-tpu:teams, ray-tpu:slices) like `raytpu preview`: no cluster, no
credentials. One row per team and slice shape (flavor): nominal quota in slices and chips, how
much the team may borrow from its cohort and lend to it, the slices the stack's node pools of
that flavor hold, and the slices of it no team's nominal quota covers (negative: the quotas
promise more than the pools hold; the kueue-quota-capacity policy blocks that).

Exit codes: 0 the table, 1 quotas above pool capacity, 2 a configuration error.

Examples:
  raytpu quota --stack prod
  raytpu quota --stack prod --json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

COLUMNS = (
    "team",
    "shape",
    "flavor",
    "slices",
    "chips",
    "borrow",
    "lend",
    "cohort",
    "pools hold",
    "unassigned",
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("--stack", required=True, help="stack name: reads Pulumi.STACK.yaml")
    parser.add_argument(
        "--project-dir",
        type=Path,
        help="folder holding Pulumi.STACK.yaml, taken as is (default: the Pulumi project of "
        "--cwd or the current directory)",
    )
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")


def _limit(value: int | None, cohort: str | None, unlimited: str) -> str:
    if cohort is None:
        return "-"
    return unlimited if value is None else str(value)


def run(args: argparse.Namespace) -> int:
    from infra.config.schema import ConfigError
    from infra.manifests.kueue import quota_rows
    from raytpu import generations
    from raytpu.table import format_table
    from raytpu_cli.common import UsageError, load_stack_config

    try:
        config = load_stack_config(args, folder=args.project_dir)
    except (ConfigError, generations.CatalogError, UsageError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    rows = quota_rows(config)
    over = sorted({r.flavor for r in rows if r.unassigned < 0})
    if args.json:
        print(json.dumps([dataclasses.asdict(r) for r in rows], indent=2))
        return 1 if over else 0
    if not rows:
        print(f"stack {args.stack}: no ray-tpu:teams; every Ray object takes slices directly")
        return 0
    table = [
        [
            r.team,
            r.shape,
            r.flavor,
            r.slices,
            r.chips,
            _limit(r.borrowing_limit, r.cohort, "any"),
            _limit(r.lending_limit, r.cohort, "all"),
            r.cohort or "-",
            r.capacity,
            r.unassigned,
        ]
        for r in rows
    ]
    print(format_table(COLUMNS, table))
    print(
        "\nslices and chips: nominal quota; borrow / lend: slices beyond / of it shared with the "
        "cohort (any / all: no limit, -: no cohort); pools hold: slices of that flavor in the stack; "
        "unassigned: slices no team's nominal quota covers"
    )
    for flavor in over:
        print(
            f"flavor {flavor}: the teams' nominal quotas exceed what the node pools hold; lower "
            "them or add slices",
            file=sys.stderr,
        )
    return 1 if over else 0
