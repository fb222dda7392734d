"""Print TPU slice shapes from the catalog: all common shapes as a table, or one shape.

Examples:
  raytpu catalog
  raytpu catalog v6e 4x4 --json
  raytpu catalog v6e 2x4 --machine-type ct6e-standard-4t --json
"""

from __future__ import annotations

import argparse
import json
import sys

from raytpu import catalog, generations
from raytpu.table import format_table

COLUMNS = (
    ("generation", "generation"),
    ("topology", "topology"),
    ("machine type", "machineType"),
    ("chips/host", "chipsPerHost"),
    ("hosts", "hosts"),
    ("chips", "chips"),
    ("pod type", "podType"),
    ("GKE accelerator", "gkeAccelerator"),
    ("Ray type", "rayAcceleratorType"),
    ("multi-host", "multiHost"),
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument(
        "generation", nargs="?", help=f"one of {', '.join(generations.GENERATIONS)}"
    )
    parser.add_argument("topology", nargs="?", help="e.g. 4x4 or 2x2x4")
    parser.add_argument(
        "--machine-type", help="GKE machine type; needed where a topology fits two host sizes"
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")


def run(args: argparse.Namespace) -> int:
    if (args.generation is None) != (args.topology is None):
        print("error: give both GENERATION and TOPOLOGY, or neither", file=sys.stderr)
        return 2
    if args.generation is None:
        records = [s.to_dict() for s in catalog.common_shapes()]
        if args.json:
            print(json.dumps(records, indent=2))
        else:
            print(
                format_table([h for h, _ in COLUMNS], [[r[k] for _, k in COLUMNS] for r in records])
            )
        return 0
    try:
        record = catalog.shape(
            args.generation, args.topology, machine_type=args.machine_type
        ).to_dict()
    except generations.CatalogError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(record, indent=2))
    else:
        print(format_table(["field", "value"], list(record.items())))
    return 0
