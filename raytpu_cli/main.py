"""``raytpu``: the command line of ray-tpu.

Each subcommand lives in its own module, which exposes ``add_arguments(parser)`` and
``run(args) -> int`` and keeps heavy imports (ray, jax, pulumi) inside ``run``.
Exit codes: 0 success, 1 a check found violations or a run failed, 2 bad input.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# name -> (module, one-line help). Add a command by adding a line here.
COMMANDS: dict[str, tuple[str, str]] = {
    "catalog": ("raytpu_cli.catalog", "print TPU slice shapes (the one catalog)"),
    "check": ("raytpu_cli.check", "check manifests / Pulumi stack files against the policy pack"),
    "preview": ("raytpu_cli.preview", "run a stack offline under mocks and apply the policy pack"),
    "submit": ("raytpu_cli.submit", "submit train/serve/any job to a stack's Ray cluster"),
    "demo": ("raytpu_cli.demo", "train and serve on a simulated TPU slice cluster"),
    "train": ("raytpu_cli.train", "train the LM on a stack's TPU slice (JaxTrainer)"),
    "serve": ("raytpu_cli.serve", "serve the latest checkpoint with Ray Serve"),
    "observability": ("raytpu_cli.observability", "write alert rules and dashboards as files"),
    "dashboard": (
        "raytpu_cli.dashboard",
        "open a stack's Ray Dashboard through kubectl port-forward",
    ),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="raytpu", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (module_name, help_text) in COMMANDS.items():
        module = importlib.import_module(module_name)
        command = sub.add_parser(name, help=help_text, description=module.__doc__)
        module.add_arguments(command)
        command.set_defaults(_run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args._run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
